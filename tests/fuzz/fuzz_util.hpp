// Helpers shared by the libFuzzer harnesses: a check that aborts with a message (libFuzzer then
// saves the input), and a record of the largest single allocation made inside a scope.
#pragma once

#include <sanitizer/allocator_interface.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

/// Aborts (a finding) when `cond` is false, naming the harness's invariant.
#define TP_FUZZ_CHECK(cond)                                                                      \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            std::abort();                                                                        \
        }                                                                                        \
    } while (0)

namespace tensorplay::fuzz {

namespace detail {
inline std::atomic<std::size_t> largest_allocation{0};
inline std::atomic<bool> tracking{false};
inline void on_malloc(const volatile void*, std::size_t size) {
    if (!tracking.load(std::memory_order_relaxed)) return;
    std::size_t cur = largest_allocation.load(std::memory_order_relaxed);
    while (size > cur && !largest_allocation.compare_exchange_weak(cur, size, std::memory_order_relaxed)) {
    }
}
inline void on_free(const volatile void*) {}
inline const int hooks_installed = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
}  // namespace detail

/// While alive, records the largest single allocation (a decoder must not allocate much more
/// than the bytes it was given: a length read from the input is checked before it is trusted).
class AllocationBound {
public:
    AllocationBound() {
        detail::largest_allocation.store(0, std::memory_order_relaxed);
        detail::tracking.store(true, std::memory_order_relaxed);
    }
    ~AllocationBound() { detail::tracking.store(false, std::memory_order_relaxed); }
    AllocationBound(const AllocationBound&) = delete;
    AllocationBound& operator=(const AllocationBound&) = delete;
    [[nodiscard]] std::size_t largest() const { return detail::largest_allocation.load(std::memory_order_relaxed); }
    /// The rule every harness applies: at most 8 bytes per input byte plus 64 KiB (messages, maps).
    [[nodiscard]] bool within(std::size_t input_size) const { return largest() <= 8 * input_size + 64 * 1024; }
};

/// Reads bytes off the front of the fuzzer's input (for harnesses that need a few choices first).
class Input {
public:
    Input(const std::uint8_t* data, std::size_t size) : data_(data, size) {}
    [[nodiscard]] std::uint8_t byte() {
        if (data_.empty()) return 0;
        const auto b = data_[0];
        data_ = data_.subspan(1);
        return b;
    }
    [[nodiscard]] std::span<const std::uint8_t> take(std::size_t n) {
        n = n < data_.size() ? n : data_.size();
        auto out = data_.first(n);
        data_ = data_.subspan(n);
        return out;
    }
    [[nodiscard]] std::span<const std::uint8_t> rest() const { return data_; }
    [[nodiscard]] bool empty() const { return data_.empty(); }

private:
    std::span<const std::uint8_t> data_;
};

}  // namespace tensorplay::fuzz
