// rpc_bench's measured half: the native agent (TENSORPIPE backend) between two worker processes.
#pragma once

#include "bench_util.hpp"
#include "plain_sockets.hpp"

#include <tensorplay/rpc.hpp>

#include "core/asio_compat.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>

#include <time.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

namespace bench {

struct RpcConfig {
    int iters;
    long calls;
    int reps_1mib;
    int reps_64mib;
    int caller_cpu;
    int callee_cpu;
    int latency_blocks;  ///< latency alternates this many pairs of plain and RPC blocks (0: RPC only, no plain figures)
    int idle_s;          ///< the caller then idles this long with its connection open (idle_cpu_pct_10s)
};

namespace rpc_detail {

using namespace tensorplay;

/// The transport both workers are restricted to (rpc_bench --transport), set before they fork.
inline std::string& transport_choice() {
    static std::string t = "uv";
    return t;
}

/// The channel both workers are restricted to (rpc_bench --channel), set before they fork.
inline std::string& channel_choice() {
    static std::string c = "basic";
    return c;
}

inline std::shared_ptr<TensorPipeRpcBackendOptions> options() {
    auto o = std::make_shared<TensorPipeRpcBackendOptions>();
    o->listen_address = "127.0.0.1";
    o->transports = std::vector<std::string>{transport_choice()};
    o->channels = std::vector<std::string>{channel_choice()};
    o->num_worker_threads = 1;
    o->rpc_timeout = 120;
    return o;
}

/// Connects to the store (rank 1 hosts it) and starts this worker's agent.
inline Task<Result<std::shared_ptr<RpcAgent>>> start(std::string name, int rank, std::uint16_t port,
                                                     std::shared_ptr<Store>& store_out) {
    auto ex = co_await asio::this_coro::executor;
    TcpStoreOptions so;
    so.host = "127.0.0.1";
    so.port = port;
    so.timeout = std::chrono::seconds(60);
    auto store = co_await TcpStore::connect(ex, so);
    if (!store) co_return fail(std::move(store).error());
    store_out = *store;
    co_return co_await init_rpc_with_store(*store, std::move(name), BackendType::tensorpipe(), rank, 2, options());
}

inline void progress(const char* what) {
    if (std::getenv("RPC_BENCH_VERBOSE")) std::fprintf(stderr, "rpc_bench: %.3f s %s\n", now_us() / 1e6, what);
}

inline Task<int> callee_main(int port_pipe, int caller_gone, const ResultPipe& out) {
    auto ex = co_await asio::this_coro::executor;
    TcpStoreServerOptions sopt;
    sopt.host = "127.0.0.1";
    auto server = TcpStoreServer::start(ex, sopt);
    if (!server) {
        std::fprintf(stderr, "rpc_bench callee: %s\n", server.error().to_string().c_str());
        co_return 1;
    }
    const std::uint16_t port = (*server)->port();
    if (::write(port_pipe, &port, sizeof port) != sizeof port) co_return 1;
    std::shared_ptr<Store> store;
    auto reg = register_startup_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; });
    if (!reg) co_return 1;
    auto agent = co_await start("callee", 1, port, store);
    if (!agent) {
        std::fprintf(stderr, "rpc_bench callee: %s\n", agent.error().to_string().c_str());
        co_return 1;
    }
    Bytes one{1};
    if (auto s = co_await store->set("bench/ready", one); !s) co_return 1;
    progress("callee: serving until shutdown");
    auto down = co_await (*agent)->shutdown(true, 300);
    progress("callee: shut down; waiting for the caller to exit");
    if (!down) std::fprintf(stderr, "rpc_bench callee: shutdown: %s\n", down.error().to_string().c_str());
    set_default_agent(nullptr, {});
    // This process hosts the store: it stays until the caller, whose shutdown still reads the
    // store, has exited (EOF on a pipe whose only writer was the caller).
    asio::posix::stream_descriptor gone(ex, caller_gone);
    char byte;
    auto [ec, n] = co_await gone.async_read_some(asio::buffer(&byte, 1), tensorplay::detail::use_nothrow);
    (void)ec;
    (void)n;
    progress("callee: caller gone");
    out.put("rss_callee", peak_rss_mib());
    (*server)->stop();
    co_return down ? 0 : 1;
}

inline Task<bool> echo_small(RpcAgent& agent, const Bytes& payload) {
    Message m;
    m.payload = payload;
    auto r = co_await agent.rpc_async("callee", "echo", std::move(m));
    if (!r) std::fprintf(stderr, "rpc_bench: echo: %s\n", r.error().to_string().c_str());
    co_return r && r->payload.size() == payload.size();
}

inline Task<void> depth_worker(RpcAgent& agent, const Bytes& payload, long& issued, long total, bool& ok) {
    while (issued < total) {
        ++issued;
        const bool good = co_await echo_small(agent, payload);
        if (!good) ok = false;
    }
    co_return;
}

/// Calls per second with `depth` calls in flight.
inline Task<double> calls_per_s(RpcAgent& agent, int depth, long total, bool& ok) {
    auto ex = co_await asio::this_coro::executor;
    const Bytes payload(64, 'r');
    long issued = 0;
    int running = depth;
    asio::steady_timer all_done(ex, std::chrono::hours(1));
    const double t0 = now_us();
    for (int i = 0; i < depth; ++i)
        asio::co_spawn(ex, depth_worker(agent, payload, issued, total, ok), [&](std::exception_ptr e) {
            if (e) ok = false;
            if (--running == 0) all_done.cancel();
        });
    auto [ec] = co_await all_done.async_wait(tensorplay::detail::use_nothrow);
    (void)ec;
    co_return static_cast<double>(total) / ((now_us() - t0) / 1e6);
}

/// Tensor echo of `size` bytes: GB/s counting both directions (median over reps).
inline Task<double> echo_gbps(RpcAgent& agent, std::size_t size, int reps, bool& ok) {
    auto t = Tensor::cpu(DType::uint8, {static_cast<std::int64_t>(size)});
    for (std::size_t i = 0; i < size; ++i) t.data()[i] = static_cast<std::uint8_t>(i * 7);
    std::vector<double> gbps;
    for (int r = 0; r < reps + 1; ++r) {
        Message m;
        m.tensors.push_back(t);
        const double t0 = now_us();
        auto reply = co_await agent.rpc_async("callee", "echo", std::move(m));
        const double dt = now_us() - t0;
        if (!reply || reply->tensors.size() != 1 || reply->tensors[0].nbytes() != size) {
            if (!reply) std::fprintf(stderr, "rpc_bench: echo: %s\n", reply.error().to_string().c_str());
            ok = false;
            co_return 0;
        }
        if (r == 0 && std::memcmp(reply->tensors[0].data(), t.data(), size) != 0) ok = false;
        if (r > 0) gbps.push_back(2.0 * static_cast<double>(size) / dt / 1e3);
    }
    co_return percentile(gbps, 50);
}


/// Round-trip latency, RPC and plain sockets interleaved, so that both sample the same machine
/// states (this host's speed drifts within seconds, which made a plain run followed by an RPC run
/// compare two states): `cfg.latency_blocks` pairs of blocks, one of each, the first of a pair
/// alternating (plain, rpc, rpc, plain, ...). `plain_fd` is a connection in the plain ping-pong
/// phase (its callee is another process). `pair_ratios`: each pair's RPC median over its plain
/// median (the host can switch state between pairs; pooled medians then mix states unevenly).
/// With cfg.latency_blocks 0, RPC alone (rtt_instructions.sh counts the RPC's instructions).
inline Task<void> latency(RpcAgent& agent, int plain_fd, const RpcConfig& cfg, std::vector<double>& rpc,
                          std::vector<double>& plain, std::vector<double>& pair_ratios, bool& ok) {
    const Bytes payload(64, 'p');
    const bool with_plain = cfg.latency_blocks > 0;
    const int pairs = std::max(1, cfg.latency_blocks);
    const int per_block = std::max(1, cfg.iters / pairs);
    const int warmup = std::max(1, per_block / 10);  // not counted: a block's first calls find colder caches
    rpc.reserve(static_cast<std::size_t>(pairs * per_block));
    plain.reserve(static_cast<std::size_t>(pairs * per_block));
    for (int b = 0; b < pairs; ++b) {
        std::vector<double> p;
        if (with_plain && b % 2 == 0) p = plain::latency_on(plain_fd, per_block, warmup);
        std::vector<double> r;
        r.reserve(static_cast<std::size_t>(per_block));
        for (int i = 0; i < warmup + per_block; ++i) {
            // The call as a user writes it, awaited here (echo_small would add a coroutine per call).
            const double t0 = now_us();
            Message m;
            m.payload = payload;
            auto call = agent.rpc_async("callee", "echo", std::move(m));
            auto reply = co_await std::move(call);
            const double t1 = now_us();  // (the check below is the benchmark's, not the call's)
            if (i >= warmup) r.push_back(t1 - t0);
            if (!reply || reply->payload != payload) {
                if (!reply) std::fprintf(stderr, "rpc_bench: echo: %s\n", reply.error().to_string().c_str());
                ok = false;
            }
        }
        if (with_plain && b % 2 == 1) p = plain::latency_on(plain_fd, per_block, warmup);
        rpc.insert(rpc.end(), r.begin(), r.end());
        if (!with_plain) continue;
        pair_ratios.push_back(percentile(r, 50) / percentile(p, 50));
        plain.insert(plain.end(), p.begin(), p.end());
    }
}

/// Calls per second with `depth` in flight, RPC and plain (one send per message) interleaved as in
/// latency(): 5 pairs of blocks of `total / 5` calls, the first of a pair alternating. Puts `key`
/// (the RPC blocks' median), "plain_" + `key` and `key` + "_paired_ratio" (the median of the pairs'
/// ratios); RPC alone when cfg.latency_blocks is 0.
inline Task<void> paired_calls_per_s(RpcAgent& agent, std::uint16_t plain_port, int depth, long total, const RpcConfig& cfg,
                                     const char* key, const ResultPipe& out, bool& ok) {
    constexpr int pairs = 5;
    const bool with_plain = cfg.latency_blocks > 0;
    const long per_block = std::max<long>(total / pairs, depth);
    std::vector<double> rpc, plain, ratios;
    for (int b = 0; b < pairs; ++b) {
        double p = 0;
        if (with_plain && b % 2 == 0) p = plain::calls_per_s(plain_port, depth, per_block);
        const double r = co_await calls_per_s(agent, depth, per_block, ok);
        if (with_plain && b % 2 == 1) p = plain::calls_per_s(plain_port, depth, per_block);
        rpc.push_back(r);
        if (!with_plain) continue;
        plain.push_back(p);
        ratios.push_back(r / p);
    }
    progress(key);
    out.put(key, percentile(rpc, 50));
    if (!with_plain) co_return;
    out.put(std::string("plain_") + key, percentile(plain, 50));
    out.put(std::string(key) + "_paired_ratio", percentile(ratios, 50));
}

inline Task<int> caller_main(int port_pipe, std::uint16_t plain_port, const RpcConfig& cfg, const ResultPipe& out) {
    std::uint16_t port = 0;
    if (::read(port_pipe, &port, sizeof port) != sizeof port) co_return 1;
    std::shared_ptr<Store> store;
    auto started = co_await start("caller", 0, port, store);
    if (!started) {
        std::fprintf(stderr, "rpc_bench caller: %s\n", started.error().to_string().c_str());
        co_return 1;
    }
    auto agent = *started;
    std::vector<std::string> ready_key{"bench/ready"};  // (not braced inside co_await: GCC 12)
    if (auto w = co_await store->wait(ready_key, std::chrono::seconds(60)); !w) co_return 1;
    bool ok = true;
    // The transport measured must be the one asked for (what the handshake negotiated).
    if (auto info = co_await agent->get_debug_info(); !info || info->peers.empty() || info->peers[0].transport != transport_choice()) {
        std::fprintf(stderr, "rpc_bench caller: the connection did not negotiate transport %s\n", transport_choice().c_str());
        ok = false;
    }
    std::vector<double> rtt, plain_rtt, pair_ratios;
    const int plain_fd = plain::open_phase(plain_port, 'L');
    co_await latency(*agent, plain_fd, cfg, rtt, plain_rtt, pair_ratios, ok);
    ::close(plain_fd);
    progress("p50_us");
    out.put("p50_us", percentile(rtt, 50));
    out.put("p99_us", percentile(rtt, 99));
    if (!pair_ratios.empty()) {
        out.put("plain_p50_us", percentile(plain_rtt, 50));
        out.put("plain_p99_us", percentile(plain_rtt, 99));
        out.put("p50_us_paired_ratio", percentile(pair_ratios, 50));
    }
    // (keys as const char*, counts in locals: GCC 12 mishandles a std::string temporary that lives
    // across a co_await in the same full expression)
    const long c1_calls = std::max<long>(cfg.calls / 5, 1000);
    co_await paired_calls_per_s(*agent, plain_port, 1, c1_calls, cfg, "calls_per_s_1", out, ok);
    co_await paired_calls_per_s(*agent, plain_port, 16, cfg.calls, cfg, "calls_per_s_16", out, ok);
    co_await paired_calls_per_s(*agent, plain_port, 128, cfg.calls, cfg, "calls_per_s_128", out, ok);
    const double g1 = co_await echo_gbps(*agent, std::size_t{1} << 20, cfg.reps_1mib, ok);
    progress("gbps_1mib");
    out.put("gbps_1mib", g1);
    const double g64 = co_await echo_gbps(*agent, std::size_t{64} << 20, cfg.reps_64mib, ok);
    progress("gbps_64mib");
    out.put("gbps_64mib", g64);
    if (cfg.idle_s > 0) {
        // An idle agent with its connection established (shm: both readers asleep on doorbells).
        timespec c0{}, c1{};
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        const double t0 = now_us();
        auto ex = co_await asio::this_coro::executor;
        asio::steady_timer idle(ex, std::chrono::seconds(cfg.idle_s));
        co_await idle.async_wait(tensorplay::detail::use_nothrow);
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        const double cpu_us = (double(c1.tv_sec - c0.tv_sec) * 1e9 + double(c1.tv_nsec - c0.tv_nsec)) / 1e3;
        out.put("idle_cpu_pct_10s", 100.0 * cpu_us / (now_us() - t0));
        progress("idle_cpu_pct_10s");
    }
    progress("shutdown");
    auto down = co_await agent->shutdown(true, 300);
    if (!down) std::fprintf(stderr, "rpc_bench caller: shutdown: %s\n", down.error().to_string().c_str());
    set_default_agent(nullptr, {});
    progress("caller: shut down");
    out.put("rss_caller", peak_rss_mib());
    co_return (ok && down) ? 0 : 1;
}

inline int run_child(int cpu, std::function<Task<int>()> body) {
    pin_to(cpu);
    asio::io_context ctx(1);
    int rc = 1;
    asio::co_spawn(ctx, body(), [&](std::exception_ptr e, int r) {
        // Done: leftover background work (store reconnects, agent timers) must not keep us alive.
        ctx.stop();
        rc = r;
        if (e) {
            rc = 3;
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& ex) {
                std::fprintf(stderr, "rpc_bench: worker threw: %s\n", ex.what());
            } catch (...) {
                std::fprintf(stderr, "rpc_bench: worker threw\n");
            }
        }
    });
    ctx.run();
    return rc;
}

}  // namespace rpc_detail

/// Runs the caller and callee workers and returns the caller's figures plus the peak RSS.
inline std::map<std::string, double> run_rpc(const RpcConfig& cfg) {
    // The plain ping-pong's callee, for the interleaved latency blocks (see latency());
    // started first, so that it holds none of the pipes below (the callee waits for EOF on one).
    std::uint16_t plain_port = 0;
    const int lfd = plain::listen_loopback(plain_port);
    pid_t plain_callee = spawn([&] {
        pin_to(cfg.callee_cpu);
        return plain::serve(lfd);
    });
    int fds[2], gone[2];
    if (::pipe(fds) != 0 || ::pipe(gone) != 0) return {{"failed", 1}};
    ResultPipe out;
    pid_t callee = spawn([&] {
        ::close(fds[0]);
        ::close(gone[1]);
        ::close(lfd);
        return rpc_detail::run_child(cfg.callee_cpu, [&] { return rpc_detail::callee_main(fds[1], gone[0], out); });
    });
    pid_t caller = spawn([&] {
        ::close(fds[1]);
        ::close(gone[0]);  // gone[1] stays open until this process exits
        ::close(lfd);
        return rpc_detail::run_child(cfg.caller_cpu, [&] { return rpc_detail::caller_main(fds[0], plain_port, cfg, out); });
    });
    ::close(fds[0]);
    ::close(fds[1]);
    ::close(gone[0]);
    ::close(gone[1]);
    const bool rpc_ok = reap(caller) & reap(callee);
    plain::quit(plain_port);
    ::close(lfd);
    const bool ok = reap(plain_callee) & rpc_ok;
    auto r = out.collect();
    r["peak_rss_mib"] = std::max(r["rss_caller"], r["rss_callee"]);
    if (!ok) r["failed"] = 1;
    return r;
}

}  // namespace bench
