// async_edge_read on Asio's epoll reactor: a reactor read of our own (core/asio_compat_internals.hpp)
// whose perform step says "drained" when the kernel reports no bytes left (TCP_INQ). Other builds
// fall back to async_read_some.
#include "transport/edge_read.hpp"

#if TP_EDGE_READ

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace tensorplay::detail::edge {

namespace {
/// Bytes left in the kernel after a recvmsg with TCP_INQ on (1 after a FIN); -1: not reported.
int inq_of(msghdr& msg) {
    int inq = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_TCP && c->cmsg_type == TCP_CM_INQ) std::memcpy(&inq, CMSG_DATA(c), sizeof inq);
    return inq;
}
}  // namespace

ReadStatus OpBase::perform(ReactorReadOp& base) {
    auto* o = static_cast<OpBase*>(&base);
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
            o->bytes() = static_cast<std::size_t>(n);
            // Drained: TCP copies all it holds up to the buffer's size, so a read that fills less
            // emptied the queue; TCP_INQ says so exactly, a pending FIN included.
            const bool drained = short_reads ? static_cast<std::size_t>(n) < iov.iov_len : inq_of(msg) == 0;
            const bool idle = drained && (!o->state->may_idle || o->state->may_idle());
            o->state->drained = idle;
            return idle ? ReadStatus::done_and_drained : ReadStatus::done;
        }
        if (n == 0) {
            o->ec() = asio::error::eof;
            o->state->drained = true;
            return ReadStatus::done_and_drained;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return ReadStatus::not_done;
        o->ec() = std::error_code(errno, asio::error::get_system_category());
        o->state->drained = false;
        return ReadStatus::done;
    }
}

void start(const ReactorRegistration& reg, OpBase* op, bool recheck) {
    if (recheck && op->state->drained) {
        // The reactor would wait for an edge that a FIN or reset which came with the last bytes
        // has already spent. No other read of this socket runs (one reader), so reading here,
        // outside the reactor's lock, is safe; an edge that comes after this read finds the
        // reactor's flag set and its own speculative read in start_read catches it.
        op->state->drained = false;
        if (OpBase::perform(*op) != ReadStatus::not_done) {
            post_completed(reg, op);
            return;
        }
    }
    start_read(reg, op);
}

void Canceller::operator()(asio::cancellation_type type) {
    if (!!(type & (asio::cancellation_type::terminal | asio::cancellation_type::partial | asio::cancellation_type::total)))
        cancel_reads(reg, this);
}

namespace {
template <class Socket>
ReactorRegistration prepare_socket(Socket& socket, EdgeReadState& state) {
    const ReactorRegistration reg = register_socket(socket, state.reactor);
    if (!state.short_reads && state.inq_fd != reg.fd) {
        // Without it no read reports the socket drained: Asio's usual behaviour, nothing worse.
        int on = 1;
        ::setsockopt(reg.fd, SOL_TCP, TCP_INQ, &on, sizeof on);
        state.inq_fd = reg.fd;
    }
    return reg;
}
}  // namespace

ReactorRegistration prepare(asio::ip::tcp::socket& socket, EdgeReadState& state) { return prepare_socket(socket, state); }

ReactorRegistration prepare(asio::generic::stream_protocol::socket& socket, EdgeReadState& state) {
    return prepare_socket(socket, state);
}

}  // namespace tensorplay::detail::edge

#endif
