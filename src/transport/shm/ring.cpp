// The shared-memory byte ring: copies in and out with acquire/release positions, checked on every read.
#include "transport/shm/ring.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

namespace tensorplay::detail::shm {

bool valid_capacity(std::uint64_t capacity, std::size_t max) noexcept {
    return capacity >= kMinRingBytes && capacity <= max && (capacity & (capacity - 1)) == 0;
}

void init_ring(void* base, std::size_t capacity) noexcept {
    auto* h = new (base) RingHeader{};
    h->magic = kRingMagic;
    h->version = kRingVersion;
    h->capacity = capacity;
    h->data_offset = kDataOffset;
    h->tail.store(0, std::memory_order_relaxed);
    h->head.store(0, std::memory_order_relaxed);
    h->writer_waiting.store(0, std::memory_order_relaxed);
    h->reader_waiting.store(0, std::memory_order_release);
}

Result<void> check_ring(const void* base, std::size_t mapped_bytes, std::size_t claimed_capacity) {
    if (mapped_bytes != mapping_bytes(claimed_capacity))
        return fail(Errc::protocol_error, "shm ring mapping is " + std::to_string(mapped_bytes) + " bytes, but a ring of " +
                                              std::to_string(claimed_capacity) + " bytes needs " +
                                              std::to_string(mapping_bytes(claimed_capacity)));
    const auto* h = static_cast<const RingHeader*>(base);
    if (h->magic != kRingMagic) return fail(Errc::protocol_error, "shm ring header has a bad magic (not a tensorplay ring)");
    if (h->version != kRingVersion)
        return fail(Errc::protocol_error, "shm ring header has version " + std::to_string(h->version) + ", expected " +
                                              std::to_string(kRingVersion));
    if (h->capacity != claimed_capacity)
        return fail(Errc::protocol_error, "shm ring header says " + std::to_string(h->capacity) +
                                              " data bytes, but the setup message claimed " +
                                              std::to_string(claimed_capacity));
    if (h->data_offset != kDataOffset)
        return fail(Errc::protocol_error, "shm ring header has data offset " + std::to_string(h->data_offset));
    if (h->head.load(std::memory_order_acquire) != 0 || h->tail.load(std::memory_order_acquire) != 0)
        return fail(Errc::protocol_error, "shm ring is not fresh (its positions are not zero)");
    return ok();
}

Result<std::size_t> RingView::used(std::uint64_t head, std::uint64_t tail) const {
    const std::uint64_t u = tail - head;  // modular: a tail behind the head shows as huge
    if (u > cap_)
        return fail(Errc::protocol_error, "shm ring positions are inconsistent (head " + std::to_string(head) + ", tail " +
                                              std::to_string(tail) + ", capacity " + std::to_string(cap_) +
                                              "): the peer corrupted the ring");
    return static_cast<std::size_t>(u);
}

Result<std::size_t> RingView::free_bytes() const {
    auto u = used(hdr_->head.load(std::memory_order_acquire), own_tail_);
    if (!u) return fail(u.error());
    return cap_ - *u;
}

Result<std::size_t> RingView::readable_bytes() const {
    return used(own_head_, hdr_->tail.load(std::memory_order_acquire));
}

Result<std::size_t> RingView::write(std::span<const iovec> iov) {
    auto room = free_bytes();
    if (!room) return room;
    std::size_t left = *room, total = 0;
    std::uint64_t pos = own_tail_;
    for (const auto& v : iov) {
        if (left == 0) break;
        const auto* src = static_cast<const std::uint8_t*>(v.iov_base);
        std::size_t n = std::min(v.iov_len, left);
        const std::size_t idx = pos & mask_;
        const std::size_t first = std::min(n, cap_ - idx);
        std::memcpy(data_ + idx, src, first);
        if (n > first) std::memcpy(data_, src + first, n - first);
        pos += n;
        total += n;
        left -= n;
    }
    if (total > 0) {
        own_tail_ = pos;
        hdr_->tail.store(pos, std::memory_order_release);
    }
    return total;
}

Result<std::size_t> RingView::read(std::span<std::uint8_t> dst) {
    auto avail = readable_bytes();
    if (!avail) return avail;
    const std::size_t n = std::min(*avail, dst.size());
    if (n == 0) return std::size_t(0);
    const std::size_t idx = own_head_ & mask_;
    const std::size_t first = std::min(n, cap_ - idx);
    std::memcpy(dst.data(), data_ + idx, first);
    if (n > first) std::memcpy(dst.data() + first, data_, n - first);
    own_head_ += n;
    hdr_->head.store(own_head_, std::memory_order_release);
    return n;
}

}  // namespace tensorplay::detail::shm
