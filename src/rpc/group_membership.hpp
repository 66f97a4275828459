// Private: a dynamic member's view of its group (issue 35): the members, the removal checks that
// run, whether this worker leaves or was evicted, its devices in the group, and the rules over them that need no agent (the
// successors it watches, the witnesses of a removal, the updates of a leave and of a removal, the
// liveness timings).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>

#include "core/flag.hpp"
#include "rpc/membership.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tensorplay::detail {

/// The dynamic group as one member sees it. Strand-bound to the agent's executor. The agent's
/// coroutines that talk to the store and to the other members (native_agent_membership.cpp,
/// native_agent_liveness.cpp) go through it; a static member's holds only its devices.
class Membership {
public:
    Membership() = default;
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

    // ---- the members ----
    /// The group as the last update listed it, this worker included, by rank: what every member
    /// recomputes its maps from.
    [[nodiscard]] const std::vector<GroupMember>& members() const noexcept { return members_; }
    /// Takes the members of `update` as the group. The agent follows (its peers and maps), then
    /// calls notify_changed().
    void adopt(const MembershipUpdate& update) { members_ = update.members; }
    /// Wakes the waiters of changed() (in place, inside this call): after a change, or when the
    /// agent closes.
    void notify_changed() { changed_.set(); }
    /// Set by notify_changed(); a waiter resets it before it waits.
    [[nodiscard]] Flag& changed() noexcept { return changed_; }

    /// The ranks of `members`, in their order (the store's member list).
    [[nodiscard]] static std::vector<int> ranks_of(const std::vector<GroupMember>& members);
    /// The at most `n` members after rank `self` (wrapping), not `self`: those whose heartbeats it
    /// watches (two, so that a host's consecutive workers lost at once are each watched by a live one).
    [[nodiscard]] std::vector<int> successors(int self, std::size_t n) const;
    /// The witnesses of a removal check of the member of `suspect` by `self`: at most `n` other
    /// members, the suspect's followers by rank (wrapping), neither `self` nor the suspect.
    [[nodiscard]] std::vector<std::string> witnesses(int self, int suspect, std::size_t n) const;
    /// The update of the leave of worker `self`: every other member that `listed` (the store's
    /// member list; null: unread, every member) still lists.
    [[nodiscard]] MembershipUpdate leave_update(const std::string& self, const std::vector<int>* listed) const;
    /// The update of the removal of the member of `rank` (named `name`): every other member that
    /// `listed` (the store's member list) lists.
    [[nodiscard]] MembershipUpdate removal_update(int rank, const std::string& name, const std::vector<int>& listed) const;

    // ---- callers refused ----
    /// Whether a refusal of caller `name` is logged: the first of each name, for at most
    /// kMaxRefusalsLogged names (a flood of names logs a bounded count).
    [[nodiscard]] bool first_refusal(const std::string& name);
    static constexpr std::size_t kMaxRefusalsLogged = 64;

    // ---- members that may be dead ----
    /// Begins the removal check of the member of `rank`; false when one runs already.
    [[nodiscard]] bool begin_check(int rank);
    /// Ends it; the last check to end wakes removals_ended().
    void end_check(int rank);
    /// Whether a removal check runs.
    [[nodiscard]] bool checking() const noexcept { return !checks_.empty(); }
    /// Completes once no removal check runs, or at `deadline` (time_point::max(): none), or when
    /// cancelled.
    [[nodiscard]] Task<void> removals_ended(Clock::time_point deadline);

    // ---- the successors' heartbeats, as this worker reads them ----
    /// Stops watching every rank not in `ranks`.
    void keep_watches(const std::vector<int>& ranks);
    /// Records that the heartbeat of `rank` read `value` at `now`; returns since when it has stood
    /// still: the previous reading's time when it moved since then (the beat came after it), `now`
    /// at a first reading of `rank`.
    Clock::time_point observe_beat(int rank, std::int64_t value, Clock::time_point now);
    /// Since when the heartbeat of `rank` has stood still at `value`, when this worker watches it
    /// and last read that value.
    [[nodiscard]] std::optional<Clock::time_point> beat_still_since(int rank, std::int64_t value) const;
    /// Starts the watch of `rank` over at `now` (after a suspicion: the next one a member timeout later).
    void restart_watch(int rank, Clock::time_point now) noexcept;

    // ---- suspects confirmed ----
    /// Members whose removal check found them unreachable, while it runs: a removal's update is
    /// not sent to them (they are removed next; waiting for their answer would hold the token).
    void confirm_unreachable(int rank) { confirmed_.push_back(rank); }
    [[nodiscard]] bool confirmed_unreachable(int rank) const noexcept;

    // ---- this worker ----
    /// Set by a graceful leave: connections that close from then on are no sign of a death.
    [[nodiscard]] bool leaving() const noexcept { return leaving_; }
    void start_leaving() noexcept { leaving_ = true; }
    /// Set when the group removed this worker while it was alive (its claim on its rank is gone):
    /// why every call of this worker fails from then on.
    [[nodiscard]] const std::optional<Error>& evicted() const noexcept { return evicted_; }
    /// Records that this worker was evicted, for `why`; false (nothing changes) when it was already.
    [[nodiscard]] bool evict(const Error& why);
    /// This worker's devices in the group: as the device-map exchange (a static group's member,
    /// once at start) or the last update (a dynamic one's) computed them.
    [[nodiscard]] const std::vector<Device>& devices() const noexcept { return devices_; }
    void set_devices(std::vector<Device> devices) { devices_ = std::move(devices); }

    // ---- liveness timings ----
    /// How often a member beats: ten times per member timeout, between 10 ms and 1 s.
    [[nodiscard]] static Duration beat_interval(Duration member_timeout);
    /// How long a probe of a suspect waits for its answer: half the member timeout, between 50 ms
    /// and 5 s.
    [[nodiscard]] static Duration probe_timeout(Duration member_timeout);
    /// How long a witness's own probe of a suspect waits: three quarters of the probe timeout, so
    /// that its answer reaches the asking member within the asker's probe timeout.
    [[nodiscard]] static Duration witness_probe_timeout(Duration member_timeout);

private:
    std::vector<GroupMember> members_;
    Flag changed_;
    std::vector<std::string> refusals_logged_;
    std::vector<int> checks_;  // ranks whose removal check runs
    Flag checks_idle_;         // set when the last check ends
    bool leaving_ = false;
    std::optional<Error> evicted_;
    std::vector<Device> devices_;
    struct BeatWatch {
        int rank = -1;
        std::int64_t value = -1;
        Clock::time_point still_since{}, last_read{};
    };
    std::vector<BeatWatch> watches_;
    std::vector<int> confirmed_;  // ranks found unreachable whose removal check runs
};

}  // namespace tensorplay::detail
