// Helpers of the shm connection tests: a connected pair in one process, a peer in a forked child,
// and loops that send or receive a whole buffer through write_some / read_some and the waits.
#pragma once

#include "core/asio_compat.hpp"
#include "support/deadline.hpp"
#include "transport/shm/shm_connection.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/local/connect_pair.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

namespace tensorplay::test {

using detail::shm::ShmConnection;
using detail::shm::ShmOptions;
using ShmPtr = std::unique_ptr<ShmConnection>;

/// Options built outside any coroutine (GCC 12 and aggregates in coroutine frames).
inline ShmOptions shm_options(std::size_t ring_bytes, std::chrono::microseconds spin) {
    ShmOptions o;
    o.ring_bytes = ring_bytes;
    o.spin = spin;
    return o;
}

struct ShmPair {
    ShmPtr a, b;
};

/// Two connected shm connections in this process.
inline Task<ShmPair> make_shm_pair(ShmOptions options) {
    using namespace detail::awaitable_ops;
    auto ex = co_await asio::this_coro::executor;
    asio::local::stream_protocol::socket sa(ex), sb(ex);
    asio::local::connect_pair(sa, sb);
    auto [ra, rb] = co_await (ShmConnection::establish(std::move(sa), options) &&
                              ShmConnection::establish(std::move(sb), options));
    REQUIRE(ra);
    REQUIRE(rb);
    co_return ShmPair{std::move(*ra), std::move(*rb)};
}

/// Writes all `n` bytes, waiting for space as needed.
inline Task<Result<void>> send_all(ShmConnection& c, const std::uint8_t* p, std::size_t n, std::size_t piece = SIZE_MAX) {
    while (n > 0) {
        iovec v{const_cast<std::uint8_t*>(p), std::min(n, piece)};
        auto k = c.write_some(std::span<const iovec>(&v, 1));
        if (!k) co_return fail(std::move(k).error());
        if (*k == 0) {
            auto w = co_await c.wait_writable();
            if (!w) co_return w;
            continue;
        }
        p += *k;
        n -= *k;
    }
    co_return ok();
}

/// Reads exactly `n` bytes, waiting for them as needed.
inline Task<Result<void>> recv_all(ShmConnection& c, std::uint8_t* p, std::size_t n, std::size_t piece = SIZE_MAX) {
    while (n > 0) {
        auto k = c.read_some(std::span<std::uint8_t>(p, std::min(n, piece)));
        if (!k) co_return fail(std::move(k).error());
        if (*k == 0) {
            auto w = co_await c.wait_readable();
            if (!w) co_return w;
            continue;
        }
        p += *k;
        n -= *k;
    }
    co_return ok();
}

/// A forked peer: killed and reaped at scope end unless wait() reaped it (a failed test leaves no
/// process behind).
struct PeerChild {
    pid_t pid = -1;
    int fd = -1;  ///< the parent's end of the socket (handed to an ShmConnection)
    PeerChild(pid_t p, int f) : pid(p), fd(f) {}
    PeerChild(const PeerChild&) = delete;
    PeerChild& operator=(const PeerChild&) = delete;
    /// Reaps the child: its exit status, or 128 + the signal that ended it.
    int wait() {
        int st = 0;
        ::waitpid(pid, &st, 0);
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    ~PeerChild() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    }
};

/// Forks a child that runs `body` on its end of a socket pair and exits with what it returns.
/// The parent gets the pid and its end of the socket (as a descriptor).
inline PeerChild fork_raw_peer(std::function<int(int sock)> body) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(sv[0]);
        ::_exit(body(sv[1]));
    }
    ::close(sv[1]);
    return PeerChild(pid, sv[0]);
}

/// Forks a child that establishes an shm connection on its end of a socket pair and runs
/// `body` on it; the child exits 0 when `body` returns, 3 when setup failed. The parent gets
/// the pid and its end of the socket (as a descriptor). Call before any io_context exists here.
inline PeerChild fork_peer(ShmOptions options, std::function<Task<void>(ShmConnection&)> body) {
    return fork_raw_peer([&](int sock) {
        asio::io_context ctx(1);
        asio::local::stream_protocol::socket s(ctx, asio::local::stream_protocol(), sock);
        asio::co_spawn(
            ctx,
            [&]() -> Task<void> {
                auto c = co_await ShmConnection::establish(std::move(s), options);
                if (!c) ::_exit(3);
                co_await body(**c);
            },
            asio::detached);
        ctx.run();
        return 0;
    });
}

}  // namespace tensorplay::test
