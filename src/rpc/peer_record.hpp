// Private: a worker's entry in the store (native_agent/info/<rank>): who it is and where it
// listens, one address per transport. The static start reads every rank's; a dynamic member's
// joins carry them too.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/transport/connection.hpp>

#include <string>
#include <vector>

namespace tensorplay::detail {

struct PeerRecord {
    std::string name;
    int rank = -1;
    std::vector<TransportOffer> addresses;
    friend bool operator==(const PeerRecord&, const PeerRecord&) = default;
};

/// Addresses one record may list (one per transport).
inline constexpr std::uint32_t kMaxRecordAddresses = 16;

/// u16 agent protocol version, str32 name, i32 rank, u32 count { str32 transport, domain, address }.
[[nodiscard]] Bytes encode_record(const PeerRecord& p);
/// Errc::protocol_error for another protocol version (named), a malformed record, or an address
/// that is not a URL of its transport.
[[nodiscard]] Result<PeerRecord> decode_record(std::span<const std::uint8_t> b);

}  // namespace tensorplay::detail
