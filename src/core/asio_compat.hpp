// The only file that names asio::experimental: non-throwing completion for library internals.
#pragma once

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/use_awaitable.hpp>

#include <typeinfo>

namespace tensorplay::detail {

/// The executor inside `ex` when it is exactly a `T`, else null. (Asio 1.22's any_executor::target<T>()
/// casts without checking the type.)
template <class T, class AnyExecutor>
const T* target_of(const AnyExecutor& ex) noexcept {
    return ex && ex.target_type() == typeid(T) ? ex.template target<T>() : nullptr;
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
