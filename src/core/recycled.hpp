// Per-thread free lists of small blocks, for the objects that come and go on every RPC call, and
// per-thread recycled payload buffers: the bytes of every message a call receives are copied out of
// the connection's read buffer into a buffer of their own, and the bytes of every message it sends
// are let go once written; a thread keeps the last few it let go, so that at steady state a reply's
// bytes reuse the request's (0 allocations per call, tests/rpc/alloc_per_call_test.cpp).
#pragma once

#include <tensorplay/core/bytes.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <utility>

namespace tensorplay::detail {

namespace recycled_lists {

/// Per-thread free lists of small blocks, by size in steps of 16 bytes. (Asio's own per-thread
/// cache keeps eight blocks of any size for its operations; sharing it, blocks of one size kept
/// being evicted for another and every call went to malloc.)
class FreeLists {
public:
    static constexpr std::size_t kStep = 16, kClasses = 24, kKeep = 256;

    FreeLists() = default;
    FreeLists(const FreeLists&) = delete;
    FreeLists& operator=(const FreeLists&) = delete;
    ~FreeLists();
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

/// This thread's lists: a plain pointer (trivially destructible, so reading it needs no
/// initialisation check); null until the thread's first allocation, `&gone` once the thread's
/// lists were deleted at its exit (blocks freed later on it go to operator delete).
inline thread_local FreeLists* lists = nullptr;
extern FreeLists gone;
/// Makes this thread's lists (its first allocation) and registers their deletion at thread exit.
[[nodiscard]] FreeLists* make();

}  // namespace recycled_lists

/// Memory for a waiter, an operation or a container node from per-thread free lists of small
/// blocks (malloc beyond them); `size` must match between the two calls. A block may be freed on
/// another thread than the one that allocated it. (Inline: several per call on each side.)
inline void* recycled_allocate(std::size_t size) {
    recycled_lists::FreeLists* l = recycled_lists::lists;
    if (l == nullptr) [[unlikely]] l = recycled_lists::make();
    return l == &recycled_lists::gone ? ::operator new(size) : l->allocate(size);
}
inline void recycled_free(void* p, std::size_t size) noexcept {
    recycled_lists::FreeLists* l = recycled_lists::lists;
    if (l == nullptr || l == &recycled_lists::gone) [[unlikely]] {
        ::operator delete(p);
        return;
    }
    l->free(p, size);
}

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

// ---- payload buffers ----
namespace recycled_payloads {

/// A thread's buffers kept for reuse: at most kKeep, each of at most kMaxCapacity bytes (a larger
/// one costs more to copy than to allocate, and would hold memory).
struct Pool {
    static constexpr std::size_t kKeep = 16, kMaxCapacity = std::size_t{64} << 10;
    Bytes kept[kKeep];
    std::size_t count = 0;
};

/// This thread's pool: null until its first use, `&gone` once deleted at its exit (buffers let go
/// later on this thread are freed).
inline thread_local Pool* pool = nullptr;
extern Pool gone;
/// Makes this thread's pool and registers its deletion at thread exit.
[[nodiscard]] Pool* make();

}  // namespace recycled_payloads

/// A buffer holding a copy of `bytes`: the last buffer this thread let go when it is large enough.
inline Bytes recycled_copy(std::span<const std::uint8_t> bytes) {
    recycled_payloads::Pool* p = recycled_payloads::pool;
    if (p != nullptr && p->count > 0 && p->kept[p->count - 1].capacity() >= bytes.size()) {
        Bytes b = std::move(p->kept[--p->count]);
        b.assign(bytes.begin(), bytes.end());
        return b;
    }
    return Bytes(bytes.begin(), bytes.end());
}

/// Lets `b`'s memory go to this thread's pool (or frees it); `b` is left empty.
inline void recycle(Bytes& b) noexcept {
    using recycled_payloads::Pool;
    Pool* p = recycled_payloads::pool;
    if (b.capacity() == 0 || b.capacity() > Pool::kMaxCapacity) [[unlikely]] {
        Bytes().swap(b);
        return;
    }
    if (p == nullptr) [[unlikely]] p = recycled_payloads::make();
    if (p == &recycled_payloads::gone || p->count == Pool::kKeep) {
        Bytes().swap(b);
        return;
    }
    b.clear();
    p->kept[p->count++].swap(b);
}

}  // namespace tensorplay::detail
