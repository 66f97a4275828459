// cma on one connection: its sending and receiving sides (cma_channel.hpp).
#include "transport/channels/cma/cma_channel.hpp"

#include "transport/channels/cma/cma.hpp"
#include "transport/channels/cma/cma_lease.hpp"
#include "transport/channels/cma/cma_offload.hpp"
#include "transport/connection_state.hpp"

#include <cstdint>
#include <memory>

namespace tensorplay::detail {

std::optional<Result<void>> CmaChannel::send(ConnectionState& s, FrameKind kind, std::uint64_t id, std::string_view name,
                                             Bytes& payload, std::vector<Tensor>& tensors, std::span<const Device> targets, bool flush) {
    std::vector<std::uint8_t> by_ref(tensors.size(), 0);
    bool any = false;
    std::size_t bytes = 0;
    // (Past limits.max_held_bytes bytes the peer has not released, tensors go inline: a peer that never
    // releases pins at most that much of our memory by reference.)
    const std::size_t bound = s.limits.max_held_bytes;
    const std::size_t room = bound == 0 ? SIZE_MAX : s.held_bytes < bound ? bound - s.held_bytes : 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const Device target = i < targets.size() ? targets[i] : tensors[i].device();
        by_ref[i] = tensors[i].defined() && tensors[i].nbytes() <= room - bytes && s.channels.cma_takes(tensors[i], target) ? 1 : 0;
        if (by_ref[i]) bytes += tensors[i].nbytes();
        any = any || by_ref[i];
    }
    if (!any) return std::nullopt;
    auto lease = cma::Lease::acquire();
    if (!lease) return std::nullopt;  // every lease of this process is taken: inline
    const std::uint64_t hold = lease->id();
    FrameParts parts{kind, id, name, payload, tensors, targets, 0, {}, {}, {}};
    parts.hold = hold;
    parts.by_ref = by_ref;
    Bytes head;
    bool inl = false;
    if (auto h = encode_frame_head(parts, s.limits, head, inl); !h) return fail(std::move(h).error().context("sending to " + s.who()));
    std::vector<Tensor> held, written;
    for (std::size_t i = 0; i < tensors.size(); ++i) (by_ref[i] ? held : written).push_back(tensors[i]);
    s.channel_stats.cma_sent += held.size();
    s.holds.emplace(hold, ConnectionState::Hold{std::move(held), bytes, std::make_shared<cma::Lease>(std::move(*lease))});
    s.held_bytes += bytes;
    s.channel_stats.cma_held = s.holds.size();
    return s.queue_frame(OutFrame{std::move(head), inl ? Bytes{} : std::move(payload), std::move(written), {}}, flush);
}

Task<Result<void>> CmaChannel::receive(ConnectionState& s, Frame& f, std::size_t i, const TensorDesc& desc, std::uint64_t ref,
                                       std::size_t& held) {
    if (f.alloc_error) co_return ok();  // (the frame failed already; its bytes are not on the stream)
    auto t = s.take_tensor(desc, held);
    if (!t) {
        f.alloc_error = std::move(t).error();
        co_return ok();
    }
    // Straight from the sender's memory into the destination (a CPU tensor: the pair is cpu ->
    // cpu). A failure (the peer's memory or process went away) fails this frame only: the stream
    // is intact, and the release tells the sender to drop it.
    Result<void> r;
    if (desc.nbytes >= cma::kCmaOffloadBytes) r = co_await cma::read_off_loop(pid_, ref, *t);
    else r = cma::read(pid_, ref, desc.nbytes, t->data());
    if (!r) {
        f.alloc_error = std::move(r).error().context("reading tensor " + std::to_string(i) + " from " + s.who() + " by cma")
                            .on_worker(s.peer.name);
        co_return ok();
    }
    ++s.channel_stats.cma_received;
    f.tensors.push_back(std::move(*t));
    co_return ok();
}

void CmaChannel::received(ConnectionState& s, Frame& f, std::uint64_t hold) {
    if (hold == 0) return;
    if (!f.alloc_error && !cma::lease_held(pid_, lease_table_, hold)) {
        // The sender let go of the tensors while we read them (it closed the connection): what we
        // read may be memory it freed or reused. The frame fails; there is nothing to release.
        f.tensors.clear();
        f.alloc_error = Error(Errc::connection_lost,
                              "frame from " + s.who() + ": the sender let go of its tensors while we read them by cma (its connection closed)",
                              s.peer.name);
        return;
    }
    s.send_release(hold);
}

}  // namespace tensorplay::detail
