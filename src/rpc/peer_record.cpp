// A worker's store entry: encoding and checking.
#include "rpc/peer_record.hpp"

#include <tensorplay/core/wire.hpp>
#include <tensorplay/transport/address.hpp>

namespace tensorplay::detail {

Bytes encode_record(const PeerRecord& p) {
    WireWriter w;
    w.u16(kProtocolVersion).str32(p.name).i32(p.rank).u32(static_cast<std::uint32_t>(p.addresses.size()));
    for (const auto& a : p.addresses) w.str32(a.name).str32(a.domain).str32(a.address);
    return std::move(w).take();
}

Result<PeerRecord> decode_record(std::span<const std::uint8_t> b) {
    WireReader r(b);
    PeerRecord p;
    auto version = r.u16();
    // (Another version's layout is unknown past the version: refuse it by number first.)
    if (!r.failed() && version != kProtocolVersion)
        return fail(Errc::protocol_error, "a worker runs agent protocol version " + std::to_string(version) +
                                              ", this worker runs version " + std::to_string(kProtocolVersion) +
                                              " (run the same tensorplay-rpc release on every worker)");
    p.name = std::string(r.str32(1024, "worker name"));
    p.rank = r.i32();
    const auto n = r.u32();
    if (!r.failed() && (n == 0 || n > kMaxRecordAddresses))
        return fail(Errc::protocol_error, "the store's record of worker \"" + p.name + "\" lists " + std::to_string(n) +
                                              " addresses (1 to " + std::to_string(kMaxRecordAddresses) + ")");
    for (std::uint32_t i = 0; i < n && !r.failed(); ++i) {
        TransportOffer a;
        a.name = std::string(r.str32(256, "transport name"));
        a.domain = std::string(r.str32(256, "transport domain"));
        a.address = std::string(r.str32(256, "transport address"));
        p.addresses.push_back(std::move(a));
    }
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding a worker address from the store"));
    for (const auto& a : p.addresses)
        if (auto parsed = Address::parse(a.address); !parsed || parsed->transport() != a.name)
            return fail(Errc::protocol_error, "the store's record of worker \"" + p.name + "\" gives transport \"" + a.name +
                                                  "\" the address \"" + a.address + "\"");
    return p;
}

}  // namespace tensorplay::detail
