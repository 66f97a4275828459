// TaskGroup: joining tasks that end by themselves, cancelling tasks parked in waits, refusing
// spawns once closed, escaped exceptions, and tasks left pending when their event loop goes.
#include "core/asio_compat.hpp"
#include "core/task_group.hpp"

#include <tensorplay/core/timeout.hpp>

#include "support/deadline.hpp"

#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <memory>
#include <stdexcept>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_task_group_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::TaskGroup;

namespace {

Task<void> sleep_then(std::chrono::milliseconds d, int* ended) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(detail::use_nothrow);
    ++*ended;
}

// Parks until cancelled (a wait that would last an hour); counts how it ended.
Task<void> park(int* cancelled, std::shared_ptr<int> token) {
    (void)token;
    asio::steady_timer t(co_await asio::this_coro::executor, 1h);
    auto [ec] = co_await t.async_wait(detail::use_nothrow);
    if (ec == asio::error::operation_aborted) ++*cancelled;
}

}  // namespace

TEST_CASE("a task group's join waits for every task that ends by itself", "[core][task_group]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        TaskGroup group(co_await asio::this_coro::executor);
        int ended = 0;
        for (int i = 0; i < 10; ++i) REQUIRE(group.spawn(sleep_then(std::chrono::milliseconds(5 * i), &ended), "sleeper"));
        CHECK(group.running() == 10);
        co_await group.join();
        CHECK(ended == 10);
        CHECK(group.running() == 0);
    });
}

TEST_CASE("cancel ends the tasks parked in waits, and join then completes", "[core][task_group]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        TaskGroup group(co_await asio::this_coro::executor);
        int cancelled = 0;
        auto token = std::make_shared<int>(0);
        for (int i = 0; i < 100; ++i) REQUIRE(group.spawn(park(&cancelled, token), "parked"));
        CHECK(token.use_count() == 101);
        group.cancel();
        co_await group.join();
        CHECK(cancelled == 100);
        CHECK(token.use_count() == 1);  // every frame is gone
    });
}

TEST_CASE("a closed task group refuses new tasks without starting them", "[core][task_group]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        TaskGroup group(co_await asio::this_coro::executor);
        int ended = 0;
        group.close();
        CHECK_FALSE(group.spawn(sleep_then(0ms, &ended), "late"));
        co_await group.join();
        asio::steady_timer t(co_await asio::this_coro::executor, 20ms);
        co_await t.async_wait(detail::use_nothrow);
        CHECK(ended == 0);
    });
}

TEST_CASE("an exception that escapes a task is logged; the others and the join go on", "[core][task_group]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        TaskGroup group(co_await asio::this_coro::executor);
        int ended = 0;
        auto thrower = []() -> Task<void> {
            co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
            throw std::runtime_error("task failure for the test");
        };
        REQUIRE(group.spawn(thrower(), "thrower"));
        REQUIRE(group.spawn(sleep_then(10ms, &ended), "sleeper"));
        co_await group.join();
        CHECK(ended == 1);
    });
}

TEST_CASE("a cancelled join ends only the join; the tasks keep running", "[core][task_group]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        TaskGroup group(co_await asio::this_coro::executor);
        int ended = 0;
        REQUIRE(group.spawn(sleep_then(300ms, &ended), "slow"));
        auto joined = co_await with_timeout(
            [](TaskGroup& g) -> Task<Result<void>> {
                co_await g.join();
                co_return ok();
            }(group),
            20ms);
        CHECK_FALSE(joined);
        CHECK(group.running() == 1);
        co_await group.join();
        CHECK(ended == 1);
    });
}

TEST_CASE("destroying a task group cancels its tasks", "[core][task_group]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        int cancelled = 0;
        auto token = std::make_shared<int>(0);
        {
            TaskGroup group(co_await asio::this_coro::executor);
            for (int i = 0; i < 5; ++i) REQUIRE(group.spawn(park(&cancelled, token), "parked"));
        }
        for (int i = 0; i < 100 && token.use_count() > 1; ++i) {
            asio::steady_timer t(co_await asio::this_coro::executor, 5ms);
            co_await t.async_wait(detail::use_nothrow);
        }
        CHECK(cancelled == 5);
        CHECK(token.use_count() == 1);
    });
}

TEST_CASE("tasks still pending when their event loop is destroyed go with it, freed", "[core][task_group]") {
    auto token = std::make_shared<int>(0);
    int cancelled = 0;
    std::unique_ptr<TaskGroup> group;  // outlives the event loop
    {
        asio::io_context ctx;
        group = std::make_unique<TaskGroup>(ctx.get_executor());
        for (int i = 0; i < 5; ++i) REQUIRE(group->spawn(park(&cancelled, token), "parked"));
        ctx.run_for(20ms);
        CHECK(group->running() == 5);
        // The loop goes first: the frames are destroyed, not resumed, and leave the group.
    }
    CHECK(token.use_count() == 1);
    CHECK(cancelled == 0);
    CHECK(group->running() == 0);
    group.reset();  // signals nothing: nothing of its tasks is left
}

}  // namespace tp_task_group_test
