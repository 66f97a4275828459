// cma's receiving side (cma_channel.hpp).
#include "transport/channels/cma/cma_channel.hpp"

#include "transport/channels/cma/cma.hpp"
#include "transport/channels/cma/cma_lease.hpp"
#include "transport/channels/cma/cma_offload.hpp"
#include "transport/connection_state.hpp"

namespace tensorplay::detail {

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
    ++s.stats.cma_received;
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
