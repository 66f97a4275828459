// SlotRegistry: destroys the waiters still parked in ResumeSlots when their event loop goes.
#include "core/resume_slot.hpp"

namespace tensorplay::detail {

asio::execution_context::id SlotRegistry::id;

SlotRegistry::SlotRegistry(asio::execution_context& ctx) : asio::execution_context::service(ctx) {}

void SlotRegistry::add(ResumeSlot* s) {
    std::lock_guard lock(mutex_);
    if (shut_) return;  // the event loop is going: nothing will resume or destroy it but its owner
    s->prev_ = nullptr;
    s->next_ = head_;
    if (head_) head_->prev_ = s;
    head_ = s;
    s->linked_ = true;
}

void SlotRegistry::remove(ResumeSlot* s) {
    std::lock_guard lock(mutex_);
    unlink(s);
}

void SlotRegistry::unlink(ResumeSlot* s) {
    if (!s->linked_) return;
    if (s->prev_) s->prev_->next_ = s->next_;
    else head_ = s->next_;
    if (s->next_) s->next_->prev_ = s->prev_;
    s->prev_ = s->next_ = nullptr;
    s->linked_ = false;
}

void SlotRegistry::shutdown() {
    // One at a time, without the lock: destroying a waiter may destroy other slots.
    for (;;) {
        ResumeSlot* s = nullptr;
        {
            std::lock_guard lock(mutex_);
            if (!head_) {
                shut_ = true;
                return;
            }
            s = head_;
            unlink(s);
        }
        s->abandon();
    }
}

}  // namespace tensorplay::detail
