// cma reads off the event loop: the pool, and the hand-off by a RemoteSignal.
#include "transport/channels/cma/cma_offload.hpp"

#include "core/flag.hpp"
#include "transport/channels/cma/cma.hpp"

#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

namespace tensorplay::detail::cma {
namespace {

std::atomic<std::uint64_t> g_reads{0};

/// The pool of this process, made at the first large read; null in a forked child of a process
/// that had made one: the child has the pointer but none of the threads, and starting threads
/// after a multi-threaded fork is what some tools (ThreadSanitizer) refuse, so such a child reads
/// on its event loop. Never destroyed: a read in flight at exit ends with the process.
asio::thread_pool* pool() {
    static std::mutex mutex;
    static asio::thread_pool* p = nullptr;
    static pid_t owner = -1;
    std::lock_guard lock(mutex);
    if (!p) {
        p = new asio::thread_pool(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
        owner = ::getpid();
    }
    return owner == ::getpid() ? p : nullptr;
}

}  // namespace

Task<Result<void>> read_off_loop(int pid, std::uint64_t remote, Tensor dst) {
    auto* threads = pool();
    if (!threads) co_return read(pid, remote, dst.nbytes(), dst.data());
    RemoteSignal done(co_await asio::this_coro::executor);
    auto out = std::make_shared<Result<void>>();
    g_reads.fetch_add(1, std::memory_order_relaxed);
    // (The notify's post to our executor orders the write of *out before our read of it.)
    asio::post(*threads, [pid, remote, dst, out, n = done.notifier()] {
        *out = read(pid, remote, dst.nbytes(), dst.data());
        n.notify();
    });
    const std::error_code ec = co_await done.wait();
    if (ec)
        co_return fail(Errc::shutdown, "cma read of " + std::to_string(dst.nbytes()) + " bytes from pid " +
                                           std::to_string(pid) + " abandoned: " + ec.message());
    co_return std::move(*out);
}

std::uint64_t reads_off_loop() noexcept { return g_reads.load(std::memory_order_relaxed); }

}  // namespace tensorplay::detail::cma
