// Private: cuda_ipc's sending side (an outbox per device: exportable memory allocated once, with
// interprocess events opened once per peer); its wire codecs are wire.hpp.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/device/backend.hpp>

#include "core/first_fit.hpp"
#include "transport/channels/cuda_ipc/wire.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

/// A tensor larger than a ring (kOutboxRing chunks) goes through one in chunks: its chunk k lies
/// in slot k % kOutboxRing of the ring. Chunks are a 16th of the outbox, at most kOutboxChunkMax.
inline constexpr std::uint32_t kOutboxRing = 4;
inline constexpr std::size_t kOutboxChunkMax = std::size_t{16} << 20;

/// One device's outbox. Thread-safe (ranges come back from wherever a connection drops a hold).
class Outbox {
public:
    [[nodiscard]] static Result<std::shared_ptr<Outbox>> create(DeviceBackend& backend, Device device, std::size_t bytes);
    Outbox(DeviceBackend& backend, Device device) : backend_(backend), device_(device) {}

    [[nodiscard]] Device device() const noexcept { return device_; }
    [[nodiscard]] DeviceBackend& backend() const noexcept { return backend_; }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    /// A ring's chunk bytes; a ring is kOutboxRing of them.
    [[nodiscard]] std::size_t chunk() const noexcept { return chunk_; }
    [[nodiscard]] std::size_t ring_bytes() const noexcept { return chunk_ * kOutboxRing; }
    [[nodiscard]] std::uint8_t* data() const noexcept { return memory_->data(); }
    [[nodiscard]] const tensorplay::Event& event(int k) const noexcept { return events_[static_cast<std::size_t>(k)].first; }
    /// This outbox's entry of the offer (bus id filled by the caller).
    [[nodiscard]] IpcDeviceParams params() const;

    /// The offset of a free range of `n` bytes (first fit), or nullopt when none is free now.
    [[nodiscard]] std::optional<std::size_t> take_range(std::size_t n);
    void give_range(std::size_t offset, std::size_t n) noexcept;
    /// A free event, or nullopt.
    [[nodiscard]] std::optional<int> take_event();
    /// Whether every event is free (no frame sent from here is still held by its peer).
    [[nodiscard]] bool idle();
    void give_event(int k) noexcept;
    /// Gives back a hold's ranges and events once those events (recorded after every copy into
    /// the ranges) have completed: at once when they have, else at a later take (a hold dropped
    /// by a closed connection may have copies still queued into its ranges).
    void give_back(std::vector<std::pair<std::size_t, std::size_t>> ranges, std::vector<int> events);

private:
    DeviceBackend& backend_;
    Device device_;
    std::shared_ptr<Storage> memory_;
    IpcHandle handle_{};
    std::size_t size_ = 0;
    std::size_t chunk_ = 0;
    std::vector<std::pair<tensorplay::Event, IpcHandle>> events_;
    /// Gives back what parked_ holds whose events completed (mutex_ held).
    void sweep();

    std::optional<FirstFit> ranges_;  ///< (set by create)
    std::mutex mutex_;                ///< free_events_, parked_
    std::vector<int> free_events_;
    struct Parked {
        std::vector<std::pair<std::size_t, std::size_t>> ranges;
        std::vector<int> events;
    };
    std::vector<Parked> parked_;
};

/// What a frame's hold keeps of the outboxes (DeviceRefs::hold): its ranges and events, given
/// back when the peer releases the hold or the connection closes.
struct OutboxHold {
    struct Range {
        std::shared_ptr<Outbox> box;
        std::size_t offset, len;
    };
    std::vector<Range> ranges;
    std::vector<std::pair<std::shared_ptr<Outbox>, int>> events;
    /// The frame's chunked sends (channels/device_channels.cpp): they end with the hold.
    std::vector<std::shared_ptr<void>> sends;
    /// Its tensors that go with one copy: the peer reads their memory until the release.
    std::vector<Tensor> tensors;
    OutboxHold() = default;
    OutboxHold(const OutboxHold&) = delete;
    OutboxHold& operator=(const OutboxHold&) = delete;
    ~OutboxHold();
};

}  // namespace tensorplay::detail
