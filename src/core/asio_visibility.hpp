// Read first in every translation unit of the library (meson.build passes it with -include); the
// library is built with -fvisibility=hidden and exports only what its headers mark TP_API.
// Asio's headers are read here under default visibility: the code and the template statics they
// define (the per-thread call stack, service keys, the functions compiled once for every user with
// ASIO_SEPARATE_COMPILATION) are then the program's one copy, shared by the library and its users,
// not a hidden second copy inside the library. Every Asio header that a file of src/ or include/
// includes is listed here (the meson test `exports` checks it).
#pragma once

#pragma GCC visibility push(default)
#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/buffer.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detail/concurrency_hint.hpp>
#include <asio/detail/reactive_socket_service.hpp>
#include <asio/detail/reactor.hpp>
#include <asio/detail/reactor_op.hpp>
#include <asio/detail/scheduler.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/execution.hpp>
#include <asio/execution/context.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/execution_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/generic/stream_protocol.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ip/v6_only.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/query.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/version.hpp>
#include <asio/write.hpp>
#pragma GCC visibility pop
