// Per-thread recycled payload buffers: the bytes of every message a call receives are copied out of
// the connection's read buffer into a buffer of their own, and the bytes of every message it sends
// are let go once written; a thread keeps the last few it let go, so that at steady state a reply's
// bytes reuse the request's (0 allocations per call, tests/rpc/alloc_per_call_test.cpp).
#pragma once

#include <tensorplay/core/bytes.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace tensorplay::detail {

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
