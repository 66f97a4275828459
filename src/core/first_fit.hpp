// Private: first-fit ranges of one buffer (the pinned staging pool, a cuda_ipc outbox).
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>

namespace tensorplay::detail {

/// Offsets of ranges in a buffer of `size` bytes, handed out first fit in units of `unit` bytes
/// and merged with their neighbours when given back. Thread-safe.
class FirstFit {
public:
    FirstFit(std::size_t size, std::size_t unit) : unit_(unit) {
        if (size != 0) free_[0] = size;
    }
    /// The offset of a free range of `n` bytes (0 counts as 1), or nullopt when none is free now.
    [[nodiscard]] std::optional<std::size_t> take(std::size_t n) {
        const std::size_t len = round(n);
        std::lock_guard lock(mutex_);
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            if (it->second < len) continue;
            const auto off = it->first;
            const auto rest = it->second - len;
            free_.erase(it);
            if (rest != 0) free_[off + len] = rest;
            return off;
        }
        return std::nullopt;
    }
    /// Gives back the range `take(n)` returned at `off`.
    void give(std::size_t off, std::size_t n) noexcept {
        std::size_t len = round(n);
        std::lock_guard lock(mutex_);
        auto next = free_.lower_bound(off);
        if (next != free_.end() && off + len == next->first) {  // merge with the following range
            len += next->second;
            next = free_.erase(next);
        }
        if (next != free_.begin()) {  // and with the preceding one
            auto prev = std::prev(next);
            if (prev->first + prev->second == off) {
                prev->second += len;
                return;
            }
        }
        free_[off] = len;
    }

private:
    [[nodiscard]] std::size_t round(std::size_t n) const noexcept { return ((n == 0 ? 1 : n) + unit_ - 1) / unit_ * unit_; }

    std::size_t unit_;
    std::mutex mutex_;
    std::map<std::size_t, std::size_t> free_;  ///< offset -> length
};

}  // namespace tensorplay::detail
