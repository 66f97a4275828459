// Private: the basic channel. A tensor's bytes are written inline after its frame's payload, from
// host memory, and read straight into the memory the receiver's allocator (or sink) gives; the
// connection's writer and reader (connection.cpp, connection_read.cpp) move them.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/device/tensor.hpp>

#include "transport/connection_ext.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace tensorplay::detail {

/// Whether basic can write the tensors of a frame that go inline: their memory must be
/// host-addressable (a CPU tensor, or one of a backend whose memory the host can address); cuda
/// memory goes by a device channel. Tensors with a reference (`refs[i]` != 0) or a source
/// (`streamed[i]`) are another channel's. Errc::device_error naming the first that cannot go.
[[nodiscard]] Result<void> basic_carries(const std::vector<Tensor>& tensors, std::span<const std::uint64_t> refs,
                                         std::span<const std::shared_ptr<ByteSource>> streamed = {});

}  // namespace tensorplay::detail
