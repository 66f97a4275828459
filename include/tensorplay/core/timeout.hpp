// with_timeout: bound any Task<Result<T>> by a deadline, cancelling it when the deadline passes.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>

#include <chrono>
#include <exception>
#include <optional>

namespace tensorplay {

using Clock = std::chrono::steady_clock;
using Duration = Clock::duration;

/// Turns the exception in flight into an Error (Errc::internal unless it is a system_error).
[[nodiscard]] TP_API Error error_from_current_exception(std::string_view where);
/// The Errc::timeout error of a deadline `d` that passed.
[[nodiscard]] TP_API Error timeout_error(Duration d);

/// Races `body` against a deadline `d` (> 0) on the caller's executor: true when `body` ended
/// first; false when `d` passed first, `body` then being cancelled (terminal cancellation) and
/// awaited until it stopped. Cancellation of the caller is forwarded to `body`. with_timeout's
/// engine (compiled in the library, not in every user's code).
[[nodiscard]] TP_API Task<bool> race_deadline(Task<void> body, Duration d);

namespace detail {

/// Runs `op`, turning an escaping exception into an Error so that racing it never hides a failure.
template <class T>
Task<Result<T>> catching(Task<Result<T>> op) {
    try {
        co_return co_await std::move(op);
    } catch (...) {
        co_return fail(error_from_current_exception("operation"));
    }
}

/// Runs `op` (as catching() does) into `out`, which must outlive this coroutine.
template <class T>
Task<void> run_into(Task<Result<T>> op, std::optional<Result<T>>& out) {
    out.emplace(co_await catching(std::move(op)));
}
}  // namespace detail

/// Runs `op` with a deadline. When `d` passes first, `op` is cancelled (terminal cancellation),
/// awaited until it stops, and the result is Errc::timeout. `d <= 0` means no deadline.
/// Cancellation of the caller is forwarded to `op`. Exceptions from `op` become Errc::internal.
template <class T>
[[nodiscard]] Task<Result<T>> with_timeout(Task<Result<T>> op, Duration d) {
    if (d <= Duration::zero()) co_return co_await detail::catching(std::move(op));
    std::optional<Result<T>> out;  // (outlives the race, which awaits `op` until it stops)
    auto race = race_deadline(detail::run_into(std::move(op), out), d);
    if (co_await std::move(race)) co_return std::move(*out);
    co_return fail(timeout_error(d));
}

}  // namespace tensorplay
