// Private: what cuda_ipc puts on the wire (docs/protocol.md, "Device channels"): its offer's
// parameters and the outbox announcement (one encoding), a tensor's reference, and its control
// frames (ring notices, refusals, exports). Pure codecs, apart from the channel's state, so that
// they can be fuzzed alone (tests/fuzz/channel_wire_fuzz.cpp).
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/device/backend.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

/// Events of one outbox: a frame takes one per device it sends from, until the peer's release.
inline constexpr int kOutboxEvents = 16;
/// Ranges are handed out in units of this (CUDA copies like 256-byte alignment).
inline constexpr std::size_t kOutboxAlign = 256;

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

/// Names of the ring notices: cuda_ipc's control frames (FrameKind::control).
inline constexpr std::string_view kRingReady = "cuda_ipc.ready";
inline constexpr std::string_view kRingFree = "cuda_ipc.free";
/// A receiver that could not open the sender's outbox of cuda:`device` (or its events) on its own
/// cuda:`offset` (a container without a shared IPC namespace, a MIG instance): from then on the
/// sender stages that pair's tensors (cuda_basic). Same encoding as a ring notice, chunk 0.
inline constexpr std::string_view kIpcRefused = "cuda_ipc.refused";
/// Chunk value of a kIpcRefused notice that refuses only one copy out of the sender's pool (its
/// descriptor or pointers could not be imported): that pair's tensors go through the outbox instead.
inline constexpr std::uint32_t kRefusedPoolOnly = 1;
/// Sent before the first frame that uses an outbox of ours on this connection: that outbox's
/// parameters (encode_ipc_params, this process, the one device, with its outbox). Outboxes are
/// made lazily, at the first tensor that goes by one, so they are not in the offer.
inline constexpr std::string_view kIpcOutbox = "cuda_ipc.outbox";
/// Sent right before a frame with a tensor that goes with one copy (PoolExport's encoding): where
/// in the sender's pool it lies.
inline constexpr std::string_view kIpcExport = "cuda_ipc.export";

/// One notice: chunk `chunk` of the ring at `offset` of the outbox on the sender's cuda:`device`.
struct RingNotice {
    std::int32_t device = 0;
    std::uint64_t offset = 0;
    std::uint32_t chunk = 0;
};
[[nodiscard]] Bytes encode_ring_notice(const RingNotice& n);
/// Errc::protocol_error when malformed.
[[nodiscard]] Result<RingNotice> decode_ring_notice(std::span<const std::uint8_t> payload);

}  // namespace tensorplay::detail
