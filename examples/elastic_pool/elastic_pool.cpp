// elastic_pool: a front worker spreads requests over a pool of workers that join and leave a
// dynamic group while it runs (init_rpc with no world size). The front hosts the group's store
// (rank 0 over tcp://); pool workers join with any free rank, serve "work", and leave gracefully
// on SIGTERM (or die on SIGKILL). A request whose worker left or died is retried on another.
//
//   elastic_pool front --port P [--duration S] [--in-flight N]
//       rank 0, hosts the store on 127.0.0.1:P; sends requests for S seconds (default 6) with N in
//       flight (default 16), printing the membership as it changes; then waits (at most 30 s)
//       until the pool is empty and leaves. Exit 0 only if every request got exactly one correct
//       reply (none lost, none mixed up).
//   elastic_pool worker --port P --rank R
//       joins as "pool<R>", serves until SIGTERM, then leaves the group (exit 0).
//
// examples/elastic_pool/run_elastic_pool.sh starts a front and scripts the pool's churn.
#include <tensorplay/rpc.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace tp = tensorplay;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<tp::TensorPipeRpcBackendOptions> options_for(int port) {
    auto o = std::make_shared<tp::TensorPipeRpcBackendOptions>();
    o->init_method = "tcp://127.0.0.1:" + std::to_string(port);
    o->listen_address = "127.0.0.1";
    o->rpc_timeout = 10;
    o->member_timeout = 2;  // a worker that stops answering is out of the group within a few seconds
    return o;
}

tp::Task<void> pause(std::chrono::milliseconds d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(asio::use_awaitable);
}

std::vector<std::string> pool_of(const tp::RpcAgent& agent) {
    std::vector<std::string> names;
    for (const auto& w : agent.get_worker_infos())
        if (w.name != agent.get_worker_info().name) names.push_back(w.name);
    return names;
}

std::string joined(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : " ") + n;
    return s.empty() ? "(none)" : s;
}

// ---- front ----

struct FrontState {
    std::shared_ptr<tp::RpcAgent> agent;
    Clock::time_point start = Clock::now();
    Clock::time_point stop_issuing;
    std::uint64_t next_id = 0, answered = 0, retried = 0, lost = 0, wrong = 0;
    std::map<std::string, std::uint64_t> served_by;
    std::size_t round_robin = 0;
    bool done = false;
};

double seconds_since(const FrontState& s) { return std::chrono::duration<double>(Clock::now() - s.start).count(); }

/// Prints the membership whenever it changes, until the front is done.
tp::Task<void> watch_membership(std::shared_ptr<FrontState> sp) {
    FrontState& s = *sp;
    std::vector<std::string> last{"?"};
    while (!s.done) {
        auto now = pool_of(*s.agent);
        if (now != last) {
            std::printf("[%6.2f s] pool: %s\n", seconds_since(s), joined(now).c_str());
            std::fflush(stdout);
            last = now;
        }
        co_await pause(20ms);
    }
}

/// One request, retried on another pool worker until it gets a reply (at most 50 tries).
tp::Task<void> one_request(FrontState& s, std::uint64_t id) {
    const std::string body = "request " + std::to_string(id);
    const std::string handler = "work";
    for (int attempt = 0; attempt < 50; ++attempt) {
        auto pool = pool_of(*s.agent);
        if (pool.empty()) {
            co_await pause(10ms);
            continue;
        }
        const std::string to = pool[s.round_robin++ % pool.size()];
        tp::Message m{tp::bytes(body), {}};
        auto r = co_await s.agent->rpc_async(to, handler, std::move(m), 10);
        if (r) {
            if (tp::to_string(r->payload) != body + " served by " + to) ++s.wrong;
            ++s.answered;
            ++s.served_by[to];
            co_return;
        }
        ++s.retried;  // it left, died, or was shut down meanwhile: another one takes it
    }
    ++s.lost;
}

tp::Task<void> issuer(std::shared_ptr<FrontState> sp) {
    FrontState& s = *sp;
    while (Clock::now() < s.stop_issuing) co_await one_request(s, s.next_id++);
}

tp::Task<int> front(int port, double duration_s, int in_flight) {
    auto ex = co_await asio::this_coro::executor;
    auto sp = std::make_shared<FrontState>();
    FrontState& s = *sp;
    auto agent = co_await tp::init_rpc("front", tp::BackendType::tensorpipe(), 0, tp::DYNAMIC_WORLD_SIZE, options_for(port));
    if (!agent) {
        std::fprintf(stderr, "front: init_rpc failed: %s\n", agent.error().to_string().c_str());
        co_return 1;
    }
    s.agent = *agent;
    std::printf("front: hosting the group's store on 127.0.0.1:%d\n", port);
    std::fflush(stdout);
    asio::co_spawn(ex, watch_membership(sp), asio::detached);
    s.stop_issuing = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration_s));
    int running = in_flight;
    asio::steady_timer all_done(ex, Clock::time_point::max());
    for (int i = 0; i < in_flight; ++i)
        asio::co_spawn(ex, issuer(sp), [&](std::exception_ptr) {
            if (--running == 0) all_done.cancel();
        });
    std::error_code ec;  // (operation_aborted: the last issuer ended)
    co_await all_done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    std::printf("done: %llu requests, %llu answered, %llu retried on another worker, %llu lost, %llu wrong replies\n",
                static_cast<unsigned long long>(s.next_id), static_cast<unsigned long long>(s.answered),
                static_cast<unsigned long long>(s.retried), static_cast<unsigned long long>(s.lost),
                static_cast<unsigned long long>(s.wrong));
    for (const auto& [who, n] : s.served_by) std::printf("  %s served %llu\n", who.c_str(), static_cast<unsigned long long>(n));
    std::fflush(stdout);
    // The front hosts the store: it leaves last, once the pool is gone.
    const auto give_up = Clock::now() + 30s;
    while (!pool_of(*s.agent).empty() && Clock::now() < give_up) co_await pause(20ms);
    s.done = true;
    auto left = co_await s.agent->shutdown(true, 10);
    if (!left) std::fprintf(stderr, "front: shutdown: %s\n", left.error().to_string().c_str());
    const bool ok = left && s.lost == 0 && s.wrong == 0 && s.answered == s.next_id && s.answered > 0;
    std::printf("elastic_pool: %s\n", ok ? "no request lost" : "FAILED");
    co_return ok ? 0 : 1;
}

// ---- pool worker ----

tp::Task<tp::Result<tp::Message>> serve_work(std::string name, tp::Message m) {
    co_await pause(1ms);  // (some work)
    co_return tp::Message{tp::bytes(tp::to_string(m.payload) + " served by " + name), {}};
}

tp::Task<int> worker(int port, int rank) {
    auto ex = co_await asio::this_coro::executor;
    const std::string name = "pool" + std::to_string(rank);
    // Registered before init: the first request can come as soon as the join is done.
    auto reg = tp::register_startup_handler("work", [name](tp::WorkerInfo, tp::Message m) { return serve_work(name, std::move(m)); });
    if (!reg) co_return 1;
    auto agent = co_await tp::init_rpc(name, tp::BackendType::tensorpipe(), rank, tp::DYNAMIC_WORLD_SIZE, options_for(port));
    if (!agent) {
        std::fprintf(stderr, "%s: init_rpc failed: %s\n", name.c_str(), agent.error().to_string().c_str());
        co_return 1;
    }
    std::printf("%s: joined (%zu members)\n", name.c_str(), (*agent)->get_worker_infos().size());
    std::fflush(stdout);
    asio::signal_set stop(ex, SIGTERM, SIGINT);
    std::error_code ec;
    co_await stop.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    auto left = co_await (*agent)->shutdown(true, 20);
    if (!left) {
        std::fprintf(stderr, "%s: leaving: %s\n", name.c_str(), left.error().to_string().c_str());
        co_return 1;
    }
    std::printf("%s: left the group\n", name.c_str());
    co_return 0;
}

int usage(const char* self) {
    std::fprintf(stderr, "usage: %s front --port P [--duration S] [--in-flight N]\n       %s worker --port P --rank R\n", self, self);
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return usage(argv[0]);
    const std::string role = argv[1];
    int port = 0, rank = -1, in_flight = 16;
    double duration = 6;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--port") port = std::atoi(argv[i + 1]);
        else if (a == "--rank") rank = std::atoi(argv[i + 1]);
        else if (a == "--duration") duration = std::atof(argv[i + 1]);
        else if (a == "--in-flight") in_flight = std::atoi(argv[i + 1]);
        else return usage(argv[0]);
    }
    if (port <= 0 || (role == "worker" && rank < 1) || (role != "worker" && role != "front") || in_flight < 1)
        return usage(argv[0]);
    asio::io_context ctx(1);
    int rc = 1;
    auto body = role == "front" ? front(port, duration, in_flight) : worker(port, rank);
    asio::co_spawn(ctx, std::move(body), [&](std::exception_ptr e, int r) {
        rc = e ? 3 : r;
        ctx.stop();
    });
    ctx.run();
    return rc;
}
