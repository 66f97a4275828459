// cma leases: how a reader knows that the tensors it just read from a peer's memory were still
// held by that peer through the whole read. A sender lets go of its holds when its connection
// closes, and the reader may be in the middle of reading them (the frame was already on the
// wire): without a check it would hand over bytes of memory that was freed, or reused, meanwhile.
//
// Each process has one lease table, a static array that lives as long as the process. A hold
// takes a slot and writes its lease id there; releasing writes 0 (then a fence) before the held
// tensors may go. The reader reads the word after the tensors: the id still there means that no
// release began before the copy ended.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace tensorplay::detail::cma {

/// Slots in a process's lease table: a frame by reference beyond this many held at once goes
/// inline instead.
inline constexpr std::size_t kLeaseSlots = std::size_t(1) << 14;

/// One hold's lease. Move-only; destroying it (or release()) marks it let go.
class Lease {
public:
    Lease() = default;
    /// A fresh lease, or nullopt when every slot is taken. Thread-safe.
    [[nodiscard]] static std::optional<Lease> acquire();
    Lease(Lease&& o) noexcept : id_(o.id_) { o.id_ = 0; }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }

    /// Unique in this process for its lifetime (never 0 while held): the frame's hold.
    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
    /// Marks the lease let go (its word cleared, then a full fence): what the holder frees after
    /// this is no longer read as valid. Idempotent.
    void release() noexcept;

private:
    explicit Lease(std::uint64_t id) noexcept : id_(id) {}
    std::uint64_t id_ = 0;
};

/// The address of this process's lease table (it goes in the cma offer).
[[nodiscard]] std::uint64_t lease_table_address() noexcept;

/// Whether lease `id` is still held in process `pid`, whose lease table is at `table`: reads its
/// word (one 8-byte process_vm_readv) after a fence that orders it after the reads before. False
/// when it cannot be read or the id names no slot.
[[nodiscard]] bool lease_held(int pid, std::uint64_t table, std::uint64_t id) noexcept;

}  // namespace tensorplay::detail::cma
