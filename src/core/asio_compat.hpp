// The only file that names asio::experimental: non-throwing completion for library internals.
#pragma once

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/detail/concurrency_hint.hpp>
#include <asio/io_context.hpp>

#include <typeinfo>

namespace tensorplay::detail {

/// The executor inside `ex` when it is exactly a `T`, else null. (Asio 1.22's any_executor::target<T>()
/// casts without checking the type.)
template <class T, class AnyExecutor>
const T* target_of(const AnyExecutor& ex) noexcept {
    return ex && ex.target_type() == typeid(T) ? ex.template target<T>() : nullptr;
}

/// The number of threads `ctx` was made for, when it says (its concurrency hint); 0 for the special
/// hints (ASIO_CONCURRENCY_HINT_UNSAFE and the like), which promise one thread. (Asio keeps the hint
/// in its private scheduler: this is the one place that names it.)
inline int io_context_threads(asio::io_context& ctx) {
    const int hint = asio::use_service<asio::detail::scheduler>(ctx).concurrency_hint();
    return ASIO_CONCURRENCY_HINT_IS_SPECIAL(hint) ? 0 : hint;
}

/// Completion token for library I/O: `auto [ec, n] = co_await sock.async_read_some(buf, use_nothrow);`
/// Never throws; convert `ec` with from_error_code.
inline constexpr auto use_nothrow = asio::experimental::as_tuple(asio::use_awaitable);

namespace awaitable_ops = asio::experimental::awaitable_operators;

// The first parameter is named separately: GCC 12 refuses a pack expanded into the alias's non-pack head.
template <class First, class... Rest>
using Channel = asio::experimental::channel<First, Rest...>;
template <class First, class... Rest>
using ConcurrentChannel = asio::experimental::concurrent_channel<First, Rest...>;

}  // namespace tensorplay::detail
