// Removal by evidence (issue 37, docs/protocol.md "Removal by evidence"): a member cut off from one
// peer only stays in the group, because a witness reaches it; in a group of two a partition
// between the members removes nobody while both beat in the store; a member cut off from everyone
// is removed by the others (not the other way round) and learns it; a dead member of a group of
// two is removed on its heartbeat's evidence; a joiner that cannot reach a live member does not
// join (and removes nobody); the witness handler answers each case, and refuses a name past its
// bound.
#include "agent_test_util.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/rpc/constants.hpp>

#include "rpc/membership.hpp"
#include "rpc/peer_record.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <mutex>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_dynamic_partition_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using test::AgentPtr;

namespace {

constexpr auto kMemberTimeout = 1s;

Task<Result<Message>> echo(WorkerInfo, Message m) { co_return m; }

Task<Result<AgentPtr>> try_join(std::shared_ptr<Store> store, int rank) {
    detail::NativeAgentTuning tuning;
    tuning.member_timeout = kMemberTimeout;
    auto args = test::init_args(std::move(store), rank, DYNAMIC_WORLD_SIZE, {});
    co_return co_await detail::NativeAgent::create(std::move(args), tuning);
}

Task<AgentPtr> join(std::shared_ptr<Store> store, int rank) {
    auto a = co_await try_join(std::move(store), rank);
    if (!a) FAIL("worker" << rank << " did not join: " << a.error().to_string());
    REQUIRE((*a)->register_handler("echo", echo));
    co_return *a;
}

/// The library's log lines at warn and above while it lives (the sink is restored after).
class LogWatch {
public:
    LogWatch() {
        set_log_sink([this](LogLevel, std::string_view, std::string_view m) {
            std::lock_guard lock(mutex_);
            lines_.emplace_back(m);
        });
    }
    ~LogWatch() { set_log_sink({}); }
    LogWatch(const LogWatch&) = delete;
    LogWatch& operator=(const LogWatch&) = delete;

    /// Lines that contain `needle`.
    [[nodiscard]] std::size_t count(std::string_view needle) const {
        std::lock_guard lock(mutex_);
        return static_cast<std::size_t>(
            std::count_if(lines_.begin(), lines_.end(), [&](const std::string& l) { return l.find(needle) != std::string::npos; }));
    }
    /// Waits until `n` lines contain `needle`; false after `limit`.
    Task<bool> until(std::string needle, std::size_t n, std::chrono::milliseconds limit) {
        asio::steady_timer timer(co_await asio::this_coro::executor);
        const auto end = std::chrono::steady_clock::now() + limit;
        while (count(needle) < n) {
            if (std::chrono::steady_clock::now() >= end) co_return false;
            timer.expires_after(20ms);
            co_await timer.async_wait(asio::use_awaitable);
        }
        co_return true;
    }
    /// Every line, for a failure's message.
    [[nodiscard]] std::string all() const {
        std::lock_guard lock(mutex_);
        std::string out;
        for (const auto& l : lines_) out += l + "\n";
        return out;
    }

private:
    mutable std::mutex mutex_;
    std::vector<std::string> lines_;
};

/// Waits (the time a removal would take, twice over) and then checks that every agent of `group`
/// still lists all of `names`.
Task<void> nobody_removed(const std::vector<AgentPtr>& group, std::vector<std::string> names) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(2 * kMemberTimeout);
    co_await timer.async_wait(asio::use_awaitable);
    for (const auto& a : group) {
        const bool all = co_await a->until_members(names, 0ms);
        INFO(a->get_worker_info().name << " lists " << a->get_worker_infos().size() << " members");
        CHECK(all);
    }
}

Task<void> close_all(std::vector<AgentPtr>& group) {
    for (auto it = group.rbegin(); it != group.rend(); ++it) (void)co_await (*it)->shutdown(false);
}

constexpr std::string_view kPartitionOnly = "a partition between these two only";
constexpr std::string_view kStillBeats = "its heartbeat in the store moves";
constexpr std::string_view kRemoves = "from the group:";

}  // namespace

namespace {

/// A group of `n` in which worker0 and worker1 are cut off from each other: each suspects the
/// other and is told, in a line containing `refuted`, that it stays; nobody is removed.
Task<std::vector<AgentPtr>> partitioned_pair(std::shared_ptr<Store> store, int n, std::string refuted) {
    std::vector<AgentPtr> group;
    for (int r = 0; r < n; ++r) group.push_back(co_await join(store, r));
    LogWatch log;
    REQUIRE(group[0]->cut_off_for_test("worker1"));
    REQUIRE(group[1]->cut_off_for_test("worker0"));
    const bool stays = co_await log.until(refuted, 2, 20s);
    INFO(log.all());
    REQUIRE(stays);
    std::vector<std::string> all;
    for (const auto& a : group) all.push_back(a->get_worker_info().name);
    co_await nobody_removed(group, all);
    CHECK(log.count(kRemoves) == 0);
    co_return group;
}

}  // namespace

TEST_CASE("a member cut off from one peer only stays: the witness reaches it", "[rpc][dynamic][partition]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto group = co_await partitioned_pair(std::make_shared<HashStore>(10s), 3, std::string(kPartitionOnly));
        // The witness still calls both; the two cut off from each other get a named error.
        const std::vector<std::string> cut_pair{"worker0", "worker1"};
        for (const auto& to : cut_pair) {
            auto r = co_await test::call_echo(*group[2], to);
            CHECK(r);
        }
        auto cut = co_await test::call_echo(*group[0], "worker1", 2);
        REQUIRE_FALSE(cut);
        CHECK(cut.error().message().find("worker1") != std::string::npos);
        co_await close_all(group);
    });
}

TEST_CASE("in a group of two, a partition between the members removes nobody while both beat in the store",
          "[rpc][dynamic][partition]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto group = co_await partitioned_pair(std::make_shared<HashStore>(10s), 2, std::string(kStillBeats));
        co_await close_all(group);
    });
}

TEST_CASE("a member cut off from every other member is removed by them, and learns it", "[rpc][dynamic][partition]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 3; ++r) group.push_back(co_await join(store, r));
        LogWatch log;
        REQUIRE(group[0]->cut_off_for_test("worker1"));
        REQUIRE(group[0]->cut_off_for_test("worker2"));
        REQUIRE(group[1]->cut_off_for_test("worker0"));
        REQUIRE(group[2]->cut_off_for_test("worker0"));
        // worker1 and worker2 confirm each other's view of worker0; worker0, whose witnesses it
        // cannot reach, finds the others beating in the store and removes nobody.
        std::vector<AgentPtr> rest{group[1], group[2]};
        const std::vector<std::string> two{"worker1", "worker2"};
        for (const auto& a : rest) {
            const bool removed = co_await a->until_members(two, 20s);
            INFO(log.all());
            REQUIRE(removed);
        }
        CHECK(log.count("removes member \"worker1\"") == 0);
        CHECK(log.count("removes member \"worker2\"") == 0);
        // worker0 learns at its next beat that it is no longer a member.
        Result<Message> r = fail(Errc::internal, "not called");
        for (int i = 0; i < 100; ++i) {
            r = co_await test::call_echo(*group[0], "worker1", 1);
            if (!r && r.error().code() == Errc::shutdown) break;
            asio::steady_timer t(co_await asio::this_coro::executor, 50ms);
            co_await t.async_wait(asio::use_awaitable);
        }
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::shutdown);
        CHECK(r.error().message().find("removed from the dynamic group") != std::string::npos);
        co_await close_all(group);
    });
}

TEST_CASE("in a group of two, a member that dies is removed on its heartbeat's evidence", "[rpc][dynamic][partition]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 2; ++r) group.push_back(co_await join(store, r));
        LogWatch log;
        // worker1 closes everything without telling anyone (as a crash would, minus the process):
        // no witness is left, and its heartbeat stands still.
        (void)co_await group[1]->shutdown(false);
        const std::vector<std::string> one{"worker0"};
        const bool removed = co_await group[0]->until_members(one, 20s);
        INFO(log.all());
        REQUIRE(removed);
        CHECK(log.count("its heartbeat stood still") >= 1);
        (void)co_await group[0]->shutdown(false);
    });
}

TEST_CASE("a witness answers whether it reaches a member, and refuses a name past its bound", "[rpc][dynamic][partition]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 3; ++r) group.push_back(co_await join(store, r));
        // (Each name and answer is named before the await: GCC 12 and coroutine temporaries.)
        auto ask = [&](const std::string& about) { return group[2]->rpc_async("worker0", detail::kWitnessHandler, test::text_message(about), 5); };
        auto answer = [](std::uint8_t a) { return Bytes(1, a); };
        const std::string member = "worker1", stranger = "nobody", huge = std::string(5000, 'w');
        auto reached = co_await ask(member);
        REQUIRE(reached);
        CHECK(reached->payload == answer(1));
        auto unknown = co_await ask(stranger);
        REQUIRE(unknown);
        CHECK(unknown->payload == answer(2));
        REQUIRE(group[0]->cut_off_for_test("worker1"));
        auto cut = co_await ask(member);
        REQUIRE(cut);
        CHECK(cut->payload == answer(0));
        auto refused = co_await ask(huge);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code() == Errc::remote_error);  // (the witness's invalid_argument, as its caller sees it)
        CHECK(refused.error().message().find("5000 bytes") != std::string::npos);
        co_await close_all(group);
    });
}

TEST_CASE("a joiner that cannot reach a live member does not join, and the group is unchanged", "[rpc][dynamic][partition]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 2; ++r) group.push_back(co_await join(store, r));
        // worker1's record, as the joiner reads it, names a TCP address where nothing listens (the
        // address every connection starts on; worker1 itself is as before, and beats).
        const std::string key = detail::member_info_key(1);
        auto held = co_await store->get(key);
        REQUIRE(held);
        auto record = detail::decode_record(*held);
        REQUIRE(record);
        for (auto& a : record->addresses)
            if (a.name == "uv") a.address = "tcp://127.0.0.1:1";
        const Bytes bogus = detail::encode_record(*record);
        auto set = co_await store->set(key, bogus);
        REQUIRE(set);
        auto joiner = co_await try_join(store, 2);
        REQUIRE_FALSE(joiner);
        INFO(joiner.error().to_string());
        CHECK(joiner.error().message().find("which is alive") != std::string::npos);
        const std::vector<std::string> both{"worker0", "worker1"};
        for (const auto& a : group) {
            const bool unchanged = co_await a->until_members(both, 0ms);
            CHECK(unchanged);
        }
        co_await close_all(group);
    });
}

}  // namespace tp_dynamic_partition_test
