// Private: cma on one connection. Sending, a frame's large CPU tensors stay in our memory under a
// lease, the frame carrying their addresses; receiving (a ReferenceChannel), a tensor the peer left
// in its memory is read straight into ours with process_vm_readv (off the event loop when large),
// then the frame's lease is checked in the peer's lease table and released.
#pragma once

#include "transport/channels/channel.hpp"
#include "transport/connection_ext.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

class CmaChannel final : public ReferenceChannel {
public:
    /// The peer's pid (the process cma reads) and the address of its lease table.
    CmaChannel(int peer_pid, std::uint64_t lease_table) : pid_(peer_pid), lease_table_(lease_table) {}

    [[nodiscard]] int peer_pid() const noexcept { return pid_; }

    /// The sending side: plans a frame on `s` by reference when some tensor's pair chose cma and it
    /// is large enough (ChannelTable::cma_takes), within what the peer may hold unreleased
    /// (ConnectionLimits::max_held_bytes): those tensors go by their addresses, held under a
    /// lease (the plan's hold and keep, until the peer's release or the close), their bytes not
    /// written; the others inline. Nothing (every tensor inline) when none qualifies or no lease
    /// is free.
    [[nodiscard]] std::optional<SendPlan> plan(ConnectionState& s, const std::vector<Tensor>& tensors,
                                               std::span<const Device> targets);

    Task<Result<void>> receive(ConnectionState& s, Frame& f, std::size_t i, const TensorDesc& desc, std::uint64_t ref,
                               std::size_t& held) override;
    /// Checks that the sender still held the frame's tensors while we read them (else the frame
    /// fails: what we read may be memory it reused), then releases its hold.
    void received(ConnectionState& s, Frame& f, std::uint64_t hold) override;

private:
    int pid_;
    std::uint64_t lease_table_;
};

}  // namespace tensorplay::detail
