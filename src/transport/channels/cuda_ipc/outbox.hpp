// Private: cuda_ipc's sending side (an outbox per device: exportable memory allocated once, with
// interprocess events opened once per peer) and the parameters its channel offer carries.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/device/backend.hpp>

#include "core/first_fit.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

/// Events of one outbox: a frame takes one per device it sends from, until the peer's release.
inline constexpr int kOutboxEvents = 16;
/// Ranges are handed out in units of this (CUDA copies like 256-byte alignment).
inline constexpr std::size_t kOutboxAlign = 256;
/// A tensor larger than a ring (kOutboxRing chunks) goes through one in chunks: its chunk k lies
/// in slot k % kOutboxRing of the ring. Chunks are a 16th of the outbox, at most kOutboxChunkMax.
inline constexpr std::uint32_t kOutboxRing = 4;
inline constexpr std::size_t kOutboxChunkMax = std::size_t{16} << 20;

/// One device of a cuda_ipc offer: its PCI bus id and UUID (peers find it among theirs: by UUID
/// when both have one, which tells MIG instances of one GPU apart). An outbox is made at the first
/// tensor that goes by it and announced to each peer before its first frame (kIpcOutbox: the same
/// encoding, one device, with its outbox): its memory handle and size, its rings' chunk bytes and
/// slots, its events' handles and its pool's descriptor.
struct IpcDeviceParams {
    int index = 0;
    std::string bus_id;
    std::string uuid;  ///< (version 3 on: empty when its driver cannot say)
    bool outbox = false;
    IpcHandle memory{};
    std::uint64_t size = 0;
    std::uint64_t chunk = 0;
    std::uint32_t ring = 0;
    std::vector<IpcHandle> events;
    /// (Version 4 on, with an outbox.) The descriptor number of the device's IPC-capable memory pool
    /// in the offering process (a peer takes it with pidfd_getfd), or -1: tensors of that pool go
    /// with one copy, the receiver's out of the sender's own memory.
    std::int32_t pool_fd = -1;
};

/// The cuda_ipc offer's parameters (docs/protocol.md, "Channels"): the offering process (a handle
/// cannot be opened in the process that exported it) and its devices.
struct IpcParams {
    std::int32_t pid = 0;
    std::vector<IpcDeviceParams> devices;
};
[[nodiscard]] std::string encode_ipc_params(const IpcParams& params);
/// Errc::protocol_error for anything malformed (counts and sizes are bounded before use).
[[nodiscard]] Result<IpcParams> decode_ipc_params(std::string_view bytes);

/// A tensor's reference in a cuda_ipc frame: where in the sender's outbox of the tensor's source
/// device it lies (chunked: where its ring starts), and which of that outbox's events its copy in
/// (a ring's first chunks) was recorded on. Never 0.
[[nodiscard]] constexpr std::uint64_t encode_ipc_ref(std::size_t offset, int event, bool chunked) noexcept {
    return (static_cast<std::uint64_t>(offset) << 16) | (static_cast<std::uint64_t>(event) << 8) | (chunked ? 3u : 1u);
}
/// A tensor's reference when it goes with one copy: its export `id` (a kIpcExport notice before the
/// frame says where it lies) and the outbox event recorded after the work that made it.
[[nodiscard]] constexpr std::uint64_t encode_pool_ref(std::uint64_t id, int event) noexcept {
    return (id << 16) | (static_cast<std::uint64_t>(event) << 8) | 5u;
}
struct IpcRef {
    std::uint64_t offset = 0;  ///< (pooled: the export id)
    int event = 0;
    bool chunked = false;
    bool pooled = false;
};
/// Errc::protocol_error when `ref` is not one (the marker bits).
[[nodiscard]] Result<IpcRef> decode_ipc_ref(std::uint64_t ref);

/// A kIpcExport notice: the tensor of export `id` lies `offset` bytes into the allocation of the
/// sender's cuda:`device` pool that `data` (cudaMemPoolExportPointer's) names.
struct PoolExport {
    std::uint64_t id = 0;
    std::int32_t device = 0;
    std::uint64_t offset = 0;
    IpcHandle data{};
};
[[nodiscard]] Bytes encode_pool_export(const PoolExport& e);
/// Errc::protocol_error when malformed.
[[nodiscard]] Result<PoolExport> decode_pool_export(std::span<const std::uint8_t> payload);

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

/// What a frame's hold keeps of the outboxes (Frame::device_hold): its ranges and events, given
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
