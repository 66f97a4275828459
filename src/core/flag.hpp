// Flag and RemoteSignal: the two hand-offs built on ResumeSlot, the one one-shot completion of
// the library. ResumeSlot parks one waiter and resumes it in place; Flag parks any number on one
// executor (a flag that is set once, for "the roster is known", "the connect finished", "nothing
// is outstanding"); RemoteSignal is completed from any thread and posts the waiter's resumption
// to its own executor (device events, a store written to by another thread).
#pragma once

#include <tensorplay/core/task.hpp>

#include "core/resume_slot.hpp"

#include <asio/any_io_executor.hpp>

#include <memory>
#include <system_error>

namespace tensorplay::detail {

/// A flag for coroutines on one executor (a strand or a single-threaded context): wait() parks
/// until set(); set() resumes every waiter in place (inside the call), once; later waits return
/// at once. reset() re-arms it. A waiter's cancellation ends its own wait with operation_aborted.
class Flag {
public:
    Flag() = default;
    ~Flag();
    Flag(const Flag&) = delete;
    Flag& operator=(const Flag&) = delete;

    /// Sets the flag with `ec` (how the waits end) and resumes every waiter. Nothing when set.
    /// A resumed waiter may destroy the event.
    void set(std::error_code ec = {});
    /// Clears the flag (waiters parked now stay parked).
    void reset() noexcept { set_ = false; }
    [[nodiscard]] bool is_set() const noexcept { return set_; }
    /// Parked waiters.
    [[nodiscard]] std::size_t waiters() const noexcept { return count_; }

    /// Completes once the flag is set, with its error code; operation_aborted when cancelled.
    [[nodiscard]] Task<std::error_code> wait();

private:
    struct Node;
    void unlink(Node& n) noexcept;

    Node* head_ = nullptr;
    std::size_t count_ = 0;
    bool set_ = false;
    std::error_code ec_;
    bool* gone_ = nullptr;  // set by the destructor while set() runs (a waiter destroyed us)
};

/// A one-shot completion whose notifier may run on any thread: notify() posts the completion to
/// the waiter's executor, where wait() observes it (before or after it began). The waiter may be
/// cancelled and go, and its event loop with it: a later notify() then touches nothing of that
/// loop. While a wait is parked the executor's event loop counts it as outstanding work (its
/// run() does not return).
class RemoteSignal {
public:
    /// A signal whose waiter runs on `ex`.
    explicit RemoteSignal(asio::any_io_executor ex);

    /// What a notifier holds: copyable, callable from any thread, at most once useful.
    class Notifier {
    public:
        /// Completes the signal with `ec` (posted to the waiter's executor); later calls do nothing.
        void notify(std::error_code ec = {}) const;

    private:
        friend class RemoteSignal;
        struct State;
        std::shared_ptr<State> s_;
    };

    [[nodiscard]] Notifier notifier() const;
    /// Completes once notified (with the notifier's code), or operation_aborted when cancelled.
    /// Call on the executor given at construction; one waiter at a time.
    [[nodiscard]] Task<std::error_code> wait();

private:
    std::shared_ptr<Notifier::State> s_;
};

}  // namespace tensorplay::detail
