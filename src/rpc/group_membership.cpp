// Membership: a dynamic member's view of its group and the rules over it.
#include "rpc/group_membership.hpp"

#include <tensorplay/core/timeout.hpp>

#include <algorithm>

namespace tensorplay::detail {
namespace {

bool lists(const std::vector<int>& ranks, int rank) { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); }

/// An update of `change` of `subject`, with no members yet (no braced list in a coroutine: GCC 12).
MembershipUpdate empty_update(MembershipChange change, const std::string& subject) {
    MembershipUpdate u;
    u.change = change;
    u.subject = subject;
    return u;
}

}  // namespace

std::vector<int> Membership::ranks_of(const std::vector<GroupMember>& members) {
    std::vector<int> r;
    r.reserve(members.size());
    for (const auto& m : members) r.push_back(m.record.rank);
    return r;
}

std::vector<std::string> Membership::witnesses(int self, int suspect, std::size_t n) const {
    std::vector<const GroupMember*> others;
    for (const auto& m : members_)
        if (m.record.rank != self && m.record.rank != suspect) others.push_back(&m);
    std::sort(others.begin(), others.end(), [](const GroupMember* a, const GroupMember* b) { return a->record.rank < b->record.rank; });
    // The suspect's followers first, then (wrapping) those below it.
    const auto after = std::partition_point(others.begin(), others.end(), [&](const GroupMember* m) { return m->record.rank < suspect; });
    std::rotate(others.begin(), after, others.end());
    std::vector<std::string> out;
    for (std::size_t i = 0; i < others.size() && i < n; ++i) out.push_back(others[i]->record.name);
    return out;
}

std::vector<int> Membership::successors(int self, std::size_t n) const {
    std::vector<int> ranks;
    for (const auto& m : members_)
        if (m.record.rank != self) ranks.push_back(m.record.rank);
    std::sort(ranks.begin(), ranks.end());
    std::rotate(ranks.begin(), std::upper_bound(ranks.begin(), ranks.end(), self), ranks.end());
    if (ranks.size() > n) ranks.resize(n);
    return ranks;
}

void Membership::keep_watches(const std::vector<int>& ranks) {
    std::erase_if(watches_, [&](const BeatWatch& w) { return std::find(ranks.begin(), ranks.end(), w.rank) == ranks.end(); });
}

Clock::time_point Membership::observe_beat(int rank, std::int64_t value, Clock::time_point now) {
    auto it = std::find_if(watches_.begin(), watches_.end(), [&](const BeatWatch& w) { return w.rank == rank; });
    if (it == watches_.end()) {
        watches_.push_back(BeatWatch{rank, value, now, now});
        return now;
    }
    if (value != it->value) {
        it->value = value;
        it->still_since = it->last_read;
    }
    it->last_read = now;
    return it->still_since;
}

std::optional<Clock::time_point> Membership::beat_still_since(int rank, std::int64_t value) const {
    for (const auto& w : watches_)
        if (w.rank == rank && w.value == value) return w.still_since;
    return std::nullopt;
}

void Membership::restart_watch(int rank, Clock::time_point now) noexcept {
    for (auto& w : watches_)
        if (w.rank == rank) w.still_since = now;
}

bool Membership::confirmed_unreachable(int rank) const noexcept {
    return std::find(confirmed_.begin(), confirmed_.end(), rank) != confirmed_.end();
}

MembershipUpdate Membership::leave_update(const std::string& self, const std::vector<int>* listed) const {
    auto u = empty_update(MembershipChange::leave, self);
    for (const auto& m : members_)
        if (m.record.name != self && (!listed || lists(*listed, m.record.rank))) u.members.push_back(m);
    return u;
}

MembershipUpdate Membership::removal_update(int rank, const std::string& name, const std::vector<int>& listed) const {
    auto u = empty_update(MembershipChange::removal, name);
    for (const auto& m : members_)
        if (m.record.rank != rank && lists(listed, m.record.rank)) u.members.push_back(m);
    return u;
}

bool Membership::first_refusal(const std::string& name) {
    if (refusals_logged_.size() >= kMaxRefusalsLogged ||
        std::find(refusals_logged_.begin(), refusals_logged_.end(), name) != refusals_logged_.end())
        return false;
    refusals_logged_.push_back(name);
    return true;
}

bool Membership::begin_check(int rank) {
    if (lists(checks_, rank)) return false;
    checks_.push_back(rank);
    checks_idle_.reset();
    return true;
}

void Membership::end_check(int rank) {
    std::erase(checks_, rank);
    std::erase(confirmed_, rank);
    if (checks_.empty()) checks_idle_.set();
}

Task<void> Membership::removals_ended(Clock::time_point deadline) {
    auto waiting = [](Flag& e) -> Task<Result<void>> {
        auto ec = co_await e.wait();
        if (ec) co_return fail(from_error_code(ec, "waiting for a removal"));
        co_return ok();
    };
    while (!checks_.empty()) {
        const Duration left = deadline == Clock::time_point::max() ? Duration::zero() : deadline - Clock::now();
        if (deadline != Clock::time_point::max() && left <= Duration::zero()) break;
        auto wait = with_timeout(waiting(checks_idle_), left);
        if (!co_await std::move(wait)) break;
    }
}

bool Membership::evict(const Error& why) {
    if (evicted_) return false;
    evicted_ = why;
    return true;
}

Duration Membership::beat_interval(Duration timeout) {
    return std::clamp<Duration>(timeout / 10, std::chrono::milliseconds(10), std::chrono::seconds(1));
}

Duration Membership::probe_timeout(Duration timeout) {
    return std::clamp<Duration>(timeout / 2, std::chrono::milliseconds(50), std::chrono::seconds(5));
}

Duration Membership::witness_probe_timeout(Duration timeout) { return probe_timeout(timeout) * 3 / 4; }

}  // namespace tensorplay::detail
