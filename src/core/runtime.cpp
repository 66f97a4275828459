// Runtime: an owned or adopted io_context plus a thread pool for blocking handlers.
#include <tensorplay/core/runtime.hpp>

#include "core/asio_compat.hpp"

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/thread_pool.hpp>

#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace tensorplay {

struct Runtime::Impl {
    std::optional<asio::io_context> owned_context;
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
    Executor executor;
    asio::thread_pool pool;
    std::vector<std::thread> io_threads;
    std::mutex mutex;
    bool stopped = false;

    explicit Impl(int pool_threads) : pool(static_cast<std::size_t>(std::max(1, pool_threads))) {}
};

Runtime::Runtime(RuntimeOptions options) : impl_(std::make_unique<Impl>(options.num_worker_threads)) {
    int n = std::max(1, options.io_threads);
    // A concurrency hint of 1 lets Asio skip locking when a single thread runs the context.
    impl_->owned_context.emplace(n == 1 ? 1 : n);
    impl_->work.emplace(impl_->owned_context->get_executor());
    impl_->executor = impl_->owned_context->get_executor();
    for (int i = 0; i < n; ++i) impl_->io_threads.emplace_back([ctx = &*impl_->owned_context] { ctx->run(); });
}

Runtime::Runtime(Executor executor, RuntimeOptions options)
    : impl_(std::make_unique<Impl>(options.num_worker_threads)) {
    impl_->executor = std::move(executor);
}

Runtime::~Runtime() {
    stop();
    join();
}

Executor Runtime::get_executor() const { return impl_->executor; }
Executor Runtime::pool_executor() const { return impl_->pool.get_executor(); }

bool Runtime::running_in_this_thread() const noexcept {
    if (impl_->pool.get_executor().running_in_this_thread()) return true;
    if (impl_->owned_context) return impl_->owned_context->get_executor().running_in_this_thread();
    // An adopted executor: when it belongs to an io_context we can still tell.
    if (auto* io = detail::target_of<asio::io_context::executor_type>(impl_->executor)) return io->running_in_this_thread();
    return false;
}

void Runtime::stop() {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;
    impl_->work.reset();
    if (impl_->owned_context) impl_->owned_context->stop();
    impl_->pool.stop();
}

void Runtime::join() {
    std::vector<std::thread> threads;
    {
        std::lock_guard lock(impl_->mutex);
        threads.swap(impl_->io_threads);
    }
    for (auto& t : threads)
        if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
        else if (t.joinable()) t.detach();
    impl_->pool.join();
}

Result<void> Runtime::check_blocking_allowed(const char* what) const {
    if (running_in_this_thread())
        return fail(Errc::invalid_argument, std::string(what) +
                                                " called on one of the runtime's own threads; it would deadlock. "
                                                "co_await the operation instead");
    return ok();
}

}  // namespace tensorplay
