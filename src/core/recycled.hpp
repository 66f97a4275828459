// Per-thread free lists of small blocks, for the objects that come and go on every RPC call.
#pragma once

#include <cstddef>
#include <new>
#include <utility>

namespace tensorplay::detail {

/// Memory for a waiter, an operation or a container node from per-thread free lists of small
/// blocks (malloc beyond them); `size` must match between the two calls. A block may be freed on
/// another thread than the one that allocated it.
void* recycled_allocate(std::size_t size);
void recycled_free(void* p, std::size_t size) noexcept;

/// A T built in a recycled block; pair with recycled_delete.
template <class T, class... Args>
T* recycled_new(Args&&... args) {
    void* mem = recycled_allocate(sizeof(T));
    try {
        return new (mem) T(std::forward<Args>(args)...);
    } catch (...) {
        recycled_free(mem, sizeof(T));
        throw;
    }
}

/// Destroys a T from recycled_new and returns its block.
template <class T>
void recycled_delete(T* p) noexcept {
    p->~T();
    recycled_free(p, sizeof(T));
}

/// A standard allocator over the same lists: for the nodes of containers that gain and lose an
/// entry on every call (a call's pending entry, its deadline).
template <class T>
struct RecyclingAllocator {
    using value_type = T;
    RecyclingAllocator() = default;
    template <class U>
    RecyclingAllocator(const RecyclingAllocator<U>&) noexcept {}
    T* allocate(std::size_t n) { return static_cast<T*>(recycled_allocate(n * sizeof(T))); }
    void deallocate(T* p, std::size_t n) noexcept { recycled_free(p, n * sizeof(T)); }
    template <class U>
    friend bool operator==(const RecyclingAllocator&, const RecyclingAllocator<U>&) noexcept {
        return true;
    }
};

}  // namespace tensorplay::detail
