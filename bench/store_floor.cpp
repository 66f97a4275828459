// store_floor: the cheapest store-like load this machine can carry, for judging store_bench.
// One thread serves N connections with bare epoll (one recv and one send per request), another
// drives them with bare epoll, each connection with one request in flight, for 2 seconds.
// No library code: the bound any server and client pair here stays under. Prints one JSON object.
// Usage: store_floor [connections (default 64)]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int kRequest = 40;  // about a SET of a short key and a 16-byte value
constexpr int kReply = 24;

double thread_cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// An epoll instance watching every descriptor for input; events carry the index.
int watch_all(const std::vector<int>& fds) {
    const int ep = ::epoll_create1(0);
    for (std::size_t i = 0; i < fds.size(); ++i) {
        epoll_event e{};
        e.events = EPOLLIN;
        e.data.u32 = static_cast<std::uint32_t>(i);
        ::epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &e);
    }
    return ep;
}

[[noreturn]] void die(const char* what) {
    std::perror(what);
    std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 64;
    if (n < 1 || n > 4096) {
        std::fprintf(stderr, "usage: store_floor [connections 1..4096]\n");
        return 2;
    }
    const int one = 1;
    const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(ls, 4096) != 0 ||
        ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
        die("listen");
    std::vector<int> clients(static_cast<std::size_t>(n)), served(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        clients[i] = ::socket(AF_INET, SOCK_STREAM, 0);
        if (clients[i] < 0 || ::connect(clients[i], reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("connect");
        ::setsockopt(clients[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        served[i] = ::accept(ls, nullptr, nullptr);
        if (served[i] < 0) die("accept");
        ::setsockopt(served[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::fcntl(served[i], F_SETFL, O_NONBLOCK);
    }
    std::atomic<bool> stop{false};
    double server_cpu = 0;
    std::thread server([&] {
        const int ep = watch_all(served);
        char buf[4096], reply[kReply * 64];
        std::memset(reply, 'r', sizeof reply);
        epoll_event events[128];
        const double c0 = thread_cpu_s();
        while (!stop.load(std::memory_order_relaxed)) {
            const int k = ::epoll_wait(ep, events, 128, 100);
            for (int j = 0; j < k; ++j) {
                const int fd = served[events[j].data.u32];
                const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
                if (got > 0) ::send(fd, reply, static_cast<std::size_t>(kReply * (got / kRequest)), MSG_NOSIGNAL);
            }
        }
        server_cpu = thread_cpu_s() - c0;
        ::close(ep);
    });
    const int ep = watch_all(clients);
    char request[kRequest], buf[4096];
    std::memset(request, 'q', sizeof request);
    for (int i = 0; i < n; ++i) ::send(clients[i], request, kRequest, MSG_NOSIGNAL);
    epoll_event events[128];
    long ops = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_s();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
        const int k = ::epoll_wait(ep, events, 128, 100);
        for (int j = 0; j < k; ++j) {
            const int fd = clients[events[j].data.u32];
            const ssize_t got = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (got > 0) {
                ops += got / kReply;
                ::send(fd, request, kRequest, MSG_NOSIGNAL);
            }
        }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double client_cpu = thread_cpu_s() - c0;
    stop = true;
    server.join();
    std::printf("{\"connections\": %d, \"ops_per_s\": %.0f, \"client_cpu_us_per_op\": %.2f, \"server_cpu_us_per_op\": %.2f}\n",
                n, static_cast<double>(ops) / secs, ops ? client_cpu * 1e6 / static_cast<double>(ops) : 0.0,
                ops ? server_cpu * 1e6 / static_cast<double>(ops) : 0.0);
    return 0;
}
