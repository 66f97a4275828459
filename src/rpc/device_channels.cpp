// The agent's device channels: stream ordering, staging (cuda_basic), outboxes (cuda_ipc), landing.
#include "rpc/device_channels.hpp"

#include <tensorplay/core/log.hpp>

#include "rpc/device_outbox.hpp"
#include "rpc/device_staging.hpp"
#include "core/asio_compat.hpp"
#include "transport/channel.hpp"
#include "transport/connection_state.hpp"
#include "transport/transport.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>

namespace tensorplay::detail {

/// What this agent knows of one connection's peer for cuda_ipc: its offer's devices, the outboxes
/// and events of theirs it opened (receiving), and which of its devices ours can reach (sending).
struct PeerDevices {
    bool decoded = false;
    std::optional<Error> bad;  ///< its offer did not decode, or names this process
    std::vector<IpcDeviceParams> devices;
    std::map<std::pair<int, int>, std::shared_ptr<Storage>> memory;  ///< (its index, our index)
    std::map<std::tuple<int, int, int>, tensorplay::Event> events;   ///< (its index, our index, event)
    std::map<std::pair<int, int>, bool> reach;                        ///< (our index, its index)
    std::map<std::pair<int, int>, Error> refused;                     ///< (its index, our index): opening failed

    const IpcDeviceParams* device(int index) const {
        for (const auto& d : devices)
            if (d.index == index) return &d;
        return nullptr;
    }
};

bool has_device_tensors(const std::vector<Tensor>& tensors) noexcept {
    for (const auto& t : tensors)
        if (t.defined() && !t.device().is_cpu()) return true;
    return false;
}

std::size_t default_outbox_bytes() {
    if (const char* v = std::getenv("TP_CUDA_IPC_OUTBOX_BYTES"); v && *v) {
        char* end = nullptr;
        const auto n = std::strtoull(v, &end, 10);
        if (end && *end == '\0' && n > 0) return static_cast<std::size_t>(n);
        log(LogLevel::warn, "rpc", "TP_CUDA_IPC_OUTBOX_BYTES=\"" + std::string(v) + "\" is not a positive byte count: ignored");
    }
    return std::size_t{256} << 20;
}

DeviceChannels::DeviceChannels(Spawn spawn) : spawn_(std::move(spawn)) {}
DeviceChannels::~DeviceChannels() = default;

Result<std::unique_ptr<DeviceChannels>> DeviceChannels::create(Spawn spawn, const std::vector<Device>& outbox_devices,
                                                               const std::vector<std::string>& channels, std::size_t outbox_bytes) {
    auto dc = std::make_unique<DeviceChannels>(std::move(spawn));
    const bool want_ipc = std::find(channels.begin(), channels.end(), "cuda_ipc") != channels.end();
    const bool want_basic = std::find(channels.begin(), channels.end(), "cuda_basic") != channels.end();
    if (!want_ipc && !want_basic) return dc;
    auto backend = backend_for(Device::cuda(0));
    if (!backend || (*backend)->device_count() == 0) return dc;  // no cuda devices: no offers
    DeviceBackend& b = **backend;
    if (want_ipc && b.name() == "cuda") {
        IpcParams params;
        params.pid = static_cast<std::int32_t>(::getpid());
        for (int i = 0; i < b.device_count(); ++i) {
            const Device d = Device::cuda(i);
            auto props = b.properties(d);
            if (!props) return fail(std::move(props).error().context("reading cuda:" + std::to_string(i) + " for cuda_ipc"));
            dc->bus_ids_[i] = props->pci_bus_id;
            dc->uuids_[i] = props->uuid;
            IpcDeviceParams p;
            if (std::find(outbox_devices.begin(), outbox_devices.end(), d) != outbox_devices.end()) {
                // A device that cannot have one (its memory taken, a fault, no IPC) loses cuda_ipc
                // from it, not the agent: its tensors go by cuda_basic.
                if (auto box = Outbox::create(b, d, outbox_bytes); box) {
                    p = (*box)->params();
                    dc->outboxes_[i] = std::move(*box);
                } else {
                    log(LogLevel::warn, "rpc", "cuda_ipc is off for tensors from " + d.str() + ": " + box.error().to_string() +
                                                   "; they go by cuda_basic");
                }
            }
            p.index = i;
            p.bus_id = props->pci_bus_id;
            p.uuid = props->uuid;
            params.devices.push_back(std::move(p));
        }
        dc->offers_.emplace_back("cuda_ipc", "cuda", "cuda_ipc:" + same_host_domain(), encode_ipc_params(params));
    }
    if (want_basic) dc->offers_.emplace_back("cuda_basic", "cuda", "any");
    return dc;
}

PeerDevices& DeviceChannels::peer_of(const Connection& conn) {
    auto& slot = peers_[&conn];
    if (!slot) slot = std::make_unique<PeerDevices>();
    PeerDevices& p = *slot;
    if (!p.decoded) {
        p.decoded = true;
        const auto& offers = conn.peer().channels;
        auto it = std::find_if(offers.begin(), offers.end(), [](const ChannelOffer& o) { return o.name == "cuda_ipc"; });
        auto decoded = it == offers.end() ? Result<IpcParams>(fail(Errc::protocol_error, "it made no cuda_ipc offer"))
                                          : decode_ipc_params(it->params);
        if (!decoded) p.bad = std::move(decoded).error();
        else if (decoded->pid == ::getpid())  // (one process's agents: its handles do not open here)
            p.bad = Error(Errc::protocol_error, "its cuda_ipc offer names this process");
        else p.devices = std::move(decoded->devices);
    }
    return p;
}

void DeviceChannels::forget(const Connection* conn) {
    peers_.erase(conn);
    arriving_.erase(conn);
    // (Its frames waiting for chunks are dropped; copies already queued keep what they use.)
    std::erase_if(sending_, [conn](const auto& e) { return std::get<0>(e.first) == conn; });
    std::erase_if(landing_, [conn](const auto& e) { return std::get<0>(e.first) == conn; });
}

Result<std::shared_ptr<ByteSink>> DeviceChannels::sink(const Connection* conn, const TensorDesc& desc) {
    if (!desc.target.is_cuda() || desc.nbytes <= kStagingChunk) return std::shared_ptr<ByteSink>();
    auto b = backend_for(desc.target);
    if (!b || (*b)->host_accessible() || desc.target.index >= (*b)->device_count())
        return std::shared_ptr<ByteSink>();  // (the allocator says why)
    auto& streams = arriving_[conn];
    auto it = std::find_if(streams.begin(), streams.end(), [&](const tensorplay::Stream& s) { return s.device == desc.target; });
    if (it == streams.end()) {
        auto s = (*b)->acquire_stream(desc.target);
        if (!s) return fail(std::move(s).error());
        streams.push_back(*s);
        it = streams.end() - 1;
    }
    auto landing = land_in_chunks(**b, *it, desc.dtype, desc.shape, desc.nbytes);
    if (landing) ++stats_.chunked_received;
    return landing;
}

// cuda_ipc for a tensor from our `source` to the peer's `target`: the pair chose it, we have an
// outbox there, and our device reaches theirs (the same PCI device, or peer access).
bool DeviceChannels::ipc_viable(const Connection& conn, Device source, Device target) {
    if (!source.is_cuda() || !target.is_cuda() || !outboxes_.count(source.index)) return false;
    if (ConnectionAccess::state(conn).channels.send_kind(source, target) != ChannelKind::cuda_ipc) return false;
    PeerDevices& p = peer_of(conn);
    if (p.bad) return false;
    const auto key = std::make_pair(source.index, target.index);
    if (auto it = p.reach.find(key); it != p.reach.end()) return it->second;
    bool ok = false;
    if (const IpcDeviceParams* theirs = p.device(target.index)) {
        for (const auto& [idx, bus] : bus_ids_) {
            // (By UUID when both sides know it: MIG instances of one GPU share its bus id.)
            const std::string& uuid = uuids_[idx];
            if (!uuid.empty() && !theirs->uuid.empty() ? uuid != theirs->uuid : bus != theirs->bus_id) continue;
            auto r = outboxes_.at(source.index)->backend().can_access_peer(source, Device::cuda(idx));
            ok = r && *r;
            break;
        }
    }
    if (!ok)
        log(LogLevel::debug, "rpc", "cuda_ipc from " + source.str() + " to " + target.str() + " of worker \"" + conn.peer().name +
                                        "\": its device is not reachable from ours (cuda_basic instead)");
    p.reach[key] = ok;
    return ok;
}

namespace {
/// The pool stream a frame's copies on `d` run on, made to wait for the work queued so far on the
/// message's stream there (its default stream when it names none).
Result<tensorplay::Stream> copy_stream(DeviceBackend& b, Device d, const std::vector<tensorplay::Stream>& streams) {
    auto s = b.acquire_stream(d);
    if (!s) return s;
    tensorplay::Stream producer{d, 0};  // (a device's default stream is id 0)
    for (const auto& m : streams)
        if (m.device == d) producer = m;
    auto ev = b.record_event(producer);
    if (!ev) return fail(std::move(ev).error());
    if (auto w = b.wait_event(*s, *ev); !w) return fail(std::move(w).error());
    return s;
}

/// Releases the peer's hold `hold` once `copied` (the frame's copies out of its outbox) is
/// complete: awaited, not a host function on the stream (which could outlive the agent's event
/// loop); cancelled with the agent, when the connection goes anyway.
Task<void> release_after(DeviceBackend& b, tensorplay::Event copied, std::weak_ptr<Connection> conn, std::uint64_t hold) {
    auto done = co_await b.wait(std::move(copied));
    (void)done;  // (a device error: the copies are over either way)
    if (auto c = conn.lock()) release_hold(*c, hold);
}

}  // namespace

namespace {
DeviceStream* find_stream(std::vector<DeviceStream>& v, Device d) {
    for (auto& s : v)
        if (s.stream.device == d) return &s;
    return nullptr;
}
}  // namespace

Result<void> DeviceChannels::queue_copies(const std::shared_ptr<Connection>& conn, std::vector<Tensor>& tensors,
                                          const std::vector<tensorplay::Stream>& streams, const std::vector<Device>& targets,
                                          PreparedTensors& out, std::vector<DeviceStream>& used, OutboxHold& hold,
                                          std::map<int, int>& reserved) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const Tensor& t = tensors[i];
        const Device d = t.device();
        out.parts.sources.push_back(d);
        if (d.is_cpu()) continue;
        DeviceStream* ds = find_stream(used, d);
        if (!ds) {
            auto b = backend_for(d);
            if (!b) return fail(std::move(b).error());
            auto s = copy_stream(**b, d, streams);
            if (!s) return fail(std::move(s).error().context("ordering the copies of tensor " + std::to_string(i)));
            used.push_back(DeviceStream{*b, *s});
            ds = &used.back();
        }
        DeviceBackend& b = *ds->backend;
        const std::size_t n = t.nbytes();
        if (ipc_viable(*conn, d, targets[i])) {
            auto& box = outboxes_.at(d.index);
            // Larger than a ring: through one, in chunks (device_rings.hpp).
            const bool ring = n > box->ring_bytes();
            const std::size_t len = ring ? box->ring_bytes() : n;
            std::optional<std::size_t> off = box->take_range(len);
            if (off && ds->event < 0) {
                auto r = reserved.find(d.index);
                std::optional<int> k;
                if (r != reserved.end()) {
                    k = r->second;
                    reserved.erase(r);
                } else {
                    k = box->take_event();
                }
                if (k) {
                    ds->event = *k;
                    hold.events.emplace_back(box, *k);
                } else {
                    box->give_range(*off, len);
                    off.reset();
                }
            }
            if (off) {
                hold.ranges.push_back(OutboxHold::Range{box, *off, len});
                if (!ring) {
                    if (auto c = b.copy_async(ds->stream, box->data() + *off, t.data(), n, t.storage()); !c) return c;
                } else {
                    auto rs = std::make_shared<RingSend>();
                    rs->box = box;
                    rs->backend = &b;
                    rs->stream = ds->stream;
                    rs->event = ds->event;
                    rs->tensor = t;
                    rs->offset = *off;
                    rs->chunk = box->chunk();
                    rs->chunks = static_cast<std::uint32_t>((n + rs->chunk - 1) / rs->chunk);
                    rs->freed.assign(rs->chunks, false);
                    for (std::uint32_t k = 0; k < kOutboxRing; ++k)  // (the rest after the peer's "free")
                        if (auto c = rs->copy_in(k); !c) return c;
                    std::erase_if(sending_, [](const auto& e) { return e.second.expired(); });  // (frames never sent)
                    sending_[RingKey{conn.get(), d.index, *off}] = rs;
                    hold.sends.push_back(std::move(rs));
                    ++stats_.ring_sent;
                }
                out.parts.refs[i] = encode_ipc_ref(*off, ds->event, ring);
                ++stats_.ipc_sent;
                continue;
            }
            // (The outbox has no free range now: this tensor is staged instead.)
        }
        if (n > kStagingChunk) {
            // Large: through a few slots, each chunk written as soon as it is in host memory.
            auto source = stage_in_chunks(b, ds->stream, t);
            if (!source) return fail(std::move(source).error().context("staging tensor " + std::to_string(i) + " of " + d.str()));
            out.parts.streamed.resize(tensors.size());
            out.parts.streamed[i] = std::move(*source);
            ++stats_.staged_sent;
            ++stats_.chunked_sent;
            continue;
        }
        auto staging = b.allocate_host(n, d);
        if (!staging) return fail(std::move(staging).error().context("staging tensor " + std::to_string(i) + " of " + d.str()));
        auto host = Tensor::wrap(*staging, t.dtype(), t.shape());
        if (!host) return fail(std::move(host).error());
        if (auto c = b.copy_async(ds->stream, (*staging)->data(), t.data(), n, t.storage()); !c) return c;
        tensors[i] = std::move(*host);
        ds->staged = true;
        ++stats_.staged_sent;
    }
    for (auto& ds : used) {
        if (ds.event < 0) continue;
        auto& box = outboxes_.at(ds.stream.device.index);
        if (auto r = ds.backend->record_again(ds.stream, box->event(ds.event)); !r) return r;
    }
    return ok();
}

namespace {
/// Lets go of `keep` (a failed frame's outbox ranges, staged copies and sources) once `events`
/// (after its queued copies) are complete: the copies into that memory must have run before
/// another frame may take it.
Task<void> drop_after(std::vector<std::pair<DeviceBackend*, tensorplay::Event>> events, std::shared_ptr<void> keep) {
    for (auto& [b, ev] : events) (void)co_await b->wait(std::move(ev));
    keep.reset();
}
}  // namespace

Task<Result<PreparedTensors>> DeviceChannels::prepare(std::shared_ptr<Connection> conn, std::vector<Tensor> tensors,
                                                      std::vector<tensorplay::Stream> streams, std::vector<Device> targets) {
    PreparedTensors out;
    out.parts.sources.reserve(tensors.size());
    out.parts.refs.assign(tensors.size(), 0);
    std::vector<DeviceStream> used;
    used.reserve(tensors.size());  // (pointers into it stay valid)
    auto hold = std::make_shared<OutboxHold>();
    // An outbox event for each device whose tensors go by cuda_ipc. When every event of an outbox is
    // in flight, the frame waits for one to come back (a peer's release) rather than go by staging;
    // the caller's deadline bounds the wait (it cancels this).
    std::map<int, int> reserved;  // cuda index -> event
    auto give_back_reserved = [&] {
        for (auto [d, k] : reserved) outboxes_.at(d)->give_event(k);
        reserved.clear();
    };
    // (In ascending device order, as locks are taken: two frames each holding one device's last event
    // and waiting for the other's would wait for each other.)
    std::set<int> wanted;
    for (std::size_t i = 0; i < tensors.size() && i < targets.size(); ++i)
        if (tensors[i].device().is_cuda() && ipc_viable(*conn, tensors[i].device(), targets[i])) wanted.insert(tensors[i].device().index);
    for (const int index : wanted) {
        const Device d = Device::cuda(index);
        auto& box = outboxes_.at(d.index);
        auto k = box->take_event();
        if (!k) {
            ++stats_.event_waits;
            asio::steady_timer timer(co_await asio::this_coro::executor);
            for (auto pause = std::chrono::microseconds(250); !k && conn->is_open(); k = box->take_event()) {
                timer.expires_after(pause);
                if (auto [ec] = co_await timer.async_wait(use_nothrow); ec) {
                    give_back_reserved();
                    co_return fail(Errc::cancelled, "waiting for a free cuda_ipc event of " + d.str() + "'s outbox");
                }
                pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(8));
            }
            if (!k) continue;  // (the connection closed: the frame fails as it is written)
        }
        reserved[d.index] = *k;
    }
    auto queued = queue_copies(conn, tensors, streams, targets, out, used, *hold, reserved);
    give_back_reserved();  // (those no tensor took: its range was not free)
    for (auto& ds : used) {
        if (!queued || !ds.staged) continue;
        // Staged bytes go on the socket: the host waits for them (suspending this coroutine only).
        auto ev = ds.backend->record_event(ds.stream);
        if (!ev) {
            queued = fail(std::move(ev).error());
            break;
        }
        auto waited = co_await ds.backend->wait(*ev);
        if (!waited) queued = fail(std::move(waited).error().context("staging tensors of " + ds.stream.device.str()));
    }
    if (!queued) {
        // (Also when the caller gave up waiting, cancelling this: the copies go on without it.)
        std::vector<std::pair<DeviceBackend*, tensorplay::Event>> events;
        for (auto& ds : used)
            if (auto ev = ds.backend->record_event(ds.stream)) events.emplace_back(ds.backend, std::move(*ev));
        using Kept = std::tuple<std::shared_ptr<OutboxHold>, std::vector<Tensor>, DeviceParts>;
        spawn_(drop_after(std::move(events), std::make_shared<Kept>(std::move(hold), std::move(tensors), std::move(out.parts))));
        co_return fail(std::move(queued).error());
    }
    if (!hold->ranges.empty()) out.parts.keep = std::move(hold);
    out.tensors = std::move(tensors);
    co_return out;
}

Result<DeviceChannels::Landed> DeviceChannels::land(const std::shared_ptr<Connection>& conn, Frame& frame,
                                                    std::vector<tensorplay::Stream>& streams, Deliver later) {
    // (The streams the frame's sinks queued its chunked tensors' arrival on are its streams there.)
    std::vector<tensorplay::Stream> arrived;
    if (auto a = arriving_.find(conn.get()); a != arriving_.end()) {
        arrived = std::move(a->second);
        arriving_.erase(a);
    }
    if (frame.device_hold == 0 && std::all_of(frame.targets.begin(), frame.targets.end(), [](Device d) { return d.is_cpu(); }))
        return Landed::now;  // (CPU tensors only: nothing to land)
    std::vector<DeviceStream> used;
    used.reserve(frame.tensors.size());  // (pointers into it stay valid)
    auto stream_on = [&](Device d) -> Result<DeviceStream*> {
        if (DeviceStream* ds = find_stream(used, d)) return ds;
        auto b = backend_for(d);
        if (!b) return fail(std::move(b).error());
        auto a = std::find_if(arrived.begin(), arrived.end(), [d](const tensorplay::Stream& s) { return s.device == d; });
        auto s = a != arrived.end() ? Result<tensorplay::Stream>(*a) : (*b)->acquire_stream(d);
        if (!s) return fail(std::move(s).error());
        used.push_back(DeviceStream{*b, *s});
        streams.push_back(*s);
        return &used.back();
    };
    std::vector<std::shared_ptr<RingLanding>> rings;
    std::vector<RefCopy> copies;
    auto landed = [&]() -> Result<void> {
        if (frame.alloc_error) return ok();  // (the frame fails as it is: nothing to land)
        for (std::size_t i = 0; i < frame.tensors.size() && i < frame.targets.size(); ++i) {
            const Device target = frame.targets[i];
            Tensor& t = frame.tensors[i];
            if (target.is_cpu() || !t.defined()) continue;
            auto ds = stream_on(target);
            if (!ds) return fail(std::move(ds).error());
            if (t.device() == target) continue;  // (received in place: host-addressable memory)
            // Staged by our allocator in host memory: up to the device on the frame's stream.
            DeviceBackend& b = *(*ds)->backend;
            auto dst = b.allocate_on((*ds)->stream, t.nbytes());
            if (!dst) return fail(std::move(dst).error());
            auto up = Tensor::wrap(*dst, t.dtype(), t.shape());
            if (!up) return fail(std::move(up).error());
            if (auto c = b.copy_async((*ds)->stream, (*dst)->data(), t.data(), t.nbytes(), t.storage()); !c) return c;
            t = std::move(*up);
            ++stats_.staged_received;
        }
        if (frame.device_refs.empty()) return ok();
        return land_refs(conn, frame, stream_on, rings, copies);
    }();
    // Copies out of the peer's outbox whose events are complete already are queued now (the common
    // case: the frame took longer to come than the peer's copy into its outbox); otherwise the host
    // waits for them (gate), never a stream of ours.
    const bool gated = landed && std::any_of(copies.begin(), copies.end(), [](const RefCopy& c) { return !c.event.ready(); });
    if (landed && !gated) landed = queue_ref_copies(copies);
    if (landed && (gated || !rings.empty())) {
        // The frame waits (its hold with it) for its gate and its rings' chunks; each copied-out
        // chunk whose slot a later one uses is said "free" once its copy ran.
        auto pending = std::make_shared<PendingFrame>();
        pending->rings = static_cast<int>(rings.size());
        pending->gates = gated ? 1 : 0;
        pending->deliver = std::move(later);
        pending->frame = std::move(frame);
        pending->streams = std::move(streams);
        pending->used = std::move(used);
        for (auto& l : rings) {
            l->frame = pending;
            landing_[RingKey{conn.get(), l->device, l->offset}] = l;
        }
        if (gated) spawn_(gate(conn, pending, std::move(copies), alive_));
        for (auto& l : rings) drain(conn, l);
        return Landed::later;
    }
    if (frame.device_hold != 0) release_when_copied(conn, used, frame.device_hold);
    if (!landed) return fail(std::move(landed).error());
    return Landed::now;
}

Result<void> DeviceChannels::land_refs(const std::shared_ptr<Connection>& conn, Frame& frame,
                                       const std::function<Result<DeviceStream*>(Device)>& stream_on,
                                       std::vector<std::shared_ptr<RingLanding>>& rings, std::vector<RefCopy>& copies) {
    PeerDevices& p = peer_of(*conn);
    if (p.bad) return fail(Errc::protocol_error, "cuda_ipc tensors from a peer whose offer is unusable: " + p.bad->message());
    for (const auto& ref : frame.device_refs) {
        const TensorDesc& desc = ref.desc;
        auto r = decode_ipc_ref(ref.ref);
        if (!r) return fail(std::move(r).error());
        const IpcDeviceParams* theirs = desc.source.is_cuda() ? p.device(desc.source.index) : nullptr;
        // (A ring: the tensor is larger than it, and it lies in the outbox.)
        const std::uint64_t len = theirs && r->chunked ? theirs->chunk * theirs->ring : desc.nbytes;
        if (!theirs || !theirs->outbox || r->event >= static_cast<int>(theirs->events.size()) || r->offset > theirs->size ||
            len > theirs->size - r->offset)
            return fail(Errc::protocol_error, "cuda_ipc tensor " + std::to_string(ref.index) + " names " + std::to_string(len) +
                                                  " bytes at " + std::to_string(r->offset) + (r->chunked ? " (a ring, event " : " (event ") +
                                                  std::to_string(r->event) + ") of an outbox on " + desc.source.str() +
                                                  " that its offer does not have");
        if (r->chunked && desc.nbytes <= len)
            return fail(Errc::protocol_error, "cuda_ipc tensor " + std::to_string(ref.index) + " of " + std::to_string(desc.nbytes) +
                                                  " bytes comes through a ring of " + std::to_string(len) + " bytes, which it fits whole");
        const RingKey key{conn.get(), theirs->index, r->offset};
        if (r->chunked && (landing_.count(key) || std::any_of(rings.begin(), rings.end(), [&](const auto& l) {
                               return l->device == theirs->index && l->offset == r->offset;
                           })))
            return fail(Errc::protocol_error, "cuda_ipc tensor " + std::to_string(ref.index) + " names the ring at " +
                                                  std::to_string(r->offset) + " of " + desc.source.str() +
                                                  ", which another tensor still uses");
        if (auto no = p.refused.find({theirs->index, desc.target.index}); no != p.refused.end()) return fail(no->second);
        auto ds = stream_on(desc.target);
        if (!ds) return fail(std::move(ds).error());
        DeviceBackend& b = *(*ds)->backend;
        auto& memory = p.memory[{theirs->index, desc.target.index}];
        if (!memory) {
            auto m = b.open_memory(desc.target, theirs->memory, theirs->size);
            if (!m)
                return fail(refuse(conn, p, theirs->index, desc.target,
                                   std::move(m).error().context("opening the cuda_ipc outbox of " + desc.source.str())));
            memory = std::move(*m);
        }
        auto& ev = p.events[{theirs->index, desc.target.index, r->event}];
        if (!ev.state()) {
            auto e = b.open_ipc_event(desc.target, theirs->events[static_cast<std::size_t>(r->event)]);
            if (!e)
                return fail(refuse(conn, p, theirs->index, desc.target,
                                   std::move(e).error().context("opening a cuda_ipc event of " + desc.source.str())));
            ev = std::move(*e);
        }
        auto dst = b.allocate_on((*ds)->stream, desc.nbytes);
        if (!dst) return fail(std::move(dst).error());
        auto t = Tensor::wrap(*dst, desc.dtype, desc.shape);
        if (!t) return fail(std::move(t).error());
        if (!r->chunked) {
            copies.push_back(RefCopy{&b, (*ds)->stream, (*dst)->data(), memory->data() + r->offset, desc.nbytes, memory, ev});
        } else {
            // Its first chunks are in the ring already (the event above orders after them): they wait
            // for it like the chunks announced later.
            auto l = std::make_shared<RingLanding>();
            l->backend = &b;
            l->stream = (*ds)->stream;
            l->memory = memory;
            l->event = ev;
            l->dst = (*dst)->data();
            l->device = theirs->index;
            l->offset = r->offset;
            l->nbytes = desc.nbytes;
            l->chunk = static_cast<std::size_t>(theirs->chunk);
            l->ring = theirs->ring;
            l->chunks = static_cast<std::uint32_t>((desc.nbytes + l->chunk - 1) / l->chunk);
            l->arrived.assign(l->chunks, false);
            for (std::uint32_t j = 0; j < l->ring; ++j) l->waiting.push_back(j);
            rings.push_back(std::move(l));
            ++stats_.ring_received;
        }
        frame.tensors[ref.index] = std::move(*t);
        (*ds)->from_peer = true;
        ++stats_.ipc_received;
    }
    return ok();
}

Error DeviceChannels::refuse(const std::shared_ptr<Connection>& conn, PeerDevices& p, int source, Device target, Error why) {
    Error e = std::move(why).context("cuda_ipc from cuda:" + std::to_string(source) + " of worker \"" + conn->peer().name + "\" to " +
                                     target.str() + " is off from now on (its tensors are staged, as cuda_basic does)");
    p.refused.emplace(std::make_pair(source, target.index), e);
    log(LogLevel::warn, "rpc", e.message());
    send_ring_notice(*conn, kIpcRefused, RingNotice{source, static_cast<std::uint64_t>(target.index), 0});
    return e;
}

Task<bool> DeviceChannels::quiesce(std::chrono::steady_clock::duration limit) {
    auto alive = std::weak_ptr<void>(alive_);
    const auto until = std::chrono::steady_clock::now() + limit;
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (;;) {
        if (alive.expired()) co_return true;
        if (std::all_of(outboxes_.begin(), outboxes_.end(), [](const auto& b) { return b.second->idle(); })) co_return true;
        if (std::chrono::steady_clock::now() >= until) co_return false;
        timer.expires_after(std::chrono::milliseconds(1));
        if (auto [ec] = co_await timer.async_wait(use_nothrow); ec) co_return false;
    }
}

Result<void> DeviceChannels::refused_by_peer(const Connection& conn, const RingNotice& n) {
    if (!outboxes_.count(n.device) || n.offset > 1023 || n.chunk != 0)
        return fail(Errc::protocol_error, "the peer refuses cuda_ipc from cuda:" + std::to_string(n.device) + " to cuda:" +
                                              std::to_string(n.offset) + ", which is not a pair we send on");
    peer_of(conn).reach[{n.device, static_cast<int>(n.offset)}] = false;
    log(LogLevel::warn, "rpc", "worker \"" + conn.peer().name + "\" cannot open the cuda_ipc outbox of our cuda:" + std::to_string(n.device) +
                                   " on its cuda:" + std::to_string(n.offset) + ": its tensors from there are staged (cuda_basic) from now on");
    return ok();
}

Result<void> DeviceChannels::queue_ref_copies(const std::vector<RefCopy>& copies) {
    for (const auto& c : copies)
        if (auto r = c.backend->copy_async(c.stream, c.dst, c.src, c.n, c.memory); !r) return r;
    return ok();
}

Task<void> DeviceChannels::gate(std::weak_ptr<Connection> weak, std::shared_ptr<PendingFrame> frame, std::vector<RefCopy> copies,
                                std::weak_ptr<void> alive) {
    const EventState* last = nullptr;
    for (const auto& c : copies) {
        if (c.event.state().get() == last) continue;  // (tensors of one outbox event: one wait)
        last = c.event.state().get();
        auto seen = co_await host_wait(*c.backend, c.event, weak);
        if (alive.expired()) co_return;
        if (!seen) {
            if (auto conn = weak.lock(); conn && seen.error().code() != Errc::connection_lost)
                conn->close(std::move(seen).error().context("waiting for a cuda_ipc event of " + c.stream.device.str() + "'s peer"));
            co_return;  // (the frame goes with its connection)
        }
    }
    auto conn = weak.lock();
    if (!conn || !conn->is_open()) co_return;
    if (auto q = queue_ref_copies(copies); !q) {
        conn->close(std::move(q).error().context("copying cuda_ipc tensors out of the peer's outbox"));
        co_return;
    }
    frame->gates = 0;
    finish_if_whole(conn, frame);
}

void DeviceChannels::finish_if_whole(const std::shared_ptr<Connection>& conn, const std::shared_ptr<PendingFrame>& frame) {
    if (frame->rings > 0 || frame->gates > 0 || !frame->deliver) return;
    if (frame->frame.device_hold != 0) release_when_copied(conn, frame->used, frame->frame.device_hold);
    auto deliver = std::move(frame->deliver);
    frame->deliver = nullptr;
    deliver(std::move(frame->frame), std::move(frame->streams));
}

// The hold goes back once every copy out of the peer's outbox has run: one stream waits for the
// others, and a coroutine of the agent's awaits an event after them. (After a failure too: the
// frame is dropped, so what its copies read no longer matters.)
void DeviceChannels::release_when_copied(const std::shared_ptr<Connection>& conn, std::vector<DeviceStream>& used,
                                         std::uint64_t hold) {
    DeviceStream* last = nullptr;
    for (auto& ds : used) {
        if (!ds.from_peer) continue;
        if (!last) {
            last = &ds;
        } else if (auto ev = ds.backend->record_event(ds.stream)) {
            (void)last->backend->wait_event(last->stream, *ev);
        }
    }
    if (last) {
        if (auto ev = last->backend->record_event(last->stream)) {
            spawn_(release_after(*last->backend, *ev, conn, hold));
            return;
        }
    }
    release_hold(*conn, hold);  // (nothing was copied out, or the device failed)
}

}  // namespace tensorplay::detail
