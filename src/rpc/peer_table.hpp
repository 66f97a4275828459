// Private: the workers an agent knows (itself included), by rank and by name, and whether they are
// the whole group yet (the roster). A member's PeerLink stays at one address while it is a
// member, and is shared: code that awaits holds a reference, so removing a member (dynamic
// groups) never leaves anyone pointing at freed memory.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/device_map.hpp>
#include <tensorplay/rpc/worker_info.hpp>
#include <tensorplay/transport/connection.hpp>

#include "core/flag.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

/// The outgoing side towards one worker: one connection, reused by every call, opened lazily. Its
/// pending calls are the CallTable's (by its rank).
struct PeerLink {
    WorkerInfo info;
    /// Where it listens, one address per transport, in its priority order (published in the store).
    std::vector<TransportOffer> addresses;
    std::shared_ptr<Connection> conn;
    std::shared_ptr<Flag> connecting;  ///< set while a connect runs; set() when it ends
    std::optional<Error> last_connect_error;
    /// Set when a membership update took it out of the group: a connect to it ends, and its waiters
    /// fail, instead of waiting on (or looping over) a connect that no longer concerns anyone.
    std::optional<Error> removed;
    DeviceMap map;      ///< my device -> its device (device_maps[to])
    DeviceMap reverse;  ///< my device -> its device for replies to its calls (its map, inverted)
};

/// Strand-bound for changes (add, remove) and for at()/link()/rank_of(), which the agent's hot
/// paths call without a lock; infos() and find() may be called from any thread (they lock, and
/// changes take the same lock).
class PeerTable {
public:
    PeerTable();
    ~PeerTable();
    PeerTable(const PeerTable&) = delete;
    PeerTable& operator=(const PeerTable&) = delete;

    /// Adds worker `info` and returns its link. invalid_argument when its rank is negative, or
    /// its rank or name is another member's (the message names both).
    [[nodiscard]] Result<std::shared_ptr<PeerLink>> add(const WorkerInfo& info);
    /// Removes the member of `rank`; its link (whoever holds it keeps a valid object), or null.
    std::shared_ptr<PeerLink> remove(int rank);

    /// The member of `rank`, or null.
    [[nodiscard]] PeerLink* at(int rank) const noexcept {
        return rank >= 0 && static_cast<std::size_t>(rank) < by_rank_.size() ? by_rank_[static_cast<std::size_t>(rank)].get() : nullptr;
    }
    /// The member of `rank` as a shared reference (for code that awaits), or null.
    [[nodiscard]] std::shared_ptr<PeerLink> link(int rank) const;
    /// The rank of the member named `name`, or -1.
    [[nodiscard]] int rank_of(std::string_view name) const;
    /// Members now.
    [[nodiscard]] std::size_t size() const noexcept { return by_name_.size(); }

    /// Every member's worker info, by rank (any thread).
    [[nodiscard]] std::vector<WorkerInfo> infos() const;
    /// The member named `name` (any thread); invalid_argument naming it when there is none.
    [[nodiscard]] Result<WorkerInfo> find(std::string_view name) const;
    /// "a, b, c": the members' names by rank (for messages).
    [[nodiscard]] std::string names() const;

    /// Calls `f(PeerLink&)` for every member, by rank. `f` may not add or remove members.
    template <class F>
    void for_each(F&& f) const {
        for (const auto& p : by_rank_)
            if (p) f(*p);
    }

    // ---- the roster (strand-bound) ----
    /// Whether the table holds the whole group: every worker's address was read (a static group),
    /// or a membership update listed the members (a dynamic one). Inbound peers are admitted
    /// against it.
    [[nodiscard]] bool roster_read() const noexcept { return roster_read_; }
    /// The table holds the whole group from now on: wait_roster()'s waiters resume (in place).
    void mark_roster_read() {
        roster_read_ = true;
        roster_known_.set();
    }
    /// Resumes wait_roster()'s waiters although the roster is not read (its owner closes).
    void wake_roster_waiters() { roster_known_.set(); }
    /// Completes once mark_roster_read() or wake_roster_waiters() was called (at once after);
    /// operation_aborted when cancelled.
    [[nodiscard]] Task<std::error_code> wait_roster() { return roster_known_.wait(); }

private:
    mutable std::mutex mutex_;  // (held by changes and by the any-thread readers)
    std::vector<std::shared_ptr<PeerLink>> by_rank_;  // null where no member has that rank
    std::map<std::string, int, std::less<>> by_name_;
    bool roster_read_ = false;
    Flag roster_known_;  // set by mark_roster_read (or wake_roster_waiters)
};

}  // namespace tensorplay::detail
