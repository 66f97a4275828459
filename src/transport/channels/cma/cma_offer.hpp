// Private: cma's offer in the hello (docs/protocol.md, "Channels"): who this process is, a buffer a
// peer probes, where its lease table lies; and whether a pair of processes can use cma at all.
#pragma once

#include <tensorplay/transport/connection.hpp>

#include "transport/channels/cma/cma.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace tensorplay::detail {

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
void prepare_cma_offers(HelloInfo& info);

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

/// The cma offer in `info`, or null.
[[nodiscard]] const ChannelOffer* find_cma(const HelloInfo& info) noexcept;

}  // namespace tensorplay::detail
