// Private: the agent's device channels (docs/protocol.md, "Channels"). Before a frame with device
// tensors is sent, its copies are ordered after the work on the message's streams and each device
// tensor is staged in pinned host memory (cuda_basic: its bytes go inline), exported from its pool
// (cuda_ipc with one copy: the peer copies it out of the tensor's own memory) or copied into this
// process's device outbox (cuda_ipc: the peer copies it out, device to device); an arriving
// frame's device tensors are landed on fresh pool streams without any host wait. A staged tensor
// larger than a chunk goes through a few pinned slots while the frame is written (cuda_basic/staging.hpp).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/backend.hpp>
#include <tensorplay/transport/connection.hpp>

#include "transport/channels/cuda_ipc/rings.hpp"
#include "transport/connection_ext.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace tensorplay::detail {

/// Whether a message must go through the device channels: some tensor is on a device other than
/// the CPU.
[[nodiscard]] bool has_device_tensors(const std::vector<Tensor>& tensors) noexcept;

struct ReleaseWatch;

/// A frame's tensors made ready for the connection: device ones replaced by their staged host
/// copies or left for their refs (parts). `released`: set when the peer reads some of them in place
/// (cuda_ipc with one copy), for await_release.
struct PreparedTensors {
    std::vector<Tensor> tensors;
    DeviceParts parts;
    std::shared_ptr<ReleaseWatch> released;
};

/// Bytes of each device's outbox (cuda_ipc): TP_CUDA_IPC_OUTBOX_BYTES, else 64 MiB.
[[nodiscard]] std::size_t default_outbox_bytes();

class Outbox;
struct IpcRef;
struct OutboxHold;
struct PeerDevices;
struct RingLanding;

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
    explicit DeviceChannels(Spawn spawn);
    ~DeviceChannels();
    DeviceChannels(const DeviceChannels&) = delete;
    DeviceChannels& operator=(const DeviceChannels&) = delete;

    /// The offers for the cuda device type, in torch's order (cuda_ipc, with its parameters, over
    /// cuda_basic); empty without cuda devices.
    [[nodiscard]] const std::vector<ChannelOffer>& offers() const noexcept { return offers_; }

    /// Sending on `conn`: orders the copies after the work queued on `streams` (the message's;
    /// default streams for the others), stages or places every device tensor, and waits (without
    /// blocking a thread) until the staged bytes are in host memory (a tensor staged in chunks:
    /// the connection's writer waits for each chunk). `targets[i]`: where tensor i lands on the peer.
    [[nodiscard]] Task<Result<PreparedTensors>> prepare(std::shared_ptr<Connection> conn, std::vector<Tensor> tensors,
                                                        std::vector<tensorplay::Stream> streams, std::vector<Device> targets);

    /// Receiving on `conn`: lands `frame`'s device tensors (`refs`: those its peer's cuda_ipc carries) on fresh pool streams (staged host
    /// bytes copied up; cuda_ipc refs copied out of the peer's outbox or pool once the host has seen its
    /// event complete: no stream of ours ever waits on another process) and names those streams in
    /// `streams`; the frame's device hold is released once the copies ran. An error fails the frame
    /// (protocol_error: a bad ref, and the connection should close). `later`: a frame with tensors
    /// in cuda_ipc rings (cuda_ipc/rings.hpp), or whose peer's events were not complete yet, is taken,
    /// and handed to `later` once every copy is queued (never, when the connection closes first).
    using Deliver = std::function<void(Frame&&, std::vector<tensorplay::Stream>&&)>;
    enum class Landed { now, later };
    [[nodiscard]] Result<Landed> land(const std::shared_ptr<Connection>& conn, Frame& frame, const DeviceRefs& refs,
                                      std::vector<tensorplay::Stream>& streams, Deliver later);

    /// A control frame from `conn`'s peer (cuda_ipc/rings.hpp): a chunk of ours is free (the next
    /// goes into its slot), one of theirs is ready (copied out), it cannot open our outbox (we
    /// stage for it from then on), or where a tensor of its next frame lies in its pool.
    /// protocol_error: the peer is wrong (an unknown name among them), close the connection.
    [[nodiscard]] Result<void> notice(const std::shared_ptr<Connection>& conn, std::string_view name,
                                      std::span<const std::uint8_t> payload);

    /// Receiving on `conn`, as the reader reads it: a sink that lands the staged tensor `desc`
    /// describes on its target device chunk by chunk (cuda_basic/staging.hpp), for one over a chunk
    /// on a cuda target; null otherwise. Its stream becomes the frame's stream there (land).
    [[nodiscard]] Result<std::shared_ptr<ByteSink>> sink(const Connection* conn, const TensorDesc& desc);

    /// Forgets what was opened for `conn` (its peer's outboxes and events).
    void forget(const Connection* conn);

    /// After `prepared` was sent (or failed to be): lets go of its part of the hold and waits, up to
    /// `limit`, until the peer released the tensors it reads in place (or the connection closed):
    /// so a call completes only once nothing reads the caller's tensors any more. False when the
    /// limit passed first. At once for a frame without such tensors.
    [[nodiscard]] static Task<bool> await_release(PreparedTensors& prepared, std::chrono::steady_clock::duration limit);

    /// Before a graceful shutdown closes the connections: waits (up to `limit`) until every frame
    /// sent from our outboxes was released by its peer, that is until their copies out of them ran,
    /// so that freeing the outboxes races no peer's copy. False when the limit passed first.
    [[nodiscard]] Task<bool> quiesce(std::chrono::steady_clock::duration limit);

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
    [[nodiscard]] const Stats& stats() const noexcept { return stats_; }

private:
    /// prepare's copies: each device tensor into the outbox or staging, on one stream per device
    /// (`used`), its outbox ranges and events in `hold`; `reserved`: an event per cuda index that
    /// prepare took for it (those taken are erased).
    [[nodiscard]] Result<void> queue_copies(const std::shared_ptr<Connection>& conn, std::vector<Tensor>& tensors,
                                            const std::vector<tensorplay::Stream>& streams, const std::vector<Device>& targets,
                                            PreparedTensors& out, std::vector<DeviceStream>& used, OutboxHold& hold,
                                            std::map<int, int>& reserved);
    /// A copy out of the peer's outbox, queued once the host has seen `event` (the peer's) complete.
    struct RefCopy {
        DeviceBackend* backend = nullptr;
        tensorplay::Stream stream;
        std::uint8_t* dst = nullptr;
        const std::uint8_t* src = nullptr;
        std::size_t n = 0;
        std::shared_ptr<Storage> memory;  ///< the peer's outbox, opened, or its tensor's memory, imported
        tensorplay::Event event;
        /// `memory` is an imported tensor: let go of as soon as the copy is queued, so that its free
        /// runs on the stream before the release's event (the exporter frees only after the release).
        bool pooled = false;
    };
    /// land's tensors out of the peer's outbox (`refs`): their copies go to `copies`, their rings
    /// (not started) to `rings`.
    [[nodiscard]] Result<void> land_refs(const std::shared_ptr<Connection>& conn, Frame& frame, const DeviceRefs& refs,
                                         const std::function<Result<DeviceStream*>(Device)>& stream_on,
                                         std::vector<std::shared_ptr<RingLanding>>& rings, std::vector<RefCopy>& copies);
    /// land_refs for a tensor that goes with one copy (`r` pooled): imports its memory from the
    /// peer's pool (taking the pool's descriptor the first time) and queues its copy in `copies`.
    [[nodiscard]] Result<Tensor> land_pooled(const std::shared_ptr<Connection>& conn, PeerDevices& p, const TensorDesc& desc,
                                             std::size_t index, const IpcRef& r,
                                             const std::function<Result<DeviceStream*>(Device)>& stream_on,
                                             std::vector<RefCopy>& copies);
    /// The peer's event `k` of its cuda:`source` outbox opened on `target` (once per connection).
    [[nodiscard]] Result<tensorplay::Event> peer_event(const std::shared_ptr<Connection>& conn, PeerDevices& p, DeviceBackend& b,
                                                       int source, Device target, int k);
    /// The outbox of our cuda:`index`, made at its first use (null: that device sends no cuda_ipc,
    /// or its outbox could not be made: then never again, with a log line).
    [[nodiscard]] Outbox* outbox(int index);
    /// A kIpcOutbox notice: the peer's outbox of one device it offered (protocol_error when it is not
    /// one, names another process or a device it did not offer, or comes twice).
    [[nodiscard]] Result<void> outbox_of_peer(const Connection& conn, std::span<const std::uint8_t> payload);
    /// A kIpcExport notice: kept until its frame lands (protocol_error past kMaxExports pending).
    [[nodiscard]] Result<void> exported_by_peer(const Connection& conn, std::span<const std::uint8_t> payload);
    /// Queues `copies` (their events seen complete); lets go of the pooled ones' imports.
    [[nodiscard]] static Result<void> queue_ref_copies(std::vector<RefCopy>& copies);
    /// A frame's copies out whose events were not complete yet: queued once they are (host waits);
    /// the connection closes on a device error.
    [[nodiscard]] Task<void> gate(std::weak_ptr<Connection> conn, std::shared_ptr<PendingFrame> frame,
                                  std::vector<RefCopy> copies, std::weak_ptr<void> alive);
    /// Copies out the ring's waiting chunks now if its event is complete, else starts pump().
    void drain(const std::shared_ptr<Connection>& conn, const std::shared_ptr<RingLanding>& l);
    /// Waits on the host for the ring's event, copies out the chunks that were waiting when it
    /// started, and goes on while more wait.
    [[nodiscard]] Task<void> pump(std::weak_ptr<Connection> conn, std::shared_ptr<RingLanding> l, std::weak_ptr<void> alive);
    /// Queues the copies out of `batch`, says "free" for slots once their copies ran, and finishes
    /// the ring (and its frame) when every chunk is queued.
    void copy_batch(const std::shared_ptr<Connection>& conn, const std::shared_ptr<RingLanding>& l,
                    const std::vector<std::uint32_t>& batch);
    /// Hands `frame` over once nothing of it waits (its hold given back after its copies ran).
    void finish_if_whole(const std::shared_ptr<Connection>& conn, const std::shared_ptr<PendingFrame>& frame);
    /// Releases the peer's `hold` once the copies out of its outbox on `used` ran.
    void release_when_copied(const std::shared_ptr<Connection>& conn, std::vector<DeviceStream>& used, std::uint64_t hold);
    [[nodiscard]] PeerDevices& peer_of(const Connection& conn);
    /// The peer's outbox of its cuda:`source` (or an event of it) could not be opened on `target`:
    /// its later tensors for that pair fail at once with `why`, and the peer is told to stage them.
    /// The peer's kIpcRefused: that pair is staged from now on.
    [[nodiscard]] Result<void> refused_by_peer(const Connection& conn, const RingNotice& n);
    [[nodiscard]] Error refuse(const std::shared_ptr<Connection>& conn, PeerDevices& p, int source, Device target, Error why);
    /// As refuse, for one copy only: the peer sends that pair's tensors through its outbox from then on.
    [[nodiscard]] Error refuse_pool(const std::shared_ptr<Connection>& conn, PeerDevices& p, int source, Device target, Error why);
    /// Whether a tensor from our `source` to the peer's `target` goes by cuda_ipc; when it does, the
    /// outbox of `source` exists and was announced on `conn`.
    [[nodiscard]] bool ipc_viable(Connection& conn, Device source, Device target);

    Spawn spawn_;
    std::vector<ChannelOffer> offers_;
    std::size_t one_copy_min_;
    std::size_t outbox_bytes_ = 0;
    std::set<int> ipc_devices_;                        ///< local cuda indices that may send by cuda_ipc
    std::map<int, std::shared_ptr<Outbox>> outboxes_;  ///< by local cuda index, once made
    std::map<int, int> pool_fds_;                      ///< by local cuda index: its exported pool (peers take it)
    std::map<const Connection*, std::unique_ptr<PeerDevices>> peers_;
    std::map<int, std::string> bus_ids_;  ///< local cuda index -> PCI bus id (cached)
    std::map<int, std::string> uuids_;    ///< local cuda index -> UUID (cached; empty: unknown)
    /// Per connection, the streams its sinks chose for the frame being read (land takes them).
    std::map<const Connection*, std::vector<tensorplay::Stream>> arriving_;
    /// cuda_ipc rings: ours with chunks still to copy in (the hold owns them), and the peers'
    /// with chunks still to copy out.
    std::map<RingKey, std::weak_ptr<RingSend>> sending_;
    std::map<RingKey, std::shared_ptr<RingLanding>> landing_;
    Stats stats_;
    /// Expires with this object: the coroutines above touch it only while it lives.
    std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace tensorplay::detail
