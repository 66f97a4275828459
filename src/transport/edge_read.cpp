// async_edge_read on Asio's epoll reactor: a reactor operation of our own whose perform step says
// "drained" when the kernel reports no bytes left (TCP_INQ). Relies on asio::detail (reactor_op,
// epoll_reactor::start_op, the socket's reactor registration), which Debian's Asio 1.22 provides;
// other builds fall back to async_read_some.
#include "transport/edge_read.hpp"

#if TP_EDGE_READ

#include <asio/detail/reactive_socket_service.hpp>
#include <asio/detail/thread_context.hpp>
#include <asio/detail/thread_info_base.hpp>
#include <asio/execution/context.hpp>
#include <asio/query.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace tensorplay::detail::edge {

namespace {
/// The socket's reactor registration (basic_socket keeps it protected; a pointer to a member named
/// through a derived class is the one well-defined way to reach it).
template <class Socket>
struct SocketAccess : Socket {
    static auto& impl(Socket& s) { return (s.*(&SocketAccess::impl_)).get_implementation(); }
};
}  // namespace

namespace {
/// Bytes left in the kernel after a recvmsg with TCP_INQ on (1 after a FIN); -1: not reported.
int inq_of(msghdr& msg) {
    int inq = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_TCP && c->cmsg_type == TCP_CM_INQ) std::memcpy(&inq, CMSG_DATA(c), sizeof inq);
    return inq;
}
}  // namespace

asio::detail::reactor_op::status OpBase::perform(asio::detail::reactor_op* base) {
    auto* o = static_cast<OpBase*>(base);
    const bool short_reads = o->state->short_reads;
    iovec iov{o->buf.data(), o->buf.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    for (;;) {
        msghdr msg{};
        ssize_t n;
        if (short_reads) {
            n = ::recv(o->fd, iov.iov_base, iov.iov_len, MSG_DONTWAIT);
        } else {
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control;
            msg.msg_controllen = sizeof control;
            n = ::recvmsg(o->fd, &msg, MSG_DONTWAIT);
        }
        if (n > 0) {
            o->bytes_transferred_ = static_cast<std::size_t>(n);
            // Drained: TCP copies all it holds up to the buffer's size, so a read that fills less
            // emptied the queue; TCP_INQ says so exactly, a pending FIN included.
            const bool drained = short_reads ? static_cast<std::size_t>(n) < iov.iov_len : inq_of(msg) == 0;
            const bool idle = drained && (!o->state->may_idle || o->state->may_idle());
            o->state->drained = idle;
            return idle ? done_and_exhausted : done;
        }
        if (n == 0) {
            o->ec_ = asio::error::eof;
            o->state->drained = true;
            return done_and_exhausted;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return not_done;
        o->ec_ = std::error_code(errno, asio::error::get_system_category());
        o->state->drained = false;
        return done;
    }
}

void start(const Registration& reg, OpBase* op, bool recheck) {
    if (recheck && op->state->drained) {
        // The reactor would wait for an edge that a FIN or reset which came with the last bytes
        // has already spent. No other read of this socket runs (one reader), so reading here,
        // outside the reactor's lock, is safe; an edge that comes after this read finds the
        // reactor's flag set and its own speculative read in start_op catches it.
        op->state->drained = false;
        if (OpBase::perform(op) != asio::detail::reactor_op::not_done) {
            reg.reactor->post_immediate_completion(op, false);
            return;
        }
    }
    reg.reactor->start_op(asio::detail::reactor::read_op, reg.fd, *reg.data, op, false, true);
}

void Canceller::operator()(asio::cancellation_type type) {
    if (!!(type & (asio::cancellation_type::terminal | asio::cancellation_type::partial | asio::cancellation_type::total)))
        reactor->cancel_ops_by_key(fd, *data, asio::detail::reactor::read_op, this);
}

namespace {
template <class Socket>
Registration prepare_socket(Socket& socket, EdgeReadState& state) {
    auto& impl = SocketAccess<Socket>::impl(socket);
    if (!state.reactor)
        state.reactor = &asio::use_service<asio::detail::reactor>(asio::query(socket.get_executor(), asio::execution::context));
    if (!state.short_reads && state.inq_fd != impl.socket_) {
        // Without it no read reports the socket drained: Asio's usual behaviour, nothing worse.
        int on = 1;
        ::setsockopt(impl.socket_, SOL_TCP, TCP_INQ, &on, sizeof on);
        state.inq_fd = impl.socket_;
    }
    return Registration{static_cast<asio::detail::reactor*>(state.reactor), &impl.reactor_data_, impl.socket_};
}
}  // namespace

Registration prepare(asio::ip::tcp::socket& socket, EdgeReadState& state) { return prepare_socket(socket, state); }

Registration prepare(asio::generic::stream_protocol::socket& socket, EdgeReadState& state) {
    return prepare_socket(socket, state);
}

}  // namespace tensorplay::detail::edge

#endif
