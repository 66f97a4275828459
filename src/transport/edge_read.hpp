// edge_read_some: a socket read that lets Asio's epoll reactor skip the next speculative read.
#pragma once

#include <tensorplay/core/task.hpp>

#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>

#include <cstddef>
#include <system_error>

namespace tensorplay::detail {

struct ReadOutcome {
    std::error_code ec;
    std::size_t n = 0;
};

/// Per-socket memo of the socket's reactor (valid while its event loop lives, as the socket).
struct EdgeReadCache {
    void* reactor = nullptr;
};

/// Reads what is there (at least one byte, at most buf.size()), like async_read_some.
///
/// Asio 1.22's epoll reactor registers sockets edge-triggered and tries a read before every wait,
/// unless the last read on the socket reported it drained, which its own reads do only at EOF. On
/// a request/reply connection that speculative read always fails with EAGAIN: one wasted system
/// call per message. This read reports a short read (fewer bytes than asked: the kernel's queue
/// is empty) as drained, so the reactor's next read waits for readiness first. The reactor itself
/// records every readiness edge that arrives meanwhile, so no wake-up can be lost.
///
/// Elsewhere (io_uring builds) it is plain async_read_some. Terminal cancellation only.
[[nodiscard]] Task<ReadOutcome> edge_read_some(asio::ip::tcp::socket& socket, asio::mutable_buffer buf,
                                              EdgeReadCache* cache = nullptr);

}  // namespace tensorplay::detail
