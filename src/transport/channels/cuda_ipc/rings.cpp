// cuda_ipc's rings: chunks of a large tensor through a few slots of the outbox (rings.hpp).
#include "transport/channels/cuda_ipc/rings.hpp"

#include <tensorplay/core/timeout.hpp>
#include <tensorplay/core/wire.hpp>

#include "transport/channels/device_channels_impl.hpp"
#include "transport/channels/cuda_ipc/outbox.hpp"
#include "transport/connection_ext.hpp"

#include <algorithm>

namespace tensorplay::detail {

void send_control(Connection& conn, std::string_view name, Bytes payload) {
    if (!conn.is_open()) return;
    std::vector<Tensor> none;
    (void)send_parts(conn, FrameKind::control, 0, name, payload, none, {}, Flush::now);  // (a closed connection: nothing to tell)
}

void send_ring_notice(Connection& conn, std::string_view name, const RingNotice& n) {
    send_control(conn, name, encode_ring_notice(n));
}

Task<void> free_after(DeviceBackend& b, tensorplay::Event copied, std::weak_ptr<Connection> conn, RingNotice n) {
    auto done = co_await b.wait(std::move(copied));
    if (!done) co_return;  // (a device error: the frame's copies failed, and its slot stays taken until the release)
    if (auto c = conn.lock()) send_ring_notice(*c, kRingFree, n);
}

namespace {
std::size_t chunk_len(std::uint64_t nbytes, std::size_t chunk, std::uint32_t k) {
    return static_cast<std::size_t>(std::min<std::uint64_t>(chunk, nbytes - std::uint64_t{k} * chunk));
}
}  // namespace

Result<void> RingSend::copy_in(std::uint32_t k) {
    const std::size_t slot = static_cast<std::size_t>(k % kOutboxRing) * chunk;
    const std::size_t at = static_cast<std::size_t>(k) * chunk;
    auto c = backend->copy_async(stream, box->data() + offset + slot, tensor.data() + at, chunk_len(tensor.nbytes(), chunk, k),
                                 tensor.storage());
    if (c) ++queued;
    return c;
}

Result<void> RingLanding::copy_out(std::uint32_t j) {
    const std::size_t slot = static_cast<std::size_t>(j % ring) * chunk;
    const std::size_t at = static_cast<std::size_t>(j) * chunk;
    if (auto c = backend->copy_async(stream, dst + at, memory->data() + offset + slot, chunk_len(nbytes, chunk, j), memory); !c)
        return c;
    ++queued;
    if (j + ring >= chunks) return ok();  // (no later chunk uses its slot)
    auto ev = backend->record_event(stream);
    if (!ev) return fail(std::move(ev).error());
    frees.emplace_back(std::move(*ev), j);
    return ok();
}

Result<void> DeviceChannelsImpl::notice(const std::shared_ptr<Connection>& conn, std::string_view name,
                                    std::span<const std::uint8_t> payload) {
    if (name == kIpcExport) return exported_by_peer(*conn, payload);
    if (name == kIpcOutbox) return outbox_of_peer(*conn, payload);
    if (name != kRingReady && name != kRingFree && name != kIpcRefused)
        return fail(Errc::protocol_error, "unknown control frame \"" + std::string(name) + "\"");
    auto n = decode_ring_notice(payload);
    if (!n) return fail(std::move(n).error());
    if (name == kIpcRefused) return refused_by_peer(*conn, *n);
    const RingKey key{conn.get(), n->device, n->offset};
    const std::string where = "chunk " + std::to_string(n->chunk) + " of the cuda_ipc ring at " + std::to_string(n->offset) +
                              " of cuda:" + std::to_string(n->device);
    if (name == kRingFree) {
        // The peer copied a chunk out: the chunk kOutboxRing further goes into its slot.
        auto it = sending_.find(key);
        auto rs = it == sending_.end() ? nullptr : it->second.lock();
        if (!rs) return fail(Errc::protocol_error, "the peer frees " + where + ", which we did not send it");
        const std::uint32_t k = n->chunk;
        if (k >= rs->chunks || k + kOutboxRing >= rs->chunks || rs->freed[k])
            return fail(Errc::protocol_error, "the peer frees " + where + ", which is not one to free");
        rs->freed[k] = true;
        const std::uint32_t next = k + kOutboxRing;
        if (auto c = rs->copy_in(next); !c) return fail(std::move(c).error().context("copying " + where + " in"));
        if (auto r = rs->backend->record_again(rs->stream, rs->box->event(rs->event)); !r) return r;
        ++stats_.ring_chunks_sent;
        send_ring_notice(*conn, kRingReady, RingNotice{n->device, n->offset, next});
        if (rs->queued == rs->chunks) sending_.erase(it);  // (every chunk is in; the hold keeps the rest)
        return ok();
    }
    // The peer copied a chunk into a ring of its outbox: out of it on the frame's stream.
    auto it = landing_.find(key);
    if (it == landing_.end()) return fail(Errc::protocol_error, "the peer says " + where + " is ready, but it sent no such ring");
    auto landing = it->second;
    RingLanding& l = *landing;
    const std::uint32_t j = n->chunk;
    if (j < l.ring || j >= l.chunks || l.arrived[j])
        return fail(Errc::protocol_error, "the peer says " + where + " is ready, which is not one to come");
    l.arrived[j] = true;
    l.waiting.push_back(j);
    drain(conn, landing);
    return ok();
}

// (The event is queried after the notices of every waiting chunk came, so after their records.)
void DeviceChannelsImpl::drain(const std::shared_ptr<Connection>& conn, const std::shared_ptr<RingLanding>& l) {
    if (l->pumping || l->waiting.empty() || !conn->is_open()) return;
    if (!l->event.ready()) {
        l->pumping = true;
        spawn_(pump(conn, l, alive_));
        return;
    }
    auto batch = std::move(l->waiting);
    l->waiting.clear();
    copy_batch(conn, l, batch);
}

Task<void> DeviceChannelsImpl::pump(std::weak_ptr<Connection> weak, std::shared_ptr<RingLanding> l, std::weak_ptr<void> alive) {
    for (;;) {
        // The chunks announced before this wait starts are the ones it covers.
        auto batch = std::move(l->waiting);
        l->waiting.clear();
        auto seen = co_await host_wait(*l->backend, l->event, weak);
        auto conn = weak.lock();
        if (alive.expired() || !conn || !conn->is_open()) co_return;  // (forget() dropped the ring)
        if (!seen) {
            conn->close(std::move(seen).error().context("waiting for the cuda_ipc event of a ring of cuda:" + std::to_string(l->device)));
            co_return;
        }
        copy_batch(conn, l, batch);
        if (l->waiting.empty() || !conn->is_open()) {
            l->pumping = false;
            co_return;
        }
    }
}

void DeviceChannelsImpl::copy_batch(const std::shared_ptr<Connection>& conn, const std::shared_ptr<RingLanding>& l,
                                const std::vector<std::uint32_t>& batch) {
    for (std::uint32_t j : batch) {
        if (auto c = l->copy_out(j); !c) {
            conn->close(std::move(c).error().context("copying chunk " + std::to_string(j) + " of a cuda_ipc ring out"));
            return;
        }
        if (j >= l->ring) ++stats_.ring_chunks_received;
    }
    for (auto& [ev, chunk] : l->frees) spawn_(free_after(*l->backend, std::move(ev), conn, RingNotice{l->device, l->offset, chunk}));
    l->frees.clear();
    if (l->queued < l->chunks) return;
    landing_.erase(RingKey{conn.get(), l->device, l->offset});
    auto frame = std::move(l->frame);
    --frame->rings;
    finish_if_whole(conn, frame);
}

Task<Result<void>> host_wait(DeviceBackend& b, tensorplay::Event event, std::weak_ptr<Connection> conn) {
    for (;;) {
        auto r = co_await with_timeout(b.wait(event), kForeignWaitSlice);
        if (r || r.error().code() != Errc::timeout) co_return r;
        auto c = conn.lock();
        if (!c || !c->is_open())
            co_return fail(Errc::connection_lost, "the connection closed while its peer's cuda_ipc event was awaited");
    }
}

}  // namespace tensorplay::detail
