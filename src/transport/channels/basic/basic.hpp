// Private: the basic channel. A tensor's bytes are written inline after its frame's payload, from
// host memory (the connection's writer, connection_writer.cpp), and read straight into the memory
// the receiver's sink or allocator gives (basic_receive, asked by the reader's read_general).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/tensor.hpp>

#include "transport/connection_ext.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace tensorplay::detail {

struct ConnectionState;

/// Whether basic can write the tensors of a frame that go inline: their memory must be
/// host-addressable (a CPU tensor, or one of a backend whose memory the host can address); cuda
/// memory goes by a device channel. Tensors with a reference (`refs[i]` != 0) or a source
/// (`streamed[i]`) are another channel's. Errc::device_error naming the first that cannot go.
[[nodiscard]] Result<void> basic_carries(const std::vector<Tensor>& tensors, std::span<const std::uint64_t> refs,
                                         std::span<const std::shared_ptr<ByteSource>> streamed = {});

/// Receives tensor `desc` of `f`, whose bytes follow on `s`'s stream: into the sink that the
/// connection's sink allocator gives for it, else into memory from its allocator, taken from the
/// receive budget first (counted in `held`). A refusal (budget, allocator, sink) is recorded in
/// f.alloc_error and the bytes are skipped; once one is recorded, the frame's other tensors are
/// skipped too. An error returned (the stream failed) closes the connection.
[[nodiscard]] Task<Result<void>> basic_receive(ConnectionState& s, Frame& f, const TensorDesc& desc, std::size_t& held);

}  // namespace tensorplay::detail
