// Tests of with_timeout: deadline, cancellation of the inner operation, exceptions.
#include <tensorplay/core/timeout.hpp>

#include "support/deadline.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_timeout_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

// Waits `d` on a timer; reports whether it was cancelled instead of finishing.
Task<Result<int>> slow_op(Duration d, bool* cancelled) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    std::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
        if (cancelled) *cancelled = true;
        co_return fail(from_error_code(ec, "slow_op"));
    }
    co_return 42;
}

Task<Result<int>> throwing_op() {
    asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
    co_await t.async_wait(asio::use_awaitable);
    throw std::runtime_error("boom");
}

}  // namespace

TEST_CASE("with_timeout returns the value when the operation finishes first", "[core]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        auto r = co_await with_timeout(slow_op(1ms, nullptr), 2s);
        REQUIRE(r);
        REQUIRE(*r == 42);
    });
}

TEST_CASE("with_timeout gives timeout and cancels the inner operation", "[core]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        bool cancelled = false;
        auto start = Clock::now();
        auto r = co_await with_timeout(slow_op(10s, &cancelled), 50ms);
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::timeout);
        REQUIRE(cancelled);
        REQUIRE(Clock::now() - start < 5s);
    });
}

TEST_CASE("a zero or negative timeout means no deadline", "[core]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        auto r = co_await with_timeout(slow_op(30ms, nullptr), 0ms);
        REQUIRE(r);
        auto r2 = co_await with_timeout(slow_op(30ms, nullptr), -5ms);
        REQUIRE(r2);
    });
}

TEST_CASE("an exception in the operation becomes an error, not a timeout", "[core]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        auto start = Clock::now();
        auto r = co_await with_timeout(throwing_op(), 3s);
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::internal);
        REQUIRE(r.error().message().find("boom") != std::string::npos);
        REQUIRE(Clock::now() - start < 2s);  // the real error, reported at once
    });
}

TEST_CASE("cancelling the caller cancels the inner operation", "[core]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::cancellation_signal signal;
        bool cancelled = false;
        std::optional<Result<int>> out;
        asio::co_spawn(ex, with_timeout(slow_op(10s, &cancelled), 10s),
                       asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr, Result<int> r) { out = r; }));
        asio::steady_timer t(ex, 20ms);
        co_await t.async_wait(asio::use_awaitable);
        signal.emit(asio::cancellation_type::terminal);
        while (!out) {
            t.expires_after(1ms);
            co_await t.async_wait(asio::use_awaitable);
        }
        REQUIRE(cancelled);
        REQUIRE_FALSE(*out);
        REQUIRE(out->error().code() == Errc::cancelled);
    });
}

namespace {
// On cancellation, keeps running for `cleanup` (a wait that ignores cancellation), then ends.
Task<Result<int>> slow_to_stop(Duration cleanup, bool* ended) {
    asio::steady_timer t(co_await asio::this_coro::executor, 10s);
    std::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    co_await asio::this_coro::throw_if_cancelled(false);
    co_await asio::this_coro::reset_cancellation_state();  // (the cleanup wait is not cancelled)
    t.expires_after(cleanup);
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    *ended = true;
    co_return 7;  // (a value after the deadline: the timeout wins all the same)
}
}  // namespace

TEST_CASE("with_timeout returns only once the cancelled operation has stopped", "[core]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        bool ended = false;
        auto start = Clock::now();
        auto r = co_await with_timeout(slow_to_stop(100ms, &ended), 20ms);
        REQUIRE(ended);  // nothing of the operation runs after with_timeout returned
        REQUIRE(Clock::now() - start >= 100ms);
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::timeout);
    });
}

}  // namespace tp_timeout_test
