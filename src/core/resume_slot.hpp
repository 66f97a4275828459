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
#include <asio/post.hpp>

#include <memory>
#include <system_error>
#include <utility>

namespace tensorplay::detail {

/// One waiter at a time, completed once with an error_code. Not thread-safe: wait and complete
/// on one executor (a strand or a single-threaded context). Cancellation of the wait (per-operation
/// cancellation, as `||` and with_timeout emit) completes it with operation_aborted, posted.
///
/// Ownership rule: whoever holds a slot with a waiter in it holds that waiter's coroutine. If the
/// slot is destroyed without completing, the waiting coroutine is destroyed with it, so a slot must
/// not be owned by the coroutine that waits on it unless something else completes it for sure.
class ResumeSlot {
public:
    ResumeSlot() = default;
    ResumeSlot(const ResumeSlot&) = delete;
    ResumeSlot& operator=(const ResumeSlot&) = delete;
    ~ResumeSlot() {
        // Released first: destroying the waiter may destroy the frame this slot lives in.
        delete waiter_.release();
    }

    /// True while a waiter is parked here.
    [[nodiscard]] bool waiting() const noexcept { return waiter_ != nullptr; }

    /// Parks the caller until complete() (or cancellation). One waiter at a time.
    template <class Token>
    auto async_wait(Token&& token) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [this](auto handler) {
                using H = decltype(handler);
                waiter_ = std::make_unique<Waiter<H>>(std::move(handler), this);
            },
            token);
    }

    /// Destroys the waiter without resuming it (Asio unwinds its coroutine through its executor).
    void abandon() { delete waiter_.release(); }

    /// Resumes the waiter with `ec`: in place when called on its executor, else through it.
    /// Does nothing when no one waits.
    void complete(std::error_code ec = {}) {
        if (auto w = std::move(waiter_)) w->resume(ec);
    }

private:
    struct WaiterBase {
        virtual ~WaiterBase() = default;
        virtual void resume(std::error_code ec) = 0;
        virtual void resume_later(std::error_code ec) = 0;
    };

    template <class H>
    struct Waiter final : WaiterBase {
        Waiter(H&& h, ResumeSlot* owner) : handler(std::move(h)) {
            auto cs = asio::get_associated_cancellation_slot(handler);
            if (cs.is_connected()) cs.template emplace<Canceller>(owner);
        }
        void resume(std::error_code ec) override {
            // Our canceller goes first: the slot that holds it may be gone before the waiter runs.
            auto cs = asio::get_associated_cancellation_slot(handler);
            if (cs.is_connected()) cs.clear();
            auto ex = asio::get_associated_executor(handler);
            asio::dispatch(ex, [h = std::move(handler), ec]() mutable { std::move(h)(ec); });
        }
        void resume_later(std::error_code ec) override {
            auto ex = asio::get_associated_executor(handler);
            asio::post(ex, [h = std::move(handler), ec]() mutable { std::move(h)(ec); });
        }
        H handler;
    };

    /// Lives in the waiter's cancellation slot; the waiter's coroutine clears it when it resumes.
    struct Canceller {
        ResumeSlot* owner;
        void operator()(asio::cancellation_type type) const {
            if (type == asio::cancellation_type::none) return;
            // Posted: this runs inside the cancellation slot, which resuming would clear.
            if (auto w = std::move(owner->waiter_)) w->resume_later(asio::error::operation_aborted);
        }
    };

    std::unique_ptr<WaiterBase> waiter_;
};

}  // namespace tensorplay::detail
