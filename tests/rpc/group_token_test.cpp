// The dynamic group's membership token: joins and leaves serialised on one store key, a dead
// holder's token taken after its heartbeat stood still, a live one's never; over a HashStore and
// over a real TCPStore server with one client per member.
#include "rpc/group_token.hpp"

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/store/hash_store.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include "core/asio_compat.hpp"
#include "core/task_group.hpp"
#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>

#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_group_token_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::GroupToken;
using detail::GroupTokenTiming;
using detail::TokenPurpose;

namespace {

const GroupTokenTiming fast{std::chrono::milliseconds(20), std::chrono::milliseconds(300)};

Task<void> pause(Duration d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(detail::use_nothrow);
}

Task<std::string> token_key(Store& store) {
    auto v = co_await store.get(detail::kGroupTokenKey);
    REQUIRE(v);
    co_return to_string(*v);
}

/// A member that takes the token, records the order it got it in, holds it for `hold`, gives it back.
Task<void> member(std::shared_ptr<Store> store, std::string name, Duration hold, std::vector<std::string>& order,
                  int& holders, int& most_holders) {
    auto t = co_await GroupToken::acquire(store, name, TokenPurpose::join, Clock::now() + 10s, fast);
    REQUIRE(t);
    order.push_back(name);
    most_holders = std::max(most_holders, ++holders);
    co_await pause(hold);
    --holders;
    CHECK_FALSE((*t)->lost());
    auto r = co_await (*t)->release();
    CHECK(r);
}

}  // namespace

TEST_CASE("joins and leaves take the token one at a time, each after the holder gave it back", "[rpc][membership]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>();
        std::vector<std::string> order;
        int holders = 0, most = 0;
        // The first takes it, then holds it past several heartbeats (and past stale_after: alive,
        // it keeps it) while the others wait.
        auto a = co_await GroupToken::acquire(store, "a", TokenPurpose::join, Clock::now() + 5s, fast);
        REQUIRE(a);
        holders = most = 1;
        detail::TaskGroup tasks(ex);
        for (const char* n : {"b", "c", "d"}) tasks.spawn(member(store, n, 10ms, order, holders, most), n);
        co_await pause(500ms);
        CHECK(order.empty());
        CHECK_FALSE((*a)->lost());
        --holders;
        auto released = co_await (*a)->release();
        CHECK(released);
        co_await tasks.join();
        REQUIRE(order.size() == 3);
        CHECK(most == 1);  // never two holders at once
        CHECK(co_await token_key(*store) == "");
    });
}

TEST_CASE("a holder that goes silent loses the token after stale_after; one that beats never does", "[rpc][membership]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>();
        auto a = co_await GroupToken::acquire(store, "a", TokenPurpose::join, Clock::now() + 5s, fast);
        REQUIRE(a);
        const std::string a_token = (*a)->value();
        // While a beats, b waits (well past stale_after) and then times out naming a.
        auto b = co_await GroupToken::acquire(store, "b", TokenPurpose::leave, Clock::now() + 700ms, fast);
        REQUIRE_FALSE(b);
        CHECK(b.error().code() == Errc::timeout);
        CHECK(b.error().message().find(a_token) != std::string::npos);
        CHECK(b.error().message().find("leaving as worker \"b\"") != std::string::npos);
        // a dies (its heartbeat stops without a release): c takes the token once a's heartbeat
        // stood still for stale_after.
        a->reset();
        const auto start = Clock::now();
        auto c = co_await GroupToken::acquire(store, "c", TokenPurpose::join, Clock::now() + 5s, fast);
        REQUIRE(c);
        CHECK(Clock::now() - start >= fast.stale_after);
        CHECK(co_await token_key(*store) == (*c)->value());
        auto r = co_await (*c)->release();
        CHECK(r);
    });
}

TEST_CASE("a holder taken for dead learns it lost the token, and its release leaves the new holder's", "[rpc][membership]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>();
        // a's heartbeat is slower than the others' stale_after: they take it for dead.
        const GroupTokenTiming slow{std::chrono::milliseconds(600), std::chrono::seconds(10)};
        auto a = co_await GroupToken::acquire(store, "a", TokenPurpose::join, Clock::now() + 5s, slow);
        REQUIRE(a);
        auto b = co_await GroupToken::acquire(store, "b", TokenPurpose::join, Clock::now() + 5s, GroupTokenTiming{20ms, 200ms});
        REQUIRE(b);
        co_await pause(1300ms);  // a's next heartbeat (within 600 ms) finds b's token
        CHECK((*a)->lost());
        auto ra = co_await (*a)->release();
        CHECK(ra);
        CHECK(co_await token_key(*store) == (*b)->value());  // a's release did not empty b's
        CHECK_FALSE((*b)->lost());
        auto rb = co_await (*b)->release();
        CHECK(rb);
        CHECK(co_await token_key(*store) == "");
    });
}

TEST_CASE("a token squatted under the name of a key that exists is taken after stale_after, without spinning", "[rpc][membership][hostile]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>();
        auto a = co_await store->set("squatter", bytes("x"));
        auto b = co_await store->set(detail::kGroupTokenKey, bytes("squatter"));
        REQUIRE(a);
        REQUIRE(b);
        const auto t0 = Clock::now();
        // (Before: a wait on "squatter" returned at once, again and again, until the deadline.)
        auto t = co_await GroupToken::acquire(store, "a", TokenPurpose::join, t0 + 5s, fast);
        REQUIRE(t);
        CHECK(Clock::now() - t0 >= fast.stale_after);
        const std::string now_held = co_await token_key(*store);
        CHECK(now_held.starts_with("Token_for_a_"));
        auto r = co_await (*t)->release();
        REQUIRE(r);
    });
}

TEST_CASE("the token over a TCPStore server, one client per member", "[rpc][membership]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        REQUIRE(server);
        std::vector<std::shared_ptr<Store>> clients;
        for (int i = 0; i < 3; ++i) {
            TcpStoreOptions o;
            o.port = (*server)->port();
            o.timeout = 5s;
            auto c = co_await TcpStore::connect(ex, o);
            REQUIRE(c);
            clients.push_back(*c);
        }
        std::vector<std::string> order;
        int holders = 0, most = 0;
        detail::TaskGroup tasks(ex);
        for (int i = 0; i < 3; ++i)
            tasks.spawn(member(clients[i], "w" + std::to_string(i), 50ms, order, holders, most), "member");
        co_await tasks.join();
        CHECK(order.size() == 3);
        CHECK(most == 1);
        CHECK(co_await token_key(*clients[0]) == "");
    });
}

}  // namespace tp_group_token_test
