// edge_read_some on Asio's epoll reactor: a reactor operation of our own whose perform step says
// "drained" when the kernel reports no bytes left (TCP_INQ). Relies on asio::detail (reactor_op,
// epoll_reactor::start_op, the socket's reactor registration), which Debian's Asio 1.22 provides;
// other builds fall back to async_read_some.
#include "transport/edge_read.hpp"

#include "core/asio_compat.hpp"
#include "core/resume_slot.hpp"

#include <asio/detail/config.hpp>
#include <asio/version.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <memory>

#if defined(ASIO_HAS_EPOLL) && !defined(ASIO_HAS_IO_URING_AS_DEFAULT) && ASIO_VERSION >= 102200 && ASIO_VERSION < 102300
#define TP_EDGE_READ 1
#else
#define TP_EDGE_READ 0
#endif

#if TP_EDGE_READ
#include <asio/detail/reactive_socket_service.hpp>
#include <asio/detail/reactor.hpp>
#include <asio/detail/reactor_op.hpp>
#include <asio/execution/context.hpp>
#include <asio/query.hpp>
#endif

namespace tensorplay::detail {

#if TP_EDGE_READ
namespace {

/// The socket's reactor registration (basic_socket keeps it protected; a pointer to a member named
/// through a derived class is the one well-defined way to reach it).
struct SocketAccess : asio::ip::tcp::socket {
    static auto& impl(asio::ip::tcp::socket& s) { return (s.*(&SocketAccess::impl_)).get_implementation(); }
};

/// Owned by the reactor from start_op until its completion (or its destruction when the event loop
/// is destroyed, which then also destroys the parked reader).
struct EdgeReadOp final : asio::detail::reactor_op {
    EdgeReadOp(int fd_, asio::mutable_buffer b, ReadOutcome* out_, const EdgeReadState& st)
        : reactor_op(asio::error_code(), &do_perform, &do_complete), fd(fd_), buf(b), out(out_), state(st) {}

    static status do_perform(reactor_op* base) {
        auto* o = static_cast<EdgeReadOp*>(base);
        iovec iov{o->buf.data(), o->buf.size()};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
        for (;;) {
            msghdr msg{};
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control;
            msg.msg_controllen = sizeof control;
            const ssize_t n = ::recvmsg(o->fd, &msg, MSG_DONTWAIT);
            if (n > 0) {
                o->bytes_transferred_ = static_cast<std::size_t>(n);
                int inq = -1;  // bytes left in the kernel (1 after a FIN); -1: not reported
                for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
                    if (c->cmsg_level == SOL_TCP && c->cmsg_type == TCP_CM_INQ) std::memcpy(&inq, CMSG_DATA(c), sizeof inq);
                const bool idle_ok = !o->state.may_idle || o->state.may_idle();
                return inq == 0 && idle_ok ? done_and_exhausted : done;
            }
            if (n == 0) {
                o->ec_ = asio::error::eof;
                return done_and_exhausted;
            }
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return not_done;
            o->ec_ = std::error_code(errno, asio::error::get_system_category());
            return done;
        }
    }

    static void do_complete(void* owner, asio::detail::operation* base, const asio::error_code&, std::size_t) {
        std::unique_ptr<EdgeReadOp> o(static_cast<EdgeReadOp*>(base));
        if (!owner) return;  // destroyed with the event loop (and the parked reader with it)
        // This may run on another thread than a cancellation of the reader (a strand on a pool):
        // the results are written only once the waiter is ours. No waiter: the reader left.
        EdgeReadOp& op = *o;
        op.slot.complete_with(op.ec_, [&op] {
            op.out->ec = op.ec_;
            op.out->n = op.bytes_transferred_;
        });  // resumes the reader here (or on its strand), before `o` goes
    }

    int fd;
    asio::mutable_buffer buf;
    ReadOutcome* out;            // on the reader's frame, valid while it waits in `slot`
    const EdgeReadState& state;  // next to the socket: valid while the socket is open
    ResumeSlot slot{ResumeSlot::untracked};  // the reactor owns this operation
};

}  // namespace

Task<ReadOutcome> edge_read_some(asio::ip::tcp::socket& socket, asio::mutable_buffer buf, EdgeReadState& state) {
    ReadOutcome out;
    if (buf.size() == 0) co_return out;
    auto& impl = SocketAccess::impl(socket);
    if (!state.reactor)
        state.reactor = &asio::use_service<asio::detail::reactor>(asio::query(socket.get_executor(), asio::execution::context));
    if (state.inq_fd != impl.socket_) {
        // Without it no read reports the socket drained: Asio's usual behaviour, nothing worse.
        int on = 1;
        ::setsockopt(impl.socket_, SOL_TCP, TCP_INQ, &on, sizeof on);
        state.inq_fd = impl.socket_;
    }
    auto& reactor = *static_cast<asio::detail::reactor*>(state.reactor);
    auto* op = new EdgeReadOp(impl.socket_, buf, &out, state);
    // Started only once the reader is parked in the op's slot: with several threads running the
    // event loop, another one may complete (and free) the op as soon as the reactor has it.
    auto start = [&reactor, &impl, op] {
        reactor.start_op(asio::detail::reactor::read_op, impl.socket_, impl.reactor_data_, op, false, true);
    };
    auto [ec] = co_await op->slot.async_wait(use_nothrow, start);
    if (ec == asio::error::operation_aborted && out.ec != ec) out.ec = ec;  // cancelled while waiting
    co_return out;
}

#else

Task<ReadOutcome> edge_read_some(asio::ip::tcp::socket& socket, asio::mutable_buffer buf, EdgeReadState&) {
    auto [ec, n] = co_await socket.async_read_some(buf, use_nothrow);
    co_return ReadOutcome{ec, n};
}

#endif

}  // namespace tensorplay::detail
