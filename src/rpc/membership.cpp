// The membership update and the store's member list: encoding and checking.
#include "rpc/membership.hpp"

#include <tensorplay/core/wire.hpp>

#include <set>

namespace tensorplay::detail {
namespace {
constexpr std::uint32_t kUpdateMagic = 0x554D5054;  // "TPMU" little-endian
constexpr std::size_t kMaxMemberBlob = 1u << 20;    // one record or device info
}  // namespace

Bytes encode_membership_update(const MembershipUpdate& u) {
    WireWriter w;
    w.u32(kUpdateMagic).u8(static_cast<std::uint8_t>(u.change)).str32(u.subject).u32(static_cast<std::uint32_t>(u.members.size()));
    for (const auto& m : u.members) w.bytes32(encode_record(m.record)).bytes32(encode_worker_device_info(m.devices));
    return std::move(w).take();
}

Result<MembershipUpdate> decode_membership_update(std::span<const std::uint8_t> b) {
    WireReader r(b);
    MembershipUpdate u;
    if (const auto magic = r.u32(); !r.failed() && magic != kUpdateMagic)
        return fail(Errc::protocol_error, "not a membership update (bad magic)");
    const auto kind = r.u8();
    if (!r.failed() && (kind < 1 || kind > 3))
        return fail(Errc::protocol_error, "membership update of unknown change " + std::to_string(kind));
    u.change = static_cast<MembershipChange>(kind);
    u.subject = std::string(r.str32(1024, "worker name"));
    const auto n = r.u32();
    if (!r.failed() && n > kMaxGroupMembers)
        return fail(Errc::protocol_error, "membership update lists " + std::to_string(n) + " members (at most " +
                                              std::to_string(kMaxGroupMembers) + ")");
    std::set<int> ranks;
    std::set<std::string, std::less<>> names;
    for (std::uint32_t i = 0; i < n && !r.failed(); ++i) {
        const auto rec = r.bytes32(kMaxMemberBlob, "member record");
        const auto dev = r.bytes32(kMaxMemberBlob, "member device info");
        if (r.failed()) break;
        auto record = decode_record(rec);
        if (!record) return fail(std::move(record).error().context("membership update, member " + std::to_string(i)));
        auto devices = decode_worker_device_info(dev);
        if (!devices) return fail(std::move(devices).error().context("membership update, member " + std::to_string(i)));
        if (record->name != devices->name)
            return fail(Errc::protocol_error, "membership update: member " + std::to_string(i) + " is \"" + record->name +
                                                  "\" in its record and \"" + devices->name + "\" in its device info");
        if (record->rank < 0 || !ranks.insert(record->rank).second || !names.insert(record->name).second)
            return fail(Errc::protocol_error, "membership update: rank " + std::to_string(record->rank) + " or name \"" +
                                                  record->name + "\" is invalid or listed twice");
        u.members.push_back(GroupMember{std::move(*record), std::move(*devices)});
    }
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding a membership update"));
    return u;
}

Bytes encode_member_ranks(const std::vector<int>& ranks) {
    WireWriter w;
    w.u32(static_cast<std::uint32_t>(ranks.size()));
    for (int r : ranks) w.i32(r);
    return std::move(w).take();
}

Result<std::vector<int>> decode_member_ranks(std::span<const std::uint8_t> b) {
    WireReader r(b);
    const auto n = r.u32();
    if (!r.failed() && (n > kMaxGroupMembers || n * 4ull > b.size()))
        return fail(Errc::protocol_error, "the store's member list announces " + std::to_string(n) + " members");
    std::vector<int> ranks;
    for (std::uint32_t i = 0; i < n && !r.failed(); ++i) ranks.push_back(r.i32());
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding the store's member list"));
    return ranks;
}

}  // namespace tensorplay::detail
