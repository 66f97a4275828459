// The byte ring in shared memory that one shm connection direction uses: its layout and the two
// views of it (the writer's and the reader's), free of I/O so that they are tested in one process.
#pragma once

#include <tensorplay/core/result.hpp>

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

namespace tensorplay::detail::shm {

inline constexpr std::uint64_t kRingMagic = 0x31474e4952505421ull;  // "!TPRING1" little-endian
inline constexpr std::uint32_t kRingVersion = 1;
inline constexpr std::size_t kCacheLine = 64;
/// Where the data starts in the mapping: the header has a page to itself.
inline constexpr std::size_t kDataOffset = 4096;
inline constexpr std::size_t kMinRingBytes = 4096;
inline constexpr std::size_t kMaxRingBytes = std::size_t(1) << 30;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the ring needs lock-free 64-bit atomics");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "the ring needs lock-free 32-bit atomics");

/// The header at the start of a ring's shared mapping. Positions count bytes ever written (tail)
/// and ever consumed (head); index = position mod capacity. Each side writes only its own cache
/// line (the writer's: tail and writer_waiting; the reader's: head and reader_waiting), except
/// that a side clears the other's waiting flag when it rings that side's doorbell.
struct RingHeader {
    // Written once by the ring's creator (its reader) before the mapping is shared.
    std::uint64_t magic;
    std::uint32_t version;
    std::uint32_t reserved;
    std::uint64_t capacity;     ///< data bytes, a power of two
    std::uint64_t data_offset;  ///< kDataOffset

    alignas(kCacheLine) std::atomic<std::uint64_t> tail;  ///< written by the writer (release)
    std::atomic<std::uint32_t> writer_waiting;            ///< the writer sleeps until space frees up

    alignas(kCacheLine) std::atomic<std::uint64_t> head;  ///< written by the reader (release)
    std::atomic<std::uint32_t> reader_waiting;            ///< the reader sleeps until bytes come
};

static_assert(sizeof(RingHeader) <= kDataOffset);

/// Bytes a mapping of a ring with `capacity` data bytes has.
[[nodiscard]] constexpr std::size_t mapping_bytes(std::size_t capacity) noexcept { return kDataOffset + capacity; }

/// Whether `capacity` is a ring size this build accepts (a power of two in [kMinRingBytes, max]).
[[nodiscard]] bool valid_capacity(std::uint64_t capacity, std::size_t max = kMaxRingBytes) noexcept;

/// Writes the header of a fresh ring into `base` (a zeroed mapping of mapping_bytes(capacity)).
void init_ring(void* base, std::size_t capacity) noexcept;

/// Checks a mapped ring's header against what its creator claimed: magic, version, capacity,
/// offset, and positions that make sense. The message says which field was wrong.
[[nodiscard]] Result<void> check_ring(const void* base, std::size_t mapped_bytes, std::size_t claimed_capacity);

/// A ring seen from one side. `capacity` is the one checked at setup, kept here, never re-read
/// from shared memory (the peer may scribble on the header at any time: every position read from
/// it is checked before it is used, and a bad one is a protocol_error).
class RingView {
public:
    RingView() = default;
    RingView(void* base, std::size_t capacity) noexcept
        : hdr_(static_cast<RingHeader*>(base)), data_(static_cast<std::uint8_t*>(base) + kDataOffset),
          cap_(capacity), mask_(capacity - 1) {}

    [[nodiscard]] std::size_t capacity() const noexcept { return cap_; }
    [[nodiscard]] RingHeader* header() const noexcept { return hdr_; }

    // ---- the writer's side ----

    /// Copies as much of `iov` as fits (stopping at the first byte that does not), publishes it
    /// with a release store of the tail, and returns the count (0: the ring is full).
    [[nodiscard]] Result<std::size_t> write(std::span<const iovec> iov) ;
    /// Free bytes now (acquire: the reader's copies out of them are done).
    [[nodiscard]] Result<std::size_t> free_bytes() const ;

    // ---- the reader's side ----

    /// Copies up to `dst.size()` buffered bytes into `dst`, releases their space with a release
    /// store of the head, and returns the count (0: the ring is empty).
    [[nodiscard]] Result<std::size_t> read(std::span<std::uint8_t> dst) ;
    /// Buffered bytes now (acquire: the writer's copies into them are visible).
    [[nodiscard]] Result<std::size_t> readable_bytes() const ;

private:
    [[nodiscard]] Result<std::size_t> used(std::uint64_t head, std::uint64_t tail) const ;

    RingHeader* hdr_ = nullptr;
    std::uint8_t* data_ = nullptr;
    std::size_t cap_ = 0;
    std::size_t mask_ = 0;
    // This side's own position (a fresh ring starts at 0): only this side writes it, so it is
    // kept here rather than read back from memory the peer can write.
    std::uint64_t own_tail_ = 0;
    std::uint64_t own_head_ = 0;
};

/// The sleep handshake (both sides, Dekker-style): the sleeper stores its waiting flag, then a
/// seq_cst fence, then looks at the ring again; the other side publishes its position, then a
/// seq_cst fence, then loads the flag. One of them sees the other's store, so a wake-up is never
/// lost: either the sleeper finds the bytes (or space) or the other side rings its doorbell.
/// Returns true when the other side must be woken (it was waiting: the flag is now cleared).
[[nodiscard]] inline bool take_waiter(std::atomic<std::uint32_t>& flag) noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return flag.load(std::memory_order_relaxed) != 0 && flag.exchange(0, std::memory_order_relaxed) != 0;
}

/// The sleeper's half: announce, fence; the caller then looks at the ring once more.
inline void announce_wait(std::atomic<std::uint32_t>& flag) noexcept {
    flag.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace tensorplay::detail::shm
