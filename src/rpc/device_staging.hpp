// Private: cuda_basic's pipeline for a large tensor (docs/protocol.md, "Device channels"): its
// bytes go device-to-host through a few pinned slots, chunk by chunk, each chunk written to the
// connection as soon as its copy ran while the next ones copy.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/device/backend.hpp>

#include "transport/connection_ext.hpp"

#include <cstddef>
#include <memory>

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

}  // namespace tensorplay::detail
