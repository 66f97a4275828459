// Same-host mechanisms against their plain baselines: an 8-byte ping-pong through ShmConnection
// vs a plain spinning shared-memory ring (and a plain Unix socket), and a 64 MiB cma::read vs one
// plain process_vm_readv. Prints one JSON object. Usage: same_host_bench [--pin cross|same] [--iters N]
#include "same_host_baselines.hpp"

#include "transport/channels/cma/cma.hpp"
#include "transport/shm/shm_connection.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <cstring>
#include <string>

using namespace tensorplay;
using detail::shm::ShmConnection;

namespace {

Task<bool> send8(ShmConnection& c, std::uint64_t v) {
    iovec io{&v, sizeof v};
    for (;;) {
        auto n = c.write_some(std::span<const iovec>(&io, 1));
        if (!n) co_return false;
        if (*n == sizeof v) co_return true;
        if (*n != 0) co_return false;  // an 8-byte write is taken whole or not at all here
        auto w = co_await c.wait_writable();
        if (!w) co_return false;
    }
}

Task<bool> recv8(ShmConnection& c, std::uint64_t& v) {
    auto* p = reinterpret_cast<std::uint8_t*>(&v);
    std::size_t got = 0;
    while (got < sizeof v) {
        auto n = c.read_some(std::span<std::uint8_t>(p + got, sizeof v - got));
        if (!n) co_return false;
        got += *n;
        if (got == sizeof v) break;
        auto w = co_await c.wait_readable();
        if (!w) co_return false;
    }
    co_return true;
}

struct ShmFigures {
    double p50_us = -1;
    double sleeps_per_round_trip = 0;
};

/// p50 round trip of an 8-byte ping-pong through two ShmConnections in two processes.
ShmFigures shm_p50_us(int cpu_parent, int cpu_child, int iters) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return {};
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::close(sv[0]);
        bench::pin_to(cpu_child);
        asio::io_context ctx(1);
        asio::local::stream_protocol::socket s(ctx, asio::local::stream_protocol(), sv[1]);
        asio::co_spawn(
            ctx,
            [&]() -> Task<void> {
                auto c = co_await ShmConnection::establish(std::move(s));
                if (!c) ::_exit(3);
                std::uint64_t v = 0;
                for (;;) {
                    auto got = co_await recv8(**c, v);
                    if (!got) break;
                    auto sent = co_await send8(**c, v + 1);
                    if (!sent) break;
                }
            },
            asio::detached);
        ctx.run();
        ::_exit(0);
    }
    ::close(sv[1]);
    bench::pin_to(cpu_parent);
    ShmFigures out;
    {
        asio::io_context ctx(1);
        asio::local::stream_protocol::socket s(ctx, asio::local::stream_protocol(), sv[0]);
        asio::co_spawn(
            ctx,
            [&]() -> Task<void> {
                auto c = co_await ShmConnection::establish(std::move(s));
                if (!c) co_return;
                std::vector<double> rtt;
                rtt.reserve(static_cast<std::size_t>(iters));
                for (int i = 0; i < iters + 1000; ++i) {
                    const double t0 = bench::now_us();
                    std::uint64_t v = static_cast<std::uint64_t>(i);
                    auto sent = co_await send8(**c, v);
                    if (!sent) co_return;
                    auto got = co_await recv8(**c, v);
                    if (!got || v != static_cast<std::uint64_t>(i) + 1) co_return;
                    if (i >= 1000) rtt.push_back(bench::now_us() - t0);
                }
                out.p50_us = bench::percentile(rtt, 50);
                out.sleeps_per_round_trip = static_cast<double>((*c)->stats().sleeps) / (iters + 1000);
            },
            asio::detached);
        ctx.run();
    }
    ::waitpid(pid, nullptr, 0);
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::string pin = "cross";
    int iters = 100000;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--pin" && i + 1 < argc) pin = argv[++i];
        else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "usage: %s [--pin cross|same] [--iters N]\n", argv[0]);
            return 2;
        }
    }
    if (pin != "cross" && pin != "same") {
        std::fprintf(stderr, "--pin takes cross or same\n");
        return 2;
    }
    const int cpu_parent = 0;
    const int cpu_child = pin == "cross" ? 1 : 0;

    const double plain_shm = bench::same_host::shm_spin_p50_us(cpu_parent, cpu_child, iters);
    const double plain_uds = bench::same_host::uds_p50_us(cpu_parent, cpu_child, iters / 2);
    const double plain_cma = bench::same_host::cma_gbps_64mib(cpu_parent, cpu_child);
    const auto ours_shm = shm_p50_us(cpu_parent, cpu_child, iters);
    const double ours_cma = bench::same_host::gbps_64mib(cpu_parent, cpu_child, [](pid_t pid, void* remote, std::size_t n, void* dst) {
        return static_cast<bool>(detail::cma::read(pid, reinterpret_cast<std::uint64_t>(remote), n, dst));
    });

    std::printf("{\"pin\": \"%s\", \"iters\": %d, \"spin_us\": %lld, "
                "\"baseline\": {\"shm_spin_p50_us\": %.3f, \"uds_p50_us\": %.3f, \"cma_gbps_64mib\": %.3f}, "
                "\"shm_p50_us\": %.3f, \"shm_sleeps_per_round_trip\": %.4f, \"cma_gbps_64mib\": %.3f, "
                "\"shm_vs_plain_shm\": %.3f, \"shm_vs_plain_uds\": %.3f, \"cma_vs_plain\": %.3f}\n",
                pin.c_str(), iters, static_cast<long long>(detail::shm::spin_from_env().count()), plain_shm, plain_uds,
                plain_cma, ours_shm.p50_us, ours_shm.sleeps_per_round_trip, ours_cma, ours_shm.p50_us / plain_shm,
                ours_shm.p50_us / plain_uds, ours_cma / plain_cma);
    return 0;
}
