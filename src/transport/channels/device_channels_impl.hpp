// Private: the device channels' implementation (the interface and its documentation:
// transport/device_channels.hpp). A staged tensor larger than a chunk goes through a few pinned
// slots while the frame is written (cuda_basic/staging.hpp); cuda_ipc's outboxes, rings and the
// peers' announced outboxes and pools are cuda_ipc/.
#pragma once

#include "transport/device_channels.hpp"
#include "transport/channels/cuda_ipc/rings.hpp"

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

class Outbox;
struct IpcRef;
struct OutboxHold;
struct PeerDevices;
struct RingLanding;

class DeviceChannelsImpl final : public DeviceChannels {
public:
    explicit DeviceChannelsImpl(Spawn spawn);
    ~DeviceChannelsImpl() override;
    DeviceChannelsImpl(const DeviceChannelsImpl&) = delete;
    DeviceChannelsImpl& operator=(const DeviceChannelsImpl&) = delete;

    [[nodiscard]] const std::vector<ChannelOffer>& offers() const noexcept override { return offers_; }
    [[nodiscard]] Task<Result<PreparedTensors>> prepare(std::shared_ptr<Connection> conn, std::vector<Tensor> tensors,
                                                        std::vector<tensorplay::Stream> streams,
                                                        std::vector<Device> targets) override;
    [[nodiscard]] Result<Landed> land(const std::shared_ptr<Connection>& conn, Frame& frame, const DeviceRefs& refs,
                                      std::vector<tensorplay::Stream>& streams, Deliver later) override;
    [[nodiscard]] Result<void> notice(const std::shared_ptr<Connection>& conn, std::string_view name,
                                      std::span<const std::uint8_t> payload) override;
    [[nodiscard]] Result<std::shared_ptr<ByteSink>> sink(const Connection* conn, const TensorDesc& desc) override;
    void forget(const Connection* conn) override;
    [[nodiscard]] Task<bool> quiesce(std::chrono::steady_clock::duration limit) override;
    [[nodiscard]] const Stats& stats() const noexcept override { return stats_; }

private:
    friend class DeviceChannels;  // (create fills what it made)
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
