// rpc_bench: latency, calls/s and tensor bandwidth of the native agent between two local worker
// processes, beside the same measures over plain sockets; prints one JSON object.
//
// Usage: rpc_bench [--transport uv|uds|shm] [--channel basic|cma] [--pin same|cross|none] [--iters N] [--calls N]
//                  [--blocks N] [--quick] [--idle S]
//        rpc_bench --device cuda [--quick]   (GPU tensors over cuda_ipc and cuda_basic: rpc_cuda.hpp)
//   --channel: what both workers are restricted to (`_channels`); baseline.cma_gbps_64mib is a plain
//   process_vm_readv of 64 MiB into a pre-faulted buffer between two processes, from the same run.
//   --transport: what both workers are restricted to (`_transports`); the baseline's plain sockets
//   are TCP loopback for uv and Unix stream sockets (abstract namespace) for uds and shm; for shm
//   baseline.shm_spin_p50_us is a plain spinning shared-memory ping-pong (same_host_baselines.hpp).
// idle_cpu_pct_10s: the caller's process CPU time over 10 s (2 s with --quick; --idle S after
// --quick sets it, 0 skips it) of idling with its connection established, as a percentage of one core.
//   same (default): both workers on CPU 0; cross: caller CPU 0, callee CPU 1; none: unpinned.
// gbps_* count the bytes of both directions of an echo (request + reply) over its round trip.
// Latency alternates --blocks N (default 20) pairs of RPC and plain blocks of round trips in one
// caller process: this host's speed drifts within seconds, and interleaving makes both figures
// sample the same states (0: RPC only, no plain figures). ratio.p50_us is the median, over the
// pairs, of the RPC block's median over the plain block's; ratio.p50_us_pooled divides the pooled
// medians. Calls per second interleave the same way (5 pairs per depth; their ratios are the
// medians of the pairs' ratios). The plain GB/s come from a separate pair of plain processes, run
// first (their buffers would count in the caller's peak RSS).
#include "bench_util.hpp"
#include "plain_sockets.hpp"
#include "rpc_cuda.hpp"
#include "rpc_half.hpp"
#include "same_host_baselines.hpp"

#include <cstdio>
#include <cstring>
#include <string>

namespace {

struct Config {
    std::string pin = "same";
    std::string transport = "uv";
    std::string channel = "basic";
    int iters = 20000;
    long calls = 100000;
    int reps_1mib = 100;
    int reps_64mib = 6;
    int latency_blocks = 20;
    int idle_s = 10;
    std::string device = "cpu";
    bool quick = false;
};

int caller_cpu(const Config& c) { return c.pin == "none" ? -1 : 0; }
int callee_cpu(const Config& c) { return c.pin == "none" ? -1 : (c.pin == "cross" ? 1 : 0); }

const char* keys[] = {"p50_us", "p99_us", "calls_per_s_1", "calls_per_s_16", "calls_per_s_128",
                      "gbps_1mib", "gbps_64mib", "peak_rss_mib"};

std::map<std::string, double> run_baseline(const Config& cfg) {
    std::uint16_t port = 0;
    int lfd = bench::plain::listen_loopback(port);
    bench::ResultPipe out;
    pid_t callee = bench::spawn([&] {
        bench::pin_to(callee_cpu(cfg));
        int rc = bench::plain::serve(lfd);
        out.put("rss_callee", bench::peak_rss_mib());
        return rc;
    });
    pid_t caller = bench::spawn([&] {
        ::close(lfd);
        bench::pin_to(caller_cpu(cfg));
        out.put("gbps_1mib", bench::plain::echo_gbps(port, std::size_t{1} << 20, cfg.reps_1mib));
        out.put("gbps_64mib", bench::plain::echo_gbps(port, std::size_t{64} << 20, cfg.reps_64mib));
        bench::plain::quit(port);
        out.put("rss_caller", bench::peak_rss_mib());
        return 0;
    });
    ::close(lfd);
    const bool ok = bench::reap(caller) & bench::reap(callee);
    auto r = out.collect();
    r["peak_rss_mib"] = std::max(r["rss_caller"], r["rss_callee"]);
    if (!ok) r["failed"] = 1;
    return r;
}

void print_object(const std::map<std::string, double>& r, const char* indent) {
    bool first = true;
    for (const char* k : keys) {
        auto it = r.find(k);
        std::printf("%s\n%s\"%s\": %.6g", first ? "" : ",", indent, k, it == r.end() ? -1.0 : it->second);
        first = false;
    }
}

}  // namespace

int main(int argc, char** argv) {
    Config cfg;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "rpc_bench: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--pin") cfg.pin = next();
        else if (a == "--transport") cfg.transport = next();
        else if (a == "--channel") cfg.channel = next();
        else if (a == "--iters") cfg.iters = std::stoi(next());
        else if (a == "--calls") cfg.calls = std::stol(next());
        else if (a == "--blocks") cfg.latency_blocks = std::stoi(next());
        else if (a == "--idle") cfg.idle_s = std::stoi(next());
        else if (a == "--device") cfg.device = next();
        else if (a == "--quick") {
            cfg.quick = true;
            cfg.iters = 2000;
            cfg.calls = 10000;
            cfg.reps_1mib = 10;
            cfg.reps_64mib = 2;
            cfg.idle_s = 2;
        } else {
            std::fprintf(stderr, "usage: rpc_bench [--transport uv|uds|shm] [--channel basic|cma] [--pin same|cross|none] "
                                 "[--iters N] [--calls N] [--blocks N] [--quick] [--idle S] [--device cpu|cuda]\n");
            return 2;
        }
    }
    if (cfg.device == "cuda") return bench::cuda_rpc::run(cfg.quick);
    if (cfg.device != "cpu") {
        std::fprintf(stderr, "rpc_bench: --device must be cpu or cuda\n");
        return 2;
    }
    if (cfg.pin != "same" && cfg.pin != "cross" && cfg.pin != "none") {
        std::fprintf(stderr, "rpc_bench: --pin must be same, cross or none\n");
        return 2;
    }

    if (cfg.transport != "uv" && cfg.transport != "uds" && cfg.transport != "shm") {
        std::fprintf(stderr, "rpc_bench: --transport must be uv, uds or shm\n");
        return 2;
    }
    if (cfg.channel != "basic" && cfg.channel != "cma") {
        std::fprintf(stderr, "rpc_bench: --channel must be basic or cma\n");
        return 2;
    }
    bench::plain::use_unix() = cfg.transport != "uv";
    bench::rpc_detail::transport_choice() = cfg.transport;
    bench::rpc_detail::channel_choice() = cfg.channel;

    auto base = run_baseline(cfg);
    // (-1: not measured; for shm, a plain spinning ring between two processes pinned as ours)
    const double shm_spin_p50 = cfg.transport == "shm" ? bench::same_host::shm_spin_p50_us(caller_cpu(cfg), callee_cpu(cfg)) : -1.0;
    const double cma_gbps = bench::same_host::cma_gbps_64mib(caller_cpu(cfg), callee_cpu(cfg));
    bench::RpcConfig rc{cfg.iters, cfg.calls, cfg.reps_1mib, cfg.reps_64mib, caller_cpu(cfg), callee_cpu(cfg), cfg.latency_blocks,
                        cfg.idle_s};
    auto ours = bench::run_rpc(rc);
    // Latency's and calls per second's plain figures come from the RPC run, whose caller
    // interleaves them with its own.
    for (const char* k : {"p50_us", "p99_us", "calls_per_s_1", "calls_per_s_16", "calls_per_s_128"})
        if (auto it = ours.find(std::string("plain_") + k); it != ours.end()) base[k] = it->second;

    std::printf("{");
    print_object(ours, "  ");
    std::printf(",\n  \"idle_cpu_pct_10s\": %.6g", ours.count("idle_cpu_pct_10s") ? ours["idle_cpu_pct_10s"] : -1.0);
    std::printf(",\n  \"baseline\": {");
    print_object(base, "    ");
    std::printf(",\n    \"shm_spin_p50_us\": %.6g", shm_spin_p50);
    std::printf(",\n    \"cma_gbps_64mib\": %.6g", cma_gbps);
    std::printf("\n  },\n  \"ratio\": {");
    bool first = true;
    for (const char* k : keys) {
        const double o = ours.count(k) ? ours[k] : -1, b = base.count(k) ? base[k] : -1;
        double ratio = (o > 0 && b > 0) ? o / b : -1.0;
        if (auto it = ours.find(std::string(k) + "_paired_ratio"); it != ours.end()) ratio = it->second;
        std::printf("%s\n    \"%s\": %.3f", first ? "" : ",", k, ratio);
        first = false;
    }
    // The pooled medians' ratio, beside the paired one above.
    if (ours.count("p50_us") && base.count("p50_us") && base["p50_us"] > 0)
        std::printf(",\n    \"p50_us_pooled\": %.3f", ours["p50_us"] / base["p50_us"]);
    if (ours.count("p50_us") && shm_spin_p50 > 0) std::printf(",\n    \"p50_us_over_shm_spin\": %.3f", ours["p50_us"] / shm_spin_p50);
    // The 64 MiB echo against one plain process_vm_readv (each direction of the echo is one read).
    if (ours.count("gbps_64mib") && cma_gbps > 0) std::printf(",\n    \"gbps_64mib_vs_cma\": %.3f", ours["gbps_64mib"] / cma_gbps);
    std::printf("\n  },\n  \"transport\": \"%s\",\n  \"channel\": \"%s\",\n  \"baseline_socket\": \"%s\",\n  \"pin\": \"%s\",\n  \"ok\": %s\n}\n",
                cfg.transport.c_str(), cfg.channel.c_str(), bench::plain::use_unix() ? "unix" : "tcp", cfg.pin.c_str(),
                (ours.count("failed") || base.count("failed")) ? "false" : "true");
    return (ours.count("failed") || base.count("failed")) ? 1 : 0;
}
