// with_timeout: bound any Task<Result<T>> by a deadline, cancelling it when the deadline passes.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <exception>
#include <variant>

namespace tensorplay {

using Clock = std::chrono::steady_clock;
using Duration = Clock::duration;

namespace detail {
/// Turns the exception in flight into an Error (Errc::internal unless it is a system_error).
[[nodiscard]] Error error_from_current_exception(std::string_view where);
[[nodiscard]] Error timeout_error(Duration d);

/// Runs `op`, turning an escaping exception into an Error so that racing it never hides a failure.
template <class T>
Task<Result<T>> catching(Task<Result<T>> op) {
    try {
        co_return co_await std::move(op);
    } catch (...) {
        co_return fail(error_from_current_exception("operation"));
    }
}
}  // namespace detail

/// Runs `op` with a deadline. When `d` passes first, `op` is cancelled (terminal cancellation),
/// awaited until it stops, and the result is Errc::timeout. `d <= 0` means no deadline.
/// Cancellation of the caller is forwarded to `op`. Exceptions from `op` become Errc::internal.
template <class T>
[[nodiscard]] Task<Result<T>> with_timeout(Task<Result<T>> op, Duration d) {
    if (d <= Duration::zero()) co_return co_await detail::catching(std::move(op));
    using namespace asio::experimental::awaitable_operators;
    asio::steady_timer timer(co_await asio::this_coro::executor, d);
    auto r = co_await (detail::catching(std::move(op)) || timer.async_wait(asio::use_awaitable));
    if (r.index() == 0) co_return std::move(std::get<0>(r));
    co_return fail(detail::timeout_error(d));
}

}  // namespace tensorplay
