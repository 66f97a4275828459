// A replaced global operator new for tests with an executable of their own: counts live heap bytes
// and allocations, throws above a size on request, counts the blocks freed that still hold given bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tensorplay::test::alloc_probe {

/// Bytes allocated through operator new (any form) and not yet freed, as malloc_usable_size counts them.
[[nodiscard]] std::size_t live_bytes() noexcept;
/// Blocks allocated through operator new (any form, any thread) since the process started.
[[nodiscard]] std::size_t allocations() noexcept;
/// Blocks allocated through operator new by the calling thread since it started.
[[nodiscard]] std::size_t thread_allocations() noexcept;

/// While alive, every operator new of more than `bytes` throws std::bad_alloc (the nothrow forms
/// return null), as a real allocator does when memory runs out. ASan's own operator new aborts
/// instead of throwing, hence this replacement. Not nestable.
class FailAbove {
public:
    explicit FailAbove(std::size_t bytes) noexcept;
    ~FailAbove();
    FailAbove(const FailAbove&) = delete;
    FailAbove& operator=(const FailAbove&) = delete;
};

/// From now on, every block freed through operator delete is searched for `bytes` (at most 64, not
/// empty) before it goes back to malloc: freed_holding() counts those that still hold them (a
/// secret that was not wiped). Set it before the threads that allocate start.
void watch_freed(std::string_view bytes) noexcept;
/// Blocks freed that held the watched bytes since watch_freed.
[[nodiscard]] std::size_t freed_holding() noexcept;

/// A field of /proc/self/status ("VmRSS", "VmSize") in bytes; 0 when it cannot be read.
[[nodiscard]] std::size_t proc_status_bytes(const char* field);

}  // namespace tensorplay::test::alloc_probe
