// TaskGroup: owns the background coroutines of an object, so that closing it cancels them and
// waits for them (no detached work, nothing kept alive only by its own callbacks).
#pragma once

#include <tensorplay/core/task.hpp>

#include <cstddef>
#include <memory>

namespace tensorplay::detail {

/// A set of coroutines started on one executor (a strand or a single-threaded context: every
/// member is called on it, and the tasks' completions run there). Typical use: an object spawns
/// its readers, accept loops and timers into its group; its close() calls cancel(), then awaits
/// join(), after which none of its coroutines runs any more.
///
/// Destroying the group cancels what still runs; the tasks then end on their executor. An owner
/// declares its group after everything the tasks wait on (destroyed first, it cancels them while
/// their timers and sockets still exist: a signal reaches the operation through them). Destroying
/// the executor's event loop destroys the unfinished tasks' frames with it (their completion,
/// and so the group's bookkeeping of them, then never runs; nothing leaks).
class TaskGroup {
public:
    explicit TaskGroup(Executor ex);
    ~TaskGroup();
    TaskGroup(const TaskGroup&) = delete;
    TaskGroup& operator=(const TaskGroup&) = delete;

    /// Starts `task` (dispatched: it may run up to its first suspension before this returns).
    /// `what` names it in the error log line of an exception that escapes it (a static string).
    /// After close() (or join()), the task is refused: destroyed unstarted, and false returned.
    bool spawn(Task<void> task, const char* what);
    /// Refuses later spawns.
    void close() noexcept;
    /// Emits terminal cancellation to every task running now: each ends at its next cancellable
    /// wait (a task that ignores cancellation keeps running until it ends by itself).
    void cancel();
    /// Closes the group, then completes once every task has ended. Cancelling the join (e.g. by a
    /// timeout) ends only the join. One joiner at a time.
    [[nodiscard]] Task<void> join();
    /// Tasks started and not yet ended.
    [[nodiscard]] std::size_t running() const noexcept;

private:
    struct State;
    struct Membership;
    std::shared_ptr<State> state_;
};

}  // namespace tensorplay::detail
