// DeadlineQueue: the deadlines of many waiting things, earliest first; DeadlineKeeper: that queue
// with the one timer that fires at its earliest deadline (no timer per waiting thing: arming one
// costs a timerfd_settime system call each time).
#pragma once

#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>

#include "core/recycled.hpp"
#include "core/task_group.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

namespace tensorplay::detail {

class DeadlineQueue;

/// What a DeadlineQueue links: embed it (as a base) in whatever has a deadline. An entry must be
/// removed from its queue before it is destroyed.
class DeadlineHook {
public:
    DeadlineHook() = default;
    DeadlineHook(const DeadlineHook&) = delete;
    DeadlineHook& operator=(const DeadlineHook&) = delete;

    /// The deadline it was added with (meaningful while queued).
    [[nodiscard]] Clock::time_point due() const noexcept { return due_; }
    /// Whether it is in a queue now.
    [[nodiscard]] bool queued() const noexcept { return kept_ != Kept::none; }

private:
    friend class DeadlineQueue;
    using Map = std::multimap<Clock::time_point, DeadlineHook*, std::less<Clock::time_point>,
                              RecyclingAllocator<std::pair<const Clock::time_point, DeadlineHook*>>>;
    enum class Kept : std::uint8_t { none, listed, mapped };
    Clock::time_point due_{};
    Kept kept_ = Kept::none;
    DeadlineHook* prev_ = nullptr;  // neighbours in the list
    DeadlineHook* next_ = nullptr;
    Map::iterator mapped_at_;
};

/// Deadlines, earliest first. A deadline no earlier than the latest one queued joins a list in
/// O(1) (with one common timeout, every deadline does); an earlier one goes into a map, O(log n).
/// Not thread-safe: one strand.
class DeadlineQueue {
public:
    DeadlineQueue() = default;
    DeadlineQueue(const DeadlineQueue&) = delete;
    DeadlineQueue& operator=(const DeadlineQueue&) = delete;

    /// Queues `h` (not queued) for `at`.
    void add(DeadlineHook& h, Clock::time_point at);
    /// Takes `h` out; nothing when it is not queued.
    void remove(DeadlineHook& h) noexcept;
    /// The entry with the earliest deadline, or null.
    [[nodiscard]] DeadlineHook* earliest() const noexcept;
    [[nodiscard]] bool empty() const noexcept { return !first_ && map_.empty(); }
    [[nodiscard]] std::size_t size() const noexcept { return listed_ + map_.size(); }

    /// Takes out every entry due at `now` or earlier, earliest first, and calls `f(hook)` for each
    /// once it is out (f may add and remove entries; one it adds that is due is taken too).
    /// Returns the earliest deadline left, or time_point::max().
    template <class F>
    Clock::time_point expire(Clock::time_point now, F&& f) {
        for (DeadlineHook* h = earliest(); h && h->due_ <= now; h = earliest()) {
            remove(*h);
            f(*h);
        }
        DeadlineHook* next = earliest();
        return next ? next->due_ : Clock::time_point::max();
    }

private:
    DeadlineHook* first_ = nullptr;  // the list, earliest first
    DeadlineHook* last_ = nullptr;
    std::size_t listed_ = 0;
    DeadlineHook::Map map_;
};

/// A DeadlineQueue and the one timer that fires at its earliest deadline: the timer is re-armed
/// only when a new deadline is earlier than the one it waits for, and its sweeping coroutine
/// (a member of the owner's TaskGroup) calls `on_due` for each entry whose deadline passed.
/// Strand-bound to the executor it was made with; `on_due` runs there and may add and remove.
class DeadlineKeeper {
public:
    DeadlineKeeper(Executor ex, TaskGroup& tasks, std::function<void(DeadlineHook&)> on_due);
    ~DeadlineKeeper();
    DeadlineKeeper(const DeadlineKeeper&) = delete;
    DeadlineKeeper& operator=(const DeadlineKeeper&) = delete;

    /// Queues `h` for `at` (time_point::max(): never, not queued).
    void add(DeadlineHook& h, Clock::time_point at);
    /// Takes `h` out (nothing when it is not queued).
    void remove(DeadlineHook& h) noexcept;
    /// Entries queued now.
    [[nodiscard]] std::size_t size() const noexcept;
    /// Stops the timer for good: no `on_due` call after this. Entries stay queued until removed.
    void close();

    struct State;

private:
    std::shared_ptr<State> s_;
};

}  // namespace tensorplay::detail
