// Connection: the public class, connecting and accepting, and each connection's watchdog (frame and
// idle timeouts, keep-alives). Queueing a frame (the channel seam) and the writer are in
// connection_writer.cpp, the reader in connection_dispatch.cpp (small frames) and
// connection_read.cpp (the general path), the handshake in connection_handshake.cpp.
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
