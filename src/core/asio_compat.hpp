// The only file that names asio::experimental: non-throwing completion for library internals.
// Also the one switch for the code that relies on Asio's internals (see TP_ASIO_INTERNALS).
#pragma once

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/version.hpp>

#include <typeinfo>

// TP_ASIO_INTERNALS: 1 when the fast paths built on Asio's private types are compiled: edge-triggered
// reads (transport/edge_read.*, transport/rearmed_read.hpp), in-place coroutine resumption
// (core/resume_slot.hpp) and io_context_threads (core/asio_compat_internals.hpp). Only core/asio_compat_internals.hpp names
// Asio's detail namespace, in our own terms (ParkedCoroutine, ReactorReadOp, ReactorRegistration); they are
// written against Asio 1.22, so any other Asio version, or meson's -Dasio_internals=false
// (TP_NO_ASIO_INTERNALS; CI's sanitizer build), builds the portable paths instead, which use
// Asio's public API only.
#if !defined(TP_NO_ASIO_INTERNALS) && ASIO_VERSION >= 102200 && ASIO_VERSION < 102300
#define TP_ASIO_INTERNALS 1
#else
#define TP_ASIO_INTERNALS 0
#endif

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
