// Private: cma's receiving side on one connection (a ReferenceChannel): a tensor the peer left in
// its memory is read straight into ours with process_vm_readv (off the event loop when large), then
// the frame's lease is checked in the peer's lease table and released.
#pragma once

#include "transport/channels/channel.hpp"

#include <cstdint>

namespace tensorplay::detail {

class CmaChannel final : public ReferenceChannel {
public:
    /// The peer's pid (the process cma reads) and the address of its lease table.
    CmaChannel(int peer_pid, std::uint64_t lease_table) : pid_(peer_pid), lease_table_(lease_table) {}

    [[nodiscard]] int peer_pid() const noexcept { return pid_; }

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
