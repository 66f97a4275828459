// rpc_bench's baseline: the same measures with plain blocking TCP sockets (no RPC runtime).
#pragma once

#include "bench_util.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <cstdint>
#include <vector>

namespace bench::plain {

inline constexpr std::size_t small_size = 64;

[[noreturn]] inline void die(const char* what) {
    std::perror(what);
    std::exit(2);
}

inline void no_delay(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Whether the plain sockets are Unix stream sockets (the uds baseline) instead of TCP loopback.
/// Set before the plain processes are forked; they all see the same value.
inline bool& use_unix() {
    static bool u = false;
    return u;
}

/// The abstract name of the plain server's Unix socket: set by listen_loopback, before the
/// processes that connect to it are forked.
inline std::string& unix_name() {
    static std::string name;
    return name;
}

inline sockaddr_un unix_address(socklen_t& len) {
    const std::string& name = unix_name();
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    return a;
}

/// A listening socket on 127.0.0.1 with a kernel-chosen port (or, use_unix(), on an abstract
/// Unix socket; `port` is then 1).
inline int listen_loopback(std::uint16_t& port) {
    if (use_unix()) {
        int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket");
        static int listens = 0;
        unix_name() = "tensorplay-bench-plain-" + std::to_string(::getpid()) + "-" + std::to_string(++listens);
        socklen_t len = 0;
        auto a = unix_address(len);
        if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) die("bind");
        if (::listen(fd, 16) != 0) die("listen");
        port = 1;
        return fd;
    }
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind");
    if (::listen(fd, 16) != 0) die("listen");
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    return fd;
}

inline int connect_loopback(std::uint16_t port) {
    if (use_unix()) {
        int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket");
        socklen_t len = 0;
        auto a = unix_address(len);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) die("connect");
        return fd;
    }
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
    no_delay(fd);
    return fd;
}

inline void send_all(int fd, const void* p, std::size_t n) {
    auto* c = static_cast<const char*>(p);
    while (n > 0) {
        auto r = ::send(fd, c, n, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR) continue;
            die("send");
        }
        c += r;
        n -= static_cast<std::size_t>(r);
    }
}

/// False on EOF before the first byte.
inline bool recv_all(int fd, void* p, std::size_t n) {
    auto* c = static_cast<char*>(p);
    std::size_t got = 0;
    while (got < n) {
        auto r = ::recv(fd, c + got, n - got, 0);
        if (r == 0) {
            if (got == 0) return false;
            die("recv: peer closed mid-message");
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            die("recv");
        }
        got += static_cast<std::size_t>(r);
    }
    return true;
}

/// The callee: serves one connection per phase until told to quit.
inline int serve(int lfd) {
    for (;;) {
        int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) die("accept");
        no_delay(fd);
        char phase = 0;
        if (!recv_all(fd, &phase, 1) || phase == 'Q') {
            ::close(fd);
            return 0;
        }
        if (phase == 'L') {  // blocking ping-pong
            char msg[small_size];
            while (recv_all(fd, msg, sizeof msg)) send_all(fd, msg, sizeof msg);
        } else if (phase == 'P') {  // pipelined echo, one send per message
            std::vector<char> in(1 << 16);
            std::size_t have = 0;
            for (;;) {
                auto r = ::recv(fd, in.data() + have, in.size() - have, 0);
                if (r <= 0) break;
                have += static_cast<std::size_t>(r);
                const std::size_t frames = have / small_size;
                for (std::size_t f = 0; f < frames; ++f) send_all(fd, in.data() + f * small_size, small_size);
                std::memmove(in.data(), in.data() + frames * small_size, have - frames * small_size);
                have -= frames * small_size;
            }
        } else if (phase == 'S') {  // stream echo into a reused, pre-faulted buffer
            std::uint64_t size = 0;
            if (recv_all(fd, &size, sizeof size)) {
                std::vector<char> buf(size, 1);
                while (recv_all(fd, buf.data(), size)) send_all(fd, buf.data(), size);
            }
        }
        ::close(fd);
    }
}

inline int open_phase(std::uint16_t port, char phase) {
    int fd = connect_loopback(port);
    send_all(fd, &phase, 1);
    return fd;
}

/// Blocking 64-byte ping-pong on `fd` (a connection in the 'L' phase): round-trip times in
/// microseconds, after `warmup` round trips that are not counted.
inline std::vector<double> latency_on(int fd, int iters, int warmup) {
    char msg[small_size];
    std::memset(msg, 'p', sizeof msg);
    std::vector<double> rtt;
    rtt.reserve(static_cast<std::size_t>(iters));
    for (int i = 0; i < warmup + iters; ++i) {
        const double t0 = now_us();
        send_all(fd, msg, sizeof msg);
        if (!recv_all(fd, msg, sizeof msg)) die("latency: peer closed");
        if (i >= warmup) rtt.push_back(now_us() - t0);
    }
    return rtt;
}

/// Requests per second with `depth` 64-byte requests in flight, one send per message.
inline double calls_per_s(std::uint16_t port, int depth, long total) {
    int fd = open_phase(port, 'P');
    char req[small_size];
    std::memset(req, 'r', sizeof req);
    std::vector<char> in(1 << 16);
    auto run = [&](long n) {
        const double t0 = now_us();
        long sent = std::min<long>(depth, n), done = 0;
        std::size_t partial = 0;
        for (long i = 0; i < sent; ++i) send_all(fd, req, sizeof req);
        while (done < n) {
            auto r = ::recv(fd, in.data(), in.size(), 0);
            if (r <= 0) die("calls_per_s: recv");
            partial += static_cast<std::size_t>(r);
            const long got = static_cast<long>(partial / small_size);
            partial %= small_size;
            done += got;
            for (long more = std::min(got, n - sent); more > 0; --more, ++sent) send_all(fd, req, sizeof req);
        }
        return (now_us() - t0) / 1e6;
    };
    run(std::max<long>(total / 10, depth));  // warm-up
    const double secs = run(total);
    ::close(fd);
    return static_cast<double>(total) / secs;
}

/// Echo of `size` bytes through a plain stream into reused pre-faulted buffers: GB/s counting
/// the bytes of both directions (median over `reps`).
inline double echo_gbps(std::uint16_t port, std::size_t size, int reps) {
    int fd = open_phase(port, 'S');
    std::uint64_t sz = size;
    send_all(fd, &sz, sizeof sz);
    std::vector<char> src(size, 'x'), dst(size, 0);
    std::vector<double> gbps;
    for (int r = 0; r < reps + 1; ++r) {  // rep 0 warms up
        const double t0 = now_us();
        send_all(fd, src.data(), size);
        if (!recv_all(fd, dst.data(), size)) die("echo: peer closed");
        const double dt = now_us() - t0;
        if (r > 0) gbps.push_back(2.0 * static_cast<double>(size) / dt / 1e3);
    }
    ::close(fd);
    return percentile(gbps, 50);
}

inline void quit(std::uint16_t port) { ::close(open_phase(port, 'Q')); }

}  // namespace bench::plain
