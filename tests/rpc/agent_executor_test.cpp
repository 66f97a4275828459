// Native agent on executors of several threads: strands of a two-thread event loop, and the
// executors an agent refuses because they may run its handlers at once.
#include "rpc/agent_test_util.hpp"

#include <tensorplay/core/runtime.hpp>

#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_future.hpp>

#include <atomic>
#include <future>
#include <optional>
#include <string>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_agent_executor_test {

using namespace tensorplay;
using namespace std::chrono_literals;

TEST_CASE("agents on strands of a two-thread event loop call each other at once, both ways", "[rpc][agent]") {
    // Each agent on its own strand, the two strands run by two threads: replies and requests are
    // handed over across threads (the reader's completions go through the strand), not in place.
    Runtime rt(RuntimeOptions{.io_threads = 2, .num_worker_threads = 1});
    auto store = std::make_shared<HashStore>(std::chrono::seconds(5));
    std::vector<Executor> strands;
    for (int r = 0; r < 2; ++r) strands.push_back(asio::make_strand(rt.get_executor()));
    std::vector<test::AgentPtr> agents(2);
    std::vector<std::future<Result<test::AgentPtr>>> started;
    for (int r = 0; r < 2; ++r)
        started.push_back(asio::co_spawn(strands[r], detail::NativeAgent::create(test::init_args(store, r, 2, {})), asio::use_future));
    for (int r = 0; r < 2; ++r) {
        REQUIRE(started[r].wait_for(10s) == std::future_status::ready);
        auto a = started[r].get();
        REQUIRE(a);
        agents[r] = *a;
        REQUIRE(agents[r]->register_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; }));
    }
    constexpr int n = 400;  // per direction
    std::atomic<int> good{0}, bad{0}, finished{0};
    std::promise<void> all;
    auto all_done = all.get_future();
    for (int i = 0; i < 2 * n; ++i) {
        const int from = i % 2;
        std::string payload = std::to_string(i);
        asio::co_spawn(strands[from], agents[from]->rpc_async(test::worker_name(1 - from), "echo", test::text_message(payload)),
                       [&, payload](std::exception_ptr e, Result<Message> r) {
                           if (!e && r && to_string(r->payload) == payload) ++good;
                           else ++bad;
                           if (++finished == 2 * n) all.set_value();
                       });
    }
    REQUIRE(all_done.wait_for(20s) == std::future_status::ready);
    CHECK(bad == 0);
    CHECK(good == 2 * n);
    std::vector<std::future<Result<void>>> down;
    for (int r = 0; r < 2; ++r) down.push_back(asio::co_spawn(strands[r], agents[r]->shutdown(true, 5), asio::use_future));
    for (auto& d : down) {
        REQUIRE(d.wait_for(10s) == std::future_status::ready);
        CHECK(d.get());
    }
}

TEST_CASE("an agent is refused an executor that may run its handlers at once, and accepts a strand of it", "[rpc][agent]") {
    auto store = std::make_shared<HashStore>(std::chrono::seconds(5));
    auto start_on = [&](Executor ex) {
        auto f = asio::co_spawn(ex, detail::NativeAgent::create(test::init_args(store, 0, 1, {})), asio::use_future);
        return f;
    };
    auto refused = [](std::future<Result<test::AgentPtr>>& f) -> std::optional<Error> {
        if (f.wait_for(10s) != std::future_status::ready) return Error(Errc::timeout, "did not finish");
        auto a = f.get();
        if (a) return std::nullopt;
        return a.error();
    };
#if TP_ASIO_INTERNALS  // (the hint is Asio's private state: without the internals it cannot be read)
    {
        asio::io_context four(4);  // made for four threads (run here by one: the hint is what counts)
        std::thread t([&] {
            auto guard = asio::make_work_guard(four);
            four.run_for(std::chrono::seconds(10));
        });
        auto f = start_on(four.get_executor());
        auto e = refused(f);
        four.stop();
        t.join();
        REQUIRE(e);
        CHECK(e->code() == Errc::invalid_argument);
        CHECK(e->message().find("io_context made for 4 threads") != std::string::npos);
        CHECK(e->message().find("make_strand") != std::string::npos);
    }
#endif
    {
        asio::thread_pool pool(2);
        auto f = start_on(pool.get_executor());
        auto e = refused(f);
        REQUIRE(e);
        CHECK(e->code() == Errc::invalid_argument);
        CHECK(e->message().find("thread pool") != std::string::npos);
        // A strand of the same pool is fine: a group of one starts and shuts down.
        auto s = asio::make_strand(pool.get_executor());
        auto ok = asio::co_spawn(s, detail::NativeAgent::create(test::init_args(store, 0, 1, {})), asio::use_future);
        REQUIRE(ok.wait_for(10s) == std::future_status::ready);
        auto a = ok.get();
        REQUIRE(a);
        auto down = asio::co_spawn(s, (*a)->shutdown(false), asio::use_future);
        REQUIRE(down.wait_for(10s) == std::future_status::ready);
        CHECK(down.get());
        pool.join();
    }
}

// A single-threaded service may make its event loop without the reactor's per-socket locks
// (README, "Build options"): the agent and its store touch sockets only from that loop's thread.
TEST_CASE("agents on an io_context without per-socket locks (ASIO_CONCURRENCY_HINT_UNSAFE_IO) echo and shut down", "[rpc][agent]") {
    asio::io_context ctx(ASIO_CONCURRENCY_HINT_UNSAFE_IO);
    bool finished = false;
    std::optional<std::string> failure;
    asio::co_spawn(
        ctx,
        [&]() -> Task<void> {
            auto g = co_await test::make_group(2);
            test::register_echo(g);
            for (int i = 0; i < 200; ++i) {
                const std::string text = "unlocked " + std::to_string(i);
                auto r = co_await g[i % 2]->rpc_async(test::worker_name(1 - i % 2), "echo", test::text_message(text));
                if (!r || to_string(r->payload) != text) {
                    failure = r ? "wrong payload" : r.error().to_string();
                    break;
                }
            }
            auto down = co_await test::shutdown_all(g);
            for (auto& d : down)
                if (!d) failure = d.error().to_string();
            finished = true;
        },
        asio::detached);
    ctx.run_for(std::chrono::seconds(20));
    REQUIRE(finished);
    INFO(failure.value_or(""));
    CHECK_FALSE(failure);
}

// An event loop destroyed while its agents still run (a service that ends without shutting them
// down): the serving coroutines parked between requests go with the loop, and the agents' own
// destruction, which the loop's teardown finishes, must not touch them (it once did: a
// use-after-free in ~AgentCore, seen under TSan and ASan).
TEST_CASE("an event loop destroyed with its agents running, their serving workers parked, frees them cleanly", "[rpc][agent]") {
    std::optional<test::AgentGroup> group;
    std::optional<std::string> failure;
    bool called = false;
    {
        asio::io_context ctx;
        asio::co_spawn(
            ctx,
            [&]() -> Task<void> {
                auto g = co_await test::make_group(2);
                test::register_echo(g);
                // Concurrent calls both ways: several serving workers run, then park.
                test::Signal done(co_await asio::this_coro::executor, 64);
                for (int i = 0; i < 16; ++i) {
                    asio::co_spawn(ctx, g[i % 2]->rpc_async(test::worker_name(1 - i % 2), "echo", test::text_message("x")),
                                   [&](std::exception_ptr e, Result<Message> r) {
                                       if (e || !r) failure = r ? "exception" : r.error().to_string();
                                       done.try_send(std::error_code{}, 0);
                                   });
                }
                for (int i = 0; i < 16; ++i) co_await done.async_receive(asio::use_awaitable);
                called = true;
                group = std::move(g);
                ctx.stop();
            },
            asio::detached);
        ctx.run_for(std::chrono::seconds(20));
        REQUIRE(called);
        // The agents' last references from here: their destructors queue their closing on the
        // stopped loop, whose teardown then runs (destroys) it along with the parked workers.
        group.reset();
    }
    INFO(failure.value_or(""));
    CHECK_FALSE(failure);
}

namespace {
/// Sets its flag when destroyed: marks that a handler's frame ended (returned, threw or was
/// destroyed), whichever way.
struct Ended {
    std::shared_ptr<bool> flag;
    ~Ended() { *flag = true; }
};
}  // namespace

TEST_CASE("shutdown cancels the agent's background work and returns once it has ended: a handler in flight, a silent "
          "socket in its handshake",
          "[rpc][agent]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto g = co_await test::make_group(2);
        auto handler_ended = std::make_shared<bool>(false);
        test::Signal entered(ex, 1);
        REQUIRE(g[1]->register_handler("hang", [&entered, handler_ended](WorkerInfo, Message m) -> Task<Result<Message>> {
            Ended mark{handler_ended};
            entered.try_send(std::error_code{}, 0);
            asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::seconds(60));
            co_await t.async_wait(asio::use_awaitable);  // (throws when cancelled)
            co_return m;
        }));
        std::optional<Result<Message>> call;
        test::Signal call_done(ex, 1);
        asio::co_spawn(ex, g[0]->rpc_async(test::worker_name(1), "hang", test::text_message("x"), 30),
                       [&call, &call_done](std::exception_ptr, Result<Message> r) {
                           call = std::move(r);
                           call_done.try_send(std::error_code{}, 0);
                       });
        co_await entered.async_receive(asio::use_awaitable);
        const std::size_t before = g[1]->background_tasks();  // accept loops, the serving worker
        // A socket that connects and never says hello: its handshake would run 10 s.
        const auto addr = g[1]->listen_address();
        const auto colon = addr.rfind(':');
        asio::ip::tcp::socket silent(ex);
        co_await silent.async_connect({asio::ip::make_address(addr.substr(0, colon)),
                                       static_cast<std::uint16_t>(std::stoi(addr.substr(colon + 1)))},
                                      asio::use_awaitable);
        // Accepted and handshaking: one more task than before the connect (no event says so; the
        // test's deadline bounds the wait).
        while (g[1]->background_tasks() <= before) co_await test::sleep_for(1ms);

        const auto t0 = Clock::now();
        auto r = co_await g[1]->shutdown(false, 5);
        const auto took = Clock::now() - t0;
        CHECK(r);
        CHECK(took < 3s);  // not the handler's 60 s nor the handshake's 10 s
        CHECK(g[1]->background_tasks() == 0);
        CHECK(*handler_ended);

        // The caller's pending call ended with the callee's connection (well before its 30 s).
        co_await call_done.async_receive(asio::use_awaitable);
        REQUIRE(call);
        CHECK_FALSE(*call);
        CHECK(g[0]->background_tasks() >= 1);
        auto r0 = co_await g[0]->shutdown(false, 5);
        CHECK(r0);
        CHECK(g[0]->background_tasks() == 0);
    });
}

TEST_CASE("after a graceful shutdown none of the agents' coroutines runs: parked workers, the deadline sweep, accept loops",
          "[rpc][agent]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto g = co_await test::make_group(3);
        test::register_echo(g);
        auto ex = co_await asio::this_coro::executor;
        test::Signal done(ex, 64);
        int ok_calls = 0;
        for (int i = 0; i < 30; ++i) {
            asio::co_spawn(ex, g[i % 3]->rpc_async(test::worker_name((i + 1) % 3), "echo", test::text_message("x"), 5),
                           [&](std::exception_ptr, Result<Message> r) {
                               ok_calls += r ? 1 : 0;
                               done.try_send(std::error_code{}, 0);
                           });
        }
        for (int i = 0; i < 30; ++i) co_await done.async_receive(asio::use_awaitable);
        CHECK(ok_calls == 30);
        for (int r = 0; r < 3; ++r) CHECK(g[r]->background_tasks() > 0);
        auto results = co_await test::shutdown_all(g, true, 5);
        for (int r = 0; r < 3; ++r) {
            INFO("worker" << r);
            CHECK(results[r]);
            CHECK(g[r]->background_tasks() == 0);
        }
    });
}

}  // namespace tp_agent_executor_test
