// Private: the native agent's serving pool (issue 35): the serving coroutines parked between
// requests, which the reader hands the next request to, and the threads of blocking handlers.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/rpc/message.hpp>

#include "core/resume_slot.hpp"
#include "rpc/handler_registry.hpp"

#include <asio/thread_pool.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tensorplay {
class Connection;
}

namespace tensorplay::detail {

class AgentCore;
class ServingPool;

/// A request as a serving worker takes it: the handler is looked up (and counted as running) by
/// the reader, so that unregister waits for it.
struct ServeRequest {
    std::uint64_t id = 0;
    std::shared_ptr<HandlerEntry> entry;  ///< null: no such handler (`unknown` names it), or `error`
    std::string unknown;
    Message message;
    std::optional<Error> error;  ///< the request could not be received whole (a tensor refused)
};

/// A coroutine that serves requests, parked between them (in a ServingPool). The reader hands it
/// the next request and resumes it in place; co_spawn per request would post a completion
/// through the event loop. A parked worker holds no reference to the agent; whoever wakes it
/// hands it one.
struct ServeWorker {
    ServeWorker() = default;
    ServeWorker(const ServeWorker&) = delete;
    ServeWorker& operator=(const ServeWorker&) = delete;
    /// A parked worker destroyed without being woken (its event loop went first, destroying the
    /// parked frame) leaves its pool's idle list.
    ~ServeWorker();

    ResumeSlot wake;
    std::shared_ptr<AgentCore> core;
    std::shared_ptr<Connection> conn;
    bool has_request = false;  ///< false when woken to exit
    ServingPool* parked_in = nullptr;  ///< whose idle list holds this worker
    ServeRequest req;
};

/// The workers parked between requests and the blocking handlers' threads. The idle list is
/// strand-bound to the agent's executor; blocking_threads() may be called from any thread.
class ServingPool {
public:
    /// Idle workers kept parked at most by default; beyond that, a worker that finishes exits.
    static constexpr std::size_t kMaxIdleWorkers = 128;

    explicit ServingPool(std::size_t max_idle = kMaxIdleWorkers) : max_idle_(max_idle) {}
    /// Abandons the workers still parked (abandon()); the blocking threads are joined.
    ~ServingPool();
    ServingPool(const ServingPool&) = delete;
    ServingPool& operator=(const ServingPool&) = delete;

    /// A parked worker, taken out of the pool (the last parked first: its frame is warm), or null
    /// when none is parked. The caller hands it a request and completes its `wake`.
    [[nodiscard]] ServeWorker* take() noexcept;
    /// Parks `w` (it then waits on its `wake`) unless the pool is closed or holds its maximum.
    [[nodiscard]] bool park(ServeWorker& w);
    /// Takes `w` out of the idle list (it is being destroyed unwoken).
    void unpark(ServeWorker& w) noexcept;
    /// Wakes every parked worker to exit (with no request), one at a time, and parks no more.
    void close();
    /// Destroys the waits of the workers still parked without resuming them (their owner is going
    /// and no request can come): each parked frame goes with its slot's waiter.
    void abandon();
    /// Workers parked now.
    [[nodiscard]] std::size_t idle() const noexcept { return idle_.size(); }

    /// The threads blocking handlers run on, `threads` of them (at least one), made at the first
    /// call (later calls' counts are ignored). Thread-safe.
    [[nodiscard]] asio::thread_pool& blocking_threads(std::size_t threads);

private:
    std::vector<ServeWorker*> idle_;
    std::size_t max_idle_;
    bool closed_ = false;
    std::mutex threads_mutex_;
    std::unique_ptr<asio::thread_pool> threads_;
};

}  // namespace tensorplay::detail
