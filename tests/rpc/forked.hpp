// Test helpers for forked worker processes: reaping them with a deadline.
#pragma once

#include <tensorplay/core/timeout.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <tensorplay/core/task.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <chrono>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tensorplay::test {

/// A client of the store a test's process hosts on this machine at `port`.
inline TcpStoreOptions local_store(std::uint16_t port, std::chrono::seconds timeout) {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.timeout = timeout;
    return o;
}

/// Exit codes of every child (-SIGNAL when killed); kills stragglers after `limit`. Waits on the
/// children's pidfds (readable when they exit), not by polling.
inline std::vector<int> reap(const std::vector<pid_t>& pids, std::chrono::seconds limit) {
    std::vector<int> codes(pids.size(), -1000);
    std::vector<int> fds(pids.size());
    bool all_fds = true;
    for (std::size_t i = 0; i < pids.size(); ++i) {
        fds[i] = static_cast<int>(::syscall(SYS_pidfd_open, pids[i], 0));
        all_fds = all_fds && fds[i] >= 0;
    }
    auto deadline = Clock::now() + limit;
    std::size_t left = pids.size();
    while (left > 0) {
        std::vector<pollfd> watch;
        for (std::size_t i = 0; i < pids.size(); ++i)
            if (codes[i] == -1000 && fds[i] >= 0) watch.push_back(pollfd{fds[i], POLLIN, 0});
        auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (!all_fds) wait_ms = std::min<long long>(wait_ms, 10);  // no pidfd for some child: look again soon
        ::poll(watch.data(), watch.size(), static_cast<int>(std::max<long long>(wait_ms, 0)));
        for (std::size_t i = 0; i < pids.size(); ++i) {
            if (codes[i] != -1000) continue;
            int status = 0;
            if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
                --left;
            }
        }
        if (left > 0 && Clock::now() > deadline) {
            for (std::size_t i = 0; i < pids.size(); ++i)
                if (codes[i] == -1000) ::kill(pids[i], SIGKILL);
            deadline = Clock::now() + std::chrono::seconds(5);
        }
    }
    for (int fd : fds)
        if (fd >= 0) ::close(fd);
    return codes;
}

/// Runs `body` on a fresh event loop for at most `limit`: its result, 98 for an exception, 99 when
/// it did not finish in time. For a forked child's main.
inline int run_child(Task<int> body, std::chrono::seconds limit) {
    int code = 99;
    {
        asio::io_context ctx(1);
        asio::co_spawn(ctx, std::move(body), [&code](std::exception_ptr e, int c) { code = e ? 98 : c; });
        ctx.run_for(limit);
    }
    return code;
}

/// A TCP store server with `so` (default: on 127.0.0.1) in its own process (it lives 60 s at
/// most); its port comes back in `port`.
inline pid_t spawn_store(std::uint16_t& port, TcpStoreServerOptions so = {.host = "127.0.0.1"}) {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        asio::io_context ctx(1);
        auto server = TcpStoreServer::start(ctx.get_executor(), so);
        if (!server) ::_exit(2);
        const std::uint16_t bound = (*server)->port();
        if (::write(p[1], &bound, sizeof bound) != sizeof bound) ::_exit(3);
        ctx.run_for(std::chrono::seconds(60));
        ::_exit(0);
    }
    ::close(p[1]);
    REQUIRE(::read(p[0], &port, sizeof port) == sizeof port);
    ::close(p[0]);
    return pid;
}

/// Runs `n` worker processes against a store process of their own: worker r forked runs
/// `body(r, the store's port)` for at most `limit`; their exit codes (the store is killed after).
inline std::vector<int> run_workers(int n, const std::function<Task<int>(int rank, std::uint16_t port)>& body,
                                    std::chrono::seconds limit) {
    std::uint16_t port = 0;
    const pid_t store = spawn_store(port);
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) ::_exit(run_child(body(r, port), limit));
        pids.push_back(pid);
    }
    auto codes = reap(pids, limit + std::chrono::seconds(10));
    ::kill(store, SIGKILL);
    (void)reap({store}, std::chrono::seconds(5));
    return codes;
}

}  // namespace tensorplay::test
