// SlotRegistry: destroys the waiters still parked in ResumeSlots when their event loop goes.
#include "core/resume_slot.hpp"

namespace tensorplay::detail {

asio::execution_context::id SlotRegistry::id;

SlotRegistry::SlotRegistry(asio::execution_context& ctx) : asio::execution_context::service(ctx) {}

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
