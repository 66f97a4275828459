// ShmConnection: rings in shared memory, spin-then-sleep waits on eventfd doorbells, socket EOF as liveness.
#include "transport/shm/shm_connection.hpp"

#include "core/asio_compat.hpp"
#include "transport/shm/setup.hpp"

#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

namespace tensorplay::detail::shm {

std::chrono::microseconds spin_from_env() {
    constexpr std::chrono::microseconds kDefault{30};
    const char* v = std::getenv("TP_SHM_SPIN_US");
    if (!v || !*v) return kDefault;
    char* end = nullptr;
    errno = 0;
    const long long us = std::strtoll(v, &end, 10);
    if (errno != 0 || *end != '\0' || us < 0 || us > 10'000'000) return kDefault;
    return std::chrono::microseconds(us);
}

namespace {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

/// Spins until `ready()` or `budget` has passed. Every 64 turns it looks at the clock and yields
/// the core, so that a peer sharing this core gets to run (spinning alone would starve it).
template <class Ready>
bool spin_until(std::chrono::microseconds budget, Ready&& ready) {
    if (budget.count() <= 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + budget;
    for (unsigned i = 1;; ++i) {
        if (ready()) return true;
        cpu_relax();
        if ((i & 63) == 0) {
            if (std::chrono::steady_clock::now() >= deadline) return false;
            ::sched_yield();
        }
    }
}

}  // namespace

struct ShmConnection::State : std::enable_shared_from_this<State> {
    State(asio::local::stream_protocol::socket s, ShmOptions o)
        : socket(std::move(s)), options(o), data_wait(socket.get_executor()), space_wait(socket.get_executor()) {}

    asio::local::stream_protocol::socket socket;
    ShmOptions options;
    LocalEnd local;
    PeerEnd peer;
    RingView inbox;   // we read it
    RingView outbox;  // the peer's inbox: we write it
    asio::posix::stream_descriptor data_wait;   // watches local.data_bell
    asio::posix::stream_descriptor space_wait;  // watches local.space_bell
    std::optional<Error> lost;  // the peer is gone (or broke the protocol)
    bool closed = false;
    int peer_pid = -1;
    ShmStats stats;
    // Doorbells that woke a wait to nothing, in the window that began at idle_since.
    std::chrono::steady_clock::time_point idle_since{};
    unsigned idle_count = 0;

    [[nodiscard]] Error ended() const {
        if (lost) return *lost;
        return Error(Errc::connection_lost, "shm connection was closed by this side");
    }

    void lose(Error e) {
        if (!lost) lost = std::move(e);
        std::error_code ec;
        data_wait.cancel(ec);
        space_wait.cancel(ec);
    }

    /// Watches the setup socket: nothing more may arrive on it, so readiness means EOF (the peer
    /// closed or died), a reset, or a protocol violation.
    void watch() {
        socket.async_wait(asio::socket_base::wait_read, [self = shared_from_this()](std::error_code ec) { self->on_socket(ec); });
    }

    void on_socket(std::error_code ec) {
        if (closed || lost) return;
        if (ec) {
            lose(from_error_code(ec, "watching the shm peer"));
            return;
        }
        char b;
        const auto n = ::recv(socket.native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) {
            lose(Error(Errc::connection_lost, "shm peer (pid " + std::to_string(peer_pid) + ") closed the connection or exited"));
        } else if (n > 0) {
            lose(Error(Errc::protocol_error, "shm peer (pid " + std::to_string(peer_pid) + ") sent bytes on the setup socket after setup"));
        } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            watch();
        } else {
            const int err = errno;
            lose(Error(Errc::connection_lost,
                       "shm peer (pid " + std::to_string(peer_pid) + ") connection failed: " + std::strerror(err), {},
                       std::error_code(err, std::system_category())));
        }
    }

    /// A corrupted ring is the peer's fault: the connection ends with that error.
    Error broken(Error e) {
        lose(e);
        return e;
    }

    Task<Result<void>> wait_bell(asio::posix::stream_descriptor& d) {
        ++stats.sleeps;
        auto [ec] = co_await d.async_wait(asio::posix::descriptor_base::wait_read, use_nothrow);
        drain_bell(d.native_handle());
        if (lost || closed) co_return fail(ended());
        if (ec == asio::error::operation_aborted) co_return fail(Errc::cancelled, "shm wait was cancelled");
        if (ec) co_return fail(from_error_code(ec, "waiting on an shm doorbell"));
        co_return ok();
    }

    /// A wait ends with bytes or space: the idle bells before it were an honest peer's (a bell
    /// rung for bytes that a look before the sleep had already found), not a storm.
    Result<void> progress() noexcept {
        idle_count = 0;
        return ok();
    }

    /// A doorbell (`bell`) woke a wait to nothing: counted, and past kIdleBells in one kIdleWindow
    /// the wait pauses until that window ends, the doorbell taken out of the event loop meanwhile
    /// (while watched, every ring wakes the loop, waited on or not). Cancellable as the waits; a
    /// close is seen after the pause.
    Task<Result<void>> idle_bell(asio::posix::stream_descriptor& bell) {
        ++stats.idle_bells;
        const auto now = std::chrono::steady_clock::now();
        if (now - idle_since >= kIdleWindow) {
            idle_since = now;
            idle_count = 0;
        }
        if (++idle_count <= kIdleBells) co_return ok();
        ++stats.backoffs;
        const int fd = bell.release();
        asio::steady_timer pause(socket.get_executor(), idle_since + kIdleWindow);
        auto [ec] = co_await pause.async_wait(use_nothrow);
        std::error_code rc;
        bell.assign(fd, rc);  // (owned again: closed with the connection)
        if (rc) {
            ::close(fd);
            lose(from_error_code(rc, "watching an shm doorbell again"));
        }
        if (lost || closed) co_return fail(ended());
        if (ec) co_return fail(Errc::cancelled, "shm wait was cancelled");
        co_return ok();
    }
};

namespace {

Task<Result<void>> await_socket(asio::local::stream_protocol::socket& s, asio::socket_base::wait_type w) {
    auto [ec] = co_await s.async_wait(w, use_nothrow);
    if (ec) co_return fail(from_error_code(ec, "shm setup socket"));
    co_return ok();
}

/// Sends our inbox and doorbells (the peer keeps its own copy of the memfd; ours goes).
Task<Result<void>> send_local_setup(ShmConnection::State& s) {
    SetupMessage msg;
    msg.capacity = s.local.capacity;
    int fds[kSetupFds];
    fds[0] = s.local.memfd.get();
    fds[1] = s.local.data_bell.get();
    fds[2] = s.local.space_bell.get();
    for (;;) {
        auto sent = send_setup(s.socket.native_handle(), msg, fds);
        if (!sent) co_return fail(std::move(sent).error());
        if (*sent) break;
        if (auto w = co_await await_socket(s.socket, asio::socket_base::wait_write); !w) co_return fail(std::move(w).error());
    }
    s.local.memfd.reset();
    co_return ok();
}

/// Receives and checks the peer's setup, mapping its inbox (our outbox).
Task<Result<void>> receive_setup(ShmConnection::State& s) {
    SetupReceiver rx;
    for (;;) {
        auto got = rx.poll(s.socket.native_handle());
        if (!got) co_return fail(std::move(got).error());
        if (*got) break;
        if (auto w = co_await await_socket(s.socket, asio::socket_base::wait_read); !w) co_return fail(std::move(w).error());
    }
    auto peer = rx.finish(s.options.max_peer_ring_bytes);
    if (!peer) co_return fail(std::move(peer).error());
    s.peer = std::move(*peer);
    co_return ok();
}

Task<Result<std::unique_ptr<ShmConnection>>> establish_impl(std::shared_ptr<ShmConnection::State> s,
                                                            std::unique_ptr<ShmConnection> conn) {
    const int fd = s->socket.native_handle();
    auto local = create_local_end(s->options.ring_bytes);
    if (!local) co_return fail(std::move(local).error());
    s->local = std::move(*local);

    if (s->options.receive_first) {
        if (auto r = co_await receive_setup(*s); !r) co_return fail(std::move(r).error());
        if (auto r = co_await send_local_setup(*s); !r) co_return fail(std::move(r).error());
    } else {
        if (auto r = co_await send_local_setup(*s); !r) co_return fail(std::move(r).error());
        if (auto r = co_await receive_setup(*s); !r) co_return fail(std::move(r).error());
    }

    const std::uint8_t ack = kSetupAck;
    for (;;) {
        auto n = ::send(fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == 1) break;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            if (auto w = co_await await_socket(s->socket, asio::socket_base::wait_write); !w) co_return fail(std::move(w).error());
            continue;
        }
        co_return fail(Errc::connection_lost, "peer closed the socket during shm setup");
    }
    for (;;) {
        std::uint8_t b = 0;
        auto n = ::recv(fd, &b, 1, MSG_DONTWAIT);
        if (n == 1) {
            if (b != kSetupAck) co_return fail(Errc::protocol_error, "shm peer answered the setup with a bad acknowledgement");
            break;
        }
        if (n == 0) co_return fail(Errc::connection_lost, "shm peer closed the socket before accepting our setup (it refused it)");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            co_return fail(Errc::connection_lost, std::string("shm setup failed: ") + std::strerror(errno));
        if (auto w = co_await await_socket(s->socket, asio::socket_base::wait_read); !w) co_return fail(std::move(w).error());
    }

    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) s->peer_pid = cred.pid;
    s->inbox = RingView(s->local.inbox.base(), s->local.capacity);
    s->outbox = RingView(s->peer.outbox.base(), s->peer.capacity);
    std::error_code ec;
    s->data_wait.assign(s->local.data_bell.release(), ec);
    if (!ec) s->space_wait.assign(s->local.space_bell.release(), ec);
    if (ec) co_return fail(from_error_code(ec, "watching the shm doorbells"));
    s->watch();
    co_return std::move(conn);
}

}  // namespace

Task<Result<std::unique_ptr<ShmConnection>>> ShmConnection::establish(asio::local::stream_protocol::socket socket,
                                                                      ShmOptions options) {
    std::error_code ec;
    socket.non_blocking(true, ec);
    if (ec) co_return fail(from_error_code(ec, "shm setup socket"));
    const auto limit = options.setup_timeout;
    auto s = std::make_shared<State>(std::move(socket), options);
    std::unique_ptr<ShmConnection> conn(new ShmConnection(s));
    auto r = co_await with_timeout(establish_impl(s, std::move(conn)), limit);
    if (!r) co_return fail(std::move(r).error().context("setting up the shm connection"));
    co_return r;
}

ShmConnection::~ShmConnection() { close(); }

void ShmConnection::close() {
    if (!s_ || s_->closed) return;
    s_->closed = true;
    std::error_code ec;
    s_->socket.shutdown(asio::socket_base::shutdown_both, ec);
    s_->socket.close(ec);
    s_->data_wait.cancel(ec);
    s_->space_wait.cancel(ec);
}

bool ShmConnection::is_open() const noexcept { return !s_->closed && !s_->lost; }
int ShmConnection::peer_pid() const noexcept { return s_->peer_pid; }
ShmStats ShmConnection::stats() const noexcept { return s_->stats; }
bool ShmConnection::peer_reader_asleep() const noexcept {
    return s_->outbox.header()->reader_waiting.load(std::memory_order_acquire) != 0;
}
std::chrono::microseconds ShmConnection::poll_spin() const noexcept { return s_->options.reader_spin; }
Executor ShmConnection::get_executor() const { return s_->socket.get_executor(); }

Result<std::size_t> ShmConnection::write_some(std::span<const iovec> iov) {
    auto& s = *s_;
    if (s.closed || s.lost) return fail(s.ended());
    auto n = s.outbox.write(iov);
    if (!n) return fail(s.broken(std::move(n).error()));
    if (*n > 0 && take_waiter(s.outbox.header()->reader_waiting)) {
        ring_bell(s.peer.data_bell.get());
        ++s.stats.bells_rung;
    }
    return n;
}

Result<std::size_t> ShmConnection::read_some(std::span<std::uint8_t> dst) {
    auto& s = *s_;
    if (s.closed) return fail(s.ended());
    auto n = s.inbox.read(dst);
    if (!n) return fail(s.broken(std::move(n).error()));
    if (*n > 0) {
        if (take_waiter(s.inbox.header()->writer_waiting)) {
            ring_bell(s.peer.space_bell.get());
            ++s.stats.bells_rung;
        }
    } else if (s.lost && !dst.empty()) {
        return fail(*s.lost);
    }
    return n;
}

Task<Result<void>> ShmConnection::wait_readable() {
    auto s = s_;  // the state outlives this wait even if the connection is destroyed meanwhile
    auto& flag = s->inbox.header()->reader_waiting;
    bool woke = false;  // by a doorbell, last turn
    for (;;) {
        if (s->closed) co_return fail(s->ended());
        auto r = s->inbox.readable_bytes();
        if (!r) co_return fail(s->broken(std::move(r).error()));
        if (*r > 0) co_return s->progress();
        if (s->lost) co_return fail(*s->lost);
        if (std::exchange(woke, false))
            if (auto b = co_await s->idle_bell(s->data_wait); !b) co_return b;
        // (An error found while spinning is reported by the next turn's readable_bytes.)
        if (spin_until(s->options.spin, [&] {
                auto n = s->inbox.readable_bytes();
                return !n || *n > 0;
            }))
            continue;
        announce_wait(flag);
        auto again = s->inbox.readable_bytes();
        if (!again || *again > 0) {
            flag.store(0, std::memory_order_relaxed);
            continue;
        }
        auto w = co_await s->wait_bell(s->data_wait);
        flag.store(0, std::memory_order_relaxed);
        woke = w.has_value();
        if (!w) {
            // Bytes the peer wrote before it went are still there to read.
            if (s->lost && !s->closed) {
                auto left = s->inbox.readable_bytes();
                if (left && *left > 0) co_return ok();
            }
            co_return w;
        }
    }
}

Task<Result<void>> ShmConnection::wait_writable() {
    auto s = s_;
    auto& flag = s->outbox.header()->writer_waiting;
    bool woke = false;  // by a doorbell, last turn
    for (;;) {
        if (s->closed || s->lost) co_return fail(s->ended());
        auto r = s->outbox.free_bytes();
        if (!r) co_return fail(s->broken(std::move(r).error()));
        if (*r > 0) co_return s->progress();
        if (std::exchange(woke, false))
            if (auto b = co_await s->idle_bell(s->space_wait); !b) co_return b;
        if (spin_until(s->options.spin, [&] {
                auto n = s->outbox.free_bytes();
                return !n || *n > 0;
            }))
            continue;
        announce_wait(flag);
        auto again = s->outbox.free_bytes();
        if (!again || *again > 0) {
            flag.store(0, std::memory_order_relaxed);
            continue;
        }
        auto w = co_await s->wait_bell(s->space_wait);
        flag.store(0, std::memory_order_relaxed);
        if (!w) co_return w;
        woke = true;
    }
}

}  // namespace tensorplay::detail::shm
