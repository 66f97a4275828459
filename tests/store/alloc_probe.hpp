// A replaced global operator new for store tests: counts live heap bytes, throws above a size on request.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tensorplay::test::alloc_probe {

/// Bytes allocated through operator new (any form) and not yet freed, as malloc_usable_size counts them.
[[nodiscard]] std::size_t live_bytes() noexcept;

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

/// A field of /proc/self/status ("VmRSS", "VmSize") in bytes; 0 when it cannot be read.
[[nodiscard]] std::size_t proc_status_bytes(const char* field);

}  // namespace tensorplay::test::alloc_probe
