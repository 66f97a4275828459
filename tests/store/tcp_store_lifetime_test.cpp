// Lifetime tests of TcpStore and TcpStoreServer: closing or stopping with work in flight ends
// every background coroutine and frees the state; callers cancelled on other threads.
#include <tensorplay/store/tcp_store.hpp>

#include "store/raw_store_client.hpp"
#include "store/store_test_util.hpp"
#include "store/tcp_store_client_impl.hpp"
#include "store/tcp_store_server_impl.hpp"
#include "support/deadline.hpp"

#include <tensorplay/core/runtime.hpp>

#include <asio/ip/tcp.hpp>

#include <catch2/catch.hpp>

#include <functional>
#include <random>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_tcp_store_lifetime_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

TcpStoreOptions client_for(std::uint16_t port, TcpStoreDialect dialect) {
    TcpStoreOptions o;
    o.port = port;
    o.timeout = 30s;
    o.dialect = dialect;
    return o;
}

// Polls `done` every 5 ms until it holds or `limit` passes (a bound, not a speed claim).
Task<bool> eventually(std::function<bool()> done, Duration limit) {
    const auto until = Clock::now() + limit;
    while (!done()) {
        if (Clock::now() > until) co_return false;
        co_await pause(5ms);
    }
    co_return true;
}

Task<std::size_t> connections(std::shared_ptr<TcpStoreServer> server) { co_return co_await server->num_connections(); }

// As many legacy GETs of `key` as fit in `budget` bytes.
Bytes pipelined_gets(std::string_view key, std::size_t budget) {
    Bytes b;
    while (b.size() + 9 + key.size() <= budget) {
        b.push_back(0x02);
        put_str(b, key);
    }
    return b;
}

}  // namespace

TEST_CASE("closing a client with operations in flight fails them with shutdown and ends its coroutines", "[store][fault]") {
    for (auto dialect : {TcpStoreDialect::torch2, TcpStoreDialect::torch113}) {
        run_with_deadline(20s, [dialect]() -> Task<void> {
            auto ex = co_await asio::this_coro::executor;
            auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
            const auto states0 = detail::client_states_alive();
            {
                auto c = co_await TcpStore::connect(ex, client_for(server->port(), dialect));
                CO_REQUIRE(c);
                // Three waits, each on its own lane (connection), blocked in the server.
                Spawned<Bytes> g1(ex, (*c)->get("never1"));
                Spawned<Bytes> g2(ex, (*c)->get("never2"));
                Spawned<void> w(ex, (*c)->wait(keys("never3"), 20s));
                const bool lanes_up = co_await eventually([&] { return detail::client_tasks_running() >= 3; }, 5s);
                REQUIRE(lanes_up);
                auto srv = server;
                std::size_t n = 0;
                for (int i = 0; i < 400 && n < 3; ++i) {
                    n = co_await connections(srv);
                    if (n < 3) co_await pause(5ms);
                }
                REQUIRE(n >= 3);
                Spawned<std::int64_t> queued(ex, (*c)->add("n", 1));  // queued or in flight at the close
                (*c)->close();
                auto r1 = co_await g1.join();
                auto r2 = co_await g2.join();
                auto r3 = co_await w.join();
                auto r4 = co_await queued.join();
                REQUIRE_FALSE(r1);
                REQUIRE_FALSE(r2);
                REQUIRE_FALSE(r3);
                CHECK(r1.error().code() == Errc::shutdown);
                CHECK(r2.error().code() == Errc::shutdown);
                CHECK(r3.error().code() == Errc::shutdown);
                CHECK((r4 || r4.error().code() == Errc::shutdown));  // it may have been answered first
                CHECK(r1.error().message().find("closed") != std::string::npos);
                auto later = co_await (*c)->set("after", bytes("x"));
                REQUIRE_FALSE(later);
                CHECK(later.error().code() == Errc::shutdown);
            }
            // The client is gone: its lane actors ended, its state freed (no coroutine holds it).
            const bool ended = co_await eventually(
                [&] { return detail::client_tasks_running() == 0 && detail::client_states_alive() == states0; }, 5s);
            CHECK(detail::client_tasks_running() == 0);
            CHECK(detail::client_states_alive() == states0);
            REQUIRE(ended);
            auto srv = server;
            std::size_t left = 1;
            for (int i = 0; i < 400 && left > 0; ++i) {
                left = co_await connections(srv);
                if (left > 0) co_await pause(5ms);
            }
            CHECK(left == 0);  // the server saw every lane close
            server->stop();
        });
    }
}

TEST_CASE("dropping a client without close ends its coroutines and frees it", "[store][fault]") {
    run_with_deadline(20s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        const auto states0 = detail::client_states_alive();
        {
            auto c = *co_await TcpStore::connect(ex, client_for(server->port(), TcpStoreDialect::torch2));
            CO_REQUIRE(co_await c->set("k", bytes("v")));
            // A timed wait leaves the deadline sweep running; a blocked get keeps a second lane.
            auto r = co_await c->wait(keys("absent"), 20ms);
            REQUIRE_FALSE(r);
            Spawned<Bytes> g(ex, c->get("never"));
            co_await pause(20ms);
            c.reset();  // the destructor closes it
            auto gr = co_await g.join();
            REQUIRE_FALSE(gr);
            CHECK(gr.error().code() == Errc::shutdown);
        }
        const bool ended = co_await eventually(
            [&] { return detail::client_tasks_running() == 0 && detail::client_states_alive() == states0; }, 5s);
        REQUIRE(ended);
        server->stop();
    });
}

// The hazard of ops on two threads: a caller on another thread than the client's strand whose wait
// is cancelled (or times out) lets its op go at once, while the strand still holds it, maybe in the
// deadline keeper. Run under ASan, a keeper entry freed before the strand took it out shows up.
TEST_CASE("callers on another thread cancelled mid-operation leave the client sound", "[store][fault]") {
    Runtime rt;  // the client's strand runs on rt's thread; the callers on the test's thread
    run_with_deadline(120s, [&rt]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(rt.get_executor(), {.host = "127.0.0.1"});
        auto o = client_for(server->port(), TcpStoreDialect::torch2);
        o.timeout = 5s;
        auto c = *co_await TcpStore::connect(rt.get_executor(), o);
        std::minstd_rand rng(7);
        std::size_t cancelled = 0, timed_out = 0, succeeded = 0;
        for (int i = 0; i < 2000; ++i) {
            const auto kind = i % 4;
            std::optional<Spawned<Bytes>> get;
            std::optional<Spawned<std::int64_t>> add;
            if (kind == 0) {
                c->set_timeout(1ms);  // its WAIT and the caller's limit expire in the keeper
                get.emplace(ex, c->get("missing"));
                c->set_timeout(5s);
            } else if (kind == 1) {
                get.emplace(ex, c->get("missing"));  // only the cancel ends it
            } else {
                add.emplace(ex, c->add("n", 1));
            }
            const auto delay = std::chrono::microseconds(rng() % (kind == 0 ? 4000 : 400));
            if (delay > 50us) co_await pause(delay);
            if (get) get->cancel();
            if (add) add->cancel();
            Errc code = Errc::internal;
            bool ok_ = false;
            if (get) {
                auto r = co_await get->join();
                ok_ = r.has_value();
                if (!r) code = r.error().code();
            } else {
                auto r = co_await add->join();
                ok_ = r.has_value();
                if (!r) code = r.error().code();
            }
            if (ok_) {
                ++succeeded;
                CHECK(kind >= 2);
            } else if (code == Errc::cancelled) {
                ++cancelled;
            } else {
                CHECK(code == Errc::timeout);
                ++timed_out;
            }
        }
        INFO("cancelled " << cancelled << ", timed out " << timed_out << ", succeeded " << succeeded);
        CHECK(cancelled > 0);
        CHECK(timed_out > 0);
        // Still usable, and it still answers in order.
        CO_REQUIRE(co_await c->set("after", bytes("x")));
        auto v = co_await c->get("after");
        REQUIRE((v && *v == bytes("x")));
        auto n = co_await c->add("n", 0);
        CO_REQUIRE(n);
        CHECK(*n >= static_cast<std::int64_t>(succeeded));
        c->close();
        c.reset();
        server->stop();
        server.reset();
        const bool ended = co_await eventually([] { return detail::client_tasks_running() == 0; }, 5s);
        REQUIRE(ended);
    });
    rt.stop();
    rt.join();
}

TEST_CASE("a server stopped with a client that does not read and a blocked waiter ends its coroutines", "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto servers0 = detail::server_states_alive();
        const auto tasks0 = detail::server_tasks_running();
        TcpStoreServerOptions so;
        so.host = "127.0.0.1";
        so.max_queued_output = 1 << 20;
        so.max_queued_output_hard = std::size_t(1) << 30;
        so.queued_output_timeout = 60s;  // (only the stop may end the stalled one here)
        auto server = *TcpStoreServer::start(ex, so);
        const auto port = server->port();
        auto c = *co_await TcpStore::connect(ex, client_for(port, TcpStoreDialect::torch2));
        CO_REQUIRE(co_await c->set("big", pattern(1 << 20, 3)));
        // A legacy client asking for 1 MiB many times over and never reading: its writer waits on a
        // full socket and its reader on back-pressure.
        tcp::socket hog(ex);
        co_await raw_connect(&hog, port);
        co_await send_all(hog, pipelined_gets("/big", 2048));
        // One blocked in a WAIT, and one that sent half a request.
        Spawned<Bytes> waiting(ex, c->get("never"));
        tcp::socket half(ex);
        co_await raw_connect(&half, port);
        Bytes partial{0x00};
        put64(partial, 100);
        co_await send_all(half, partial);
        const auto conns = co_await wait_for_connections(*server, 3, 5s);
        REQUIRE(conns == 3);
        co_await pause(50ms);  // the hog's replies fill its socket
        CHECK(detail::server_tasks_running() >= tasks0 + 7);  // acceptor, sweeper, 3 readers and 3 writers
        server->stop();
        server.reset();
        // Every coroutine of the server ends and its state is freed, while the clients' sockets stay open.
        const bool ended = co_await eventually([&] {
            return detail::server_tasks_running() == tasks0 && detail::server_states_alive() == servers0;
        }, 5s);
        CHECK(detail::server_tasks_running() == tasks0);
        CHECK(detail::server_states_alive() == servers0);
        REQUIRE(ended);
        auto r = co_await waiting.join();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::connection_lost);
        const bool half_closed = co_await closed_within(half, 5s);
        CHECK(half_closed);
        c->close();
    });
}

TEST_CASE("a stopped server's port refuses new clients and a new server serves on another", "[store][fault]") {
    run_with_deadline(20s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto servers0 = detail::server_states_alive();
        for (int i = 0; i < 20; ++i) {
            auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
            auto c = *co_await TcpStore::connect(ex, client_for(server->port(), TcpStoreDialect::torch2));
            CO_REQUIRE(co_await c->set("k", bytes("v")));
            server->stop();
            auto after = co_await c->get("k");
            REQUIRE_FALSE(after);  // the connection was closed (and reconnecting is refused)
            c->close();
        }
        const bool freed = co_await eventually([&] { return detail::server_states_alive() == servers0; }, 5s);
        REQUIRE(freed);
    });
}

}  // namespace tp_tcp_store_lifetime_test
