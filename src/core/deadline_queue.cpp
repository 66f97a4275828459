// DeadlineQueue (a list for monotone deadlines, a map for earlier ones) and DeadlineKeeper's sweep.
#include "core/deadline_queue.hpp"

#include "core/asio_compat.hpp"

#include <asio/steady_timer.hpp>

namespace tensorplay::detail {

void DeadlineQueue::add(DeadlineHook& h, Clock::time_point at) {
    h.due_ = at;
    if (!last_ || last_->due_ <= at) {
        h.kept_ = DeadlineHook::Kept::listed;
        h.prev_ = last_;
        h.next_ = nullptr;
        (last_ ? last_->next_ : first_) = &h;
        last_ = &h;
        ++listed_;
    } else {
        h.kept_ = DeadlineHook::Kept::mapped;
        h.mapped_at_ = map_.emplace(at, &h);
    }
}

void DeadlineQueue::remove(DeadlineHook& h) noexcept {
    if (h.kept_ == DeadlineHook::Kept::listed) {
        (h.prev_ ? h.prev_->next_ : first_) = h.next_;
        (h.next_ ? h.next_->prev_ : last_) = h.prev_;
        h.prev_ = h.next_ = nullptr;
        --listed_;
    } else if (h.kept_ == DeadlineHook::Kept::mapped) {
        map_.erase(h.mapped_at_);
    }
    h.kept_ = DeadlineHook::Kept::none;
}

DeadlineHook* DeadlineQueue::earliest() const noexcept {
    DeadlineHook* m = map_.empty() ? nullptr : map_.begin()->second;
    if (!first_) return m;
    return m && m->due_ < first_->due_ ? m : first_;
}

struct DeadlineKeeper::State {
    State(Executor ex, TaskGroup& g, std::function<void(DeadlineHook&)> f)
        : timer(std::move(ex)), tasks(&g), on_due(std::move(f)) {}
    DeadlineQueue queue;
    asio::steady_timer timer;
    Clock::time_point armed_at = Clock::time_point::max();
    TaskGroup* tasks;  // (the owner's: it outlives the keeper's use of it, which ends with close())
    std::function<void(DeadlineHook&)> on_due;
    bool sweeping = false;
    bool closed = false;
};

namespace {
/// Waits for the timer and expires what is due, until closed. Holds the state: the keeper may go
/// while it waits (its destructor closes it, which cancels the wait).
Task<void> sweep(std::shared_ptr<DeadlineKeeper::State> s) {
    while (!s->closed) {
        auto [ec] = co_await s->timer.async_wait(use_nothrow);
        if (s->closed) break;
        if (ec) continue;  // re-armed for an earlier deadline
        const auto next = s->queue.expire(Clock::now(), [&s](DeadlineHook& h) {
            if (!s->closed) s->on_due(h);
        });
        if (s->closed) break;
        s->armed_at = next;  // (what on_due added is in `next`)
        s->timer.expires_at(next);
    }
    s->sweeping = false;
}
}  // namespace

DeadlineKeeper::DeadlineKeeper(Executor ex, TaskGroup& tasks, std::function<void(DeadlineHook&)> on_due)
    : s_(std::make_shared<State>(std::move(ex), tasks, std::move(on_due))) {}

DeadlineKeeper::~DeadlineKeeper() { close(); }

void DeadlineKeeper::add(DeadlineHook& h, Clock::time_point at) {
    if (at == Clock::time_point::max()) return;
    auto& s = *s_;
    s.queue.add(h, at);
    if (s.closed) return;
    if (at < s.armed_at) {
        s.armed_at = at;
        s.timer.expires_at(at);  // (cancels the wait: the sweep waits again, for this one)
    }
    if (!s.sweeping) s.sweeping = s.tasks->spawn(sweep(s_), "a deadline sweep");
}

void DeadlineKeeper::remove(DeadlineHook& h) noexcept { s_->queue.remove(h); }

std::size_t DeadlineKeeper::size() const noexcept { return s_->queue.size(); }

void DeadlineKeeper::close() {
    if (s_->closed) return;
    s_->closed = true;
    s_->timer.cancel();
}

}  // namespace tensorplay::detail
