// Helpers behind with_timeout and block_on: the deadline's race, exceptions and deadlines turned
// into Errors.
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/core/runtime.hpp>

#include "core/asio_compat.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <system_error>
#include <variant>

namespace tensorplay {

Error error_from_exception_ptr(std::exception_ptr e, std::string_view where) {
    try {
        std::rethrow_exception(e);
    } catch (const std::system_error& se) {
        return from_error_code(se.code(), where);
    } catch (const std::exception& ex) {
        return Error(Errc::internal, std::string(where) + " threw: " + ex.what());
    } catch (...) {
        return Error(Errc::internal, std::string(where) + " threw a non-standard exception");
    }
}

Error error_from_current_exception(std::string_view where) {
    return error_from_exception_ptr(std::current_exception(), where);
}

Error timeout_error(Duration d) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    return Error(Errc::timeout, "timed out after " + std::to_string(ms) + " ms");
}

Task<bool> race_deadline(Task<void> body, Duration d) {
    using namespace detail::awaitable_ops;
    asio::steady_timer timer(co_await asio::this_coro::executor, d);
    // (`||` cancels the loser, terminally, and waits for it; the caller's cancellation reaches both.)
    auto r = co_await (std::move(body) || timer.async_wait(asio::use_awaitable));
    co_return r.index() == 0;
}

}  // namespace tensorplay
