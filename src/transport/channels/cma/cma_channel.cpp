// cma on one connection: its sending and receiving sides (cma_channel.hpp).
#include "transport/channels/cma/cma_channel.hpp"

#include "transport/channels/cma/cma.hpp"
#include "transport/channels/cma/cma_lease.hpp"
#include "transport/channels/cma/cma_offload.hpp"
#include "transport/connection_state.hpp"

#include <cstdint>
#include <memory>

namespace tensorplay::detail {

std::optional<SendPlan> CmaChannel::plan(ConnectionState& s, const std::vector<Tensor>& tensors,
                                         std::span<const Device> targets) {
    // (Past limits.max_held_bytes bytes the peer has not released, tensors go inline: a peer that
    // never releases pins at most that much of our memory by reference.)
    const std::size_t bound = s.limits.max_held_bytes;
    const std::size_t room = bound == 0 ? SIZE_MAX : s.held_bytes < bound ? bound - s.held_bytes : 0;
    SendPlan p;
    p.refs.assign(tensors.size(), 0);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const Tensor& t = tensors[i];
        const Device target = i < targets.size() ? targets[i] : t.device();
        if (!t.defined() || t.nbytes() > room - p.held_bytes || !s.channels.cma_takes(t, target)) continue;
        p.refs[i] = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(t.data()));  // (where the peer reads it)
        p.held.push_back(t);
        p.held_bytes += t.nbytes();
    }
    if (p.held.empty()) return std::nullopt;
    auto lease = cma::Lease::acquire();
    if (!lease) return std::nullopt;  // every lease of this process is taken: inline
    p.hold = lease->id();
    p.keep = std::make_shared<cma::Lease>(std::move(*lease));
    s.channel_stats.cma_sent += p.held.size();
    return p;
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
