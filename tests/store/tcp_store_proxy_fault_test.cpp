// TcpStore client and server with a FaultProxy between them: a cut or reset mid-request fails that
// call with connection_lost, a stall ends at the client's timeout, and the server keeps serving.
#include <tensorplay/store/tcp_store.hpp>

#include "store/store_test_util.hpp"
#include "support/deadline.hpp"
#include "support/fault_proxy.hpp"

#include <catch2/catch.hpp>

#include <cstdio>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_tcp_store_proxy_fault_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

TcpStoreOptions options_for(std::uint16_t port, Duration timeout) {
    TcpStoreOptions o;
    o.port = port;
    o.timeout = timeout;
    o.dialect = TcpStoreDialect::torch2;
    return o;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A second client, connected directly, is served: the fault affected only the proxied connection.
Task<void> require_server_healthy(std::uint16_t port, std::string key) {
    auto ex = co_await asio::this_coro::executor;
    auto c = co_await TcpStore::connect(ex, options_for(port, 5s));
    REQUIRE(c);
    CO_REQUIRE(co_await (*c)->set(key, bytes("ok")));
    auto v = co_await (*c)->get(key);
    REQUIRE((v && *v == bytes("ok")));
}

Bytes big_value() { return Bytes(100000, 0x5A); }


struct CutCase {
    const char* name;
    Direction dir;
    Cut how;
};

// A cut of `c` while one call is on the wire: the call fails with connection_lost within 1 s
// (its timeout is `timeout`), the client reconnects, the server keeps serving.
void cut_case(CutCase c, Duration timeout = std::chrono::seconds(5)) {
    INFO(c.name);
    run_with_deadline(15s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        FaultProxy proxy("127.0.0.1", server->port());
        auto client = co_await TcpStore::connect(ex, options_for(proxy.port(), timeout));
        REQUIRE(client);
        CO_REQUIRE(co_await (*client)->set("small", bytes("v")));
        // Another client, connected directly.
        auto bystander = co_await TcpStore::connect(ex, options_for(server->port(), 10s));
        REQUIRE(bystander);

        if (c.dir == Direction::to_server) {
            // A request with a reply (a c10d SET has none: the client cannot tell that its bytes
            // were lost: it reports success once they are written).
            proxy.cut_after(c.dir, 1000, c.how);  // the 100 kB value is a thousand bytes in
            const auto t0 = Clock::now();
            Bytes expected, desired = big_value();  // (named: no temporary inside a co_await, GCC 12)
            auto r = co_await (*client)->compare_set("big", std::move(expected), std::move(desired));
            const double took = seconds_since(t0);
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::connection_lost);
            CHECK(took < 1.0);
            std::printf("[timing] store %s: the call failed after %.1f ms\n", c.name, took * 1000);
        } else {
            CO_REQUIRE(co_await (*bystander)->set("big", big_value()));
            proxy.cut_after(c.dir, 1000, c.how);  // the reply of the next GET, a thousand bytes in
            const auto t0 = Clock::now();
            auto r = co_await (*client)->get("big");
            const double took = seconds_since(t0);
            std::printf("[timing] store %s: the call failed after %.1f ms\n", c.name, took * 1000);
            REQUIRE_FALSE(r);
            REQUIRE(r.error().code() == Errc::connection_lost);
            REQUIRE(took < 1.0);
        }
        CHECK(proxy.cuts() == 1);
        // The client's next call reconnects (through the proxy again) and is served.
        auto later = co_await (*client)->get("small");
        REQUIRE(later);
        CHECK(*later == bytes("v"));
        CHECK(proxy.accepted() == 2);
        // The server keeps serving: the bystander's connection and a new one.
        CO_REQUIRE(co_await (*bystander)->set("after", bytes("x")));
        co_await require_server_healthy(server->port(), "healthy");
        // A request cut midway stored nothing half-written.
        std::vector<std::string> big_key{"big"};
        auto big = co_await (*bystander)->check(std::move(big_key));
        REQUIRE(big);
        CHECK(*big == (c.dir == Direction::to_client));
    });
}

}  // namespace

TEST_CASE("a store request cut or reset midway fails with connection_lost and the server keeps serving",
          "[store][fault][proxy]") {
    cut_case({"request cut (FIN)", Direction::to_server, Cut::fin});
    cut_case({"request cut (RST)", Direction::to_server, Cut::rst});
    cut_case({"reply cut (FIN)", Direction::to_client, Cut::fin});
}

// Issue 15 failure 2's pattern on the store client's side: an RST right behind the last bytes of
// an unfinished reply must fail the call at once (it once waited for its timeout plus graces).
TEST_CASE("a store reply cut with an RST midway fails with connection_lost at once", "[store][fault][proxy]") {
    cut_case({"reply cut (RST)", Direction::to_client, Cut::rst}, std::chrono::seconds(1));
}

TEST_CASE("a store connection reset while a wait is pending fails it with connection_lost at once", "[store][fault][proxy]") {
    run_with_deadline(15s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        FaultProxy proxy("127.0.0.1", server->port());
        auto client = co_await TcpStore::connect(ex, options_for(proxy.port(), 30s));
        REQUIRE(client);
        std::optional<Result<void>> waited;
        Clock::time_point ended;
        detail::Channel<void(std::error_code, int)> done(ex, 1);
        std::vector<std::string> never{"never"};
        const auto before = proxy.forwarded(Direction::to_server);
        asio::co_spawn(ex, (*client)->wait(std::move(never), 30s), [&](std::exception_ptr, Result<void> r) {
            waited = std::move(r);
            ended = Clock::now();
            done.try_send(std::error_code{}, 0);
        });
        // Let the WAIT reach the server (its bytes went through the proxy).
        for (int i = 0; i < 200 && proxy.forwarded(Direction::to_server) == before; ++i) {
            asio::steady_timer t(ex, 5ms);
            co_await t.async_wait(detail::use_nothrow);
        }
        INFO("accepted " << proxy.accepted() << ", wait " << (waited ? (*waited ? "ok" : waited->error().to_string()) : "pending"));
        REQUIRE(proxy.forwarded(Direction::to_server) > before);
        {
            asio::steady_timer t(ex, 50ms);  // and the server take it
            co_await t.async_wait(detail::use_nothrow);
        }
        const auto t0 = Clock::now();
        proxy.reset_all();
        co_await done.async_receive(asio::use_awaitable);
        REQUIRE(waited);
        REQUIRE_FALSE(*waited);
        CHECK(waited->error().code() == Errc::connection_lost);
        const double took = std::chrono::duration<double>(ended - t0).count();
        CHECK(took < 1.0);
        std::printf("[timing] store reset during wait: the wait failed after %.1f ms\n", took * 1000);
        co_await require_server_healthy(server->port(), "after-reset");
    });
}

TEST_CASE("a stalled store link ends a call at the client's timeout", "[store][fault][proxy]") {
    for (auto d : {Direction::to_server, Direction::to_client}) {
        run_with_deadline(15s, [&]() -> Task<void> {
            auto ex = co_await asio::this_coro::executor;
            auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
            FaultProxy proxy("127.0.0.1", server->port());
            auto client = co_await TcpStore::connect(ex, options_for(proxy.port(), 1s));
            REQUIRE(client);
            CO_REQUIRE(co_await (*client)->set("k", bytes("v")));
            proxy.stall(d);
            const auto t0 = Clock::now();
            auto r = co_await (*client)->add("n", 1);
            const double took = seconds_since(t0);
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::timeout);
            CHECK(took >= 0.99);  // not before the 1 s timeout
            CHECK(took < 1.5);    // nor much after
            std::printf("[timing] store stall %s: a 1 s ADD ended after %.3f s\n",
                        d == Direction::to_server ? "to_server" : "to_client", took);
            co_await require_server_healthy(server->port(), "after-stall");
            proxy.resume(d);
        });
    }
}

// A GET (a WAIT underneath) on a stalled link ends at its timeout, not seconds after it: the grace
// for the WAIT's verdict and the CHECKs that name the missing keys are charged to the caller's limit.
TEST_CASE("a stalled store link ends a get at the client's timeout", "[store][fault][proxy]") {
    for (auto d : {Direction::to_server, Direction::to_client}) {
        run_with_deadline(15s, [&]() -> Task<void> {
            auto ex = co_await asio::this_coro::executor;
            auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
            FaultProxy proxy("127.0.0.1", server->port());
            auto client = co_await TcpStore::connect(ex, options_for(proxy.port(), 1s));
            REQUIRE(client);
            CO_REQUIRE(co_await (*client)->set("k", bytes("v")));
            proxy.stall(d);
            const auto t0 = Clock::now();
            auto r = co_await (*client)->get("k");
            const double took = seconds_since(t0);
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::timeout);
            std::printf("[timing] store stall %s: a 1 s GET ended after %.3f s\n",
                        d == Direction::to_server ? "to_server" : "to_client", took);
            CHECK(took >= 0.99);
            CHECK(took < 1.5);
            proxy.resume(d);
        });
    }
}

}  // namespace tp_tcp_store_proxy_fault_test
