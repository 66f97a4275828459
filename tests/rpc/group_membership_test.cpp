// Membership: a dynamic member's view of its group: the members an update brings, the successor
// each member watches, the updates of a leave and a removal, refusals logged once a name, removal
// checks and their end, and eviction.
#include "rpc/group_membership.hpp"

#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_group_membership_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::GroupMember;
using detail::Membership;
using detail::MembershipChange;
using detail::MembershipUpdate;

namespace {

GroupMember member(const std::string& name, int rank) {
    GroupMember m;
    m.record.name = name;
    m.record.rank = rank;
    m.devices.name = name;
    return m;
}

/// A join's update listing `ranks` (worker "w<rank>" each).
MembershipUpdate group_of(const std::vector<int>& ranks) {
    MembershipUpdate u;
    u.change = MembershipChange::join;
    u.subject = "w" + std::to_string(ranks.back());
    for (int r : ranks) u.members.push_back(member("w" + std::to_string(r), r));
    return u;
}

std::vector<std::string> names(const MembershipUpdate& u) {
    std::vector<std::string> n;
    for (const auto& m : u.members) n.push_back(m.record.name);
    return n;
}

Task<void> end_check_after(Membership& m, int rank, Duration d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(detail::use_nothrow);
    m.end_check(rank);
}

}  // namespace

TEST_CASE("a membership takes an update's members and watches its two successors by rank, wrapping", "[rpc][membership]") {
    Membership m;
    CHECK(m.members().empty());
    CHECK(m.successors(0, 2).empty());  // alone (or not joined yet): nobody to watch
    m.adopt(group_of({0, 3, 7}));
    REQUIRE(m.members().size() == 3);
    CHECK(Membership::ranks_of(m.members()) == std::vector<int>{0, 3, 7});
    CHECK(m.successors(0, 2) == std::vector<int>{3, 7});
    CHECK(m.successors(3, 2) == std::vector<int>{7, 0});
    CHECK(m.successors(7, 2) == std::vector<int>{0, 3});  // the last watches the first
    CHECK(m.successors(5, 2) == std::vector<int>{7, 0});  // (a rank between members: the next ones)
    CHECK(m.successors(0, 5) == std::vector<int>{3, 7});  // (no more than the others)
    m.adopt(group_of({4}));
    CHECK(m.successors(4, 2).empty());
}

TEST_CASE("a removal's witnesses are the suspect's followers by rank, neither the asker nor the suspect", "[rpc][membership]") {
    Membership m;
    m.adopt(group_of({0, 3, 5, 7}));
    CHECK(m.witnesses(0, 3, 2) == std::vector<std::string>{"w5", "w7"});
    CHECK(m.witnesses(5, 3, 2) == std::vector<std::string>{"w7", "w0"});
    CHECK(m.witnesses(0, 7, 2) == std::vector<std::string>{"w3", "w5"});  // (wrapping, the asker left out)
    m.adopt(group_of({0, 3}));
    CHECK(m.witnesses(0, 3, 2).empty());  // a group of two: nobody to witness
}

TEST_CASE("a watched heartbeat stands still from the reading before the one that saw it move", "[rpc][membership]") {
    Membership m;
    const auto t0 = Clock::now();
    const auto at = [&](int ms) { return t0 + std::chrono::milliseconds(ms); };
    CHECK(m.observe_beat(3, 10, at(0)) == at(0));  // (a first reading: from now)
    CHECK(m.observe_beat(3, 10, at(100)) == at(0));
    CHECK(m.observe_beat(3, 11, at(200)) == at(100));  // (it beat after the reading at 100)
    CHECK(m.observe_beat(3, 11, at(900)) == at(100));
    CHECK(m.beat_still_since(3, 11) == at(100));
    CHECK_FALSE(m.beat_still_since(3, 12));
    CHECK_FALSE(m.beat_still_since(4, 11));
    m.restart_watch(3, at(1000));
    CHECK(m.beat_still_since(3, 11) == at(1000));
    m.keep_watches({5});
    CHECK_FALSE(m.beat_still_since(3, 11));
}

TEST_CASE("the updates of a leave and a removal list the other members that the store still lists", "[rpc][membership]") {
    Membership m;
    m.adopt(group_of({0, 1, 2, 3}));

    const auto all = m.leave_update("w1", nullptr);  // the store's list unread: every other member
    CHECK(all.change == MembershipChange::leave);
    CHECK(all.subject == "w1");
    CHECK(names(all) == std::vector<std::string>{"w0", "w2", "w3"});
    const std::vector<int> listed{0, 1, 3};  // the others removed w2 meanwhile
    CHECK(names(m.leave_update("w1", &listed)) == std::vector<std::string>{"w0", "w3"});

    const auto removal = m.removal_update(3, "w3", listed);
    CHECK(removal.change == MembershipChange::removal);
    CHECK(removal.subject == "w3");
    CHECK(names(removal) == std::vector<std::string>{"w0", "w1"});
}

TEST_CASE("a refused caller is logged once a name, for a bounded count of names", "[rpc][membership]") {
    Membership m;
    CHECK(m.first_refusal("intruder"));
    CHECK_FALSE(m.first_refusal("intruder"));
    for (std::size_t i = 1; i < Membership::kMaxRefusalsLogged; ++i) CHECK(m.first_refusal("n" + std::to_string(i)));
    CHECK_FALSE(m.first_refusal("one too many"));
}

TEST_CASE("one removal check per member; removals_ended waits for the last, or its deadline", "[rpc][membership]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Membership m;
        CHECK_FALSE(m.checking());
        co_await m.removals_ended(Clock::time_point::max());  // none: at once

        CHECK(m.begin_check(2));
        CHECK_FALSE(m.begin_check(2));  // one check per member at a time
        CHECK(m.begin_check(5));
        CHECK(m.checking());

        // Its deadline ends the wait while checks still run.
        const auto began = Clock::now();
        co_await m.removals_ended(Clock::now() + 30ms);
        CHECK(Clock::now() - began >= 25ms);
        CHECK(m.checking());

        // The last check to end ends the wait; the first does not.
        asio::co_spawn(ex, end_check_after(m, 2, 10ms), asio::detached);
        asio::co_spawn(ex, end_check_after(m, 5, 40ms), asio::detached);
        const auto waited = Clock::now();
        co_await m.removals_ended(Clock::now() + 4s);
        CHECK_FALSE(m.checking());
        CHECK(Clock::now() - waited >= 35ms);
        CHECK(Clock::now() - waited < 3s);
        CHECK(m.begin_check(2));  // ended checks may begin again
        m.end_check(2);
    });
}

TEST_CASE("changed() wakes a waiter at each change; eviction and leaving are recorded once", "[rpc][membership]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Membership m;
        bool woken = false;
        asio::co_spawn(
            ex,
            [](Membership& mm, bool& w) -> Task<void> {
                mm.changed().reset();
                (void)co_await mm.changed().wait();
                w = true;
            }(m, woken),
            asio::detached);
        co_await asio::post(ex, asio::use_awaitable);  // (one turn: the waiter is parked now)
        CHECK_FALSE(woken);
        m.adopt(group_of({0, 1}));
        CHECK_FALSE(woken);  // (the agent follows first, then notifies)
        m.notify_changed();
        CHECK(woken);  // in place

        CHECK_FALSE(m.leaving());
        m.start_leaving();
        CHECK(m.leaving());
        CHECK_FALSE(m.evicted());
        CHECK(m.evict(Error(Errc::shutdown, "removed by the others")));
        CHECK_FALSE(m.evict(Error(Errc::shutdown, "again")));
        REQUIRE(m.evicted());
        CHECK(m.evicted()->message() == "removed by the others");
    });
}

TEST_CASE("liveness timings follow the member timeout within their bounds", "[rpc][membership]") {
    CHECK(Membership::beat_interval(2s) == 200ms);
    CHECK(Membership::beat_interval(50ms) == 10ms);
    CHECK(Membership::beat_interval(60s) == 1s);
    CHECK(Membership::probe_timeout(2s) == 1s);
    CHECK(Membership::probe_timeout(20ms) == 50ms);
    CHECK(Membership::probe_timeout(60s) == 5s);
}

}  // namespace tp_group_membership_test
