// Plain same-host baselines (no library code): a spinning shared-memory ping-pong, a blocking
// Unix-socket ping-pong, and process_vm_readv of 64 MiB into a pre-faulted buffer. Each runs
// between this process and a forked child, each pinned to the cpu given (-1: not pinned).
// rpc_bench reports them as baseline.shm_spin_p50_us and baseline.cma_gbps_64mib.
#pragma once

#include "bench_util.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace bench::same_host {

/// One direction of the plain ring: 64 slots of 8 bytes, positions on their own cache lines.
struct PlainRing {
    alignas(64) std::atomic<std::uint64_t> tail{0};
    alignas(64) std::atomic<std::uint64_t> head{0};
    alignas(64) std::uint64_t slot[64];
};

inline void relax(bool yield_too, unsigned& i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    // Sharing a core, the peer runs only if we give the core up.
    if (yield_too && (++i & 63) == 0) ::sched_yield();
}

inline void ring_send(PlainRing& r, std::uint64_t v, bool yield_too) {
    const auto t = r.tail.load(std::memory_order_relaxed);
    unsigned i = 0;
    while (t - r.head.load(std::memory_order_acquire) >= 64) relax(yield_too, i);
    r.slot[t & 63] = v;
    r.tail.store(t + 1, std::memory_order_release);
}

inline std::uint64_t ring_recv(PlainRing& r, bool yield_too) {
    const auto h = r.head.load(std::memory_order_relaxed);
    unsigned i = 0;
    while (r.tail.load(std::memory_order_acquire) == h) relax(yield_too, i);
    const auto v = r.slot[h & 63];
    r.head.store(h + 1, std::memory_order_release);
    return v;
}

/// p50 round trip (us) of an 8-byte ping-pong over two plain rings in a shared mapping, both
/// sides spinning (yielding now and then when they share one cpu).
inline double shm_spin_p50_us(int cpu_parent, int cpu_child, int iters = 200000) {
    const bool same = cpu_parent >= 0 && cpu_parent == cpu_child;
    void* m = ::mmap(nullptr, 2 * sizeof(PlainRing), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    auto* ping = new (m) PlainRing();
    auto* pong = new (static_cast<char*>(m) + sizeof(PlainRing)) PlainRing();
    const pid_t pid = ::fork();
    if (pid == 0) {
        pin_to(cpu_child);
        for (int i = 0; i < iters + 1000; ++i) ring_send(*pong, ring_recv(*ping, same) + 1, same);
        ::_exit(0);
    }
    pin_to(cpu_parent);
    std::vector<double> rtt;
    rtt.reserve(static_cast<std::size_t>(iters));
    for (int i = 0; i < iters + 1000; ++i) {
        const double t0 = now_us();
        ring_send(*ping, static_cast<std::uint64_t>(i), same);
        if (ring_recv(*pong, same) != static_cast<std::uint64_t>(i) + 1) std::abort();
        if (i >= 1000) rtt.push_back(now_us() - t0);  // after a warm-up
    }
    ::waitpid(pid, nullptr, 0);
    ::munmap(m, 2 * sizeof(PlainRing));
    return percentile(rtt, 50);
}

/// p50 round trip (us) of an 8-byte ping-pong over a blocking Unix stream socket pair.
inline double uds_p50_us(int cpu_parent, int cpu_child, int iters = 50000) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::close(sv[0]);
        pin_to(cpu_child);
        std::uint64_t v;
        while (::read(sv[1], &v, sizeof v) == sizeof v) {
            ++v;
            if (::write(sv[1], &v, sizeof v) != sizeof v) break;
        }
        ::_exit(0);
    }
    ::close(sv[1]);
    pin_to(cpu_parent);
    std::vector<double> rtt;
    for (int i = 0; i < iters + 1000; ++i) {
        std::uint64_t v = static_cast<std::uint64_t>(i);
        const double t0 = now_us();
        if (::write(sv[0], &v, sizeof v) != sizeof v || ::read(sv[0], &v, sizeof v) != sizeof v) std::abort();
        if (i >= 1000) rtt.push_back(now_us() - t0);
    }
    ::close(sv[0]);
    ::waitpid(pid, nullptr, 0);
    return percentile(rtt, 50);
}

/// A child holding `bytes` of filled memory at a known address until killed.
struct MemoryChild {
    pid_t pid = -1;
    std::uint8_t* addr = nullptr;
    MemoryChild(std::size_t bytes, int cpu) {
        // Mapped before the fork: the child's copy is at the same address.
        addr = static_cast<std::uint8_t*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        int up[2];
        if (addr == MAP_FAILED || ::pipe(up) != 0) std::abort();
        pid = ::fork();
        if (pid == 0) {
            pin_to(cpu);
            std::memset(addr, 0x5a, bytes);  // the child's own pages, not shared with the parent
            char c = 1;
            if (::write(up[1], &c, 1) != 1) ::_exit(2);
            for (;;) ::pause();
        }
        char c;
        if (::read(up[0], &c, 1) != 1) std::abort();
        ::close(up[0]);
        ::close(up[1]);
        ::munmap(addr, bytes);
    }
    ~MemoryChild() {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
};

/// Median GB/s of `read(dst, remote, n)` over `reps` reads of 64 MiB from a child, into a
/// pre-faulted buffer. `read` returns false on failure (then -1).
template <class Read>
double gbps_64mib(int cpu_parent, int cpu_child, Read&& read, int reps = 10) {
    constexpr std::size_t n = std::size_t(64) << 20;
    MemoryChild child(n, cpu_child);
    pin_to(cpu_parent);
    std::vector<std::uint8_t> dst(n, 1);  // pre-faulted
    std::vector<double> rates;
    for (int i = 0; i < reps + 1; ++i) {
        const double t0 = now_us();
        if (!read(child.pid, child.addr, n, dst.data())) return -1;
        if (i > 0) rates.push_back(static_cast<double>(n) / ((now_us() - t0) * 1e3));  // bytes/ns = GB/s
    }
    if (dst[n - 1] != 0x5a) return -1;
    return percentile(rates, 50);
}

/// The plain figure: one process_vm_readv per 64 MiB.
inline double cma_gbps_64mib(int cpu_parent, int cpu_child) {
    return gbps_64mib(cpu_parent, cpu_child, [](pid_t pid, void* remote, std::size_t n, void* dst) {
        iovec l{dst, n}, r{remote, n};
        return ::process_vm_readv(pid, &l, 1, &r, 1, 0) == static_cast<ssize_t>(n);
    });
}

}  // namespace bench::same_host
