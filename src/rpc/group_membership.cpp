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

int Membership::successor(int self) const {
    int next = -1, first = -1;
    for (const auto& m : members_) {
        const int r = m.record.rank;
        if (r == self) continue;
        if (first < 0 || r < first) first = r;
        if (r > self && (next < 0 || r < next)) next = r;
    }
    return next >= 0 ? next : first;
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

Clock::time_point Membership::observe_beat(int rank, std::int64_t value, Clock::time_point before, Clock::time_point now) {
    if (rank != watch_.rank) watch_ = BeatWatch{rank, value, now};
    else if (value != watch_.value) watch_ = BeatWatch{rank, value, before};
    return watch_.still_since;
}

std::optional<Clock::time_point> Membership::beat_still_since(int rank, std::int64_t value) const {
    if (rank != watch_.rank || value != watch_.value) return std::nullopt;
    return watch_.still_since;
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
