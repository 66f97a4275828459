// Fault tests of TcpStoreServer: bad and oversized requests, silent and vanishing clients, many waiters.
#include <tensorplay/store/tcp_store.hpp>

#include "store/store_test_util.hpp"
#include "support/deadline.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <catch2/catch.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_tcp_store_fault_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;
using asio::ip::tcp;

// REQUIRE evaluates its expression more than once under GCC 12 coroutines: await first.
#define REQUIRE_TRUE_AWAITED(...)        \
    do {                                 \
        const bool tp_b_ = (__VA_ARGS__); \
        REQUIRE(tp_b_);                  \
    } while (false)

namespace {

void put64(Bytes& b, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_str(Bytes& b, std::string_view s) {
    put64(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
}

// Sockets are connected in place: GCC 12 mishandles a socket returned by value from a coroutine.
Task<void> raw_connect(tcp::socket* s, std::uint16_t port) {
    auto [ec] = co_await s->async_connect({asio::ip::make_address("127.0.0.1"), port}, detail::use_nothrow);
    REQUIRE_FALSE(ec);
}

Task<void> send(tcp::socket& s, Bytes b) {
    auto [ec, n] = co_await asio::async_write(s, asio::buffer(b), detail::use_nothrow);
    REQUIRE_FALSE(ec);
    (void)n;
}

// Reads exactly n bytes (empty on EOF/error).
Task<Bytes> read_n(tcp::socket& s, std::size_t n) {
    Bytes b(n);
    auto [ec, got] = co_await asio::async_read(s, asio::buffer(b), detail::use_nothrow);
    if (ec) co_return Bytes{};
    b.resize(got);
    co_return b;
}

// True when the server closed the connection (EOF or reset) rather than sending anything.
Task<bool> closed_by_server(tcp::socket& s) {
    std::uint8_t byte = 0;
    auto [ec, n] = co_await s.async_read_some(asio::buffer(&byte, 1), detail::use_nothrow);
    co_return ec && n == 0;
}

TcpStoreOptions options_for(std::uint16_t port) {
    TcpStoreOptions o;
    o.port = port;
    o.timeout = 5s;
    return o;
}

// Another client still gets served: the fault affected only its own connection.
Task<void> require_server_healthy(std::uint16_t port, std::string key) {
    auto ex = co_await asio::this_coro::executor;
    auto c = co_await TcpStore::connect(ex, options_for(port));
    REQUIRE(c);
    CO_REQUIRE(co_await (*c)->set(key, bytes("ok")));
    auto v = co_await (*c)->get(key);
    REQUIRE((v && *v == bytes("ok")));
}

Bytes validate() { return Bytes{0x00, 0xCE, 0xF7, 0x85, 0x3C}; }

}  // namespace

TEST_CASE("an unknown query type closes only that connection, in both dialects", "[store][fault]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        tcp::socket idle(ex);
        co_await raw_connect(&idle, server->port());  // a bystander that says nothing
        tcp::socket legacy(ex);
        co_await raw_connect(&legacy, server->port());
        Bytes unknown(1, 0x09);
        co_await send(legacy, unknown);
        REQUIRE_TRUE_AWAITED(co_await closed_by_server(legacy));
        tcp::socket modern(ex);
        co_await raw_connect(&modern, server->port());
        Bytes m = validate();
        m.push_back(0x63);
        co_await send(modern, m);
        REQUIRE_TRUE_AWAITED(co_await closed_by_server(modern));
        co_await require_server_healthy(server->port(), "after-unknown");
        {
            auto v_ = co_await server->num_connections();
            CHECK(v_ >= 1);
        }
    });
}

TEST_CASE("oversized keys, values and key counts are refused before their bytes arrive", "[store][fault]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        TcpStoreServerOptions so;
        so.host = "127.0.0.1";
        so.max_value_size = 1024;
        auto server = *TcpStoreServer::start(ex, so);
        {  // a key announced at 1 TiB: nothing more is sent, the server must not wait for (or allocate) it
            tcp::socket s(ex);
        co_await raw_connect(&s, server->port());
            Bytes b{0x02};
            put64(b, 1ull << 40);
            co_await send(s, b);
            REQUIRE_TRUE_AWAITED(co_await closed_by_server(s));
        }
        {  // a key one byte over 64 KiB
            tcp::socket s(ex);
        co_await raw_connect(&s, server->port());
            Bytes b = validate();
            b.push_back(0x03);  // GET (modern)
            put64(b, 64 * 1024 + 1);
            co_await send(s, b);
            REQUIRE_TRUE_AWAITED(co_await closed_by_server(s));
        }
        {  // a value over the configured maximum
            tcp::socket s(ex);
        co_await raw_connect(&s, server->port());
            Bytes b{0x00};
            put_str(b, "/k");
            put64(b, 1025);
            co_await send(s, b);
            REQUIRE_TRUE_AWAITED(co_await closed_by_server(s));
        }
        {  // a value of 2^64-1 bytes
            tcp::socket s(ex);
        co_await raw_connect(&s, server->port());
            Bytes b{0x00};
            put_str(b, "/k");
            put64(b, ~0ull);
            co_await send(s, b);
            REQUIRE_TRUE_AWAITED(co_await closed_by_server(s));
        }
        {  // more than 131072 keys in one WAIT
            tcp::socket s(ex);
        co_await raw_connect(&s, server->port());
            Bytes b{0x05};
            put64(b, 131073);
            co_await send(s, b);
            REQUIRE_TRUE_AWAITED(co_await closed_by_server(s));
        }
        {  // more than 131072 pairs in one MULTI_SET
            tcp::socket s(ex);
        co_await raw_connect(&s, server->port());
            Bytes b = validate();
            b.push_back(0x0B);
            put64(b, 1ull << 62);
            co_await send(s, b);
            REQUIRE_TRUE_AWAITED(co_await closed_by_server(s));
        }
        co_await require_server_healthy(server->port(), "after-oversized");
        auto n = co_await server->num_keys();
        CHECK(n == 1);
    });
}

TEST_CASE("a client that sends half a request and vanishes leaves nothing behind", "[store][fault]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        for (int mode = 0; mode < 2; ++mode) {
            tcp::socket s(ex);
            co_await raw_connect(&s, server->port());
            Bytes b;
            if (mode == 0) {  // SET with 1 of its 100 value bytes
                b.push_back(0x00);
                put_str(b, "/half");
                put64(b, 100);
                b.push_back('x');
            } else {  // WAIT: its registration must go away with the connection
                b.push_back(0x05);
                put64(b, 1);
                put_str(b, "/never");
            }
            co_await send(s, b);
            co_await pause(20ms);
            s.close();
            co_await pause(20ms);
        }
        co_await pause(30ms);
        auto conns = co_await server->num_connections();
        CHECK(conns == 0);
        auto nkeys = co_await server->num_keys();
        CHECK(nkeys == 0);
        co_await require_server_healthy(server->port(), "after-half");
        // A set of the key the vanished client waited for must not touch its dead connection.
        auto c = *co_await TcpStore::connect(ex, options_for(server->port()));
        CO_REQUIRE(co_await c->set("never", bytes("1")));
    });
}

TEST_CASE("a silent client and a partial request do not stall anyone else", "[store][fault]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        tcp::socket silent(ex);
        co_await raw_connect(&silent, server->port());
        tcp::socket partial(ex);
        co_await raw_connect(&partial, server->port());
        Bytes b{0x03};
        put_str(b, "/ctr");  // ADD without its delta
        co_await send(partial, b);
        const auto start = Clock::now();
        co_await require_server_healthy(server->port(), "while-partial");
        CHECK(Clock::now() - start < 500ms);
        // The partial request completes later and is answered correctly.
        Bytes rest;
        put64(rest, 7);
        co_await send(partial, rest);
        auto reply = co_await read_n(partial, 8);
        REQUIRE(reply.size() == 8);
        CHECK(reply[0] == 7);
        {
            auto v_ = co_await server->num_connections();
            CHECK(v_ == 2);
        }
    });
}

TEST_CASE("a thousand clients blocked in wait do not hold up others and are all woken", "[store][fault][slow]") {
    run_with_deadline(20s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        std::vector<tcp::socket> waiters;
        waiters.reserve(1000);
        Bytes wait_go{0x05};
        put64(wait_go, 1);
        put_str(wait_go, "/go");
        for (int i = 0; i < 1000; ++i) {
            waiters.emplace_back(ex);
            co_await raw_connect(&waiters.back(), server->port());
            co_await send(waiters.back(), wait_go);
        }
        auto c = *co_await TcpStore::connect(ex, options_for(server->port()));
        const auto start = Clock::now();
        for (int i = 0; i < 50; ++i) {
            CO_REQUIRE(co_await c->set("k", bytes(std::to_string(i))));
            auto v = co_await c->get("k");
            REQUIRE((v && *v == bytes(std::to_string(i))));
        }
        CHECK(Clock::now() - start < 1s);
        CO_REQUIRE(co_await c->set("go", bytes("1")));
        for (auto& w : waiters) {
            auto r = co_await read_n(w, 1);
            REQUIRE(r.size() == 1);
            REQUIRE(r[0] == 0x00);
        }
        {
            auto v_ = co_await server->num_connections();
            CHECK(v_ == 1001);
        }
    });
}

TEST_CASE("legacy dialect: SET has no reply, counters are ASCII, WATCH_KEY sends events", "[store][fault]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        tcp::socket watcher(ex);
        co_await raw_connect(&watcher, server->port());
        Bytes w{0x07};
        put_str(w, "/watched");
        co_await send(watcher, w);
        auto registered = co_await read_n(watcher, 1);
        REQUIRE(registered == Bytes{0x03});

        tcp::socket s(ex);
        co_await raw_connect(&s, server->port());
        Bytes req{0x00};  // SET /watched = "a" (no reply), then ADD /n 5, then GET /n
        put_str(req, "/watched");
        put_str(req, "a");
        req.push_back(0x03);
        put_str(req, "/n");
        put64(req, 5);
        req.push_back(0x02);
        put_str(req, "/n");
        co_await send(s, req);
        auto add_reply = co_await read_n(s, 8);
        REQUIRE(add_reply.size() == 8);
        CHECK(add_reply[0] == 5);
        auto get_reply = co_await read_n(s, 9);
        REQUIRE(get_reply.size() == 9);
        CHECK(get_reply[0] == 1);
        CHECK(get_reply[8] == '5');

        // CREATED event: type 1, key, old "", new "a".
        Bytes expected{0x01};
        put_str(expected, "/watched");
        put_str(expected, "");
        put_str(expected, "a");
        auto event = co_await read_n(watcher, expected.size());
        REQUIRE(event == expected);
        // DELETE_KEY: reply i64 1 and a DELETED event (old "a", new "").
        Bytes del{0x08};
        put_str(del, "/watched");
        co_await send(s, del);
        auto deleted = co_await read_n(s, 8);
        REQUIRE((deleted.size() == 8 && deleted[0] == 1));
        Bytes expected_del{0x02};
        put_str(expected_del, "/watched");
        put_str(expected_del, "a");
        put_str(expected_del, "");
        auto event2 = co_await read_n(watcher, expected_del.size());
        REQUIRE(event2 == expected_del);
    });
}

TEST_CASE("stop closes idle connections and refuses new ones", "[store][fault]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        tcp::socket idle(ex);
        co_await raw_connect(&idle, server->port());
        const auto port = server->port();
        server->stop();
        REQUIRE_TRUE_AWAITED(co_await closed_by_server(idle));
        tcp::socket again(ex);
        auto [ec] = co_await again.async_connect({asio::ip::make_address("127.0.0.1"), port}, detail::use_nothrow);
        CHECK(ec);
    });
}

// A "server" that accepts but never answers: the client's own deadlines must end its calls.
Task<Result<void>> mute_server(tcp::acceptor* a, tcp::socket* peer) {
    auto [ec] = co_await a->async_accept(*peer, detail::use_nothrow);
    (void)ec;
    co_return ok();
}

TEST_CASE("operations time out on their own deadline when the server never answers", "[store][fault]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        tcp::acceptor acceptor(ex, {asio::ip::make_address("127.0.0.1"), 0});
        tcp::socket peer(ex);
        Spawned<void> accepting(ex, mute_server(&acceptor, &peer));
        auto o = options_for(acceptor.local_endpoint().port());
        o.dialect = TcpStoreDialect::torch113;  // no handshake to wait for
        o.timeout = 200ms;
        auto c = co_await TcpStore::connect(ex, o);
        CO_REQUIRE(c);
        // Two calls in flight at once, then one more: each ends with timeout, none hangs.
        Spawned<std::int64_t> a1(ex, (*c)->add("n", 1));
        auto a2 = co_await (*c)->add("m", 1);
        REQUIRE_FALSE(a2);
        CHECK(a2.error().code() == Errc::timeout);
        auto r1 = co_await a1.join();
        REQUIRE_FALSE(r1);
        CHECK(r1.error().code() == Errc::timeout);
        auto n = co_await (*c)->num_keys();
        REQUIRE_FALSE(n);
        CHECK(n.error().code() == Errc::timeout);
        (*c)->close();
    });
}

TEST_CASE("a cancelled get ends at once with cancelled and the client stays usable", "[store][fault]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        REQUIRE(server);
        for (auto dialect : {TcpStoreDialect::torch2, TcpStoreDialect::torch113}) {
            auto o = options_for((*server)->port());
            o.dialect = dialect;
            auto c = co_await TcpStore::connect(ex, o);
            CO_REQUIRE(c);
            Spawned<Bytes> g(ex, (*c)->get("never"));
            co_await pause(20ms);
            g.cancel();
            auto r = co_await g.join();
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::cancelled);
            CO_REQUIRE(co_await (*c)->set("after", bytes("x")));
            auto v = co_await (*c)->get("after");
            REQUIRE((v && *v == bytes("x")));
            (*c)->close();
        }
        (*server)->stop();
    });
}

}  // namespace tp_tcp_store_fault_test
#undef REQUIRE_TRUE_AWAITED
