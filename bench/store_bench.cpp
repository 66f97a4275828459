// store_bench: TcpStoreServer throughput and all-gather latency, against PyTorch's own TCPStore server.
// Prints one JSON object. Clients are coroutines of this process, each with its own connection.
#include <tensorplay/store/collectives.hpp>
#include <tensorplay/store/prefix_store.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <pthread.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

struct Figures {
    double ops_1 = 0, ops_64 = 0;
    std::optional<double> ag_64, ag_256, ag_1024;
};

struct Load {
    std::uint16_t port;
    TcpStoreDialect dialect;
    bool use_library_all_gather;  // tensorplay::all_gather (multi_get) vs set + multi_get written here
    std::string tag;              // key namespace of this run
};

Task<Result<std::vector<std::shared_ptr<TcpStore>>>> connect_all(Load load, int n) {
    auto ex = co_await asio::this_coro::executor;
    std::vector<std::shared_ptr<TcpStore>> out;
    out.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        TcpStoreOptions o;
        o.port = load.port;
        o.dialect = load.dialect;
        o.timeout = 60s;
        auto c = co_await TcpStore::connect(ex, o);
        if (!c) co_return fail(c.error());
        out.push_back(*c);
    }
    co_return out;
}

// One client: set+get on its own key until `until`; returns the number of operations.
Task<Result<std::int64_t>> churn(std::shared_ptr<TcpStore> c, std::string key, Clock::time_point until) {
    std::int64_t ops = 0;
    const Bytes value(16, 'v');
    while (Clock::now() < until) {
        if (auto r = co_await c->set(key, value); !r) co_return fail(r.error());
        if (auto r = co_await c->get(key); !r) co_return fail(r.error());
        ops += 2;
    }
    co_return ops;
}

Task<Result<std::vector<Bytes>>> gather_once(std::shared_ptr<TcpStore> c, Load load, int rank, int world) {
    Bytes mine(32, static_cast<std::uint8_t>(rank));
    if (load.use_library_all_gather) {
        // A fresh namespace per group size: all_gather's round counters are per rank.
        PrefixStore scoped(load.tag + "/ag" + std::to_string(world), c);
        co_return co_await all_gather(scoped, rank, world, std::move(mine));
    }
    const std::string prefix = load.tag + "/ag" + std::to_string(world) + "/";
    if (auto r = co_await c->set(prefix + std::to_string(rank), std::move(mine)); !r) co_return fail(r.error());
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back(prefix + std::to_string(r));
    co_return co_await c->multi_get(std::move(keys));
}

// Runs `n` coroutines of `body` at once on this executor and waits for all; returns the first error.
template <class T, class Make>
Task<Result<std::vector<T>>> run_all(int n, Make make) {
    auto ex = co_await asio::this_coro::executor;
    auto results = std::make_shared<std::vector<std::optional<Result<T>>>>(static_cast<std::size_t>(n));
    auto left = std::make_shared<int>(n);
    asio::steady_timer done(ex, asio::steady_timer::time_point::max());
    for (int i = 0; i < n; ++i) {
        asio::co_spawn(ex, make(i), [results, left, i, &done](std::exception_ptr e, Result<T> r) {
            if (e) r = fail(Errc::internal, "a client threw");
            (*results)[static_cast<std::size_t>(i)] = std::move(r);
            if (--*left == 0) done.cancel();
        });
    }
    if (*left > 0) {
        std::error_code ec;
        co_await done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    std::vector<T> out;
    for (auto& r : *results) {
        if (!*r) co_return fail(r->error());
        out.push_back(std::move(**r));
    }
    co_return out;
}

Task<Result<double>> ops_per_s(Load load, int clients) {
    auto cs = co_await connect_all(load, clients);
    if (!cs) co_return fail(cs.error());
    const auto start = Clock::now();
    const auto until = start + 1s;
    auto counts = co_await run_all<std::int64_t>(clients, [&](int i) {
        return churn((*cs)[static_cast<std::size_t>(i)], load.tag + "/k" + std::to_string(i), until);
    });
    if (!counts) co_return fail(counts.error());
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::int64_t total = 0;
    for (auto c : *counts) total += c;
    for (auto& c : *cs) c->close();
    co_return static_cast<double>(total) / secs;
}

Task<Result<double>> allgather_s(Load load, int world) {
    auto cs = co_await connect_all(load, world);
    if (!cs) co_return fail(cs.error());
    const auto start = Clock::now();
    auto r = co_await run_all<std::vector<Bytes>>(world, [&](int rank) {
        return gather_once((*cs)[static_cast<std::size_t>(rank)], load, rank, world);
    });
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    for (auto& c : *cs) c->close();
    if (!r) co_return fail(r.error());
    for (auto& v : *r)
        if (v.size() != static_cast<std::size_t>(world) || v.back() != Bytes(32, static_cast<std::uint8_t>(world - 1)))
            co_return fail(Errc::internal, "all_gather returned wrong values");
    co_return secs;
}

template <class T>
std::optional<T> run_blocking(Task<Result<T>> task) {
    asio::io_context ctx(1);
    std::optional<Result<T>> out;
    asio::co_spawn(ctx, std::move(task), [&](std::exception_ptr e, Result<T> r) {
        if (e) r = fail(Errc::internal, "benchmark threw");
        out = std::move(r);
    });
    ctx.run();
    if (!out || !*out) {
        std::fprintf(stderr, "store_bench: %s\n", out ? out->error().to_string().c_str() : "did not finish");
        return std::nullopt;
    }
    return **out;
}

// For profiling one part: TP_STORE_BENCH_ONLY=ours,ours113,torch (servers) and
// TP_STORE_BENCH_PHASES=ops1,ops64,ag64,ag256,ag1024 (figures); unset means all.
bool selected(const char* var, const std::string& name) {
    const char* v = std::getenv(var);
    if (!v || !*v) return true;
    const std::string list = std::string(",") + v + ",";
    return list.find("," + name + ",") != std::string::npos;
}

Figures measure(Load load) {
    Figures f;
    load.tag += "1";
    if (selected("TP_STORE_BENCH_PHASES", "ops1")) f.ops_1 = run_blocking(ops_per_s(load, 1)).value_or(0);
    load.tag += "64";
    if (selected("TP_STORE_BENCH_PHASES", "ops64")) f.ops_64 = run_blocking(ops_per_s(load, 64)).value_or(0);
    if (selected("TP_STORE_BENCH_PHASES", "ag64")) f.ag_64 = run_blocking(allgather_s(load, 64));
    if (selected("TP_STORE_BENCH_PHASES", "ag256")) f.ag_256 = run_blocking(allgather_s(load, 256));
    if (selected("TP_STORE_BENCH_PHASES", "ag1024")) f.ag_1024 = run_blocking(allgather_s(load, 1024));
    return f;
}

Task<Result<int>> release_torch_server(TcpStoreOptions o) {
    auto ex = co_await asio::this_coro::executor;
    auto c = co_await TcpStore::connect(ex, o);
    if (!c) co_return fail(c.error());
    if (auto r = co_await (*c)->set("bench_done", bytes("1")); !r) co_return fail(r.error());
    co_return 0;
}

std::string num(std::optional<double> v) {
    if (!v) return "null";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", *v);
    return buf;
}

std::string json(const Figures& f) {
    return "{\"ops_per_s_1\": " + num(f.ops_1) + ", \"ops_per_s_64\": " + num(f.ops_64) +
           ", \"allgather_s_64\": " + num(f.ag_64) + ", \"allgather_s_256\": " + num(f.ag_256) +
           ", \"allgather_s_1024\": " + num(f.ag_1024) + "}";
}

}  // namespace

int main() {
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
    // Our server on its own thread (one executor), clients on this one.
    asio::io_context server_ctx(1);
    auto server = TcpStoreServer::start(server_ctx.get_executor(), {.host = "127.0.0.1"});
    if (!server) {
        std::fprintf(stderr, "store_bench: %s\n", server.error().to_string().c_str());
        return 1;
    }
    auto guard = asio::make_work_guard(server_ctx);
    std::thread server_thread([&] {
        pthread_setname_np(pthread_self(), "store_server");  // to tell the threads apart in perf
        server_ctx.run();
    });
    const auto port = (*server)->port();
    Figures ours113, ours;
    if (selected("TP_STORE_BENCH_ONLY", "ours113")) ours113 = measure({port, TcpStoreDialect::torch113, false, "t113"});
    if (selected("TP_STORE_BENCH_ONLY", "ours")) ours = measure({port, TcpStoreDialect::torch2, true, "t2"});
    (*server)->stop();
    guard.reset();
    server_thread.join();

    std::optional<Figures> theirs;
    const char* script =
        "exec /usr/bin/python3 -c \"import sys, datetime, torch.distributed as d; "
        "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=600), wait_for_workers=False); "
        "print('PORT', s.port, flush=True); s.wait(['bench_done'], datetime.timedelta(seconds=600))\" 2>/dev/null";
    if (selected("TP_STORE_BENCH_ONLY", "torch") &&
        std::system("/usr/bin/python3 -c \"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)\" 2>/dev/null") == 0) {
        if (FILE* py = ::popen(script, "r")) {
            char line[128] = {0};
            std::uint16_t tport = 0;
            if (std::fgets(line, sizeof line, py) && std::string(line).rfind("PORT ", 0) == 0)
                tport = static_cast<std::uint16_t>(std::atoi(line + 5));
            if (tport) {
                theirs = measure({tport, TcpStoreDialect::torch113, false, "torch"});
                TcpStoreOptions o;
                o.port = tport;
                o.dialect = TcpStoreDialect::torch113;
                o.timeout = 10s;
                run_blocking(release_torch_server(o));
            }
            ::pclose(py);
        }
    }
    std::string out = json(ours);
    out.pop_back();
    out += ", \"dialect\": \"torch2\", \"allgather\": \"tensorplay::all_gather (multi_get)\"";
    out += ", \"ours_torch113\": " + json(ours113);
    if (theirs) {
        out += ", \"torch\": " + json(*theirs);
        if (theirs->ops_64 > 0)
            out += ", \"ratio_ops_per_s_64_same_dialect\": " + num(ours113.ops_64 / theirs->ops_64);
    }
    out += ", \"note\": \"ours_torch113 and torch use the same client load (torch113 dialect, set+multi_get all-gather); "
           "ops count each set and each get\"}";
    std::printf("%s\n", out.c_str());
    return 0;
}
