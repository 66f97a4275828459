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

#include <dirent.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
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
    std::optional<double> server_us_64;  // server CPU time per operation at 64 clients
    std::optional<double> client_us_64;  // the clients' CPU time per operation (same code for every server)
};

// CPU time (s) used so far by every thread of process `pid` (0: this process) whose id is in `tids`
// (empty: all), from /proc/<pid>/task/*/schedstat (nanoseconds on CPU).
double cpu_seconds(int pid, const std::vector<int>& tids) {
    const std::string dir = "/proc/" + (pid ? std::to_string(pid) : std::string("self")) + "/task";
    double total = 0;
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) return 0;
    while (dirent* e = ::readdir(d.get())) {
        if (e->d_name[0] == '.') continue;
        const int tid = std::atoi(e->d_name);
        if (!tids.empty() && std::find(tids.begin(), tids.end(), tid) == tids.end()) continue;
        if (FILE* f = std::fopen((dir + "/" + e->d_name + "/schedstat").c_str(), "r")) {
            unsigned long long ns = 0;
            if (std::fscanf(f, "%llu", &ns) == 1) total += static_cast<double>(ns) * 1e-9;
            std::fclose(f);
        }
    }
    return total;
}

struct Load {
    std::uint16_t port;
    TcpStoreDialect dialect;
    bool use_library_all_gather;  // tensorplay::all_gather (multi_get) vs set + multi_get written here
    std::string tag;              // key namespace of this run
    int server_pid = 0;           // whose threads serve (0: this process, thread server_tid)
    int server_tid = 0;
};

double server_cpu(const Load& l) {
    return l.server_pid ? cpu_seconds(l.server_pid, {}) : cpu_seconds(0, {l.server_tid});
}

struct Rate {
    double ops_per_s = 0;
    double server_us_per_op = 0;
    double client_us_per_op = 0;
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

Task<Result<Rate>> ops_per_s(Load load, int clients) {
    auto cs = co_await connect_all(load, clients);
    if (!cs) co_return fail(cs.error());
    const double cpu0 = server_cpu(load);
    const std::vector<int> me{static_cast<int>(::gettid())};  // the clients' thread
    const double client0 = cpu_seconds(0, me);
    const auto start = Clock::now();
    const auto until = start + 1s;
    auto counts = co_await run_all<std::int64_t>(clients, [&](int i) {
        return churn((*cs)[static_cast<std::size_t>(i)], load.tag + "/k" + std::to_string(i), until);
    });
    if (!counts) co_return fail(counts.error());
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    const double cpu = server_cpu(load) - cpu0;
    const double client_cpu = cpu_seconds(0, me) - client0;
    std::int64_t total = 0;
    for (auto c : *counts) total += c;
    for (auto& c : *cs) c->close();
    Rate rate;
    rate.ops_per_s = static_cast<double>(total) / secs;
    rate.server_us_per_op = total > 0 ? cpu * 1e6 / static_cast<double>(total) : 0;
    rate.client_us_per_op = total > 0 ? client_cpu * 1e6 / static_cast<double>(total) : 0;
    co_return rate;
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
    if (selected("TP_STORE_BENCH_PHASES", "ops1")) f.ops_1 = run_blocking(ops_per_s(load, 1)).value_or(Rate{}).ops_per_s;
    load.tag += "64";
    if (selected("TP_STORE_BENCH_PHASES", "ops64")) {
        if (auto r = run_blocking(ops_per_s(load, 64))) {
            f.ops_64 = r->ops_per_s;
            f.server_us_64 = r->server_us_per_op;
            f.client_us_64 = r->client_us_per_op;
        }
    }
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
           ", \"allgather_s_1024\": " + num(f.ag_1024) + ", \"server_cpu_us_per_op_64\": " + num(f.server_us_64) +
           ", \"client_cpu_us_per_op_64\": " + num(f.client_us_64) + "}";
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
    std::atomic<int> server_tid{0};
    std::thread server_thread([&] {
        pthread_setname_np(pthread_self(), "store_server");  // to tell the threads apart in perf
        server_tid = static_cast<int>(::gettid());
        server_ctx.run();
    });
    while (server_tid == 0) std::this_thread::yield();
    const auto port = (*server)->port();
    Figures ours113, ours;
    if (selected("TP_STORE_BENCH_ONLY", "ours113"))
        ours113 = measure({port, TcpStoreDialect::torch113, false, "t113", 0, server_tid});
    if (selected("TP_STORE_BENCH_ONLY", "ours")) ours = measure({port, TcpStoreDialect::torch2, true, "t2", 0, server_tid});
    (*server)->stop();
    guard.reset();
    server_thread.join();

    std::optional<Figures> theirs;
    const char* script =
        "exec /usr/bin/python3 -c \"import sys, datetime, torch.distributed as d; "
        "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=600), wait_for_workers=False); "
        "import os; print('PORT', s.port, os.getpid(), flush=True); s.wait(['bench_done'], datetime.timedelta(seconds=600))\" 2>/dev/null";
    if (selected("TP_STORE_BENCH_ONLY", "torch") &&
        std::system("/usr/bin/python3 -c \"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)\" 2>/dev/null") == 0) {
        if (FILE* py = ::popen(script, "r")) {
            char line[128] = {0};
            std::uint16_t tport = 0;
            int tpid = 0;
            if (std::fgets(line, sizeof line, py) && std::string(line).rfind("PORT ", 0) == 0) {
                unsigned p = 0;
                if (std::sscanf(line + 5, "%u %d", &p, &tpid) >= 1) tport = static_cast<std::uint16_t>(p);
            }
            if (tport) {
                theirs = measure({tport, TcpStoreDialect::torch113, false, "torch", tpid, 0});
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
        if (ours113.server_us_64 && theirs->server_us_64 && *ours113.server_us_64 > 0)
            out += ", \"ratio_server_cpu_per_op_64_torch_over_ours\": " + num(*theirs->server_us_64 / *ours113.server_us_64);
    }
    out += ", \"note\": \"ours_torch113 and torch use the same client load (torch113 dialect, set+multi_get all-gather); "
           "ops count each set and each get; server_cpu_us_per_op_64 is the serving process's CPU time (schedstat) per operation\"}";
    std::printf("%s\n", out.c_str());
    return 0;
}
