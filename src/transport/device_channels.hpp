// Private: the agent's device channels, the transport's interface to them (docs/protocol.md,
// "Channels"); their implementation is channels/device_channels_impl.hpp. Before a frame with
// device tensors is sent, its copies are ordered after the work on the message's streams and each
// device tensor is staged in pinned host memory (cuda_basic: its bytes go inline), exported from
// its pool (cuda_ipc with one copy: the peer copies it out of the tensor's own memory) or copied
// into this process's device outbox (cuda_ipc: the peer copies it out, device to device); an
// arriving frame's device tensors are landed on fresh pool streams without any host wait.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/backend.hpp>
#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

/// Whether a message must go through the device channels: some tensor is on a device other than
/// the CPU.
[[nodiscard]] inline bool has_device_tensors(const std::vector<Tensor>& tensors) noexcept {
    for (const auto& t : tensors)
        if (t.defined() && !t.device().is_cpu()) return true;
    return false;
}

struct ReleaseWatch;

/// A frame's tensors made ready for the connection: device ones replaced by their staged host
/// copies or left for their refs (parts). `released`: set when the peer reads some of them in place
/// (cuda_ipc with one copy), for await_release.
struct PreparedTensors {
    std::vector<Tensor> tensors;
    SendPlan parts;
    std::shared_ptr<ReleaseWatch> released;
};

/// Bytes of each device's outbox (cuda_ipc): TP_CUDA_IPC_OUTBOX_BYTES, else 64 MiB.
[[nodiscard]] std::size_t default_outbox_bytes();

/// One agent's device channels. Used on the agent's executor (spawned coroutines run there too);
/// the outbox ranges a peer still holds are given back from wherever the connection drops its holds.
class DeviceChannels {
public:
    /// `outbox_devices`: the local cuda devices that may send by cuda_ipc (when the cuda backend can
    /// export memory): each gets its outbox at the first tensor that goes by it, not here (an
    /// agent makes no context on a GPU before it moves a tensor there);
    /// `channels`: the selected channel names (cuda_ipc, cuda_basic offered when listed).
    /// `spawn` starts a background coroutine of the agent's (the releases that wait for copies).
    using Spawn = std::function<void(Task<void>)>;
    [[nodiscard]] static Result<std::unique_ptr<DeviceChannels>> create(Spawn spawn,
                                                                        const std::vector<Device>& outbox_devices,
                                                                        const std::vector<std::string>& channels,
                                                                        std::size_t outbox_bytes);
    virtual ~DeviceChannels() = default;

    /// The offers for the cuda device type, in torch's order (cuda_ipc, with its parameters, over
    /// cuda_basic); empty without cuda devices.
    [[nodiscard]] virtual const std::vector<ChannelOffer>& offers() const noexcept = 0;

    /// Sending on `conn`: orders the copies after the work queued on `streams` (the message's;
    /// default streams for the others), stages or places every device tensor, and waits (without
    /// blocking a thread) until the staged bytes are in host memory (a tensor staged in chunks:
    /// the connection's writer waits for each chunk). `targets[i]`: where tensor i lands on the peer.
    [[nodiscard]] virtual Task<Result<PreparedTensors>> prepare(std::shared_ptr<Connection> conn, std::vector<Tensor> tensors,
                                                                std::vector<tensorplay::Stream> streams,
                                                                std::vector<Device> targets) = 0;

    /// Receiving on `conn`: lands `frame`'s device tensors (`refs`: those its peer's cuda_ipc carries) on fresh pool streams (staged host
    /// bytes copied up; cuda_ipc refs copied out of the peer's outbox or pool once the host has seen its
    /// event complete: no stream of ours ever waits on another process) and names those streams in
    /// `streams`; the frame's device hold is released once the copies ran. An error fails the frame
    /// (protocol_error: a bad ref, and the connection should close). `later`: a frame with tensors
    /// in cuda_ipc rings (channels/cuda_ipc/rings.hpp), or whose peer's events were not complete yet, is taken,
    /// and handed to `later` once every copy is queued (never, when the connection closes first).
    using Deliver = std::function<void(Frame&&, std::vector<tensorplay::Stream>&&)>;
    enum class Landed { now, later };
    [[nodiscard]] virtual Result<Landed> land(const std::shared_ptr<Connection>& conn, Frame& frame, const DeviceRefs& refs,
                                              std::vector<tensorplay::Stream>& streams, Deliver later) = 0;

    /// A control frame from `conn`'s peer (channels/cuda_ipc/rings.hpp): a chunk of ours is free (the next
    /// goes into its slot), one of theirs is ready (copied out), it cannot open our outbox (we
    /// stage for it from then on), or where a tensor of its next frame lies in its pool.
    /// protocol_error: the peer is wrong (an unknown name among them), close the connection.
    [[nodiscard]] virtual Result<void> notice(const std::shared_ptr<Connection>& conn, std::string_view name,
                                              std::span<const std::uint8_t> payload) = 0;

    /// Receiving on `conn`, as the reader reads it: a sink that lands the staged tensor `desc`
    /// describes on its target device chunk by chunk (channels/cuda_basic/staging.hpp), for one over a chunk
    /// on a cuda target; null otherwise. Its stream becomes the frame's stream there (land).
    [[nodiscard]] virtual Result<std::shared_ptr<ByteSink>> sink(const Connection* conn, const TensorDesc& desc) = 0;

    /// Forgets what was opened for `conn` (its peer's outboxes and events).
    virtual void forget(const Connection* conn) = 0;

    /// After `prepared` was sent (or failed to be): lets go of its part of the hold and waits, up to
    /// `limit`, until the peer released the tensors it reads in place (or the connection closed):
    /// so a call completes only once nothing reads the caller's tensors any more. False when the
    /// limit passed first. At once for a frame without such tensors.
    [[nodiscard]] static Task<bool> await_release(PreparedTensors& prepared, std::chrono::steady_clock::duration limit);

    /// Before a graceful shutdown closes the connections: waits (up to `limit`) until every frame
    /// sent from our outboxes was released by its peer, that is until their copies out of them ran,
    /// so that freeing the outboxes races no peer's copy. False when the limit passed first.
    [[nodiscard]] virtual Task<bool> quiesce(std::chrono::steady_clock::duration limit) = 0;

    /// Counters for tests: tensors sent by cuda_ipc and by staging (chunked_sent, _received:
    /// those of them staged or landed in chunks, cuda_basic/staging.hpp; ring_sent, _received: those
    /// sent by cuda_ipc through a ring, and ring_chunks_*: their chunks that waited for a notice;
    /// event_waits: frames that waited for one of an outbox's kOutboxEvents events).
    struct Stats {
        std::uint64_t ipc_sent = 0, staged_sent = 0, ipc_received = 0, staged_received = 0, chunked_sent = 0,
                      chunked_received = 0, ring_sent = 0, ring_received = 0, ring_chunks_sent = 0, ring_chunks_received = 0,
                      event_waits = 0,  ///< frames that waited for a free outbox event
                      pooled_sent = 0,  ///< of ipc_sent: with one copy, out of the tensor's own memory
                      pooled_received = 0;
    };
    [[nodiscard]] virtual const Stats& stats() const noexcept = 0;
};

}  // namespace tensorplay::detail
