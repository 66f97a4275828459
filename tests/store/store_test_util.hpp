// Test helpers for stores: a spawned operation to join or cancel later, and a short async sleep.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>

#include "core/asio_compat.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <exception>

// GCC 12 reports -Wmismatched-new-delete, a false positive, on some coroutines returning
// asio::awaitable (the frame's class-specific operator new/delete pair is seen only in part after
// inlining). It would break the CI's -Werror build of these tests, so it is silenced here only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
#include <memory>
#include <string>
#include <vector>

/// REQUIRE(expr) for an expression containing co_await: GCC 12 evaluates a co_await inside Catch's
/// REQUIRE more than once (the macro repeats the expression in an unevaluated-looking branch).
/// The expression must give a Result; a failure shows its error.
#define CO_REQUIRE(...)                                          \
    do {                                                         \
        auto tp_r_ = (__VA_ARGS__);                              \
        if (!tp_r_) FAIL(#__VA_ARGS__ << ": " << tp_r_.error()); \
    } while (false)

namespace tensorplay::test {

/// Runs a Task<Result<T>> in the background on `ex`; join() awaits its result, cancel() cancels it
/// (emit from `ex`'s thread, as Asio requires).
template <class T>
class Spawned {
public:
    Spawned(Executor ex, Task<Result<T>> task)
        : channel_(std::make_shared<Chan>(ex, 1)), signal_(std::make_shared<asio::cancellation_signal>()) {
        asio::co_spawn(ex, std::move(task),
                       asio::bind_cancellation_slot(signal_->slot(), [ch = channel_](std::exception_ptr e, Result<T> r) {
                           if (e) r = fail(Errc::internal, "the spawned operation threw");
                           ch->try_send(std::error_code{}, std::make_shared<Result<T>>(std::move(r)));
                       }));
    }
    /// True once the operation has finished.
    [[nodiscard]] bool ready() const { return channel_->ready(); }
    void cancel(asio::cancellation_type type = asio::cancellation_type::terminal) { signal_->emit(type); }
    [[nodiscard]] Task<Result<T>> join() {
        auto ch = channel_;
        auto [ec, r] = co_await ch->async_receive(detail::use_nothrow);
        if (ec || !r) co_return fail(Errc::internal, "join failed");
        co_return std::move(*r);
    }

private:
    using Chan = detail::ConcurrentChannel<void(std::error_code, std::shared_ptr<Result<T>>)>;
    std::shared_ptr<Chan> channel_;
    std::shared_ptr<asio::cancellation_signal> signal_;
};

/// A key list built outside any coroutine: GCC 12 miscompiles braced lists ("array used as
/// initializer") in expressions that contain co_await, so tests write keys("a", "b") instead.
template <class... S>
[[nodiscard]] std::vector<std::string> keys(S... s) {
    return std::vector<std::string>{std::string(s)...};
}
/// A value list, for the same reason.
template <class... B>
[[nodiscard]] std::vector<Bytes> vals(B... b) {
    return std::vector<Bytes>{std::move(b)...};
}

/// Lets other coroutines run for `d` (used to show that something has NOT happened yet).
inline Task<void> pause(Duration d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(detail::use_nothrow);
}

}  // namespace tensorplay::test
