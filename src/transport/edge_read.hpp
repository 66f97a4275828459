// async_edge_read: a socket read that lets Asio's epoll reactor skip the next speculative read.
#pragma once

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/buffer.hpp>
#include <asio/dispatch.hpp>
#include <asio/io_context.hpp>
#include <asio/generic/stream_protocol.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/version.hpp>

#include "core/asio_compat_internals.hpp"
#include "core/resume_slot.hpp"

#include <cstddef>
#include <functional>
#include <system_error>
#include <utility>

// TP_EDGE_READ: edge reads are built (they are reactor reads of our own: core/asio_compat_internals.hpp).
#define TP_EDGE_READ TP_REACTOR_READS

namespace tensorplay::detail {

/// Per-socket state of edge reads. Keep one per socket, next to it. Owned by the socket's one
/// reader: touched where it starts a read, by that read's perform step (on whichever thread runs
/// the reactor, outside any strand) and by its completion, never by two at once.
struct EdgeReadState {
    /// Whether a read that drained the socket may tell the reactor so. Evaluated by the perform
    /// step, outside the reader's strand: it may read only what nothing writes while a read is
    /// pending (or atomics). Empty: true. A reader that decides after the bytes are in (on its
    /// strand) passes `recheck` to async_edge_read instead.
    std::function<bool()> may_idle;

    /// How a read tells that it drained the socket. False: recvmsg asks the kernel how many bytes
    /// are left (TCP_INQ, which counts a pending FIN as one), so a FIN that arrives with the last
    /// bytes is seen at once. True: plain recv, and a read that fills less than its buffer drained
    /// it (TCP hands over all it holds); cheaper (about 0.4 us a round trip here), but such a FIN
    /// is then seen only by a recheck (async_edge_read) or the reset that our next send provokes.
    bool short_reads = false;

    /// The last read reported the socket drained, so the reactor will not read again before the
    /// next readiness edge (written by the perform step, read where the next read starts).
    bool drained = false;

    void* reactor = nullptr;  ///< the socket's event loop's reactor (use_service takes a mutex: once)
    int inq_fd = -1;          ///< the descriptor TCP_INQ was turned on for
};

#if TP_EDGE_READ
namespace edge {

/// The untyped part of the operation: what to read into and where. Its perform step, the read
/// itself (recv, or recvmsg + TCP_INQ), is perform() in edge_read.cpp; `Complete` takes the result.
struct OpBase : ReactorReadOp {
    /// Reads now (without blocking) and says whether that drained the socket.
    static ReadStatus perform(ReactorReadOp& base);
    template <void (*Complete)(ReactorReadOp&, bool)>
    OpBase(Steps<&perform, Complete> steps, int fd_, asio::mutable_buffer b, EdgeReadState& st)
        : ReactorReadOp(steps), fd(fd_), buf(b), state(&st) {}
    int fd;
    asio::mutable_buffer buf;
    EdgeReadState* state;  // next to the socket: valid while the socket is open
};

/// Cancels the read through the reactor (terminal, partial or total), as Asio's own reads do.
struct Canceller {
    ReactorRegistration reg;
    void operator()(asio::cancellation_type type);
};

/// Owned by the reactor from start() until its completion, or its destruction with the event
/// loop (not live), which destroys the handler (and so the parked coroutine) with it.
template <class Handler>
struct Op final : OpBase {
    Op(Handler&& h, int fd_, asio::mutable_buffer b, EdgeReadState& st)
        : OpBase(Steps<&OpBase::perform, &Op::complete>{}, fd_, b, st), handler(std::move(h)) {}

    static Op* create(Handler&& h, int fd_, asio::mutable_buffer b, EdgeReadState& st) {
        return recycled_new<Op>(std::move(h), fd_, b, st);
    }
    static void destroy(Op* o) noexcept { recycled_delete(o); }

    static void complete(ReactorReadOp& base, bool live) {
        auto* o = static_cast<Op*>(&base);
        if (!live) {
            destroy(o);
            return;
        }
        Handler h(std::move(o->handler));
        const std::error_code ec = o->ec();
        const std::size_t n = o->bytes();
        destroy(o);
        // Our canceller goes first: it names this operation, which is gone.
        if (auto cs = asio::get_associated_cancellation_slot(h); cs.is_connected()) cs.clear();
        resume_in_place(std::move(h), ec, n);  // the reactor's completion runs inside the event loop
    }

    Handler handler;
};

/// The socket's reactor registration; prepares `state` (TCP_INQ unless short_reads, the
/// reactor) on first use. For a TCP socket, or a generic stream one (TCP or a Unix socket: a Unix
/// socket's reader must read short, TCP_INQ being TCP's).
ReactorRegistration prepare(asio::ip::tcp::socket& socket, EdgeReadState& state);
ReactorRegistration prepare(asio::generic::stream_protocol::socket& socket, EdgeReadState& state);

/// Starts `op` on the reactor. `recheck` after a read that drained the socket: read once now
/// instead of waiting for the next edge (a FIN or reset that came in with the bytes already read
/// has spent its edge: only a read finds it); a completed read is posted like Asio's own
/// speculative reads.
void start(const ReactorRegistration& reg, OpBase* op, bool recheck);

}  // namespace edge
#endif

/// Reads what is there (at least one byte, at most buf.size()), like async_read_some, completing
/// with (error_code, bytes).
///
/// Asio 1.22's epoll reactor registers sockets edge-triggered and tries a read before every wait,
/// unless the last read on the socket reported it drained, which its own reads do only at EOF. On
/// a request/reply connection that speculative read always fails with EAGAIN: one wasted system
/// call per message. This read tells when it drained the socket (EdgeReadState::short_reads says
/// how) and reports it as such, so that the reactor's next read waits for readiness first. The
/// reactor records every readiness edge that arrives meanwhile. A handler whose event loop is the
/// one completing the read is resumed in place.
///
/// `recheck`: the reader, after looking at the bytes, needs the end of the stream seen at once
/// (something waits on the peer, and nothing we send first would provoke a reset): when the last
/// read drained the socket, read now anyway (one recv that fails with EAGAIN when nothing came).
///
/// Elsewhere (io_uring builds, other Asio versions) it is plain async_read_some.
template <class Socket, class Token>
auto async_edge_read(Socket& socket, asio::mutable_buffer buf, EdgeReadState& state, bool recheck, Token&& token) {
#if TP_EDGE_READ
    return asio::async_initiate<Token, void(std::error_code, std::size_t)>(
        [](auto handler, Socket* sock, asio::mutable_buffer b, EdgeReadState* st, bool again) {
            using H = decltype(handler);
            if (b.size() == 0) {
                auto ex = asio::get_associated_executor(handler, sock->get_executor());
                asio::dispatch(ex, [h = std::move(handler)]() mutable { std::move(h)(std::error_code(), std::size_t(0)); });
                return;
            }
            const auto reg = edge::prepare(*sock, *st);
            auto cs = asio::get_associated_cancellation_slot(handler);
            auto* op = edge::Op<H>::create(std::move(handler), reg.fd, b, *st);
            if (cs.is_connected())
                op->set_cancellation_key(&cs.template emplace<edge::Canceller>(edge::Canceller{reg}));
            edge::start(reg, op, again);
        },
        token, &socket, buf, &state, recheck);
#else
    (void)state;
    (void)recheck;
    return socket.async_read_some(buf, std::forward<Token>(token));
#endif
}

/// async_edge_read without a recheck.
template <class Socket, class Token>
auto async_edge_read(Socket& socket, asio::mutable_buffer buf, EdgeReadState& state, Token&& token) {
    return async_edge_read(socket, buf, state, false, std::forward<Token>(token));
}

}  // namespace tensorplay::detail
