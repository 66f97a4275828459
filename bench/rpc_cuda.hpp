// rpc_bench --device cuda: echo of GPU tensors between two worker processes on one GPU over
// cuda_ipc (one copy, out of the sender's pool), cuda_ipc through its outbox only (two copies:
// TP_CUDA_IPC_ONE_COPY_MIN past any size, key outbox_) and cuda_basic, beside plain device-to-device copies and pinned device-to-host +
// host-to-device copies of the same sizes, measured in the same run (each in its own process: a
// process that initialised CUDA cannot use it in children it forks).
//
// Figures: gbps_<size> of an echo count both directions (2 x size over its round trip); the plain
// d2d_gbps_<size> is one cudaMemcpyAsync device to device of `size` over its time; pinned_gbps is
// `size` over the time of a device-to-host plus a host-to-device copy through pinned memory.
// ratio.ipc_<size> = the ipc echo's GB/s over d2d's (outbox_<size> the same through the outbox),
// ratio.basic_<size> = cuda_basic's over
// pinned's. p50_us_4kib: the median round trip of a 4 KiB tensor. Exits 77 without a device; with
// TP_CUDART naming the fake runtime (a test double) the figures only show that it runs.
#pragma once

#include "bench_util.hpp"

#include <tensorplay/rpc.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace bench::cuda_rpc {

using namespace tensorplay;

struct Sizes {
    std::vector<std::size_t> bytes{std::size_t{1} << 20, std::size_t{64} << 20, std::size_t{1} << 30};
    int reps = 10;        ///< echoes (and plain copies) per size
    int small_iters = 2000;
};

inline std::string label(std::size_t n) {
    if (n >= (std::size_t{1} << 30)) return std::to_string(n >> 30) + "gib";
    if (n >= (std::size_t{1} << 20)) return std::to_string(n >> 20) + "mib";
    return std::to_string(n >> 10) + "kib";
}

template <class F>
inline int run_loop(F body, std::chrono::seconds limit) {
    int code = 99;
    asio::io_context ctx(1);
    asio::co_spawn(ctx, body(), [&code](std::exception_ptr e, int c) { code = e ? 98 : c; });
    ctx.run_for(limit);
    return code;
}

/// Plain copies on one stream of cuda:0: device to device, and device to host to device through
/// pinned memory. Seconds of `reps` copies, over their count.
inline Task<int> plain_copies(Sizes sz, const ResultPipe& out) {
    auto b = backend_for(Device::cuda(0));
    if (!b) co_return 77;
    DeviceBackend& be = **b;
    auto s = be.acquire_stream(Device::cuda(0));
    if (!s) co_return 1;
    for (std::size_t n : sz.bytes) {
        auto x = be.allocate(Device::cuda(0), n), y = be.allocate(Device::cuda(0), n);
        auto h = be.allocate_host(n);
        if (!x || !y || !h) co_return 1;
        auto sync = [&]() -> Task<bool> { co_return (co_await be.synchronize(*s)).has_value(); };
        (void)be.copy_async(*s, (*y)->data(), (*x)->data(), n);  // (warm up)
        if (!co_await sync()) co_return 1;
        double t0 = now_us();
        for (int i = 0; i < sz.reps; ++i) (void)be.copy_async(*s, (*y)->data(), (*x)->data(), n);
        if (!co_await sync()) co_return 1;
        const double d2d = (now_us() - t0) / 1e6 / sz.reps;
        t0 = now_us();
        for (int i = 0; i < sz.reps; ++i) {
            (void)be.copy_async(*s, (*h)->data(), (*x)->data(), n);
            (void)be.copy_async(*s, (*y)->data(), (*h)->data(), n);
        }
        if (!co_await sync()) co_return 1;
        const double pinned = (now_us() - t0) / 1e6 / sz.reps;
        out.put("d2d_gbps_" + label(n), static_cast<double>(n) / d2d / 1e9);
        out.put("pinned_gbps_" + label(n), static_cast<double>(n) / pinned / 1e9);
    }
    co_return 0;
}

inline std::shared_ptr<TensorPipeRpcBackendOptions> options(const std::string& channel, bool map) {
    auto o = std::make_shared<TensorPipeRpcBackendOptions>();
    o->listen_address = "127.0.0.1";
    o->channels = std::vector<std::string>{"basic", channel};
    o->devices = {Device::cuda(0)};
    o->rpc_timeout = 120;
    if (map) o->device_maps["callee"] = DeviceMap{{Device::cuda(0), Device::cuda(0)}};
    return o;
}

inline Task<int> callee(std::string channel, int port_pipe) {
    auto ex = co_await asio::this_coro::executor;
    TcpStoreServerOptions so;
    so.host = "127.0.0.1";
    auto server = TcpStoreServer::start(ex, so);
    if (!server) co_return 1;
    const std::uint16_t port = (*server)->port();
    if (::write(port_pipe, &port, sizeof port) != sizeof port) co_return 1;
    TcpStoreOptions co;
    co.host = "127.0.0.1";
    co.port = port;
    auto store = co_await TcpStore::connect(ex, co);
    if (!store) co_return 1;
    if (!register_startup_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; })) co_return 1;
    auto agent = co_await init_rpc_with_store(*store, "callee", BackendType::tensorpipe(), 1, 2, options(channel, false));
    if (!agent) {
        std::fprintf(stderr, "rpc_bench callee: %s\n", agent.error().to_string().c_str());
        co_return 1;
    }
    auto down = co_await (*agent)->shutdown(true, 600);
    set_default_agent(nullptr, {});
    // (This process hosts the store: it stays up until the caller's shutdown no longer reads it.)
    std::vector<std::string> left{"bench/caller_left"};
    (void)co_await (*store)->wait(std::move(left), std::chrono::seconds(120));
    co_return down ? 0 : 1;
}

/// Echo round trips of `n`-byte cuda:0 tensors: seconds each (the reply's bytes ready on its stream).
inline Task<std::vector<double>> echoes(RpcAgent& a, DeviceBackend& be, std::size_t n, int reps) {
    std::vector<double> out;
    auto s = be.acquire_stream(Device::cuda(0));
    auto t = be.allocate(Device::cuda(0), n);
    if (!s || !t) co_return out;
    auto tensor = Tensor::wrap(*t, DType::uint8, {static_cast<std::int64_t>(n)});
    if (!tensor) co_return out;
    const std::string to = "callee", handler = "echo";
    for (int i = 0; i < reps + 1; ++i) {
        Message m{Bytes{}, {*tensor}};
        const double t0 = now_us();
        auto r = co_await a.rpc_async(to, handler, std::move(m));
        if (!r || r->tensors.size() != 1) co_return std::vector<double>{};
        const Stream* rs = r->stream_for(Device::cuda(0));
        if (rs && !co_await be.synchronize(*rs)) co_return std::vector<double>{};
        if (i > 0) out.push_back((now_us() - t0) / 1e6);  // (the first warms the outbox and handles)
    }
    co_return out;
}

inline Task<int> caller(std::string channel, std::uint16_t port, Sizes sz, const ResultPipe& out) {
    auto ex = co_await asio::this_coro::executor;
    TcpStoreOptions co;
    co.host = "127.0.0.1";
    co.port = port;
    auto store = co_await TcpStore::connect(ex, co);
    if (!store) co_return 1;
    auto agent = co_await init_rpc_with_store(*store, "caller", BackendType::tensorpipe(), 0, 2, options(channel, true));
    if (!agent) {
        std::fprintf(stderr, "rpc_bench caller: %s\n", agent.error().to_string().c_str());
        co_return 1;
    }
    auto& be = **backend_for(Device::cuda(0));
    const std::string key = channel == "cuda_basic" ? "basic_" : std::getenv("TP_CUDA_IPC_ONE_COPY_MIN") ? "outbox_" : "ipc_";
    auto small = co_await echoes(**agent, be, 4096, sz.small_iters);
    if (small.empty()) co_return 1;
    out.put(key + "p50_us_4kib", percentile(small, 50) * 1e6);
    for (std::size_t n : sz.bytes) {
        auto rt = co_await echoes(**agent, be, n, sz.reps);
        if (rt.empty()) co_return 1;
        out.put(key + "gbps_" + label(n), 2.0 * static_cast<double>(n) / percentile(rt, 50) / 1e9);
    }
    auto down = co_await (*agent)->shutdown(true, 600);
    set_default_agent(nullptr, {});
    const Bytes one{1};
    (void)co_await (*store)->set("bench/caller_left", one);
    co_return down ? 0 : 1;
}

/// The whole run: plain figures, then each channel; one JSON object on stdout. 77: no device.
inline int run(bool quick) {
    Sizes sz;
    if (quick) {
        sz.bytes = {std::size_t{1} << 20, std::size_t{64} << 20};
        sz.reps = 3;
        sz.small_iters = 200;
    }
    const pid_t probe = spawn([] { return cuda_device_count() > 0 ? 0 : 77; });
    int status = 0;
    ::waitpid(probe, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::printf("{\"device\": \"cuda\", \"ok\": false, \"skipped\": \"no cuda device\"}\n");
        return 77;
    }
    ResultPipe out;
    bool ok = reap(spawn([&] { return run_loop([&] { return plain_copies(sz, out); }, std::chrono::seconds(600)); }));
    for (const std::string variant : {"cuda_ipc", "cuda_ipc/outbox", "cuda_basic"}) {
        // (The outbox run's processes send every tensor through the outbox.)
        const std::string channel = variant == "cuda_basic" ? variant : "cuda_ipc";
        if (variant == "cuda_ipc/outbox") ::setenv("TP_CUDA_IPC_ONE_COPY_MIN", "18446744073709551615", 1);
        else ::unsetenv("TP_CUDA_IPC_ONE_COPY_MIN");
        int p[2];
        if (::pipe(p) != 0) return 2;
        const pid_t callee_pid = spawn([&] { return run_loop([&] { return callee(channel, p[1]); }, std::chrono::seconds(900)); });
        std::uint16_t port = 0;
        if (::read(p[0], &port, sizeof port) != sizeof port) return 2;
        ::close(p[0]);
        ::close(p[1]);
        const pid_t caller_pid =
            spawn([&] { return run_loop([&] { return caller(channel, port, sz, out); }, std::chrono::seconds(900)); });
        ok = reap(caller_pid) && ok;
        ok = reap(callee_pid) && ok;
    }
    auto r = out.collect();
    std::printf("{\n  \"device\": \"cuda\",\n  \"runtime\": \"%s\",", std::getenv("TP_CUDART") ? std::getenv("TP_CUDART") : "libcudart");
    for (const auto& [k, v] : r) std::printf("\n  \"%s\": %.6g,", k.c_str(), v);
    std::printf("\n  \"ratio\": {");
    bool first = true;
    for (std::size_t n : sz.bytes) {
        const std::string l = label(n);
        auto ratio = [&](const std::string& a, const std::string& b) {
            return r.count(a) && r.count(b) && r[b] > 0 ? r[a] / r[b] : -1.0;
        };
        std::printf("%s\n    \"ipc_%s_vs_d2d\": %.3f,\n    \"outbox_%s_vs_d2d\": %.3f,\n    \"basic_%s_vs_pinned\": %.3f",
                    first ? "" : ",", l.c_str(), ratio("ipc_gbps_" + l, "d2d_gbps_" + l), l.c_str(),
                    ratio("outbox_gbps_" + l, "d2d_gbps_" + l), l.c_str(), ratio("basic_gbps_" + l, "pinned_gbps_" + l));
        first = false;
    }
    std::printf("\n  },\n  \"ok\": %s\n}\n", ok ? "true" : "false");
    return ok ? 0 : 1;
}

}  // namespace bench::cuda_rpc
