// The agent's device channels, receiving: device tensors landed on fresh pool streams, copies out
// of the peer's outbox once the host saw its event complete, refusals, and the hold's release.
#include "transport/channels/device_channels_impl.hpp"

#include <tensorplay/core/log.hpp>

#include "transport/channels/cuda_ipc/peer.hpp"
#include "transport/channels/cuda_basic/staging.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tensorplay::detail {

namespace {
/// Releases the peer's hold `hold` once `copied` (the frame's copies out of its outbox) is
/// complete: awaited, not a host function on the stream (which could outlive the agent's event
/// loop); cancelled with the agent, when the connection goes anyway.
Task<void> release_after(DeviceBackend& b, tensorplay::Event copied, std::weak_ptr<Connection> conn, std::uint64_t hold) {
    auto done = co_await b.wait(std::move(copied));
    (void)done;  // (a device error: the copies are over either way)
    if (auto c = conn.lock()) release_hold(*c, hold);
}
}  // namespace

Result<DeviceChannels::Landed> DeviceChannelsImpl::land(const std::shared_ptr<Connection>& conn, Frame& frame,
                                                    const DeviceRefs& refs, std::vector<tensorplay::Stream>& streams,
                                                    Deliver later) {
    // (The streams the frame's sinks queued its chunked tensors' arrival on are its streams there.)
    std::vector<tensorplay::Stream> arrived;
    if (auto a = arriving_.find(conn.get()); a != arriving_.end()) {
        arrived = std::move(a->second);
        arriving_.erase(a);
    }
    if (refs.hold == 0 && std::all_of(frame.targets.begin(), frame.targets.end(), [](Device d) { return d.is_cpu(); }))
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
        if (refs.refs.empty()) return ok();
        return land_refs(conn, frame, refs, stream_on, rings, copies);
    }();
    // (Exports announced for this frame that it did not take, failing first, go with it.)
    if (!refs.refs.empty())
        if (auto p = peers_.find(conn.get()); p != peers_.end())
            for (const auto& ref : refs.refs)
                if (auto r = decode_ipc_ref(ref.ref); r && r->pooled) p->second->exports.erase(r->offset);
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
        pending->hold = refs.hold;
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
    // (Imports whose copies were not queued, the frame failing, are freed before the release.)
    copies.clear();
    if (refs.hold != 0) release_when_copied(conn, used, refs.hold);
    if (!landed) return fail(std::move(landed).error());
    return Landed::now;
}

Result<void> DeviceChannelsImpl::land_refs(const std::shared_ptr<Connection>& conn, Frame& frame, const DeviceRefs& refs,
                                       const std::function<Result<DeviceStream*>(Device)>& stream_on,
                                       std::vector<std::shared_ptr<RingLanding>>& rings, std::vector<RefCopy>& copies) {
    PeerDevices& p = peer_of(*conn);
    if (p.bad) return fail(Errc::protocol_error, "cuda_ipc tensors from a peer whose offer is unusable: " + p.bad->message());
    for (const auto& ref : refs.refs) {
        const TensorDesc& desc = ref.desc;
        auto r = decode_ipc_ref(ref.ref);
        if (!r) return fail(std::move(r).error());
        if (r->pooled) {
            auto t = land_pooled(conn, p, desc, ref.index, *r, stream_on, copies);
            if (!t) return fail(std::move(t).error());
            frame.tensors[ref.index] = std::move(*t);
            continue;
        }
        const IpcDeviceParams* theirs = desc.source.is_cuda() ? p.device(desc.source.index) : nullptr;
        // (A ring: the tensor is larger than it, and it lies in the outbox.)
        const std::uint64_t len = theirs && r->chunked ? theirs->chunk * theirs->ring : desc.nbytes;
        if (!theirs || !theirs->outbox || r->event >= static_cast<int>(theirs->events.size()) || r->offset > theirs->size ||
            len > theirs->size - r->offset)
            return fail(Errc::protocol_error, "cuda_ipc tensor " + std::to_string(ref.index) + " names " + std::to_string(len) +
                                                  " bytes at " + std::to_string(r->offset) + (r->chunked ? " (a ring, event " : " (event ") +
                                                  std::to_string(r->event) + ") of an outbox on " + desc.source.str() +
                                                  " that it did not announce");
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
        auto ev = peer_event(conn, p, b, theirs->index, desc.target, r->event);
        if (!ev) return fail(std::move(ev).error());
        auto dst = b.allocate_on((*ds)->stream, desc.nbytes);
        if (!dst) return fail(std::move(dst).error());
        auto t = Tensor::wrap(*dst, desc.dtype, desc.shape);
        if (!t) return fail(std::move(t).error());
        if (!r->chunked) {
            copies.push_back(RefCopy{&b, (*ds)->stream, (*dst)->data(), memory->data() + r->offset, desc.nbytes, memory, *ev});
        } else {
            // Its first chunks are in the ring already (the event above orders after them): they wait
            // for it like the chunks announced later.
            auto l = std::make_shared<RingLanding>();
            l->backend = &b;
            l->stream = (*ds)->stream;
            l->memory = memory;
            l->event = *ev;
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

Result<tensorplay::Event> DeviceChannelsImpl::peer_event(const std::shared_ptr<Connection>& conn, PeerDevices& p, DeviceBackend& b,
                                                     int source, Device target, int k) {
    const auto key = std::make_tuple(source, target.index, k);
    if (auto it = p.events.find(key); it != p.events.end()) return it->second;
    const IpcDeviceParams* theirs = p.device(source);
    auto e = b.open_ipc_event(target, theirs->events[static_cast<std::size_t>(k)]);
    if (!e)
        return fail(refuse(conn, p, source, target, std::move(e).error().context("opening a cuda_ipc event of cuda:" + std::to_string(source))));
    p.events.emplace(key, *e);
    return std::move(*e);
}

namespace {
/// Descriptor `fd` of process `pid`, duplicated into this one (pidfd_getfd: the right to ptrace it).
Result<int> take_descriptor(int pid, int fd) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0)
        return fail(Errc::not_supported, "pidfd_open of process " + std::to_string(pid) + " failed: " + std::strerror(errno));
    const int got = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    const int err = errno;
    ::close(pidfd);
    if (got < 0)
        return fail(Errc::not_supported, "pidfd_getfd of descriptor " + std::to_string(fd) + " of process " + std::to_string(pid) +
                                             " failed: " + std::strerror(err) +
                                             (err == EPERM ? " (taking it needs the right to ptrace that process)" : ""));
    return got;
}
}  // namespace

Result<Tensor> DeviceChannelsImpl::land_pooled(const std::shared_ptr<Connection>& conn, PeerDevices& p, const TensorDesc& desc,
                                           std::size_t index, const IpcRef& r,
                                           const std::function<Result<DeviceStream*>(Device)>& stream_on,
                                           std::vector<RefCopy>& copies) {
    const std::string what = "cuda_ipc tensor " + std::to_string(index);
    auto it = p.exports.find(r.offset);
    if (it == p.exports.end())
        return fail(Errc::protocol_error, what + " names export " + std::to_string(r.offset) + ", which the peer did not announce");
    const PoolExport e = std::move(it->second);
    p.exports.erase(it);
    const IpcDeviceParams* theirs = desc.source.is_cuda() ? p.device(desc.source.index) : nullptr;
    if (!theirs || e.device != theirs->index || !theirs->outbox || theirs->pool_fd < 0 ||
        r.event >= static_cast<int>(theirs->events.size()))
        return fail(Errc::protocol_error, what + " names the pool of cuda:" + std::to_string(e.device) + " (event " +
                                              std::to_string(r.event) + ") for a tensor from " + desc.source.str() +
                                              ", which it did not announce");
    if (auto no = p.pool_refused.find({theirs->index, desc.target.index}); no != p.pool_refused.end()) return fail(no->second);
    auto ds = stream_on(desc.target);
    if (!ds) return fail(std::move(ds).error());
    DeviceBackend& b = *(*ds)->backend;
    auto& pool = p.pools[theirs->index];
    if (!pool) {
        // (The offer's pid is the connection's peer where cma proved which process that is.)
        const int verified = cma_peer_pid(*conn);
        if (verified > 0 && verified != p.pid)
            return fail(Errc::protocol_error, "its cuda_ipc offer names process " + std::to_string(p.pid) +
                                                  ", but the connection's peer is process " + std::to_string(verified));
        auto fd = take_descriptor(p.pid, theirs->pool_fd);
        auto imported = fd ? b.import_pool(desc.target, *fd) : Result<std::shared_ptr<ImportedPool>>(fail(std::move(fd).error()));
        if (fd) ::close(*fd);
        if (!imported)
            return fail(refuse_pool(conn, p, theirs->index, desc.target,
                                    std::move(imported).error().context("importing the memory pool of " + desc.source.str())));
        pool = std::move(*imported);
    }
    auto memory = b.import_pointer(*pool, (*ds)->stream, e.data);
    if (!memory)
        return fail(refuse_pool(conn, p, theirs->index, desc.target,
                                std::move(memory).error().context("importing a tensor from the pool of " + desc.source.str())));
    // (Its free goes on this stream, whatever happens next: the release is recorded after it.)
    (*ds)->from_peer = true;
    const std::size_t size = (*memory)->size();
    if (e.offset > size || desc.nbytes > size - e.offset)
        return fail(Errc::protocol_error, what + " of " + std::to_string(desc.nbytes) + " bytes at " + std::to_string(e.offset) +
                                              " lies past its allocation of " + std::to_string(size) + " bytes");
    auto ev = peer_event(conn, p, b, theirs->index, desc.target, r.event);
    if (!ev) return fail(std::move(ev).error());
    auto dst = b.allocate_on((*ds)->stream, desc.nbytes);
    if (!dst) return fail(std::move(dst).error());
    auto t = Tensor::wrap(*dst, desc.dtype, desc.shape);
    if (!t) return fail(std::move(t).error());
    copies.push_back(RefCopy{&b, (*ds)->stream, (*dst)->data(), (*memory)->data() + e.offset, desc.nbytes, std::move(*memory), *ev, true});
    ++stats_.ipc_received;
    ++stats_.pooled_received;
    return t;
}

Result<void> DeviceChannelsImpl::exported_by_peer(const Connection& conn, std::span<const std::uint8_t> payload) {
    auto e = decode_pool_export(payload);
    if (!e) return fail(std::move(e).error());
    PeerDevices& p = peer_of(conn);
    // (Each goes right before its frame, which takes it: more pending means a peer that lies.)
    constexpr std::size_t kMaxExports = 4096;
    if (p.exports.size() >= kMaxExports)
        return fail(Errc::protocol_error, "the peer announced more than " + std::to_string(kMaxExports) +
                                              " cuda_ipc exports that no frame took");
    if (!p.exports.emplace(e->id, *e).second)
        return fail(Errc::protocol_error, "the peer announced cuda_ipc export " + std::to_string(e->id) + " twice");
    return ok();
}

Result<void> DeviceChannelsImpl::outbox_of_peer(const Connection& conn, std::span<const std::uint8_t> payload) {
    auto decoded = decode_ipc_params(std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
    if (!decoded) return fail(std::move(decoded).error().context("a cuda_ipc outbox notice"));
    PeerDevices& p = peer_of(conn);
    if (p.bad) return fail(Errc::protocol_error, "the peer announces a cuda_ipc outbox, but its offer was refused: " + p.bad->message());
    if (decoded->pid != p.pid || decoded->devices.size() != 1 || !decoded->devices[0].outbox)
        return fail(Errc::protocol_error, "a cuda_ipc outbox notice must name the offering process and one device with its outbox");
    IpcDeviceParams& announced = decoded->devices[0];
    auto it = std::find_if(p.devices.begin(), p.devices.end(), [&](const IpcDeviceParams& d) { return d.index == announced.index; });
    if (it == p.devices.end())
        return fail(Errc::protocol_error, "the peer announces an outbox of cuda:" + std::to_string(announced.index) + ", which it did not offer");
    if (it->outbox)
        return fail(Errc::protocol_error, "the peer announces its outbox of cuda:" + std::to_string(announced.index) + " twice");
    // (What identifies the device stays the offer's.)
    announced.bus_id = std::move(it->bus_id);
    announced.uuid = std::move(it->uuid);
    *it = std::move(announced);
    return ok();
}

Error DeviceChannelsImpl::refuse_pool(const std::shared_ptr<Connection>& conn, PeerDevices& p, int source, Device target, Error why) {
    Error e = std::move(why).context("one copy for cuda_ipc from cuda:" + std::to_string(source) + " of worker \"" + conn->peer().name +
                                     "\" to " + target.str() + " is off from now on (its tensors come through the outbox)");
    p.pool_refused.emplace(std::make_pair(source, target.index), e);
    log(LogLevel::warn, "rpc", e.message());
    send_ring_notice(*conn, kIpcRefused, RingNotice{source, static_cast<std::uint64_t>(target.index), kRefusedPoolOnly});
    return e;
}

Error DeviceChannelsImpl::refuse(const std::shared_ptr<Connection>& conn, PeerDevices& p, int source, Device target, Error why) {
    Error e = std::move(why).context("cuda_ipc from cuda:" + std::to_string(source) + " of worker \"" + conn->peer().name + "\" to " +
                                     target.str() + " is off from now on (its tensors are staged, as cuda_basic does)");
    p.refused.emplace(std::make_pair(source, target.index), e);
    log(LogLevel::warn, "rpc", e.message());
    send_ring_notice(*conn, kIpcRefused, RingNotice{source, static_cast<std::uint64_t>(target.index), 0});
    return e;
}

Result<void> DeviceChannelsImpl::queue_ref_copies(std::vector<RefCopy>& copies) {
    for (auto& c : copies) {
        if (auto r = c.backend->copy_async(c.stream, c.dst, c.src, c.n, c.pooled ? nullptr : c.memory); !r) return r;
        if (c.pooled) c.memory.reset();  // (its free is queued after the copy)
    }
    return ok();
}

Task<void> DeviceChannelsImpl::gate(std::weak_ptr<Connection> weak, std::shared_ptr<PendingFrame> frame, std::vector<RefCopy> copies,
                                std::weak_ptr<void> alive) {
    const tensorplay::Event* last = nullptr;
    for (const auto& c : copies) {
        if (last && c.event == *last) continue;  // (tensors of one outbox event: one wait)
        last = &c.event;
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

void DeviceChannelsImpl::finish_if_whole(const std::shared_ptr<Connection>& conn, const std::shared_ptr<PendingFrame>& frame) {
    if (frame->rings > 0 || frame->gates > 0 || !frame->deliver) return;
    if (frame->hold != 0) release_when_copied(conn, frame->used, frame->hold);
    auto deliver = std::move(frame->deliver);
    frame->deliver = nullptr;
    deliver(std::move(frame->frame), std::move(frame->streams));
}

// The hold goes back once every copy out of the peer's outbox has run: one stream waits for the
// others, and a coroutine of the agent's awaits an event after them. (After a failure too: the
// frame is dropped, so what its copies read no longer matters.)
void DeviceChannelsImpl::release_when_copied(const std::shared_ptr<Connection>& conn, std::vector<DeviceStream>& used,
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
