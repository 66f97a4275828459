// A worker program as a new user writes one, from the README and the public headers only: its own
// io_context, typed handlers registered before init, a call to every peer at once, then shutdown
// in the way --shutdown names. It must return from ctx.run() and exit cleanly (exit status 0).
// Run by lifecycle_test.cpp with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE set.
//
//   --shutdown method       init_rpc, then co_await agent->shutdown(true)
//   --shutdown with_store   rendezvous + init_rpc_with_store, then agent->shutdown(true)
//   --shutdown free         init_rpc, then the free tensorplay::shutdown()
//   --shutdown never        init_rpc, no shutdown: the process must still exit cleanly
//   --stop-rank R           rank R stops itself (SIGSTOP) after its calls; the others' graceful
//                           shutdown must end with a timeout naming it within --timeout seconds
#include <tensorplay/rpc.hpp>
#include <tensorplay/store/rendezvous.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tp = tensorplay;

namespace {

struct Args {
    std::string shutdown = "method";
    int stop_rank = -1;
    double timeout = tp::DEFAULT_SHUTDOWN_TIMEOUT;
};

std::atomic<int> g_called{0};
asio::io_context* g_ctx = nullptr;  // calls of times_ten this worker has served

int env_int(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : -1;
}

tp::Task<int> run(Args args) {
    const int rank = env_int("RANK");
    const int world = env_int("WORLD_SIZE");
    const std::string name = "worker" + std::to_string(rank);
    // Typed, and registered before init: a fast peer's first call must find it.
    auto reg = tp::define_startup<std::int64_t(std::int64_t)>("times_ten", [](std::int64_t x) {
        ++g_called;
        return x * 10;
    });
    if (!reg) {
        std::fprintf(stderr, "%s: define_startup: %s\n", name.c_str(), reg.error().to_string().c_str());
        co_return 2;
    }
    auto options = std::make_shared<tp::TensorPipeRpcBackendOptions>();
    options->listen_address = "127.0.0.1";
    std::shared_ptr<tp::TcpStoreServer> server;  // with_store: the caller keeps what rendezvous made
    tp::Result<std::shared_ptr<tp::RpcAgent>> agent = tp::fail(tp::Errc::invalid_argument, "not started");
    if (args.shutdown == "with_store") {
        auto rv = co_await tp::rendezvous("env://", -1, -1);
        if (!rv) {
            std::fprintf(stderr, "%s: rendezvous: %s\n", name.c_str(), rv.error().to_string().c_str());
            co_return 3;
        }
        server = rv->server;
        agent = co_await tp::init_rpc_with_store(rv->store, name, tp::BackendType::tensorpipe(), rank, world, options);
    } else {
        agent = co_await tp::init_rpc(name, tp::BackendType::tensorpipe(), -1, -1, options);
    }
    if (!agent) {
        std::fprintf(stderr, "%s: init: %s\n", name.c_str(), agent.error().to_string().c_str());
        co_return 4;
    }
    for (int peer = 0; peer < world; ++peer) {
        if (peer == rank) continue;
        auto r = co_await tp::call<std::int64_t>(**agent, "worker" + std::to_string(peer), "times_ten", std::int64_t{rank + 1});
        if (!r || *r != (rank + 1) * 10) {
            std::fprintf(stderr, "%s: first call to worker%d: %s\n", name.c_str(), peer,
                         r ? "wrong value" : r.error().to_string().c_str());
            co_return 5;
        }
    }
    // Stay until every peer has called us too (a worker that stopped or left before answering
    // would fail the others' first calls, not what is tested here).
    auto ex = co_await asio::this_coro::executor;
    while (g_called.load() < world - 1) {
        asio::steady_timer t(ex, std::chrono::milliseconds(5));
        co_await t.async_wait(asio::use_awaitable);
    }
    if (rank == args.stop_rank || args.shutdown == "never") {
        // The last reply leaves after its handler has counted itself: let it go out first (a
        // worker that stops or exits at once may leave its peer's call unanswered).
        asio::steady_timer t(ex, std::chrono::milliseconds(300));
        co_await t.async_wait(asio::use_awaitable);
    }
    if (rank == args.stop_rank) {
        std::fprintf(stderr, "%s: stopping myself\n", name.c_str());
        ::kill(::getpid(), SIGSTOP);
        co_return 0;  // killed by the test while stopped
    }
    if (args.shutdown == "never") {
        // End the event loop with the agent running: main returns, the io_context is destroyed,
        // and the static destructors must cope.
        g_ctx->stop();
        co_return 0;
    }
    const auto start = std::chrono::steady_clock::now();
    tp::Result<void> down = tp::ok();
    if (args.shutdown == "free") down = co_await tp::shutdown(true, args.timeout);  // (GCC 12: no co_await in ?:)
    else down = co_await (*agent)->shutdown(true, args.timeout);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "%s: shutdown took %.3f s: %s\n", name.c_str(), secs, down ? "ok" : down.error().to_string().c_str());
    if (args.stop_rank >= 0) {
        // Expected: a timeout within the given time (plus slack), naming the stopped worker. The
        // store's host (rank 0) leaves at its own timeout; a worker still waiting then loses the
        // store, and its error still names whom it waited for.
        const std::string stopped = "\"worker" + std::to_string(args.stop_rank) + "\"";
        const auto code = down ? tp::Errc::internal : down.error().code();
        const bool expected_code = code == tp::Errc::timeout || (rank != 0 && code == tp::Errc::connection_lost);
        if (!expected_code || down.error().to_string().find(stopped) == std::string::npos) co_return 6;
        if (secs > args.timeout + 2.0) co_return 7;
        co_return 0;
    }
    if (!down) co_return 8;
    if (tp::default_agent()) {
        std::fprintf(stderr, "%s: still the process default after shutdown\n", name.c_str());
        co_return 9;
    }
    co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Args args;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--shutdown")) args.shutdown = argv[i + 1];
        else if (!std::strcmp(argv[i], "--stop-rank")) args.stop_rank = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--timeout")) args.timeout = std::atof(argv[i + 1]);
    }
    asio::io_context ctx;
    g_ctx = &ctx;
    int code = 1;
    asio::co_spawn(ctx, run(args), [&](std::exception_ptr e, int c) {
        code = e ? 10 : c;
        if (code != 0) ctx.stop();  // (failed with its agent running: exit with the code, not hang)
    });
    ctx.run();  // returns only when the library has left no work behind
    std::fprintf(stderr, "event loop finished, exit %d\n", code);
    return code;  // static destructors run after this: they must not touch the gone event loop
}
