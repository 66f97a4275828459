// soak: many small calls between two agents in two processes, sampling both processes' RSS and
// open fds each second, printing one JSON object: the samples, their growth after warm-up (the
// first 10% of samples left out) in percent, and calls per second.
//
// usage: soak [--calls N (1000000)] [--depth D (16)] [--interval-ms MS (1000)]
#include "rpc_half.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>

#include <fstream>
#include <sstream>

namespace {

using namespace tensorplay;

struct Config {
    long calls = 1000000;
    int depth = 16;
    int interval_ms = 1000;
};

struct Sample {
    double t;  // seconds since the calls started
    long rss_kib[2];
    long fds[2];
};

long vm_rss_kib(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
    return -1;
}

long open_fds(pid_t pid) {
    DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
    if (!d) return -1;
    long n = 0;
    while (auto* e = ::readdir(d))
        if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    return n;
}

// The caller: `phase` gets 'S' when its calls start and 'E' when they have all returned.
Task<int> caller_main(int port_pipe, int phase, const Config& cfg, const bench::ResultPipe& out) {
    std::uint16_t port = 0;
    if (::read(port_pipe, &port, sizeof port) != sizeof port) co_return 1;
    std::shared_ptr<Store> store;
    auto started = co_await bench::rpc_detail::start("caller", 0, port, store);
    if (!started) {
        std::fprintf(stderr, "soak caller: %s\n", started.error().to_string().c_str());
        co_return 1;
    }
    auto agent = *started;
    std::vector<std::string> ready_key{"bench/ready"};  // (not braced inside co_await: GCC 12)
    if (auto w = co_await store->wait(ready_key, std::chrono::seconds(60)); !w) co_return 1;
    bool ok = true;
    if (::write(phase, "S", 1) != 1) co_return 1;
    const double t0 = bench::now_us();
    // In steps, so that a failure shows early and each step's rate can be compared.
    const long step = std::max<long>(cfg.calls / 20, 1);
    double slowest = 1e18, fastest = 0;
    for (long done = 0; done < cfg.calls && ok; done += step) {
        const long n = std::min(step, cfg.calls - done);
        const double rate = co_await bench::rpc_detail::calls_per_s(*agent, cfg.depth, n, ok);
        slowest = std::min(slowest, rate);
        fastest = std::max(fastest, rate);
    }
    const double seconds = (bench::now_us() - t0) / 1e6;
    if (::write(phase, "E", 1) != 1) co_return 1;
    out.put("calls_per_s", static_cast<double>(cfg.calls) / seconds);
    out.put("step_calls_per_s_min", slowest);
    out.put("step_calls_per_s_max", fastest);
    out.put("seconds", seconds);
    auto down = co_await agent->shutdown(true, 60);
    if (!down) std::fprintf(stderr, "soak caller: shutdown: %s\n", down.error().to_string().c_str());
    set_default_agent(nullptr, {});
    co_return (ok && down) ? 0 : 1;
}

// The first 10% of the samples, rounded up: warm-up, left out of the growth.
std::size_t warmup_samples(std::size_t n) { return (n + 9) / 10; }

// Growth in percent from the first sample after warm-up to the last, and to the largest.
struct Growth {
    double last = 0, peak = 0;
};

Growth growth(const std::vector<Sample>& s, long (Sample::*field)[2], int who) {
    Growth g;
    if (s.size() < 2) return g;  // (then warm-up leaves at least one sample)
    const std::size_t from = warmup_samples(s.size());
    const double base = static_cast<double>((s[from].*field)[who]);
    double peak = base;
    for (std::size_t i = from; i < s.size(); ++i) peak = std::max(peak, static_cast<double>((s[i].*field)[who]));
    if (base <= 0) return g;
    g.last = (static_cast<double>((s.back().*field)[who]) - base) / base * 100.0;
    g.peak = (peak - base) / base * 100.0;
    return g;
}

}  // namespace

int main(int argc, char** argv) {
    Config cfg;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "soak: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--calls") cfg.calls = std::stol(next());
        else if (a == "--depth") cfg.depth = std::stoi(next());
        else if (a == "--interval-ms") cfg.interval_ms = std::stoi(next());
        else {
            std::fprintf(stderr, "usage: soak [--calls N] [--depth D] [--interval-ms MS]\n");
            return 2;
        }
    }
    if (cfg.calls <= 0 || cfg.depth <= 0 || cfg.interval_ms <= 0) {
        std::fprintf(stderr, "soak: --calls, --depth and --interval-ms must be positive\n");
        return 2;
    }

    int ports[2], gone[2], phase[2];
    if (::pipe(ports) != 0 || ::pipe(gone) != 0 || ::pipe(phase) != 0) return 2;
    bench::ResultPipe out;
    pid_t callee = bench::spawn([&] {
        ::close(ports[0]);
        ::close(gone[1]);
        ::close(phase[0]);
        ::close(phase[1]);
        return bench::rpc_detail::run_child(-1, [&] { return bench::rpc_detail::callee_main(ports[1], gone[0], out); });
    });
    pid_t caller = bench::spawn([&] {
        ::close(ports[1]);
        ::close(gone[0]);  // gone[1] stays open until this process exits
        ::close(phase[0]);
        return bench::rpc_detail::run_child(-1, [&] { return caller_main(ports[0], phase[1], cfg, out); });
    });
    ::close(ports[0]);
    ::close(ports[1]);
    ::close(gone[0]);
    ::close(gone[1]);
    ::close(phase[1]);

    // Sample while the calls run: from the caller's 'S' to its 'E' (or its exit).
    std::vector<Sample> samples;
    bool calling = false;
    double t0 = 0;
    for (;;) {
        pollfd p{phase[0], POLLIN, 0};
        const int wait_ms = calling ? cfg.interval_ms : 100;
        if (::poll(&p, 1, wait_ms) > 0) {
            char c = 0;
            if (::read(phase[0], &c, 1) != 1) break;  // the caller exited
            if (c == 'S') {
                calling = true;
                t0 = bench::now_us();
            } else {
                break;  // the calls are done: what follows (the shutdown) is not sampled
            }
        }
        if (!calling) continue;
        Sample s{(bench::now_us() - t0) / 1e6, {vm_rss_kib(caller), vm_rss_kib(callee)}, {open_fds(caller), open_fds(callee)}};
        samples.push_back(s);
    }
    ::close(phase[0]);
    const bool ok = bench::reap(caller) & bench::reap(callee);
    auto r = out.collect();

    std::printf("{\n  \"calls\": %ld,\n  \"depth\": %d,\n  \"calls_per_s\": %.0f,\n  \"seconds\": %.1f,\n", cfg.calls,
                cfg.depth, r["calls_per_s"], r["seconds"]);
    std::printf("  \"step_calls_per_s_min\": %.0f,\n  \"step_calls_per_s_max\": %.0f,\n", r["step_calls_per_s_min"],
                r["step_calls_per_s_max"]);
    const char* who[2] = {"caller", "callee"};
    std::printf("  \"growth_after_warmup_percent\": {");
    for (int w = 0; w < 2; ++w) {
        auto rss = growth(samples, &Sample::rss_kib, w);
        auto fds = growth(samples, &Sample::fds, w);
        std::printf("%s\n    \"%s\": {\"rss\": %.3f, \"rss_peak\": %.3f, \"fds\": %.3f, \"fds_peak\": %.3f}", w ? "," : "",
                    who[w], rss.last, rss.peak, fds.last, fds.peak);
    }
    std::printf("\n  },\n  \"warmup_samples\": %zu,\n  \"samples\": [", warmup_samples(samples.size()));
    for (std::size_t i = 0; i < samples.size(); ++i) {
        const auto& s = samples[i];
        std::printf("%s\n    {\"t\": %.2f, \"rss_kib\": [%ld, %ld], \"fds\": [%ld, %ld]}", i ? "," : "", s.t, s.rss_kib[0],
                    s.rss_kib[1], s.fds[0], s.fds[1]);
    }
    std::printf("\n  ],\n  \"ok\": %s\n}\n", ok ? "true" : "false");
    return ok ? 0 : 1;
}
