// Private: what the members of a dynamic group tell each other (issue 19): the built-in handlers'
// names and the membership update, which lists every member after a join or a leave with its
// store record and its device info, so that each member recomputes its reverse maps and device
// list from the whole group (the seed's rules), as the static exchange would.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/rpc/device_map_exchange.hpp>

#include "rpc/peer_record.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tensorplay::detail {

/// Answers with this worker's encode_worker_device_info (the seed's _get_device_infos).
inline constexpr const char* kDeviceInfosHandler = "_tp_get_device_infos";
/// Takes a MembershipUpdate (the seed's _update_group_membership, with the whole group).
inline constexpr const char* kMembershipHandler = "_tp_update_group_membership";
/// Takes a member's name; answers one byte (WitnessAnswer): whether this member reaches it.
inline constexpr const char* kWitnessHandler = "_tp_probe_member";
/// A witness's answer about a suspect.
enum class WitnessAnswer : std::uint8_t { unreachable = 0, reachable = 1, not_a_member = 2 };
/// Witnesses asked at once before a suspect is removed.
inline constexpr std::size_t kRemovalWitnesses = 2;
/// Successors by rank whose heartbeats each member watches.
inline constexpr std::size_t kWatchedSuccessors = 2;

/// The store keys of a dynamic group: each member's record (as a static group's), its claim on
/// its rank (its name), its heartbeat (a counter), and the member list (encode_member_ranks).
[[nodiscard]] inline std::string member_info_key(int rank) { return "native_agent/info/" + std::to_string(rank); }
[[nodiscard]] inline std::string member_claim_key(int rank) { return "native_agent/dynamic/names/" + std::to_string(rank); }
[[nodiscard]] inline std::string member_beat_key(int rank) { return "native_agent/dynamic/beat/" + std::to_string(rank); }
inline constexpr const char* kMembersKey = "native_agent/dynamic/members";

/// Members one update may list.
inline constexpr std::size_t kMaxGroupMembers = 65536;

struct GroupMember {
    PeerRecord record;
    WorkerDeviceInfo devices;
    friend bool operator==(const GroupMember&, const GroupMember&) = default;
};

/// What changed: `subject` joined, left by itself (graceful shutdown), or was removed by the
/// sender (it died without leaving).
enum class MembershipChange : std::uint8_t { join = 1, leave = 2, removal = 3 };

/// After `subject` joined, left or was removed: every member of the group now, by rank.
struct MembershipUpdate {
    MembershipChange change = MembershipChange::join;
    std::string subject;
    std::vector<GroupMember> members;
    friend bool operator==(const MembershipUpdate&, const MembershipUpdate&) = default;
};

/// u32 magic "TPMU", u8 change (1 join, 2 leave, 3 removal), str32 subject, u32 count { bytes32 record, bytes32 device info }.
[[nodiscard]] Bytes encode_membership_update(const MembershipUpdate& u);
/// Errc::protocol_error for anything malformed: bad magic or change, a count over kMaxGroupMembers
/// or the data, a record or device info that does not decode, two members of one rank or name,
/// a member whose record and device info name different workers.
[[nodiscard]] Result<MembershipUpdate> decode_membership_update(std::span<const std::uint8_t> b);

/// The member list as the store keeps it (native_agent/members): u32 count { i32 rank }.
[[nodiscard]] Bytes encode_member_ranks(const std::vector<int>& ranks);
[[nodiscard]] Result<std::vector<int>> decode_member_ranks(std::span<const std::uint8_t> b);

}  // namespace tensorplay::detail
