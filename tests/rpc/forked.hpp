// Test helpers for forked worker processes: reaping them with a deadline.
#pragma once

#include <tensorplay/core/timeout.hpp>

#include <algorithm>
#include <chrono>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tensorplay::test {

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

}  // namespace tensorplay::test
