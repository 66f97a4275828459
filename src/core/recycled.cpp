// Per-thread free lists of small blocks and recycled payload buffers: their creation on a thread's
// first use and their deletion at its exit (the fast paths are inline in recycled.hpp).
#include "core/recycled.hpp"

namespace tensorplay::detail {
namespace {

/// Deletes a thread's object at the thread's exit and points the thread's pointer to it at `gone`,
/// so that what is freed later on this thread (by objects destroyed after it) bypasses it.
template <class T>
struct ThreadOwner {
    T* owned = nullptr;
    T** current = nullptr;
    T* gone = nullptr;
    ~ThreadOwner() {
        if (current) *current = gone;
        delete owned;
    }
};

/// The object `current` points to, made on the thread's first use.
template <class T>
T* make_for_thread(T*& current, T& gone, ThreadOwner<T>& owner) {
    if (current == nullptr) {
        current = new T;
        owner.owned = current;  // (its first use registers its destructor)
        owner.current = &current;
        owner.gone = &gone;
    }
    return current;
}

thread_local ThreadOwner<recycled_lists::FreeLists> lists_owner;
thread_local ThreadOwner<recycled_payloads::Pool> pool_owner;

}  // namespace

namespace recycled_lists {

FreeLists gone;

FreeLists::~FreeLists() {
    for (auto* head : heads_)
        while (head) {
            Node* next = head->next;
            ::operator delete(head);
            head = next;
        }
}

FreeLists* make() { return make_for_thread(lists, gone, lists_owner); }

}  // namespace recycled_lists

namespace recycled_payloads {

Pool gone;

Pool* make() { return make_for_thread(pool, gone, pool_owner); }

}  // namespace recycled_payloads
}  // namespace tensorplay::detail
