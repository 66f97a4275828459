// cma leases: the process's table of lease words and its free slots.
#include "transport/channels/cma/cma_lease.hpp"

#include <sys/uio.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace tensorplay::detail::cma {
namespace {

constexpr unsigned kSlotBits = 14;
static_assert((std::size_t(1) << kSlotBits) == kLeaseSlots);
constexpr std::uint64_t kSlotMask = kLeaseSlots - 1;

/// The words peers read. Static storage: the address stays valid while the process lives, so a
/// peer's late read of a slot finds a word (0, or a later lease's id), never unmapped memory.
alignas(64) std::atomic<std::uint64_t> g_words[kLeaseSlots];
static_assert(sizeof(std::atomic<std::uint64_t>) == sizeof(std::uint64_t));

/// The free slots and the generation counter that makes every id unique.
struct Slots {
    std::mutex mutex;
    std::vector<std::uint16_t> free;
    std::uint64_t generation = 0;
    Slots() {
        free.reserve(kLeaseSlots);
        for (std::size_t i = kLeaseSlots; i-- > 0;) free.push_back(static_cast<std::uint16_t>(i));
    }
};

Slots& slots() {
    static Slots s;  // (never destroyed before the leases of static objects: see release())
    return s;
}

}  // namespace

std::optional<Lease> Lease::acquire() {
    auto& s = slots();
    std::uint64_t id;
    {
        std::lock_guard lock(s.mutex);
        if (s.free.empty()) return std::nullopt;
        const std::uint64_t slot = s.free.back();
        s.free.pop_back();
        id = (++s.generation << kSlotBits) | slot;
    }
    g_words[id & kSlotMask].store(id, std::memory_order_release);
    return Lease(id);
}

Lease& Lease::operator=(Lease&& o) noexcept {
    if (this != &o) {
        release();
        id_ = o.id_;
        o.id_ = 0;
    }
    return *this;
}

void Lease::release() noexcept {
    if (id_ == 0) return;
    const std::uint64_t slot = id_ & kSlotMask;
    g_words[slot].store(0, std::memory_order_relaxed);
    // Orders the cleared word before everything the holder does next (freeing, reusing the
    // tensors' memory): a peer that still reads the id has finished its copy before any of it.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    id_ = 0;
    auto& s = slots();
    std::lock_guard lock(s.mutex);
    s.free.push_back(static_cast<std::uint16_t>(slot));
}

std::uint64_t lease_table_address() noexcept { return reinterpret_cast<std::uint64_t>(&g_words[0]); }

bool lease_held(int pid, std::uint64_t table, std::uint64_t id) noexcept {
    if (id == 0 || table == 0) return false;
    // The reads of the tensors (earlier system calls of this thread) come before this one.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::uint64_t word = 0;
    iovec local{&word, sizeof word};
    iovec remote{reinterpret_cast<void*>(table + (id & kSlotMask) * sizeof(std::uint64_t)), sizeof word};
    const auto n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    return n == static_cast<ssize_t>(sizeof word) && word == id;
}

}  // namespace tensorplay::detail::cma
