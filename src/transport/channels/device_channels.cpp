// The agent's device channels: offers, stream ordering, staging (cuda_basic) and outboxes (cuda_ipc)
// on the sending side; the receiving side is in device_landing.cpp.
#include "transport/channels/device_channels_impl.hpp"

#include <tensorplay/core/log.hpp>

#include "transport/channels/cuda_ipc/outbox.hpp"
#include "transport/channels/cuda_ipc/peer.hpp"
#include "transport/channels/cuda_basic/staging.hpp"
#include "core/asio_compat.hpp"
#include "core/resume_slot.hpp"
#include "transport/transport.hpp"

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <set>

namespace tensorplay::detail {

std::size_t default_outbox_bytes() {
    if (const char* v = std::getenv("TP_CUDA_IPC_OUTBOX_BYTES"); v && *v) {
        char* end = nullptr;
        const auto n = std::strtoull(v, &end, 10);
        if (end && *end == '\0' && n > 0) return static_cast<std::size_t>(n);
        log(LogLevel::warn, "rpc", "TP_CUDA_IPC_OUTBOX_BYTES=\"" + std::string(v) + "\" is not a positive byte count: ignored");
    }
    return std::size_t{64} << 20;  // (tensors of 1 MiB and more of the pool go with one copy, not through it)
}

namespace {
/// Tensors of at least this many bytes go with one copy (TP_CUDA_IPC_ONE_COPY_MIN, else 1 MiB):
/// below it, two copies through the outbox cost less than importing the tensor's memory.
std::size_t one_copy_min_bytes() {
    if (const char* v = std::getenv("TP_CUDA_IPC_ONE_COPY_MIN"); v && *v) {
        char* end = nullptr;
        const auto n = std::strtoull(v, &end, 10);
        if (end && *end == '\0') return static_cast<std::size_t>(n);
        log(LogLevel::warn, "rpc", "TP_CUDA_IPC_ONE_COPY_MIN=\"" + std::string(v) + "\" is not a byte count: ignored");
    }
    return std::size_t{1} << 20;
}
}  // namespace

DeviceChannelsImpl::DeviceChannelsImpl(Spawn spawn) : spawn_(std::move(spawn)), one_copy_min_(one_copy_min_bytes()) {}
DeviceChannelsImpl::~DeviceChannelsImpl() {
    for (auto [index, fd] : pool_fds_) ::close(fd);
}

Result<std::unique_ptr<DeviceChannels>> DeviceChannels::create(Spawn spawn, const std::vector<Device>& outbox_devices,
                                                               const std::vector<std::string>& channels, std::size_t outbox_bytes) {
    auto dc = std::make_unique<DeviceChannelsImpl>(std::move(spawn));
    dc->outbox_bytes_ = outbox_bytes;
    const bool want_ipc = std::find(channels.begin(), channels.end(), "cuda_ipc") != channels.end();
    const bool want_basic = std::find(channels.begin(), channels.end(), "cuda_basic") != channels.end();
    if (!want_ipc && !want_basic) return dc;
    auto backend = backend_for(Device::cuda(0));
    if (!backend || (*backend)->device_count() == 0) return dc;  // no cuda devices: no offers
    DeviceBackend& b = **backend;
    if (want_ipc && b.name() == "cuda") {
        // (Properties need no context. Outboxes are made at their first use and announced then.)
        IpcParams params;
        params.pid = static_cast<std::int32_t>(::getpid());
        for (int i = 0; i < b.device_count(); ++i) {
            const Device d = Device::cuda(i);
            auto props = b.properties(d);
            if (!props) return fail(std::move(props).error().context("reading cuda:" + std::to_string(i) + " for cuda_ipc"));
            dc->bus_ids_[i] = props->pci_bus_id;
            dc->uuids_[i] = props->uuid;
            if (std::find(outbox_devices.begin(), outbox_devices.end(), d) != outbox_devices.end()) dc->ipc_devices_.insert(i);
            IpcDeviceParams p;
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

PeerDevices& DeviceChannelsImpl::peer_of(const Connection& conn) {
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
        else if (std::any_of(decoded->devices.begin(), decoded->devices.end(), [](const IpcDeviceParams& d) { return d.outbox; }))
            p.bad = Error(Errc::protocol_error, "its cuda_ipc offer carries an outbox (they are announced before their first frame)");
        else {
            p.pid = decoded->pid;
            p.devices = std::move(decoded->devices);
        }
    }
    return p;
}

void DeviceChannelsImpl::forget(const Connection* conn) {
    peers_.erase(conn);
    arriving_.erase(conn);
    // (Its frames waiting for chunks are dropped; copies already queued keep what they use.)
    std::erase_if(sending_, [conn](const auto& e) { return std::get<0>(e.first) == conn; });
    std::erase_if(landing_, [conn](const auto& e) { return std::get<0>(e.first) == conn; });
}

Result<std::shared_ptr<ByteSink>> DeviceChannelsImpl::sink(const Connection* conn, const TensorDesc& desc) {
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

Outbox* DeviceChannelsImpl::outbox(int index) {
    if (auto it = outboxes_.find(index); it != outboxes_.end()) return it->second.get();
    if (!ipc_devices_.count(index)) return nullptr;
    const Device d = Device::cuda(index);
    auto b = backend_for(d);
    auto box = b ? Outbox::create(**b, d, outbox_bytes_) : Result<std::shared_ptr<Outbox>>(fail(std::move(b).error()));
    if (!box) {
        // A device that cannot have one (its memory taken, held by another process, no IPC) loses
        // cuda_ipc from it, not the agent: its tensors go by cuda_basic.
        ipc_devices_.erase(index);
        log(LogLevel::warn, "rpc", "cuda_ipc is off for tensors from " + d.str() + ": " + box.error().to_string() +
                                       "; they go by cuda_basic");
        return nullptr;
    }
    // Its pool's descriptor, for peers to take: its tensors then go with one copy.
    if (auto fd = (*b)->export_pool(d); fd) pool_fds_[index] = *fd;
    else log(LogLevel::debug, "rpc", "cuda_ipc from " + d.str() + " copies through the outbox: " + fd.error().to_string());
    return (outboxes_[index] = std::move(*box)).get();
}

// cuda_ipc for a tensor from our `source` to the peer's `target`: the pair chose it, our device may
// send by cuda_ipc, and it reaches theirs (the same PCI device, or peer access); then its outbox,
// made now if it is the first, is announced to the peer before the frame that uses it.
bool DeviceChannelsImpl::ipc_viable(Connection& conn, Device source, Device target) {
    if (!source.is_cuda() || !target.is_cuda() || !ipc_devices_.count(source.index)) return false;
    if (send_channel(conn, source, target) != ChannelKind::cuda_ipc) return false;
    PeerDevices& p = peer_of(conn);
    if (p.bad) return false;
    const auto key = std::make_pair(source.index, target.index);
    auto it = p.reach.find(key);
    if (it == p.reach.end()) {
        bool ok = false;
        if (const IpcDeviceParams* theirs = p.device(target.index)) {
            for (const auto& [idx, bus] : bus_ids_) {
                // (By UUID when both sides know it: MIG instances of one GPU share its bus id.)
                const std::string& uuid = uuids_[idx];
                if (!uuid.empty() && !theirs->uuid.empty() ? uuid != theirs->uuid : bus != theirs->bus_id) continue;
                auto b = backend_for(source);
                auto r = b ? (*b)->can_access_peer(source, Device::cuda(idx)) : Result<bool>(false);
                ok = r && *r;
                break;
            }
        }
        if (!ok)
            log(LogLevel::debug, "rpc", "cuda_ipc from " + source.str() + " to " + target.str() + " of worker \"" + conn.peer().name +
                                            "\": its device is not reachable from ours (cuda_basic instead)");
        it = p.reach.emplace(key, ok).first;
    }
    if (!it->second) return false;
    Outbox* box = outbox(source.index);
    if (!box) return false;
    if (p.announced.insert(source.index).second) {
        IpcParams params;
        params.pid = static_cast<std::int32_t>(::getpid());
        params.devices.push_back(box->params());
        params.devices.back().bus_id = bus_ids_[source.index];
        params.devices.back().uuid = uuids_[source.index];
        if (auto fd = pool_fds_.find(source.index); fd != pool_fds_.end()) params.devices.back().pool_fd = fd->second;
        const std::string encoded = encode_ipc_params(params);
        send_control(conn, kIpcOutbox, Bytes(encoded.begin(), encoded.end()));
    }
    return true;
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

// The outbox event that the frame's work on `ds`'s device is recorded on: the one reserved for that
// device, else a free one; false when none is free.
bool frame_event(const std::shared_ptr<Outbox>& box, DeviceStream& ds, OutboxHold& hold, std::map<int, int>& reserved) {
    if (ds.event >= 0) return true;
    std::optional<int> k;
    if (auto r = reserved.find(box->device().index); r != reserved.end()) {
        k = r->second;
        reserved.erase(r);
    } else {
        k = box->take_event();
    }
    if (!k) return false;
    ds.event = *k;
    hold.events.emplace_back(box, *k);
    return true;
}

}  // namespace

DeviceStream* find_stream(std::vector<DeviceStream>& v, Device d) {
    for (auto& s : v)
        if (s.stream.device == d) return &s;
    return nullptr;
}

Result<void> DeviceChannelsImpl::queue_copies(const std::shared_ptr<Connection>& conn, std::vector<Tensor>& tensors,
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
        // (An empty tensor has no memory to refer to: it goes inline, as a staged one of 0 bytes.)
        if (n > 0 && ipc_viable(*conn, d, targets[i])) {
            auto& box = outboxes_.at(d.index);  // (ipc_viable made it)
            // One copy: the peer copies out of the tensor's own memory, which the hold keeps.
            PeerDevices& peer = peer_of(*conn);
            if (n >= one_copy_min_ && pool_fds_.count(d.index) != 0 && !peer.pool_off[{d.index, targets[i].index}]) {
                const auto& storage = t.storage();
                auto data = b.export_pointer(*storage);
                if (data && frame_event(box, *ds, hold, reserved)) {
                    const std::uint64_t id = peer.next_export++;
                    const auto offset = static_cast<std::uint64_t>(t.data() - storage->data());
                    out.parts.preface.emplace_back(std::string(kIpcExport), encode_pool_export(PoolExport{id, d.index, offset, *data}));
                    hold.tensors.push_back(t);
                    out.parts.refs[i] = encode_pool_ref(id, ds->event);
                    ++stats_.ipc_sent;
                    ++stats_.pooled_sent;
                    continue;
                }
                // (Not memory of our pool, say a wrapped pointer: through the outbox.)
            }
            // Larger than a ring: through one, in chunks (cuda_ipc/rings.hpp).
            const bool ring = n > box->ring_bytes();
            const std::size_t len = ring ? box->ring_bytes() : n;
            std::optional<std::size_t> off = box->take_range(len);
            if (off && !frame_event(box, *ds, hold, reserved)) {
                box->give_range(*off, len);
                off.reset();
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

/// The signal of a frame whose tensors the peer reads in place: set (and its waiter woken, on its
/// executor) when the connection lets go of the frame's hold.
struct ReleaseWatch {
    explicit ReleaseWatch(asio::any_io_executor e) : ex(std::move(e)) {}
    asio::any_io_executor ex;
    ResumeSlot slot;
    std::atomic<bool> released{false};
};

namespace {
/// What the connection's hold keeps of such a frame: its outbox hold, and the watch it sets when it
/// goes. (Holds are let go of on the agent's executor, where the waiter checks and parks, so the
/// wake-up is never missed; a waiter is bounded by its limit anyway.)
struct WatchedHold {
    std::shared_ptr<OutboxHold> hold;
    std::shared_ptr<ReleaseWatch> watch;
    WatchedHold(std::shared_ptr<OutboxHold> h, std::shared_ptr<ReleaseWatch> w) : hold(std::move(h)), watch(std::move(w)) {}
    WatchedHold(const WatchedHold&) = delete;
    WatchedHold& operator=(const WatchedHold&) = delete;
    ~WatchedHold() {
        hold.reset();  // (its events and tensors go back first)
        watch->released.store(true, std::memory_order_release);
        if (watch->slot.waiting())
            asio::post(watch->ex, [w = watch] {
                if (w->slot.waiting()) w->slot.complete();
            });
    }
};

Task<Result<void>> until_released(std::shared_ptr<ReleaseWatch> w) {
    if (!w->released.load(std::memory_order_acquire)) co_await w->slot.wait();
    if (!w->released.load(std::memory_order_acquire)) co_return fail(Errc::cancelled, "waiting for the peer's release");
    co_return ok();
}
}  // namespace

Task<bool> DeviceChannels::await_release(PreparedTensors& prepared, std::chrono::steady_clock::duration limit) {
    prepared.parts.keep.reset();
    auto w = std::move(prepared.released);
    if (!w || w->released.load(std::memory_order_acquire)) co_return true;
    auto r = co_await with_timeout(until_released(w), limit);
    co_return r.has_value();
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

Task<Result<PreparedTensors>> DeviceChannelsImpl::prepare(std::shared_ptr<Connection> conn, std::vector<Tensor> tensors,
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
        if (tensors[i].device().is_cuda() && tensors[i].nbytes() > 0 && ipc_viable(*conn, tensors[i].device(), targets[i]))
            wanted.insert(tensors[i].device().index);
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
        using Kept = std::tuple<std::shared_ptr<OutboxHold>, std::vector<Tensor>, SendPlan>;
        spawn_(drop_after(std::move(events), std::make_shared<Kept>(std::move(hold), std::move(tensors), std::move(out.parts))));
        co_return fail(std::move(queued).error());
    }
    if (!hold->tensors.empty()) {
        out.released = std::make_shared<ReleaseWatch>(co_await asio::this_coro::executor);
        out.parts.keep = std::make_shared<WatchedHold>(std::move(hold), out.released);
    } else if (!hold->ranges.empty()) {
        out.parts.keep = std::move(hold);
    }
    out.tensors = std::move(tensors);
    co_return out;
}

Task<bool> DeviceChannelsImpl::quiesce(std::chrono::steady_clock::duration limit) {
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

Result<void> DeviceChannelsImpl::refused_by_peer(const Connection& conn, const RingNotice& n) {
    const bool pool_only = n.chunk == kRefusedPoolOnly;
    if (!outboxes_.count(n.device) || n.offset > 1023 || (n.chunk != 0 && !pool_only) || (pool_only && !pool_fds_.count(n.device)))
        return fail(Errc::protocol_error, "the peer refuses cuda_ipc from cuda:" + std::to_string(n.device) + " to cuda:" +
                                              std::to_string(n.offset) + ", which is not a pair we send on");
    if (pool_only) {
        peer_of(conn).pool_off[{n.device, static_cast<int>(n.offset)}] = true;
        log(LogLevel::warn, "rpc", "worker \"" + conn.peer().name + "\" cannot import the memory pool of our cuda:" +
                                       std::to_string(n.device) + " on its cuda:" + std::to_string(n.offset) +
                                       ": its tensors from there go through the cuda_ipc outbox (two copies) from now on");
        return ok();
    }
    peer_of(conn).reach[{n.device, static_cast<int>(n.offset)}] = false;
    log(LogLevel::warn, "rpc", "worker \"" + conn.peer().name + "\" cannot open the cuda_ipc outbox of our cuda:" + std::to_string(n.device) +
                                   " on its cuda:" + std::to_string(n.offset) + ": its tensors from there are staged (cuda_basic) from now on");
    return ok();
}


}  // namespace tensorplay::detail
