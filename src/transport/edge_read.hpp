// edge_read_some: a socket read that lets Asio's epoll reactor skip the next speculative read.
#pragma once

#include <tensorplay/core/task.hpp>

#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>

#include <cstddef>
#include <functional>
#include <system_error>

namespace tensorplay::detail {

struct ReadOutcome {
    std::error_code ec;
    std::size_t n = 0;
};

/// Per-socket state of edge reads. Keep one per socket, next to it.
struct EdgeReadState {
    /// Whether a reader may stop speculating after a drained read. A reset (RST) that arrives in
    /// the same batch as the last bytes is not reported again (a FIN is: the kernel's TCP_INQ
    /// says so), so a reader that relies on the socket to end a wait must say false here while
    /// something waits for more input and nothing will be sent first (a send finds the reset).
    /// Evaluated when the bytes arrive. Empty: true.
    std::function<bool()> may_idle;

    void* reactor = nullptr;  ///< the socket's event loop's reactor (use_service takes a mutex: once)
    int inq_fd = -1;          ///< the descriptor TCP_INQ was turned on for
};

/// Reads what is there (at least one byte, at most buf.size()), like async_read_some.
///
/// Asio 1.22's epoll reactor registers sockets edge-triggered and tries a read before every wait,
/// unless the last read on the socket reported it drained, which its own reads do only at EOF. On
/// a request/reply connection that speculative read always fails with EAGAIN: one wasted system
/// call per message. This read asks the kernel how many bytes remain (TCP_INQ, which also counts
/// a pending FIN) and reports a drained socket as such, so that the reactor's next read waits for
/// readiness first. The reactor records every readiness edge that arrives meanwhile.
///
/// Elsewhere (io_uring builds) it is plain async_read_some. Terminal cancellation only.
[[nodiscard]] Task<ReadOutcome> edge_read_some(asio::ip::tcp::socket& socket, asio::mutable_buffer buf,
                                              EdgeReadState& state);

}  // namespace tensorplay::detail
