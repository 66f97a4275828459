// Private: cuda_basic's pipeline for a large tensor (docs/protocol.md, "Device channels"): its
// bytes go device-to-host through a few pinned slots, chunk by chunk, each chunk written to the
// connection as soon as its copy ran while the next ones copy; on the receiving side the same
// in reverse (each chunk read into a slot goes up while the next is read).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/device/backend.hpp>

#include "transport/connection_ext.hpp"

#include <cstddef>
#include <memory>
#include <vector>

namespace tensorplay::detail {

/// Bytes of one staging chunk: a tensor larger than this is staged in chunks.
inline constexpr std::size_t kStagingChunk = std::size_t{2} << 20;
/// Slots (chunks in flight) per staged tensor.
inline constexpr std::size_t kStagingSlots = 4;

/// A source of `tensor`'s bytes (on one of `backend`'s devices): its first chunks' copies are
/// queued on `stream` now (ordered after what `stream` already has), each later one once the
/// connection wrote the chunk whose slot it reuses. The slots and the tensor stay alive until
/// every queued copy ran, even when the source is dropped first (a closed connection).
[[nodiscard]] Result<std::shared_ptr<ByteSource>> stage_in_chunks(DeviceBackend& backend, tensorplay::Stream stream, Tensor tensor,
                                                                  std::size_t chunk = kStagingChunk,
                                                                  std::size_t slots = kStagingSlots);

/// A sink for a tensor of `dtype` and `shape` (`nbytes` bytes) arriving on one of `backend`'s
/// devices: device memory allocated on `stream`, filled chunk by chunk through a few pinned slots,
/// each chunk's host-to-device copy queued on `stream` as soon as it was read, a slot handed out
/// again once its copy ran. The tensor's bytes are ready on `stream` once finish() returned.
[[nodiscard]] Result<std::shared_ptr<ByteSink>> land_in_chunks(DeviceBackend& backend, tensorplay::Stream stream, DType dtype,
                                                              std::vector<std::int64_t> shape, std::size_t nbytes,
                                                              std::size_t chunk = kStagingChunk,
                                                              std::size_t slots = kStagingSlots);

}  // namespace tensorplay::detail
