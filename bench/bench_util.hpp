// Helpers of rpc_bench: options, pinning, percentiles, child processes and a result pipe.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace bench {

inline double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

/// Nearest-rank percentile (p in 0..100) of `v`.
inline double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

/// Pins the calling process to `cpu` (no-op for a negative cpu).
inline void pin_to(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) std::perror("sched_setaffinity");
}

/// Peak resident set of this process in MiB.
inline double peak_rss_mib() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

/// "key value" lines written by a child, read by the parent.
class ResultPipe {
public:
    ResultPipe() {
        if (::pipe(fds_) != 0) {
            std::perror("pipe");
            std::exit(2);
        }
    }
    /// In the child: report one figure.
    void put(const std::string& key, double value) const {
        char line[256];
        int n = std::snprintf(line, sizeof line, "%s %.9g\n", key.c_str(), value);
        if (n > 0 && ::write(fds_[1], line, static_cast<std::size_t>(n)) < 0) std::perror("write");
    }
    /// In the parent, after the children exited: every figure reported.
    std::map<std::string, double> collect() {
        ::close(fds_[1]);
        std::string all;
        char buf[4096];
        for (;;) {
            auto n = ::read(fds_[0], buf, sizeof buf);
            if (n <= 0) break;
            all.append(buf, static_cast<std::size_t>(n));
        }
        ::close(fds_[0]);
        std::map<std::string, double> out;
        std::size_t pos = 0;
        while (pos < all.size()) {
            auto end = all.find('\n', pos);
            if (end == std::string::npos) end = all.size();
            auto line = all.substr(pos, end - pos);
            auto sp = line.find(' ');
            if (sp != std::string::npos) out[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
            pos = end + 1;
        }
        return out;
    }

private:
    int fds_[2]{-1, -1};
};

/// Forks a child that runs `fn` and exits with its return value.
inline pid_t spawn(const std::function<int()>& fn) {
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) {
        std::perror("fork");
        std::exit(2);
    }
    if (pid == 0) {
        int rc = 1;
        try {
            rc = fn();
        } catch (...) {
            rc = 3;
        }
        std::fflush(nullptr);
        ::_exit(rc);
    }
    return pid;
}

/// Waits for `pid`; true when it exited with status 0.
inline bool reap(pid_t pid) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return false;
    if (WIFSIGNALED(status)) std::fprintf(stderr, "rpc_bench: worker %d killed by signal %d\n", pid, WTERMSIG(status));
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        std::fprintf(stderr, "rpc_bench: worker %d exited with %d\n", pid, WEXITSTATUS(status));
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace bench
