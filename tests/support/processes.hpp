// Child processes for tests that run workers the way users do: separate programs, their own
// environment, a deadline on the whole group (a hang kills them and fails the test), and their
// output kept for the failure message.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace tensorplay::test {

/// A port that was free a moment ago on 127.0.0.1 (for a launcher-style MASTER_PORT).
inline std::uint16_t free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    std::uint16_t port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    ::close(fd);
    return port;
}

/// One child: its pid, where its stdout and stderr went, and how it ended.
struct Child {
    pid_t pid = -1;
    std::string log_path;
    int status = 0;      ///< waitpid status once `done`
    bool done = false;
    double seconds = 0;  ///< from spawn until it ended

    [[nodiscard]] bool exited_ok() const { return done && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
    [[nodiscard]] std::string describe() const {
        std::ostringstream out;
        if (!done) out << "still running (killed at the deadline)";
        else if (WIFEXITED(status)) out << "exit " << WEXITSTATUS(status);
        else if (WIFSIGNALED(status)) out << "killed by signal " << WTERMSIG(status);
        std::ifstream f(log_path);
        out << " after " << seconds << " s; output:\n" << f.rdbuf();
        return out.str();
    }
};

/// Starts `argv[0]` with `argv` and the current environment plus `env` ("NAME=value", replacing), its output
/// going to a temporary file.
inline Child spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
    Child c;
    char path[] = "/tmp/tp-child-XXXXXX";
    int fd = ::mkstemp(path);
    c.log_path = path;
    // `env` replaces variables of the same name (getenv would find the first of two).
    auto name_of = [](std::string_view e) { return e.substr(0, e.find('=')); };
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
        bool replaced = false;
        for (auto& mine : env) replaced = replaced || name_of(mine) == name_of(*e);
        if (!replaced) envs.emplace_back(*e);
    }
    for (auto& e : env) envs.push_back(e);
    std::vector<char*> args, envp;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    posix_spawn_file_actions_adddup2(&fa, fd, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (::posix_spawn(&c.pid, args[0], &fa, nullptr, args.data(), envp.data()) != 0) c.pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    ::close(fd);
    return c;
}

/// Waits for every child until `limit` has passed since the call; kills (SIGKILL) and reaps the ones
/// still running then. Returns true when all ended by themselves.
inline bool wait_all(std::vector<Child>& children, std::chrono::milliseconds limit) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + limit;
    for (;;) {
        bool running = false;
        for (auto& c : children) {
            if (c.done || c.pid < 0) continue;
            int st = 0;
            pid_t r = ::waitpid(c.pid, &st, WNOHANG);
            if (r == c.pid) {
                c.done = true;
                c.status = st;
                c.seconds = std::chrono::duration<double>(clock::now() - start).count();
            } else {
                running = true;
            }
        }
        if (!running) return true;
        if (clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (auto& c : children) {
        if (c.done || c.pid < 0) continue;
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &c.status, 0);
        c.seconds = std::chrono::duration<double>(clock::now() - start).count();
    }
    return false;
}

/// The whole output of a child so far.
inline std::string output_of(const Child& c) {
    std::ifstream f(c.log_path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

/// The steps of a two-process test, as lines on two pipes (the child's ends inherited, their numbers
/// passed in its environment): a wait ends with the step, with EOF when the other process is gone,
/// or at its limit. Either end may be -1 (steps go one way only).
struct Steps {
    int in = -1, out = -1;
    std::string buffered;

    /// Tells the other process `name`; false when it cannot be written.
    bool mark(const std::string& name) {
        const std::string line = name + "\n";
        return ::write(out, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    }
    /// Waits for the other process to say `name` (lines before it are skipped).
    bool await(const std::string& name, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        for (;;) {
            if (const auto nl = buffered.find('\n'); nl != std::string::npos) {
                const std::string line = buffered.substr(0, nl);
                buffered.erase(0, nl + 1);
                if (line == name) return true;
                continue;
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
            pollfd p{in, POLLIN, 0};
            if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
            char buf[256];
            const auto n = ::read(in, buf, sizeof buf);
            if (n <= 0) return false;
            buffered.append(buf, static_cast<std::size_t>(n));
        }
    }
};

}  // namespace tensorplay::test
