// Runtime: the I/O context, its threads and the pool for blocking handlers.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>

#include <asio/co_spawn.hpp>

#include <exception>
#include <future>
#include <memory>
#include <optional>

namespace tensorplay {

struct RuntimeOptions {
    int io_threads = 1;            ///< threads running the io_context (ignored when adopting an executor)
    int num_worker_threads = 16;   ///< threads of the pool that runs blocking handlers
};

/// Owns (or adopts) the executor the library runs on, plus a worker pool.
/// Thread-safe. Destruction stops and joins everything it started.
class TP_API Runtime {
public:
    /// Starts an io_context run by `options.io_threads` threads and a worker pool.
    /// Values below 1 are raised to 1.
    explicit Runtime(RuntimeOptions options = {});
    /// Adopts an executor the user already runs: no I/O thread is started, only the worker pool.
    explicit Runtime(Executor executor, RuntimeOptions options = {});
    ~Runtime();
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    /// The I/O executor: coroutine handlers and all connection state run here.
    [[nodiscard]] Executor get_executor() const;
    /// The worker pool's executor, for blocking handlers.
    [[nodiscard]] Executor pool_executor() const;
    /// True on a thread this runtime started (I/O or pool): blocking waits there would deadlock.
    [[nodiscard]] bool running_in_this_thread() const noexcept;

    /// Stops the io_context (if owned) and the pool; idempotent. Pending coroutines are abandoned.
    void stop();
    /// Waits for every thread this runtime started; call after stop() or when work ran out.
    void join();

    /// Runs `task` on the I/O executor and blocks the calling thread until it finishes.
    /// Refuses (Errc::invalid_argument) when called on one of this runtime's own threads.
    template <class T>
    [[nodiscard]] Result<T> block_on(Task<Result<T>> task);

private:
    [[nodiscard]] Result<void> check_blocking_allowed(const char* what) const;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// Turns an exception (from a coroutine's completion, say) into an Error: Errc::internal unless it
/// is a system_error; `where` names what threw.
[[nodiscard]] TP_API Error error_from_exception_ptr(std::exception_ptr e, std::string_view where);

template <class T>
Result<T> Runtime::block_on(Task<Result<T>> task) {
    if (auto allowed = check_blocking_allowed("block_on"); !allowed) return fail(allowed.error());
    std::promise<Result<T>> promise;
    auto future = promise.get_future();
    asio::co_spawn(get_executor(), std::move(task),
                   [&promise](std::exception_ptr e, Result<T> r) {
                       if (e) r = fail(error_from_exception_ptr(e, "block_on"));
                       promise.set_value(std::move(r));
                   });
    return future.get();
}

}  // namespace tensorplay
