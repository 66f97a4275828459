// run_with_deadline: runs a coroutine test on its own io_context; a hang fails the test.
#pragma once

#include <tensorplay/core/task.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <future>
#include <utility>

namespace tensorplay::test {

/// Waits `d` on the awaiting coroutine's executor (a cancelled wait ends early, quietly).
inline Task<void> sleep_for(std::chrono::milliseconds d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    std::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

/// Runs `fn` (a callable returning Task<void>) on a fresh io_context driven by this thread.
/// Fails the test with a message when it has not finished after `limit`; rethrows its exceptions.
template <class F>
void run_with_deadline(std::chrono::milliseconds limit, F&& fn) {
    asio::io_context ctx(1);
    bool done = false;
    std::exception_ptr error;
    asio::co_spawn(ctx, std::forward<F>(fn), [&](std::exception_ptr e) {
        done = true;
        error = e;
    });
    ctx.run_for(limit);
    if (!done) FAIL("test coroutine did not finish within " << limit.count() << " ms (a hang)");
    if (error) std::rethrow_exception(error);
}

/// Same, but the coroutine runs on `executor` (e.g. a Runtime's) and this thread waits.
template <class F>
void run_with_deadline_on(Executor executor, std::chrono::milliseconds limit, F&& fn) {
    std::promise<std::exception_ptr> promise;
    auto future = promise.get_future();
    asio::co_spawn(executor, std::forward<F>(fn), [&promise](std::exception_ptr e) { promise.set_value(e); });
    if (future.wait_for(limit) != std::future_status::ready)
        FAIL("test coroutine did not finish within " << limit.count() << " ms (a hang)");
    if (auto e = future.get()) std::rethrow_exception(e);
}

}  // namespace tensorplay::test
