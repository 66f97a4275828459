// Per-thread free lists of small blocks: their creation on a thread's first allocation and their
// deletion at its exit (the fast paths are inline in recycled.hpp).
#include "core/recycled.hpp"

namespace tensorplay::detail::recycled_lists {

FreeLists gone;

namespace {

/// Deletes this thread's lists at its exit and points `lists` at `gone`, so that blocks freed
/// later on this thread (by objects destroyed after it) go to operator delete.
struct ListsOwner {
    FreeLists* owned = nullptr;
    ~ListsOwner() {
        lists = &gone;
        delete owned;
    }
};
thread_local ListsOwner owner;

}  // namespace

FreeLists::~FreeLists() {
    for (auto* head : heads_)
        while (head) {
            Node* next = head->next;
            ::operator delete(head);
            head = next;
        }
}

FreeLists* make() {
    if (lists == nullptr) {
        lists = new FreeLists;
        owner.owned = lists;  // (its first use registers its destructor)
    }
    return lists;
}

}  // namespace tensorplay::detail::recycled_lists
