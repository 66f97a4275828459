// ResumeSlot: a one-shot wait that resumes its waiter in place. Asio's channels and timers always
// post their completions, and every posted handler costs the event loop one more epoll_wait(0);
// on the RPC round trip that is a system call on each side. A slot dispatches instead: a waiter
// on the completing thread's executor runs at once, inside complete().
#pragma once

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/query.hpp>

#include "core/asio_compat.hpp"
#include "core/asio_compat_internals.hpp"
#include "core/recycled.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/awaitable.hpp>
#include <asio/version.hpp>

// wait() parks the awaiting coroutine itself (ParkedCoroutine, core/asio_compat_internals.hpp); without
// TP_ASIO_INTERNALS it is a coroutine over async_wait.
#define TP_DIRECT_WAIT TP_ASIO_INTERNALS

#include <atomic>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>

namespace tensorplay::detail {

/// Runs `h(args...)` now when its executor is an io_context running on this thread, else through
/// asio::dispatch (which, for the same case, would first wrap the handler in one more allocation).
template <class Handler, class... Args>
void resume_in_place(Handler&& h, Args... args) {
    auto ex = asio::get_associated_executor(h);
    if (auto* io = target_of<asio::io_context::executor_type>(ex); io && io->running_in_this_thread()) {
        std::move(h)(args...);
        return;
    }
    asio::dispatch(ex, [h = std::move(h), args...]() mutable { std::move(h)(args...); });
}

class ResumeSlot;

/// Per event loop: the slots with a parked waiter. When the event loop is destroyed (its services
/// shut down), the waiters still parked are destroyed, as Asio destroys the handlers of pending
/// operations; otherwise a coroutine parked in a slot that its own frame owns would leak.
class SlotRegistry final : public asio::execution_context::service {
public:
    static asio::execution_context::id id;
    explicit SlotRegistry(asio::execution_context& ctx);
    /// The registry of the event loop behind `ex` (takes the context's service mutex: cache it).
    template <class Executor>
    static SlotRegistry& of(const Executor& ex) {
        return asio::use_service<SlotRegistry>(asio::query(ex, asio::execution::context));
    }

private:
    friend class ResumeSlot;
    void add(ResumeSlot* s);
    void remove(ResumeSlot* s);
    void unlink(ResumeSlot* s);  // with mutex_ held
    void shutdown() override;

    /// Guards the list: held for a few stores per wait, so a spin lock (a pthread mutex pair cost
    /// more than the list operations it guarded, twice per call on each side).
    class SpinLock {
    public:
        void lock() noexcept {
            while (flag_.test_and_set(std::memory_order_acquire))
                while (flag_.test(std::memory_order_relaxed)) {
                }
        }
        void unlock() noexcept { flag_.clear(std::memory_order_release); }

    private:
        std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
    };
    SpinLock mutex_;
    ResumeSlot* head_ = nullptr;
    bool shut_ = false;
};

/// One waiter at a time, completed once with an error_code. Wait and complete on one executor (a
/// strand or a single-threaded context); only taking the waiter is atomic (complete_with). Cancellation of the wait (per-operation
/// cancellation, as `||` and with_timeout emit) completes it with operation_aborted, posted.
///
/// Ownership: whoever holds a slot with a waiter in it holds that waiter's coroutine; destroying
/// the slot (or abandon()) destroys the parked coroutine. A tracked slot (the default) is also
/// listed with its event loop's SlotRegistry while a waiter is parked, so that destroying the
/// event loop destroys the waiter; `untracked` is for slots that an Asio operation owns already.
class ResumeSlot {
public:
    struct Untracked {};
    static constexpr Untracked untracked{};

    /// `registry`: the waiters' event loop's registry, when known (else looked up at the first wait).
    explicit ResumeSlot(SlotRegistry* registry = nullptr) : registry_(registry) {}
    explicit ResumeSlot(Untracked) : tracked_(false) {}
    ResumeSlot(const ResumeSlot&) = delete;
    ResumeSlot& operator=(const ResumeSlot&) = delete;
    ~ResumeSlot() { take(); }

    /// True while a waiter is parked here.
    [[nodiscard]] bool waiting() const noexcept { return waiter_.load(std::memory_order_acquire) != nullptr; }

    /// Parks the caller until complete() (or cancellation). One waiter at a time.
    template <class Token>
    auto async_wait(Token&& token) {
        return async_wait(std::forward<Token>(token), [] {});
    }

    /// As async_wait, then calls `start()` once the waiter is parked: for starting what will
    /// complete the slot when that may happen at once on another thread. After start() returns,
    /// the slot may already be gone.
    template <class Token, class Start>
    auto async_wait(Token&& token, Start start) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [this](auto handler, Start go) {
                using H = decltype(handler);
                if (tracked_ && !registry_) registry_ = &SlotRegistry::of(asio::get_associated_executor(handler));
                auto* w = recycled_new<Waiter<H>>(std::move(handler), this);
                if (tracked_) registry_->add(this);
                waiter_.store(w, std::memory_order_release);
                go();
            },
            token, std::move(start));
    }

    /// Whether a wait() ends when the awaiting coroutine is cancelled.
    enum class OnCancel : std::uint8_t { end, ignore };

    /// `co_await slot.wait();` parks the awaiting coroutine (a Task, on an any_io_executor) until
    /// complete() or cancellation, as async_wait does; error() then says how it ended. The waiter
    /// holds the coroutine itself: no initiation coroutine, no completion handler wrapped around
    /// it (about 350 instructions less per wait than async_wait(use_awaitable)). `ignore`: only
    /// complete() ends it (for a waiter that its owner always wakes: installing the canceller in a
    /// connected slot costs some 75 instructions per wait).
    auto wait(OnCancel on_cancel = OnCancel::end);

    /// How the last wait() ended: clear when completed without an error.
    [[nodiscard]] std::error_code error() const noexcept { return error_; }

    /// Resumes the waiter with `ec`: in place when called on its executor, else through it.
    /// Does nothing when no one waits.
    void complete(std::error_code ec = {}) {
        if (auto w = take()) w->resume(ec);
    }

    /// As complete(), always through the waiter's executor (posted): for a wake-up that should
    /// run after the caller's turn of the event loop, not inside it. Does nothing when no one waits.
    void complete_later(std::error_code ec = {}) {
        if (auto w = take()) w->resume_later(ec);
    }

    /// As complete(), but runs `before()` first, once the waiter is taken (so it cannot be
    /// cancelled any more): for handing it results. Returns false (and runs nothing) when no one
    /// waits. The taking is atomic: an untracked slot may be completed from another thread than
    /// the one that cancels its waiter.
    template <class F>
    bool complete_with(std::error_code ec, F&& before) {
        auto w = take();
        if (!w) return false;
        before();
        w->resume(ec);
        return true;
    }

    /// Destroys the waiter without resuming it (Asio unwinds its coroutine through its executor).
    void abandon() { take(); }

private:
    friend class SlotRegistry;

    struct WaiterBase {
        virtual void resume(std::error_code ec) = 0;
        virtual void resume_later(std::error_code ec) = 0;
        virtual void destroy() noexcept = 0;

    protected:
        ~WaiterBase() = default;
    };
    struct Destroy {
        void operator()(WaiterBase* w) const noexcept { w->destroy(); }
    };
    using WaiterPtr = std::unique_ptr<WaiterBase, Destroy>;

    template <class H>
    struct Waiter final : WaiterBase {
        Waiter(H&& h, ResumeSlot* owner) : handler(std::move(h)) {
            auto cs = asio::get_associated_cancellation_slot(handler);
            if (cs.is_connected()) cs.template emplace<Canceller>(owner);
        }
        void destroy() noexcept override { recycled_delete(this); }
        void resume(std::error_code ec) override {
            // Our canceller goes first: the slot that holds it may be gone before the waiter runs.
            auto cs = asio::get_associated_cancellation_slot(handler);
            if (cs.is_connected()) cs.clear();
            resume_in_place(std::move(handler), ec);
        }
        void resume_later(std::error_code ec) override {
            auto ex = asio::get_associated_executor(handler);
            asio::post(ex, [h = std::move(handler), ec]() mutable { std::move(h)(ec); });
        }
        H handler;
    };

#if TP_DIRECT_WAIT
    /// The waiter of wait(): the coroutine itself.
    struct DirectWaiter final : WaiterBase {
        DirectWaiter(ParkedCoroutine::Detached running, ResumeSlot* owner, bool cancellable) : coro(running), slot(owner) {
            if (!cancellable) return;
            auto cs = coro.get_cancellation_slot();
            if (cs.is_connected()) cs.template emplace<Canceller>(owner);
        }
        void destroy() noexcept override { recycled_delete(this); }
        void resume(std::error_code ec) override {
            slot->error_ = ec;  // (the slot outlives the wait: its coroutine owns it)
            if (auto cs = coro.get_cancellation_slot(); cs.is_connected()) cs.clear();
            resume_in_place(std::move(coro));
        }
        void resume_later(std::error_code ec) override {
            slot->error_ = ec;
            auto ex = coro.get_executor();
            asio::post(ex, std::move(coro));
        }
        ParkedCoroutine coro;
        ResumeSlot* slot;
    };
#endif

    /// Lives in the waiter's cancellation slot; the waiter's coroutine clears it when it resumes.
    /// (A constructor, not an aggregate: the slot's emplace constructs it with parentheses, which
    /// clang 14 does not accept for aggregates.)
    struct Canceller {
        explicit Canceller(ResumeSlot* o) noexcept : owner(o) {}
        ResumeSlot* owner;
        void operator()(asio::cancellation_type type) const {
            if (type == asio::cancellation_type::none) return;
            // Posted: this runs inside the cancellation slot, which resuming would clear.
            if (auto w = owner->take()) w->resume_later(asio::error::operation_aborted);
        }
    };

    /// Removes the waiter (and this slot from the registry's list); one taker wins.
    WaiterPtr take() {
        WaiterPtr w(waiter_.exchange(nullptr, std::memory_order_acq_rel));
        if (w && linked_) registry_->remove(this);
        return w;
    }

    std::atomic<WaiterBase*> waiter_{nullptr};
    std::error_code error_;  // how the last wait() ended
    SlotRegistry* registry_ = nullptr;
    bool tracked_ = true;
    bool linked_ = false;  // in registry_'s list (guarded by its mutex)
    ResumeSlot* prev_ = nullptr;
    ResumeSlot* next_ = nullptr;
};

#if TP_DIRECT_WAIT
inline auto ResumeSlot::wait(OnCancel on_cancel) {
    // Runs once the awaiting coroutine is suspended: takes it over and parks it here.
    return park_awaiting([this, on_cancel](ParkedCoroutine::Detached running) {
        auto* w = recycled_new<DirectWaiter>(running, this, on_cancel == OnCancel::end);
        error_ = {};
        if (tracked_ && !registry_) registry_ = &SlotRegistry::of(w->coro.get_executor());
        if (tracked_) registry_->add(this);
        waiter_.store(w, std::memory_order_release);
    });
}
#else
inline auto ResumeSlot::wait(OnCancel on_cancel) {
    return [](ResumeSlot* slot, OnCancel oc) -> asio::awaitable<void> {
        if (oc == OnCancel::ignore) {
            // (An unconnected slot: the awaiting coroutine's cancellation does not reach the wait.)
            auto [ec] = co_await slot->async_wait(asio::bind_cancellation_slot(asio::cancellation_slot(), use_nothrow));
            slot->error_ = ec;
        } else {
            auto [ec] = co_await slot->async_wait(use_nothrow);
            slot->error_ = ec;
        }
    }(this, on_cancel);
}
#endif

// (Inline: every call adds and removes a slot on each side.)
inline void SlotRegistry::add(ResumeSlot* s) {
    std::lock_guard lock(mutex_);
    if (shut_) return;  // the event loop is going: nothing will resume or destroy it but its owner
    s->prev_ = nullptr;
    s->next_ = head_;
    if (head_) head_->prev_ = s;
    head_ = s;
    s->linked_ = true;
}

inline void SlotRegistry::remove(ResumeSlot* s) {
    std::lock_guard lock(mutex_);
    unlink(s);
}

inline void SlotRegistry::unlink(ResumeSlot* s) {
    if (!s->linked_) return;
    if (s->prev_) s->prev_->next_ = s->next_;
    else head_ = s->next_;
    if (s->next_) s->next_->prev_ = s->prev_;
    s->prev_ = s->next_ = nullptr;
    s->linked_ = false;
}

}  // namespace tensorplay::detail
