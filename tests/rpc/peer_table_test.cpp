// PeerTable: members by rank and name, links that stay put while the table grows and shrinks, and
// the roster's waiters.
#include "rpc/peer_table.hpp"

#include "core/asio_compat.hpp"
#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_peer_table_test {

using namespace tensorplay;
using tensorplay::detail::PeerLink;
using tensorplay::detail::PeerTable;
using tensorplay::detail::use_nothrow;
using namespace std::chrono_literals;

TEST_CASE("a peer table finds members by rank and by name, and refuses a taken rank or name", "[rpc][peers]") {
    PeerTable t;
    REQUIRE(t.add(WorkerInfo{"a", 0}));
    REQUIRE(t.add(WorkerInfo{"c", 2}));  // (ranks need not be dense)
    CHECK(t.size() == 2);
    CHECK(t.rank_of("a") == 0);
    CHECK(t.rank_of("c") == 2);
    CHECK(t.rank_of("b") == -1);
    CHECK(t.at(1) == nullptr);
    CHECK(t.at(-1) == nullptr);
    CHECK(t.at(7) == nullptr);
    REQUIRE(t.at(2));
    CHECK(t.at(2)->info.name == "c");
    CHECK(t.names() == "a, c");
    CHECK(t.infos() == std::vector<WorkerInfo>{{"a", 0}, {"c", 2}});

    auto rank_taken = t.add(WorkerInfo{"x", 2});
    REQUIRE_FALSE(rank_taken);
    CHECK(rank_taken.error().code() == Errc::invalid_argument);
    CHECK(rank_taken.error().message().find("\"c\"") != std::string::npos);
    auto name_taken = t.add(WorkerInfo{"a", 5});
    REQUIRE_FALSE(name_taken);
    CHECK(name_taken.error().message().find("not unique") != std::string::npos);
    CHECK_FALSE(t.add(WorkerInfo{"n", -1}));
    CHECK(t.size() == 2);  // refusals change nothing

    auto found = t.find("c");
    REQUIRE(found);
    CHECK(found->id == 2);
    auto missing = t.find("zz");
    REQUIRE_FALSE(missing);
    CHECK(missing.error().message().find("\"zz\"") != std::string::npos);
}

TEST_CASE("a member's link stays where it is while the table grows, and outlives its removal for whoever holds it",
          "[rpc][peers]") {
    PeerTable t;
    auto first = t.add(WorkerInfo{"w0", 0});
    REQUIRE(first);
    PeerLink* at0 = t.at(0);
    for (int r = 1; r < 1000; ++r) REQUIRE(t.add(WorkerInfo{"w" + std::to_string(r), r}));
    CHECK(t.at(0) == at0);  // (growth moved no link)
    CHECK(first->get() == at0);

    auto held = t.link(999);
    REQUIRE(held);
    held->last_connect_error = Error(Errc::timeout, "marker");
    auto removed = t.remove(999);
    CHECK(removed == held);
    CHECK(t.at(999) == nullptr);
    CHECK(t.rank_of("w999") == -1);
    CHECK(t.size() == 999);
    REQUIRE(held->last_connect_error);  // still a valid object
    CHECK(held->last_connect_error->message() == "marker");
    CHECK(t.remove(999) == nullptr);

    // A new member may take a departed member's name and rank: a new link.
    auto again = t.add(WorkerInfo{"w999", 999});
    REQUIRE(again);
    CHECK(*again != held);
    CHECK_FALSE((*again)->last_connect_error);
}

TEST_CASE("a peer table's any-thread readers see whole members while the strand adds and removes them", "[rpc][peers]") {
    PeerTable t;
    REQUIRE(t.add(WorkerInfo{"fixed", 0}));
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0};
    std::thread reader([&] {
        while (!stop.load()) {
            for (const auto& w : t.infos())
                if (w.name.empty() || w.id < 0) ++bad;
            if (!t.find("fixed")) ++bad;
        }
    });
    for (int i = 0; i < 2000; ++i) {
        REQUIRE(t.add(WorkerInfo{"w" + std::to_string(i), 1 + i % 7}));
        t.remove(1 + i % 7);
    }
    stop = true;
    reader.join();
    CHECK(bad == 0);
    CHECK(t.size() == 1);
}

namespace {
/// Waits for the roster of `t`, then records that it resumed and how its wait ended.
Task<void> wait_for_roster(PeerTable& t, bool& resumed, std::error_code& ec) {
    ec = co_await t.wait_roster();
    resumed = true;
}
}  // namespace

TEST_CASE("the roster's waiters resume once it is read, or when woken without it", "[rpc][peers]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        PeerTable woken;
        bool resumed = false;
        std::error_code ec;
        asio::co_spawn(ex, wait_for_roster(woken, resumed, ec), asio::detached);
        co_await asio::post(ex, use_nothrow);
        CHECK_FALSE(resumed);
        woken.wake_roster_waiters();  // (its owner closes: in place, the roster still unread)
        CHECK(resumed);
        CHECK_FALSE(ec);
        CHECK_FALSE(woken.roster_read());

        PeerTable read;
        REQUIRE(read.add(WorkerInfo{"a", 0}));
        resumed = false;
        asio::co_spawn(ex, wait_for_roster(read, resumed, ec), asio::detached);
        co_await asio::post(ex, use_nothrow);
        CHECK_FALSE(resumed);
        CHECK_FALSE(read.roster_read());
        read.mark_roster_read();
        CHECK(resumed);
        CHECK(read.roster_read());
        auto again = co_await read.wait_roster();  // (once read: at once)
        CHECK_FALSE(again);
    });
}

}  // namespace tp_peer_table_test
