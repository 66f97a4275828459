// SlotRegistry: destroys the waiters still parked in ResumeSlots when their event loop goes.
#include "core/resume_slot.hpp"

#include <new>

namespace tensorplay::detail {

namespace {

/// Per-thread free lists of small blocks, by size in steps of 16 bytes. (Asio's own per-thread
/// cache keeps eight blocks of any size for its operations; sharing it, blocks of one size kept
/// being evicted for another and every call went to malloc.)
class FreeLists {
public:
    static constexpr std::size_t kStep = 16, kClasses = 24, kKeep = 256;

    ~FreeLists() {
        dead_ = true;  // blocks freed later on this thread (by objects destroyed after it) go to delete
        for (auto* head : heads_)
            while (head) {
                Node* next = head->next;
                ::operator delete(head);
                head = next;
            }
    }
    void* allocate(std::size_t size) {
        const std::size_t c = (size + kStep - 1) / kStep;
        if (dead_ || c == 0 || c > kClasses) return ::operator new(size);
        if (Node* n = heads_[c - 1]) {
            heads_[c - 1] = n->next;
            --counts_[c - 1];
            return n;
        }
        return ::operator new(c * kStep);
    }
    void free(void* p, std::size_t size) noexcept {
        const std::size_t c = (size + kStep - 1) / kStep;
        if (dead_ || c == 0 || c > kClasses || counts_[c - 1] >= kKeep) {
            ::operator delete(p);
            return;
        }
        heads_[c - 1] = new (p) Node{heads_[c - 1]};
        ++counts_[c - 1];
    }

private:
    struct Node {
        Node* next;
    };
    Node* heads_[kClasses] = {};
    std::size_t counts_[kClasses] = {};
    bool dead_ = false;
};

thread_local FreeLists free_lists;

}  // namespace

void* recycled_allocate(std::size_t size) { return free_lists.allocate(size); }

void recycled_free(void* p, std::size_t size) noexcept { free_lists.free(p, size); }

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
