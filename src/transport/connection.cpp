// Connection: the writer coroutine that gathers every queued frame into one async_write, direct
// sends, and the public class. Queueing a frame (the channel seam) is in connection_send.cpp, the
// reader in connection_read.cpp, the handshake in connection_handshake.cpp.
#include <tensorplay/transport/connection.hpp>

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/device/backend.hpp>

#include "core/asio_compat.hpp"
#include "core/resolve.hpp"
#include "transport/connection_state.hpp"
#include "transport/transport.hpp"

#include <asio/co_spawn.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/write.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <span>
#include <utility>

namespace tensorplay {
namespace detail {

namespace {

/// One non-blocking sendmsg of `iov`: the bytes written (0 when the socket is full); other
/// failures set `ec`.
std::size_t sendmsg_now(int fd, iovec* iov, std::size_t count, std::error_code& ec) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    for (;;) {
        // One buffer (a small frame, payload inlined): send(), which spares the kernel copying
        // in a msghdr and an iovec array (about 0.1 us per call here).
        ssize_t n = count == 1 ? ::send(fd, iov[0].iov_base, iov[0].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL)
                               : ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0) return static_cast<std::size_t>(n);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) ec = std::error_code(errno, asio::error::get_system_category());
        return 0;
    }
}

/// One non-blocking sendmsg of as many buffers as one call takes (IOV_MAX). Writing before
/// handing the rest to the event loop saves a submission round trip on the latency path.
std::size_t try_write_now(asio::generic::stream_protocol::socket& sock, const std::vector<asio::const_buffer>& bufs,
                          std::vector<iovec>& iov, std::error_code& ec) {
    iov.clear();
    for (const auto& b : bufs) {
        if (iov.size() == IOV_MAX) break;
        iov.push_back(iovec{const_cast<void*>(b.data()), b.size()});
    }
    return sendmsg_now(sock.native_handle(), iov.data(), iov.size(), ec);
}

/// polled: one write_some of as much of `bufs` as the stream takes.
Result<std::size_t> polled_write_now(ByteStream& c, const std::vector<asio::const_buffer>& bufs, std::vector<iovec>& iov) {
    iov.clear();
    for (const auto& b : bufs)
        if (b.size() > 0) iov.push_back(iovec{const_cast<void*>(b.data()), b.size()});
    return c.write_some(iov);
}

/// Completion condition for async_read/async_write: all of it, and all of the rest in every
/// system call. (Asio's transfer_all caps each call at 64 KiB: a 64 MiB tensor took 1024 passes
/// through the event loop, one epoll_wait each.)
struct TransferRest {
    std::size_t total;
    std::size_t operator()(const std::error_code& ec, std::size_t done) const { return ec ? 0 : total - done; }
};

/// Drops the first `n` bytes of a buffer sequence.
void consume(std::vector<asio::const_buffer>& bufs, std::size_t n) {
    std::size_t i = 0;
    while (i < bufs.size() && n >= bufs[i].size()) {
        n -= bufs[i].size();
        ++i;
    }
    bufs.erase(bufs.begin(), bufs.begin() + static_cast<std::ptrdiff_t>(i));
    if (n > 0 && !bufs.empty()) bufs[0] += n;
}
}  // namespace

bool ConnectionState::polled_write_iov(iovec* v, std::size_t count, std::size_t& written) {
    auto w = v ? polled->write_some(std::span<const iovec>(v, count)) : polled_write_now(*polled, bufs, iov);
    if (!w) {
        close(std::move(w).error().context("writing to " + who()).on_worker(peer.name));
        return false;
    }
    written = *w;
    return true;
}

Task<Result<void>> ConnectionState::polled_write(std::vector<asio::const_buffer>& b) {
    for (;;) {
        auto n = polled_write_now(*polled, b, iov);
        if (!n) co_return fail(std::move(n).error());
        consume(b, *n);
        if (asio::buffer_size(b) == 0) co_return ok();
        if (*n == 0)
            if (auto w = co_await polled->wait_writable(); !w) co_return w;
    }
}

/// Points `bufs` at every byte of `frames`, skipping the first `skip` (already written).
void ConnectionState::gather(std::span<OutFrame> frames, std::size_t skip) {
    bufs.clear();
    for (auto& f : frames) {
        bufs.push_back(asio::buffer(f.head));
        if (!f.payload.empty()) bufs.push_back(asio::buffer(f.payload));
        for (auto& t : f.tensors)
            if (t.nbytes() > 0) bufs.push_back(asio::buffer(t.data(), t.nbytes()));
    }
    if (skip) consume(bufs, skip);
}

/// Writes the queue now with one non-blocking sendmsg; the writer is woken for any rest.
void ConnectionState::flush_now() {
    if (streamed_queued) {  // (its pieces come from their sources: the writer's)
        wake.complete_later();
        return;
    }
    gather(queue, queue_written);
    std::error_code ec;
    const std::size_t total = asio::buffer_size(bufs);
    std::size_t n = 0;
    if (polled) [[unlikely]] {
        if (!polled_write_iov(nullptr, 0, n)) return;
    } else {
        n = try_write_now(socket, bufs, iov, ec);
    }
    ++stats.writes;
    if (ec) {
        close(from_error_code(ec, "writing to " + who()).on_worker(peer.name));
        return;
    }
    if (n == total) {
        stats.frames_sent += queue.size();
        queue.clear();
        queue_bytes = 0;
        queue_written = 0;
        output_written();
        return;
    }
    queue_written += n;
    wake.complete_later();
}

/// Writes a frame (head in `scratch`) with one non-blocking sendmsg; queues what the socket
/// did not take for the writer (taking `payload` and `tensors`). The queue must be empty and
/// no write in progress.
Result<void> ConnectionState::send_direct(Bytes& payload, std::vector<Tensor>& tensors, bool payload_inline) {
    iovec v[2 + kDirectSendTensors];
    std::size_t cnt = 0, total = 0;
    auto add = [&](const void* p, std::size_t n) {
        if (n == 0) return;
        v[cnt++] = iovec{const_cast<void*>(p), n};
        total += n;
    };
    add(scratch.data(), scratch.size());
    if (!payload_inline) add(payload.data(), payload.size());
    for (auto& t : tensors) add(t.data(), t.nbytes());
    std::error_code ec;
    std::size_t written = 0;
    if (polled) [[unlikely]] {
        if (!polled_write_iov(v, cnt, written)) return fail(closed_error());
    } else {
        written = sendmsg_now(socket.native_handle(), v, cnt, ec);
    }
    ++stats.writes;
    if (ec) {
        close(from_error_code(ec, "writing to " + who()).on_worker(peer.name));
        return fail(closed_error());
    }
    if (written == total) {
        ++stats.frames_sent;
        return ok();
    }
    queue.push_back(OutFrame{scratch, payload_inline ? Bytes{} : std::move(payload), std::move(tensors), {}});
    queue_bytes += total;
    queue_written = written;
    wake.complete_later();
    return ok();
}

namespace {

/// Writes every byte of `s.bufs` (the ring's way or the socket's), or the error that closes the
/// connection.
Task<Result<void>> write_all(ConnectionState& s) {
    if (s.polled) {
        auto w = co_await s.polled_write(s.bufs);
        if (!w) co_return fail(std::move(w).error().context("writing to " + s.who()));
        co_return ok();
    }
    std::error_code ec;
    const std::size_t total = asio::buffer_size(s.bufs);
    const std::size_t n = try_write_now(s.socket, s.bufs, s.iov, ec);
    if (!ec && n < total) {
        consume(s.bufs, n);
        auto [aec, m] = co_await asio::async_write(s.socket, s.bufs, TransferRest{total - n}, use_nothrow);
        ec = aec;
    }
    if (ec) co_return fail(from_error_code(ec, "writing to " + s.who()));
    co_return ok();
}

/// Writes `s->batch`, some of whose frames have tensors from sources: the frames before such a
/// tensor in one write, then its pieces one write each as its source yields them, then on. (The
/// first `skip` bytes were written by a flush, which never takes a frame with sources.)
Task<Result<void>> write_streamed(std::shared_ptr<ConnectionState> s, std::size_t skip) {
    std::span<OutFrame> frames(s->batch);
    std::size_t plain = 0;  // frames[0, plain) gathered and not yet written
    auto flush_plain = [&](std::size_t upto) {
        s->gather(frames.subspan(0, upto), skip);
        skip = 0;
        frames = frames.subspan(upto);
    };
    while (!frames.empty()) {
        while (plain < frames.size() && frames[plain].sources.empty()) ++plain;
        flush_plain(plain);
        plain = 0;
        if (frames.empty()) break;
        OutFrame& f = frames[0];
        // s->bufs holds the plain frames before this one: its head and payload join them.
        s->bufs.push_back(asio::buffer(f.head));
        if (!f.payload.empty()) s->bufs.push_back(asio::buffer(f.payload));
        for (std::size_t i = 0; i < f.tensors.size(); ++i) {
            const Tensor& t = f.tensors[i];
            ByteSource* src = i < f.sources.size() ? f.sources[i].get() : nullptr;
            if (!src) {
                if (t.nbytes() > 0) s->bufs.push_back(asio::buffer(t.data(), t.nbytes()));
                continue;
            }
            if (auto w = co_await write_all(*s); !w) co_return w;
            std::size_t left = t.nbytes();
            for (;;) {
                auto piece = co_await src->next();
                if (!piece) co_return fail(std::move(piece).error().context("writing tensor " + std::to_string(i) + " to " + s->who()));
                if (piece->empty()) break;
                if (piece->size() > left)
                    co_return fail(Errc::internal, "the source of tensor " + std::to_string(i) + " gave more than its " +
                                                       std::to_string(t.nbytes()) + " bytes");
                left -= piece->size();
                s->bufs.assign(1, asio::buffer(piece->data(), piece->size()));
                if (auto w = co_await write_all(*s); !w) co_return w;
            }
            if (left > 0)
                co_return fail(Errc::internal, "the source of tensor " + std::to_string(i) + " ended " + std::to_string(left) +
                                                   " bytes short of its " + std::to_string(t.nbytes()));
            s->bufs.clear();
            f.sources[i].reset();  // (its staging goes back now)
        }
        frames = frames.subspan(1);
    }
    co_return co_await write_all(*s);
}

Task<void> writer_loop(std::shared_ptr<ConnectionState> s) {
    // (close() cancels the group and wakes us: we end by `open`, not by a throw at the next wait)
    co_await asio::this_coro::throw_if_cancelled(false);
    while (s->open) {
        if (s->queue.empty()) {
            co_await s->wake.wait();  // a send, or close() (which also cancels the group)
            continue;
        }
        s->batch.swap(s->queue);
        s->batch_bytes = std::exchange(s->queue_bytes, 0);
        s->writing = true;
        ++s->stats.writes;
        s->stats.frames_sent += s->batch.size();
        if (s->streamed_queued) [[unlikely]] {
            s->streamed_queued = false;
            const std::size_t skip = std::exchange(s->queue_written, 0);
            auto w = co_await write_streamed(s, skip);
            s->writing = false;
            s->batch.clear();
            s->batch_bytes = 0;
            s->output_written();
            if (!w) {
                if (s->open) s->close(std::move(w).error().on_worker(s->peer.name));
                break;
            }
            continue;
        }
        s->gather(s->batch, s->queue_written);
        s->queue_written = 0;
        std::error_code ec;
        if (s->polled) {
            auto w = co_await s->polled_write(s->bufs);
            s->writing = false;
            s->batch.clear();
            s->batch_bytes = 0;
            s->output_written();
            if (!w) {
                if (s->open) s->close(std::move(w).error().context("writing to " + s->who()).on_worker(s->peer.name));
                break;
            }
            continue;
        }
        const std::size_t total = asio::buffer_size(s->bufs);
        const std::size_t n = try_write_now(s->socket, s->bufs, s->iov, ec);
        if (!ec && n < total) {
            consume(s->bufs, n);
            auto [aec, m] = co_await asio::async_write(s->socket, s->bufs, TransferRest{total - n}, use_nothrow);
            ec = aec;
        }
        s->writing = false;
        s->batch.clear();
        s->batch_bytes = 0;
        s->output_written();
        if (ec) {
            if (s->open) s->close(from_error_code(ec, "writing to " + s->who()).on_worker(s->peer.name));
            break;
        }
    }
    s->queue.clear();
    s->queue_bytes = 0;
}

std::string seconds_of(Duration d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", std::chrono::duration<double>(d).count());
    return buf;
}

/// The watchdog's tick: the shortest of the frame and idle timeouts and the keep-alive interval
/// that are set (> 0); zero when none is (no watchdog).
Duration watchdog_period(const ConnectionLimits& l) {
    Duration best{0};
    for (const Duration d : {l.frame_timeout, l.idle_timeout, l.keepalive_interval})
        if (d > Duration::zero() && (best == Duration::zero() || d < best)) best = d;
    return best;
}

/// Queues a keep-alive, flushed (a closed connection has nothing to keep alive).
void send_keepalive(ConnectionState& s) {
    ++s.stats.keepalives_sent;
    (void)s.queue_frame(OutFrame{encode_keepalive(), {}, {}, {}}, true);
}

/// Closes a connection whose frame has not arrived whole within limits.frame_timeout, or that
/// received nothing for limits.idle_timeout; sends a keep-alive when nothing was sent for
/// limits.keepalive_interval. One tick per period (the shortest of them) instead of a timer per
/// frame, which would cost a timerfd_settime system call on every frame: a condition that held at
/// two ticks in a row has lasted at least one period.
Task<void> watchdog_loop(std::shared_ptr<ConnectionState> s) {
    const Duration frame_t = s->limits.frame_timeout, idle_t = s->limits.idle_timeout, keep_t = s->limits.keepalive_interval;
    const Duration period = watchdog_period(s->limits);
    co_await asio::this_coro::throw_if_cancelled(false);  // (ends by `open`, as the writer)
    std::uint64_t frames = s->stats.frames_received, reads = s->stats.reads, sent = s->stats.frames_sent;
    bool was_partial = false;
    Duration partial_for{0}, idle_for{0}, quiet_for{0};
    while (s->open) {
        s->watchdog.expires_after(period);
        auto [ec] = co_await s->watchdog.async_wait(use_nothrow);
        if (!s->open) break;
        if (ec) continue;
        const bool partial = s->in_frame || (s->reading && s->rend > s->rbeg);
        partial_for = partial && was_partial && s->stats.frames_received == frames ? partial_for + period : Duration::zero();
        idle_for = !partial && s->stats.reads == reads ? idle_for + period : Duration::zero();
        was_partial = partial;
        quiet_for = s->stats.frames_sent == sent ? quiet_for + period : Duration::zero();
        frames = s->stats.frames_received;
        reads = s->stats.reads;
        sent = s->stats.frames_sent;
        if (keep_t > Duration::zero() && quiet_for >= keep_t) {
            quiet_for = Duration::zero();
            send_keepalive(*s);
        }
        if (frame_t > Duration::zero() && partial_for >= frame_t) {
            s->close(Error(Errc::timeout,
                           "closed the connection to " + s->who() + ": a frame from it did not arrive whole within " +
                               seconds_of(frame_t) + " (ConnectionLimits::frame_timeout)"));
        } else if (idle_t > Duration::zero() && idle_for >= idle_t) {
            s->close(Error(Errc::timeout,
                           "closed the connection to " + s->who() + ": nothing received for " + seconds_of(idle_t) +
                               " (ConnectionLimits::idle_timeout)"));
        }
    }
}

/// What a connection needs once its handshake is done: the full read buffer, the writer, and
/// the watchdog when a timeout is set.
void start_connection(const std::shared_ptr<ConnectionState>& s) {
    s->rbuf.grow(kReadBufferSize, s->rbeg, s->rend);
    (void)s->tasks.spawn(writer_loop(s), "connection writer");
    if (watchdog_period(s->limits) > Duration::zero())
        (void)s->tasks.spawn(watchdog_loop(s), "connection watchdog");
}

}  // namespace

namespace {

Result<Tensor> default_allocate(const TensorDesc& d) { return empty(d.target, d.dtype, d.shape); }

/// Opens a stream to `address`, runs the client's handshake on it and, when the server chose
/// another transport, does so once more at the address it named (which must then settle).
Task<Result<std::shared_ptr<ConnectionState>>> connect_negotiated(Address address, HelloInfo local, ConnectionLimits limits,
                                                                  HandshakeAuth auth) {
    for (int hop = 0;; ++hop) {
        auto transport = transport_for(address);
        if (!transport) co_return fail(transport.error());
        auto connecting = (*transport)->connect(address);
        auto stream = co_await std::move(connecting);
        if (!stream) co_return fail(stream.error());
        auto s = std::make_shared<ConnectionState>(std::move(stream->socket), limits, stream->tcp);
        s->transport = std::move(stream->transport);
        s->endpoint = std::move(stream->endpoint);
        s->peer_pid = stream->peer_pid;
        // (The handshake finds `auth` in the state: GCC 12 mis-destroyed it as a coroutine argument.)
        s->auth = auth;
        auto handshake = client_handshake(s, local);
        auto peer = co_await std::move(handshake);
        s->auth = HandshakeAuth{};
        if (!peer) {
            s->close(std::nullopt);
            co_return fail(peer.error());
        }
        s->peer = std::move(*peer);
        if (s->negotiated.transport == s->transport) {
            if (auto r = co_await finish_transport(*s, limits.handshake_timeout); !r) {
                s->close(std::nullopt);
                co_return fail(std::move(r).error());
            }
            s->allocator = default_allocate;
            s->channels = ChannelTable(s->negotiated, true, s->peer);
            co_return s;
        }
        s->close(std::nullopt);  // (negotiation only: the chosen transport carries the frames)
        const std::string who = "worker \"" + s->peer.name + "\" at " + s->endpoint;
        if (hop > 0)
            co_return fail(Errc::protocol_error, who + " sent us on to transport \"" + s->negotiated.transport +
                                                     "\" again, after we followed its first answer");
        auto next = Address::parse(s->negotiated.address);
        if (!next || next->transport() != s->negotiated.transport)
            co_return fail(Errc::protocol_error, who + " chose transport \"" + s->negotiated.transport +
                                                     "\" with an unusable address \"" + s->negotiated.address + "\"");
        address = std::move(*next);
    }
}

}  // namespace
}  // namespace detail

bool ReceiveBudget::try_take(std::size_t n) noexcept {
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
        if (n > limit_ || used > limit_ - n) return false;
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
    return true;
}

void ReceiveBudget::give_back(std::size_t n) noexcept { used_.fetch_sub(n, std::memory_order_relaxed); }

Connection::Connection(std::shared_ptr<detail::ConnectionState> state) : state_(std::move(state)) {}

Connection::~Connection() {
    if (state_) state_->close(std::nullopt);
}

Task<Result<std::shared_ptr<Connection>>> Connection::connect(Address address, HelloInfo local, ConnectionLimits limits,
                                                              HandshakeAuth auth) {
    const auto timeout = limits.handshake_timeout;
    const std::string where = address.where();
    auto work = detail::connect_negotiated(std::move(address), std::move(local), std::move(limits), std::move(auth));
    auto s = co_await with_timeout(std::move(work), timeout);
    if (!s) co_return fail(std::move(s).error().context("connecting to " + where));
    detail::start_connection(*s);
    co_return std::shared_ptr<Connection>(new Connection(std::move(*s)));
}

Task<Result<std::shared_ptr<Connection>>> Connection::connect(std::string host, std::uint16_t port, HelloInfo local,
                                                              ConnectionLimits limits, HandshakeAuth auth) {
    return connect(Address::tcp(std::move(host), port), std::move(local), std::move(limits), std::move(auth));
}

Task<Result<std::shared_ptr<Connection>>> detail::accept_stream(TransportStream stream, HelloInfo local, ConnectionLimits limits,
                                                                HandshakeAuth auth) {
    auto timeout = limits.handshake_timeout;
    auto s = std::make_shared<detail::ConnectionState>(std::move(stream.socket), std::move(limits), stream.tcp);
    s->transport = std::move(stream.transport);
    s->endpoint = std::move(stream.endpoint);
    s->peer_pid = stream.peer_pid;
    s->auth = std::move(auth);
    auto handshake = detail::server_handshake(s, std::move(local));
    auto peer = co_await with_timeout(std::move(handshake), timeout);
    s->auth = HandshakeAuth{};  // (the key and the admit check are not kept past the handshake)
    if (!peer) {
        s->close(std::nullopt);
        co_return fail(std::move(peer).error().context("handshake with " + s->endpoint));
    }
    s->peer = std::move(*peer);
    if (s->negotiated.transport != s->transport) {
        // The client reconnects over the chosen transport; this stream carried the negotiation only.
        s->redirected = true;
        s->close(std::nullopt);
        co_return ConnectionAccess::wrap(std::move(s));
    }
    if (auto r = co_await detail::finish_transport(*s, timeout); !r) {
        s->close(std::nullopt);
        co_return fail(std::move(r).error().context("setting up the " + s->transport + " stream of " + s->endpoint));
    }
    s->allocator = detail::default_allocate;
    s->channels = detail::ChannelTable(s->negotiated, false, s->peer);
    detail::start_connection(s);
    co_return ConnectionAccess::wrap(std::move(s));
}

Task<Result<std::shared_ptr<Connection>>> Connection::connect(std::string host, std::uint16_t port, HelloInfo local,
                                                              ConnectionLimits limits) {
    return connect(std::move(host), port, std::move(local), std::move(limits), HandshakeAuth{});
}

const HelloInfo& Connection::peer() const noexcept { return state_->peer; }

const std::string& Connection::transport() const noexcept { return state_->transport; }

const Negotiated& Connection::negotiated() const noexcept { return state_->negotiated; }

bool Connection::redirected() const noexcept { return state_->redirected; }

std::string Connection::describe() const { return state_->who(); }

Executor Connection::get_executor() const { return state_->socket.get_executor(); }

void Connection::set_allocator(TensorAllocator allocator) { state_->allocator = std::move(allocator); }

void detail::set_sink_allocator(Connection& c, SinkAllocator allocator) {
    ConnectionAccess::state(c).sink_allocator = std::move(allocator);
}

// (A stream other than TCP always reads short: TCP_INQ is TCP's.)
void detail::set_short_reads(Connection& c, bool short_reads) {
    auto& s = ConnectionAccess::state(c);
    s.edge.short_reads = short_reads || !s.tcp;
}

detail::ChannelKind detail::send_channel(const Connection& c, Device source, Device target) noexcept {
    return ConnectionAccess::state(c).channels.send_kind(source, target);
}

int detail::cma_peer_pid(const Connection& c) noexcept { return ConnectionAccess::state(c).channels.peer_pid(); }


Task<Result<Frame>> Connection::receive() {
    auto s = state_;  // (the state stays alive across the read even if this handle goes)
    auto reading = s->polled ? s->polled_read_frame(s) : s->read_frame(s);
    auto f = co_await std::move(reading);
    if (f) s->refuse_refs(*f);  // (a device channel's references are for the agent's dispatch only)
    co_return f;
}

void detail::dispatch_to(Connection& c, std::shared_ptr<FrameSink> sink) {
    auto s = ConnectionAccess::shared_state(c);
    FrameSink* reader = sink.get();
    if (reader->answers_requests()) s->edge.short_reads = true;  // (set_short_reads says why that is safe)
    auto* op = recycled_new<DispatchOp>(s->socket, s->edge, DispatchReader{s, std::move(sink)});
    s->dispatch_sink = reader;
    if (s->polled) dispatch_polled_frames(*op);
    else dispatch_frames(*op);
}

void Connection::close(std::optional<Error> reason) { state_->close(std::move(reason)); }

Task<void> Connection::join() {
    auto s = state_;  // (the state outlives the join even if this handle goes)
    co_await s->tasks.join();
}

bool Connection::is_open() const noexcept { return state_->open; }

const ConnectionStats& Connection::stats() const noexcept { return state_->stats; }

const detail::ChannelStats& detail::channel_stats(const Connection& c) noexcept { return ConnectionAccess::state(c).channel_stats; }

}  // namespace tensorplay
