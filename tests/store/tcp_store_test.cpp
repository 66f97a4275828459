// Tests of TcpStoreServer + TcpStore: the Store contract in both dialects, addresses, retries, stop.
#include <tensorplay/store/tcp_store.hpp>

#include "store/store_conformance.hpp"

#include <tensorplay/core/runtime.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <asio/ip/tcp.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_tcp_store_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

#ifndef TP_IO_THREADS
#define TP_IO_THREADS 2
#endif
namespace {

// A client that keeps its own server alive: the conformance suite wants a fresh, empty store.
struct ServedStore {
    std::shared_ptr<TcpStoreServer> server;
    std::shared_ptr<TcpStore> client;
};

Task<std::shared_ptr<Store>> make_served(TcpStoreDialect dialect) {
    auto ex = co_await asio::this_coro::executor;
    auto server = TcpStoreServer::start(ex, {.host = "127.0.0.1"});
    REQUIRE(server);
    TcpStoreOptions o;
    o.port = (*server)->port();
    o.timeout = 5s;
    o.dialect = dialect;
    auto client = co_await TcpStore::connect(ex, o);
    REQUIRE(client);
    auto both = std::make_shared<ServedStore>(ServedStore{*server, *client});
    co_return std::shared_ptr<Store>(both, both->client.get());
}

Task<std::shared_ptr<Store>> make_torch2() { co_return co_await make_served(TcpStoreDialect::torch2); }
Task<std::shared_ptr<Store>> make_torch113() { co_return co_await make_served(TcpStoreDialect::torch113); }

TcpStoreOptions client_options(std::uint16_t port, TcpStoreDialect d = TcpStoreDialect::torch2,
                               std::string host = "127.0.0.1") {
    TcpStoreOptions o;
    o.host = std::move(host);
    o.port = port;
    o.timeout = 5s;
    o.dialect = d;
    return o;
}

}  // namespace

STORE_CONFORMANCE_TESTS("TcpStore torch2", "[store]", make_torch2)
STORE_CONFORMANCE_TESTS("TcpStore torch113", "[store]", make_torch113)

TEST_CASE("the server reports its ephemeral port and serves IPv4 and IPv6 clients on one key space", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = TcpStoreServer::start(ex, {});  // all interfaces: [::] dual-stack
        REQUIRE(server);
        REQUIRE((*server)->port() != 0);
        auto v4 = co_await TcpStore::connect(ex, client_options((*server)->port(), TcpStoreDialect::torch2, "127.0.0.1"));
        REQUIRE(v4);
        auto v6 = co_await TcpStore::connect(ex, client_options((*server)->port(), TcpStoreDialect::torch113, "::1"));
        REQUIRE(v6);
        CO_REQUIRE(co_await (*v4)->set("from4", bytes("x")));
        CO_REQUIRE(co_await (*v6)->set("from6", bytes("y")));
        auto a = co_await (*v6)->get("from4");
        auto b = co_await (*v4)->get("from6");
        REQUIRE((a && *a == bytes("x")));
        REQUIRE((b && *b == bytes("y")));
        {
            auto r_ = co_await (*server)->num_keys();
            REQUIRE(r_ == 2);
        }
    });
}

TEST_CASE("a server bound to ::1 serves IPv6 clients", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = TcpStoreServer::start(ex, {.host = "::1"});
        REQUIRE(server);
        REQUIRE((*server)->address().find("[::1]") == 0);
        auto c = co_await TcpStore::connect(ex, client_options((*server)->port(), TcpStoreDialect::torch2, "::1"));
        REQUIRE(c);
        {
            auto r_ = co_await (*c)->add("n", 2);
            REQUIRE((r_ && *r_ == 2));
        }
    });
}

TEST_CASE("binding a taken port fails with io_error", "[store]") {
    asio::io_context ctx;
    auto first = TcpStoreServer::start(ctx.get_executor(), {.host = "127.0.0.1"});
    REQUIRE(first);
    auto second = TcpStoreServer::start(ctx.get_executor(), {.host = "127.0.0.1", .port = (*first)->port()});
    REQUIRE_FALSE(second);
    CHECK(second.error().code() == Errc::io_error);
}

TEST_CASE("a client retries until a late server starts", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        // Reserve a free port, release it, and start the server there 300 ms after the client.
        auto probe = TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        REQUIRE(probe);
        const auto port = (*probe)->port();
        probe->reset();
        co_await pause(20ms);
        std::shared_ptr<TcpStoreServer> late;
        asio::steady_timer t(ex, 300ms);
        t.async_wait([&](std::error_code) {
            auto s = TcpStoreServer::start(ex, {.host = "127.0.0.1", .port = port});
            if (s) late = *s;
        });
        const auto start = Clock::now();
        auto c = co_await TcpStore::connect(ex, client_options(port));
        REQUIRE(c);
        REQUIRE(late);
        REQUIRE(Clock::now() - start >= 250ms);
        {
            auto r_ = co_await (*c)->check(keys("none"));
            REQUIRE((r_ && *r_ == false));
        }
    });
}

TEST_CASE("connect gives up with a timeout naming the address when no server comes", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto probe = TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        const auto port = (*probe)->port();
        probe->reset();
        co_await pause(20ms);
        auto o = client_options(port);
        o.timeout = 300ms;
        auto c = co_await TcpStore::connect(ex, o);
        REQUIRE_FALSE(c);
        CHECK(c.error().code() == Errc::timeout);
        CHECK(c.error().message().find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
    });
}

TEST_CASE("stopping the server wakes blocked waiters with connection_lost", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto c2 = *co_await TcpStore::connect(ex, client_options(server->port()));
        auto c1 = *co_await TcpStore::connect(ex, client_options(server->port(), TcpStoreDialect::torch113));
        Spawned<void> w2(ex, c2->wait(keys("never"), 0ms));
        Spawned<Bytes> w1(ex, c1->get("never"));
        co_await pause(50ms);
        REQUIRE_FALSE(w1.ready());
        server->stop();
        server->stop();  // idempotent
        auto r2 = co_await w2.join();
        auto r1 = co_await w1.join();
        REQUIRE_FALSE(r2);
        REQUIRE_FALSE(r1);
        CHECK(r2.error().code() == Errc::connection_lost);
        CHECK(r1.error().code() == Errc::connection_lost);
        // Later operations fail at once, too.
        auto later = co_await c2->set("k", bytes("v"));
        REQUIRE_FALSE(later);
        CHECK(later.error().code() == Errc::connection_lost);
    });
}

TEST_CASE("every pending operation fails at once when the server goes away", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        std::vector<std::unique_ptr<Spawned<Bytes>>> gets;
        for (int i = 0; i < 20; ++i)
            gets.push_back(std::make_unique<Spawned<Bytes>>(ex, c->get("missing" + std::to_string(i))));
        co_await pause(30ms);
        const auto start = Clock::now();
        server.reset();  // destructor stops it
        for (auto& g : gets) {
            auto r = co_await g->join();
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::connection_lost);
        }
        CHECK(Clock::now() - start < 1s);
    });
}

TEST_CASE("a timed-out wait leaves the connection in sync in both dialects", "[store]") {
    for (auto dialect : {TcpStoreDialect::torch2, TcpStoreDialect::torch113}) {
        run_with_deadline(5s, [dialect]() -> Task<void> {
            auto ex = co_await asio::this_coro::executor;
            auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
            auto c = *co_await TcpStore::connect(ex, client_options(server->port(), dialect));
            auto other = *co_await TcpStore::connect(ex, client_options(server->port()));
            auto w = co_await c->wait(keys("late"), 100ms);
            REQUIRE_FALSE(w);
            CHECK(w.error().code() == Errc::timeout);
            CHECK(w.error().message().find("'late'") != std::string::npos);
            CO_REQUIRE(co_await other->set("late", bytes("1")));
            CO_REQUIRE(co_await other->set("n", bytes("42")));
            // A stray STOP_WAITING would make this read the wrong bytes (the 1.13 defect).
            auto n = co_await c->get("n");
            REQUIRE((n && *n == bytes("42")));
            {
                auto r_ = co_await c->add("count", 3);
                REQUIRE((r_ && *r_ == 3));
            }
            {
                auto r_ = co_await c->num_keys();
                REQUIRE((r_ && *r_ == 3));
            }
        });
    }
}

TEST_CASE("operations from many coroutines at once on one client all complete correctly", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        std::vector<std::unique_ptr<Spawned<std::int64_t>>> adds;
        for (int i = 0; i < 200; ++i) adds.push_back(std::make_unique<Spawned<std::int64_t>>(ex, c->add("ctr", 1)));
        std::vector<std::unique_ptr<Spawned<Bytes>>> gets;
        for (int i = 0; i < 50; ++i) {
            CO_REQUIRE(co_await c->set("k" + std::to_string(i), bytes(std::to_string(i))));
            gets.push_back(std::make_unique<Spawned<Bytes>>(ex, c->get("k" + std::to_string(i))));
        }
        std::vector<bool> seen(201, false);
        for (auto& a : adds) {
            auto r = co_await a->join();
            REQUIRE(r);
            REQUIRE((*r >= 1 && *r <= 200));
            REQUIRE_FALSE(seen[static_cast<std::size_t>(*r)]);
            seen[static_cast<std::size_t>(*r)] = true;
        }
        for (int i = 0; i < 50; ++i) {
            auto r = co_await gets[static_cast<std::size_t>(i)]->join();
            REQUIRE((r && *r == bytes(std::to_string(i))));
        }
    });
}

TEST_CASE("clients of both dialects share one key space, keys prefixed with a slash", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto modern = *co_await TcpStore::connect(ex, client_options(server->port()));
        auto legacy = *co_await TcpStore::connect(ex, client_options(server->port(), TcpStoreDialect::torch113));
        {
            auto r_ = co_await legacy->add("n", 5);
            REQUIRE((r_ && *r_ == 5));
        }
        {
            auto r_ = co_await modern->add("n", -2);
            REQUIRE((r_ && *r_ == 3));
        }
        auto v = co_await legacy->get("n");
        REQUIRE((v && *v == bytes("3")));
        CO_REQUIRE(co_await modern->append("log", bytes("a")));
        CO_REQUIRE(co_await legacy->append("log", bytes("b")));
        auto log = co_await modern->get("log");
        REQUIRE(log);
        REQUIRE(to_string(*log) == "ab");
        Spawned<void> waiting(ex, legacy->wait(keys("ready"), 0ms));
        co_await pause(20ms);
        REQUIRE_FALSE(waiting.ready());
        CO_REQUIRE(co_await modern->multi_set(keys("ready", "other"), vals(bytes("1"), bytes("2"))));
        CO_REQUIRE(co_await waiting.join());
        CHECK(modern->has_extended_api());
        CHECK_FALSE(legacy->has_extended_api());
        auto p = co_await modern->ping();
        REQUIRE(p);
        CO_REQUIRE(co_await legacy->ping());
    });
}

TEST_CASE("worker counting: connect waits until world_size clients joined", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto o = client_options(server->port());
        o.world_size = 3;
        Spawned<std::shared_ptr<TcpStore>> a(ex, TcpStore::connect(ex, o));
        Spawned<std::shared_ptr<TcpStore>> b(ex, TcpStore::connect(ex, o));
        co_await pause(50ms);
        REQUIRE_FALSE(a.ready());
        auto c = co_await TcpStore::connect(ex, o);
        REQUIRE(c);
        CO_REQUIRE(co_await a.join());
        CO_REQUIRE(co_await b.join());
        auto n = co_await (*c)->num_keys();
        REQUIRE((n && *n == 1));  // "init/" (un-prefixed, as c10d counts it)
        auto v = co_await (*c)->check(keys("init/"));
        REQUIRE((v && !*v));  // user keys are prefixed: "/init/" does not exist
    });
}

TEST_CASE("worker counting times out naming how many joined", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto o = client_options(server->port());
        o.world_size = 2;
        o.timeout = 200ms;
        auto c = co_await TcpStore::connect(ex, o);
        REQUIRE_FALSE(c);
        CHECK(c.error().code() == Errc::timeout);
        CHECK(c.error().message().find("1/2") != std::string::npos);
    });
}

TEST_CASE("a torch2 client refuses a server that does not answer the handshake", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        // A listener that accepts and never answers (like a wedged server).
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        auto o = client_options(acc.local_endpoint().port());
        o.timeout = 300ms;
        auto c = co_await TcpStore::connect(ex, o);
        REQUIRE_FALSE(c);
        // A silent listener is no 1.13 store either (that one drops VALIDATE): no dialect is suggested.
        CHECK(c.error().code() == Errc::timeout);
        CHECK(c.error().message().find("not a tensorplay/c10d store") != std::string::npos);
        CHECK(c.error().message().find("torch113") == std::string::npos);
    });
}

namespace {
// One client's share of the two-thread test: sets, gets and adds, with a wait that times out
// (a cancelled read) between them.
Task<Result<int>> client_churn(Executor ex, std::uint16_t port, int id) {
    auto opts = client_options(port);
    auto c = co_await TcpStore::connect(ex, opts);
    if (!c) co_return fail(c.error());
    int checked = 0;
    for (int i = 0; i < 100; ++i) {
        const std::string key = "c" + std::to_string(id) + "/" + std::to_string(i);
        if (auto r = co_await (*c)->set(key, bytes(key)); !r) co_return fail(r.error());
        auto g = co_await (*c)->get(key);
        if (!g || *g != bytes(key)) co_return fail(Errc::internal, "get " + key + " returned something else");
        auto a = co_await (*c)->add("shared", 1);
        if (!a) co_return fail(a.error());
        if (i % 25 == 0) {
            std::vector<std::string> missing{"never/" + key};
            auto w = co_await (*c)->wait(missing, 20ms);
            if (w || w.error().code() != Errc::timeout) co_return fail(Errc::internal, "a wait on a missing key did not time out");
        }
        ++checked;
    }
    (*c)->close();
    co_return checked;
}

template <class T>
Task<Result<T>> on_strand(Executor strand, Task<Result<T>> t) {
    co_return co_await asio::co_spawn(strand, std::move(t), asio::use_awaitable);
}

// Runs on a strand of its own; the server and the clients make theirs on `io` (two threads).
Task<Result<std::int64_t>> two_thread_load(Executor io) {
    auto self = co_await asio::this_coro::executor;
    auto server = TcpStoreServer::start(io, {.host = "127.0.0.1"});
    if (!server) co_return fail(server.error());
    const auto port = (*server)->port();
    std::vector<std::unique_ptr<Spawned<int>>> clients;
    for (int id = 0; id < 8; ++id) clients.push_back(std::make_unique<Spawned<int>>(self, client_churn(io, port, id)));
    for (auto& c : clients) {
        auto r = co_await c->join();
        if (!r) co_return fail(r.error());
        if (*r != 100) co_return fail(Errc::internal, "a client finished early");
    }
    auto check = co_await TcpStore::connect(io, client_options(port));
    if (!check) co_return fail(check.error());
    auto total = co_await (*check)->add("shared", 0);
    (*check)->close();
    (*server)->stop();
    co_return total;
}
}  // namespace

// Server and clients on an event loop run by two threads: every connection is strand-bound, but
// reactor completions and cancellations (the timed-out waits) may run on either thread.
TEST_CASE("a server and clients on a two-thread event loop serve every operation", "[store]") {
    Runtime rt(RuntimeOptions{.io_threads = TP_IO_THREADS, .num_worker_threads = 1});
    const Executor io = rt.get_executor();
    const Executor strand = asio::make_strand(io);
    auto r = rt.block_on(on_strand(strand, with_timeout(two_thread_load(io), 30s)));
    REQUIRE(r);
    CHECK(*r == 8 * 100);
}

}  // namespace tp_tcp_store_test
#undef TP_IO_THREADS
