// Per-thread free lists of small blocks (recycled_allocate / recycled_free).
#include "core/recycled.hpp"

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
        for (auto* head : heads_)
            while (head) {
                Node* next = head->next;
                ::operator delete(head);
                head = next;
            }
    }
    void* allocate(std::size_t size) {
        const std::size_t c = (size + kStep - 1) / kStep;
        if (c == 0 || c > kClasses) return ::operator new(size);
        if (Node* n = heads_[c - 1]) {
            heads_[c - 1] = n->next;
            --counts_[c - 1];
            return n;
        }
        return ::operator new(c * kStep);
    }
    void free(void* p, std::size_t size) noexcept {
        const std::size_t c = (size + kStep - 1) / kStep;
        if (c == 0 || c > kClasses || counts_[c - 1] >= kKeep) {
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
};

/// This thread's lists: a plain pointer (trivially destructible, so reading it is one load with no
/// initialisation check); `owner` deletes them at thread exit and points `lists` at `gone`, so
/// that blocks freed later on this thread (by objects destroyed after it) go to operator delete.
FreeLists gone;
thread_local FreeLists* lists = nullptr;
struct ListsOwner {
    FreeLists* owned = nullptr;
    ~ListsOwner() {
        lists = &gone;
        delete owned;
    }
};
thread_local ListsOwner owner;

FreeLists* this_thread_lists() {
    if (lists == nullptr) {
        lists = new FreeLists;
        owner.owned = lists;  // (its first use registers its destructor)
    }
    return lists;
}

}  // namespace

void* recycled_allocate(std::size_t size) {
    FreeLists* l = this_thread_lists();
    return l == &gone ? ::operator new(size) : l->allocate(size);
}

void recycled_free(void* p, std::size_t size) noexcept {
    FreeLists* l = lists;
    if (l == nullptr || l == &gone) {
        ::operator delete(p);
        return;
    }
    l->free(p, size);
}

}  // namespace tensorplay::detail
