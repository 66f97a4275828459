// Private: the channel seam between a frame and its tensors' bytes (docs/protocol.md, "Channels").
// Per (device type of a tensor on its sender, device type it lands on at the receiver) the
// channel negotiated for that pair decides how its bytes travel: `basic` writes them inline after
// the frame's payload; `cma` leaves them in the sender's memory, announces their address, and the
// receiver reads them with process_vm_readv and releases them. Device channels (cuda_basic,
// cuda_ipc) add a kind here and their setup beside cma's.
#pragma once

#include <tensorplay/transport/connection.hpp>

#include "transport/cma.hpp"
#include "transport/cma_lease.hpp"

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace tensorplay::detail {

/// cuda_basic: a device tensor staged through pinned host memory, its bytes inline as basic's;
/// cuda_ipc: left in the sender's device outbox, copied device to device by the receiver (the
/// agent's device channels, src/rpc/device_channels.hpp; the connection carries the reference).
enum class ChannelKind : std::uint8_t { basic = 0, cma = 1, cuda_basic = 2, cuda_ipc = 3 };

/// A CPU tensor of at least this many bytes goes by cma on a cma pair; a smaller one inline. At
/// 64 KiB the two copies of the inline path (into the socket, out of it: about 10 us here) cost
/// what cma's syscall, the release frame and the hold cost; below it inline is cheaper.
inline constexpr std::size_t kCmaMinBytes = 64 * 1024;

/// What a side's cma offer carries (ChannelOffer::params): who it is, a buffer to probe, and
/// where its lease table lies (cma_lease.hpp: a reader checks there that what it read was held).
struct CmaParams {
    cma::Identity identity;
    cma::ProbeTarget probe;
    std::uint64_t lease_table = 0;
};

[[nodiscard]] std::string encode_cma_params(const CmaParams& p);
/// Errc::protocol_error when `bytes` is not a cma parameters block.
[[nodiscard]] Result<CmaParams> decode_cma_params(std::string_view bytes);

/// The cma offer's domain: boot id, pid and user namespaces (the peers must share all three).
[[nodiscard]] std::string cma_domain(const cma::Identity& id);

/// Fills this process's part of `info`'s cma offers (domain, params) before its hello is sent;
/// drops them when this process's identity cannot be read. An offer whose params are already set
/// keeps them (tests). With TP_CMA_TEST_BAD_PROBE=1 in the environment the advertised probe
/// target is wrong (a test seam: the peer's probe of this process fails).
void prepare_channel_offers(HelloInfo& info);

/// Whether `info` offers cma.
[[nodiscard]] bool offers_cma(const HelloInfo& info) noexcept;
/// `info` without its cma offers.
[[nodiscard]] HelloInfo without_cma(HelloInfo info);
/// Whether the answer chose cma for some pair.
[[nodiscard]] bool chose_cma(const Negotiated& n) noexcept;

/// Whether this side may read `peer`'s memory with cma: both offer it, the pid its offer names is
/// the process at the other end of the connection's socket `fd` (cma::peer_process_is, with
/// `known_pid` from SO_PEERCRED for the Unix-socket transports, -1 for TCP), the identities pass
/// check_viable both ways (the peer will read us too), and the live probe of the peer's buffer
/// succeeds. False (with the reason logged) otherwise.
[[nodiscard]] bool cma_usable(const HelloInfo& local, const HelloInfo& peer, int fd, int known_pid);

/// The channels of one connection, as the sender and the receiver look them up.
class ChannelTable {
public:
    ChannelTable() = default;
    /// From the negotiation's answer, on the client side or the server's; `peer` is the peer's
    /// hello (its cma pid).
    ChannelTable(const Negotiated& n, bool client, const HelloInfo& peer);

    /// The channel for a tensor this side sends from `source` to the peer's `target`.
    [[nodiscard]] ChannelKind send_kind(Device source, Device target) const noexcept { return send_[idx(source)][idx(target)]; }
    /// The channel for a tensor the peer sends from its `source` to our `target`.
    [[nodiscard]] ChannelKind receive_kind(Device source, Device target) const noexcept { return recv_[idx(source)][idx(target)]; }
    /// Whether a tensor goes by reference: a cma pair and at least kCmaMinBytes.
    [[nodiscard]] bool by_reference(const Tensor& t, Device target) const noexcept {
        return t.nbytes() >= kCmaMinBytes && send_kind(t.device(), target) == ChannelKind::cma;
    }
    /// The peer's pid for cma reads (-1: no cma).
    [[nodiscard]] int peer_pid() const noexcept { return peer_pid_; }
    /// The address of the peer's lease table (with cma).
    [[nodiscard]] std::uint64_t peer_lease_table() const noexcept { return peer_lease_table_; }

private:
    static std::size_t idx(Device d) noexcept { return d.type == DeviceType::cpu ? 0 : 1; }
    std::array<std::array<ChannelKind, 2>, 2> send_{}, recv_{};
    int peer_pid_ = -1;
    std::uint64_t peer_lease_table_ = 0;
};

}  // namespace tensorplay::detail
