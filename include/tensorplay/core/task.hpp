// Task<T>: the coroutine type of every asynchronous operation in the API.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

namespace tensorplay {

/// A C++20 coroutine run by an Asio executor. Public operations return Task<Result<T>>.
template <class T>
using Task = asio::awaitable<T, asio::any_io_executor>;

using Executor = asio::any_io_executor;

}  // namespace tensorplay
