// Tests of Runtime: owned and adopted executors, the pool, block_on, stop and join.
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/core/timeout.hpp>

#include "support/deadline.hpp"

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_runtime_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {
Task<Result<int>> add_on(Executor ex, int a, int b) {
    co_await asio::post(ex, asio::use_awaitable);
    co_return a + b;
}
}  // namespace

TEST_CASE("block_on runs a task on the runtime and returns its result", "[core]") {
    Runtime rt({.io_threads = 2, .num_worker_threads = 2});
    auto r = rt.block_on(add_on(rt.get_executor(), 2, 3));
    REQUIRE(r);
    REQUIRE(*r == 5);
}

TEST_CASE("block_on refuses to run on the runtime's own threads", "[core]") {
    Runtime rt;
    std::promise<Result<int>> p;
    asio::post(rt.get_executor(), [&] { p.set_value(rt.block_on(add_on(rt.get_executor(), 1, 1))); });
    auto fut = p.get_future();
    REQUIRE(fut.wait_for(5s) == std::future_status::ready);
    auto r = fut.get();
    REQUIRE_FALSE(r);
    REQUIRE(r.error().code() == Errc::invalid_argument);
    REQUIRE(r.error().message().find("deadlock") != std::string::npos);
}

TEST_CASE("the worker pool runs blocking work off the I/O threads", "[core]") {
    Runtime rt({.io_threads = 1, .num_worker_threads = 4});
    auto io_thread = std::make_shared<std::thread::id>();
    auto r = rt.block_on([](Runtime* rt) -> Task<Result<bool>> {
        auto pool_id = co_await asio::co_spawn(rt->pool_executor(), []() -> Task<std::thread::id> {
            co_return std::this_thread::get_id();
        }, asio::use_awaitable);
        co_return pool_id != std::this_thread::get_id() && rt->running_in_this_thread();
    }(&rt));
    REQUIRE(r);
    REQUIRE(*r);
    REQUIRE_FALSE(rt.running_in_this_thread());  // the test thread is not the runtime's
}

TEST_CASE("a runtime adopts a user's executor and starts no I/O thread", "[core]") {
    asio::io_context user_ctx;
    Runtime rt(user_ctx.get_executor(), {.num_worker_threads = 1});
    bool ran = false;
    asio::post(rt.get_executor(), [&] { ran = true; });
    REQUIRE_FALSE(ran);  // nobody runs the user's context but the user
    user_ctx.run_for(1s);
    REQUIRE(ran);
    bool inside = false;
    asio::post(user_ctx, [&] { inside = rt.running_in_this_thread(); });
    user_ctx.restart();
    user_ctx.run_for(1s);
    REQUIRE(inside);
}

TEST_CASE("stop abandons pending work and join returns", "[core]") {
    auto rt = std::make_unique<Runtime>(RuntimeOptions{.io_threads = 2, .num_worker_threads = 2});
    std::atomic<bool> fired{false};
    auto timer = std::make_shared<asio::steady_timer>(rt->get_executor(), 1h);
    timer->async_wait([&](std::error_code) { fired = true; });
    auto start = Clock::now();
    rt->stop();
    rt->join();
    REQUIRE(Clock::now() - start < 5s);
    rt->stop();  // idempotent
    timer.reset();
    rt.reset();
    REQUIRE_FALSE(fired);
}

}  // namespace tp_runtime_test
