// CallTable: the calls a worker waits on (their ids, every pending call by peer and id, their
// deadlines, and how many are outstanding for a graceful shutdown to wait on).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/rpc/message.hpp>

#include "core/deadline_queue.hpp"
#include "core/flag.hpp"
#include "core/recycled.hpp"
#include "core/resume_slot.hpp"
#include "core/task_group.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

namespace tensorplay {
class Connection;
}

namespace tensorplay::detail {

/// A call waiting for its reply; lives outside the caller's coroutine frame (PendingCallHandle).
/// Signalled once, by the reply, a lost connection or its deadline. The signal resumes the caller
/// in place: a reply read by the connection's reader runs the caller's continuation at once, with
/// no trip through the event loop's queue (each such trip costs an epoll_wait system call).
struct PendingCall : DeadlineHook {
    explicit PendingCall(SlotRegistry* slots) : done(slots) {}
    ResumeSlot done;
    bool signalled = false;
    std::optional<Result<Message>> result;  ///< unset after the signal: the deadline passed
    const Connection* conn = nullptr;       ///< the connection the request went out on

    void signal() {
        signalled = true;
        done.complete();
    }
    void finish(Result<Message> r) {
        result = std::move(r);
        signal();
    }
};

/// One peer's pending calls by request id (a reply names its id).
using PendingCalls = std::unordered_map<std::uint64_t, PendingCall*, std::hash<std::uint64_t>, std::equal_to<std::uint64_t>,
                                        RecyclingAllocator<std::pair<const std::uint64_t, PendingCall*>>>;

/// The calls of one worker: it owns every pending call, by the rank of the peer it went to and its
/// request id. Strand-bound to the agent's executor. A call is registered once its request is sent
/// (add), taken by its reply (take) or failed with its connection or peer (fail), and ended when
/// its caller's frame ends (end: a reply, a timeout, a cancellation, or the frame's destruction).
/// Deadlines: one DeadlineKeeper (no timer per call; arming one costs a timerfd_settime system
/// call); a call past its deadline is signalled without a result.
///
/// A rank's calls stay here after its member left the peer table (a graceful leaver's calls still
/// get their replies); the group gives the rank to nobody else until they ended (the leaver holds
/// the group token meanwhile), and request ids are unique for this worker.
class CallTable {
public:
    /// `tasks` owns the deadline sweep (it must outlive the table's use of it, which ends with close()).
    CallTable(Executor ex, TaskGroup& tasks);
    CallTable(const CallTable&) = delete;
    CallTable& operator=(const CallTable&) = delete;

    /// The registry of resume slots of the table's event loop, for its calls' PendingCalls (looked
    /// up once: the lookup takes a mutex).
    [[nodiscard]] SlotRegistry* slots() const noexcept { return slots_; }
    /// A new request id (unique for this worker).
    [[nodiscard]] std::uint64_t next_id() noexcept { return next_id_++; }
    /// Calls registered and not yet ended.
    [[nodiscard]] std::size_t outstanding() const noexcept { return outstanding_; }
    /// Calls awaiting a reply from the peer of `rank` (registered, not yet taken or failed).
    [[nodiscard]] std::size_t in_flight(int rank) const noexcept {
        const PendingCalls* p = of(rank);
        return p ? p->size() : 0;
    }

    /// Registers `pc`, sent to the peer of `rank` (>= 0) as `id`, due at `at` (time_point::max():
    /// no deadline). Counted outstanding until finished().
    void add(int rank, std::uint64_t id, PendingCall& pc, Clock::time_point at) {
        if (static_cast<std::size_t>(rank) >= by_rank_.size()) by_rank_.resize(static_cast<std::size_t>(rank) + 1);
        by_rank_[static_cast<std::size_t>(rank)].emplace(id, &pc);
        deadlines_.add(pc, at);
        ++outstanding_;
    }
    /// Counts a call outstanding that has no request on a wire (a call to this worker itself).
    void add_local() noexcept { ++outstanding_; }
    /// The call that reply `id` from the peer of `rank` answers, taken out of the table; null for a
    /// late reply (the call timed out or was cancelled) or an id that peer was never sent.
    [[nodiscard]] PendingCall* take(int rank, std::uint64_t id) noexcept {
        PendingCalls* p = of(rank);
        if (!p) return nullptr;
        auto it = p->find(id);
        if (it == p->end()) return nullptr;
        PendingCall* pc = it->second;
        p->erase(it);
        return pc;
    }
    /// Takes `pc` (registered as `id` to `rank`) out of the table when no reply took it, and out
    /// of the deadlines; finished() then ends its count.
    void remove(int rank, std::uint64_t id, PendingCall& pc) noexcept;
    /// Ends the count of a call (added with add or add_local). When nothing is outstanding any
    /// more, a drained() waiter resumes in place, inside this call: call it last.
    void finished() noexcept {
        if (--outstanding_ == 0 || watching_ != 0)
            if (idle_.waiters() != 0) idle_.set();
    }
    /// Finishes every call to the peer of `rank` sent on `conn` (null: every one) with `reason`.
    /// Each caller resumes in place (and may make calls meanwhile).
    void fail(int rank, const Connection* conn, const Error& reason);

    /// Completes once nothing is outstanding (true), or at `deadline` (false), or when the table
    /// closes (true when nothing is outstanding then).
    [[nodiscard]] Task<bool> drained(Clock::time_point deadline);
    /// Completes once no call to the peer of `rank` awaits its reply and those calls have ended
    /// (true), or at `deadline` (false), or when the table closes.
    [[nodiscard]] Task<bool> drained(int rank, Clock::time_point deadline);
    /// Stops the deadlines (no more timeouts: the owner fails every call itself) and ends drained().
    void close();

private:
    /// Waits until done() holds (woken by every call's end while watching_ > 0, else by the last).
    template <class Done>
    Task<bool> wait_until(Done done, Clock::time_point deadline);
    /// The pending calls to `rank`, or null when it never had one.
    [[nodiscard]] PendingCalls* of(int rank) noexcept {
        return rank >= 0 && static_cast<std::size_t>(rank) < by_rank_.size() ? &by_rank_[static_cast<std::size_t>(rank)] : nullptr;
    }
    [[nodiscard]] const PendingCalls* of(int rank) const noexcept { return const_cast<CallTable*>(this)->of(rank); }

    SlotRegistry* slots_;
    std::uint64_t next_id_ = 1;
    /// By rank (grown by add, never shrunk): an element may move when another rank is added, so no
    /// reference to one is kept across a call that may add.
    std::vector<PendingCalls> by_rank_;
    std::size_t outstanding_ = 0;
    std::size_t watching_ = 0;  // drained(rank) waits parked: every call's end wakes them
    DeadlineKeeper deadlines_;
    Flag idle_;  // set when outstanding_ reaches zero with drained() waiting
    bool closed_ = false;
};

/// Owns a call's PendingCall (from the per-thread free lists: it is what the reply path points
/// at, and keeping it out of the caller's coroutine frame keeps that frame small enough for
/// Asio's frame cache); ends the call in its table when the caller's frame ends.
class PendingCallHandle {
public:
    /// A call to the peer of `rank` as request `id`.
    PendingCallHandle(CallTable& table, int rank, std::uint64_t id, SlotRegistry* slots)
        : table_(&table), rank_(rank), id_(id), pc_(recycled_new<PendingCall>(slots)) {}
    PendingCallHandle(const PendingCallHandle&) = delete;
    PendingCallHandle& operator=(const PendingCallHandle&) = delete;
    ~PendingCallHandle() {
        if (added_) table_->remove(rank_, id_, *pc_);
        recycled_delete(pc_);
        if (added_) table_->finished();  // (last: it may resume a shutdown in place)
    }
    PendingCall& operator*() const noexcept { return *pc_; }
    PendingCall* operator->() const noexcept { return pc_; }
    /// Its request id.
    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
    /// Registers the call (its request is sent), due at `at`.
    void add(Clock::time_point at) {
        table_->add(rank_, id_, *pc_, at);
        added_ = true;
    }

private:
    CallTable* table_;
    int rank_;
    std::uint64_t id_;
    PendingCall* pc_;
    bool added_ = false;
};

}  // namespace tensorplay::detail
