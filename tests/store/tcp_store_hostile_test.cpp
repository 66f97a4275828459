// Hostile store clients whose requests make the server run out of memory: the server fails that
// request's connection only, answers everyone else at once and never touches freed connections.
// Links alloc_probe.cpp: operator new throws std::bad_alloc above a size, as under memory pressure.
#include <tensorplay/store/tcp_store.hpp>

#include "rpc/forked.hpp"
#include "support/alloc_probe.hpp"
#include "store/raw_store_client.hpp"
#include "support/deadline.hpp"

#include <asio/io_context.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <optional>

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

// A request that has no reply (SET, APPEND, MULTI_SET) is refused by closing the connection: the
// close shows in the call or in the next round trip.
Task<bool> refused(TcpStore& c, Result<void> sent) {
    if (!sent) co_return true;
    auto p = co_await c.ping();
    co_return !p;
}

// Legacy WAIT on one key: answered with one byte 0x00 when the key exists.
Bytes legacy_wait(std::string_view key) {
    Bytes b{0x05};
    put64(b, 1);
    put_str(b, key);
    return b;
}

// Two raw clients blocked in WAIT on `key`.
struct Waiters {
    tcp::socket answered;  // must be answered at once when the key is set
    tcp::socket vanishing; // closes without reading: its connection is freed while it was owed a reply
};

Task<void> start_waiting(Waiters* w, std::uint16_t port, std::string_view key) {
    co_await raw_connect(&w->answered, port);
    co_await raw_connect(&w->vanishing, port);
    co_await send_all(w->answered, legacy_wait(key));
    co_await send_all(w->vanishing, legacy_wait(key));
    co_await pause(50ms);  // both registered
}

// After the offending batch: the first waiter is answered at once, the second goes away and
// the server must not touch its connection again when the next client's request arrives.
Task<void> check_waiters_and_others(Waiters* w, TcpStoreServer& server, const char* healthy_key) {
    auto woken = co_await read_within(w->answered, 1, 2s);
    CHECK(woken.complete);
    CHECK(woken.bytes == Bytes{0x00});
    w->vanishing.close();
    co_await pause(50ms);
    co_await require_server_healthy(server.port(), healthy_key);
    auto conns = co_await wait_for_connections(server, 1, 2s);
    CHECK(conns == 1);  // only `answered` is left
}

}  // namespace

TEST_CASE("a MULTI_GET whose reply would be 25 GiB closes only its connection and wakes the batch's waiters",
          "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        {
            auto c = co_await TcpStore::connect(ex, client_options(server->port()));
            CO_REQUIRE(c);
            CO_REQUIRE(co_await (*c)->set("b", Bytes(64 * kMiB, 0x5a)));  // "/b" on the wire
            (*c)->close();
        }
        Waiters w{tcp::socket(ex), tcp::socket(ex)};
        co_await start_waiting(&w, server->port(), "/go");

        // One read's worth (4095 bytes): VALIDATE, SET /go (wakes both waiters), MULTI_GET "/b" x 406.
        Bytes batch = validate_bytes();
        batch.push_back(0x01);
        put_str(batch, "/go");
        put_str(batch, "1");
        batch.push_back(0x0A);
        put64(batch, 406);
        for (int i = 0; i < 406; ++i) put_str(batch, "/b");
        REQUIRE(batch.size() <= 4096);
        const alloc_probe::FailAbove no_huge_allocations(1ull << 30);  // a machine without 25 GiB to spare
        tcp::socket offender(ex);
        co_await raw_connect(&offender, server->port());
        co_await send_all(offender, batch);
        const bool closed = co_await closed_within(offender, 2s);
        CHECK(closed);  // not hung in CLOSE-WAIT
        co_await check_waiters_and_others(&w, *server, "after-multi-get");
        server->stop();
    });
}

TEST_CASE("an allocation failure while serving a request closes only that connection", "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        {
            auto c = co_await TcpStore::connect(ex, client_options(server->port()));
            CO_REQUIRE(c);
            CO_REQUIRE(co_await (*c)->set("big", Bytes(12 * kMiB, 0x33)));
            (*c)->close();
        }
        Waiters w{tcp::socket(ex), tcp::socket(ex)};
        co_await start_waiting(&w, server->port(), "/go");

        // Legacy SET /go (wakes the waiters) and GET /big, whose 12 MiB reply cannot be allocated.
        Bytes batch{0x00};
        put_str(batch, "/go");
        put_str(batch, "1");
        batch.push_back(0x02);
        put_str(batch, "/big");
        const alloc_probe::FailAbove fail_above(8 * kMiB);
        tcp::socket offender(ex);
        co_await raw_connect(&offender, server->port());
        co_await send_all(offender, batch);
        auto r = co_await read_within(offender, 8, 2s);
        CHECK(r.closed);  // closed, not hung
        CHECK(r.bytes.empty());  // and no partial reply (a length prefix without its value)
        co_await check_waiters_and_others(&w, *server, "after-bad-alloc");
        server->stop();
    });
}

TEST_CASE("a reply over max_reply_size closes the connection; one at the limit is served", "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        TcpStoreServerOptions so;
        so.host = "127.0.0.1";
        so.max_reply_size = 2 * (8 + 300 * 1024);  // two values of 300 KiB, with their length prefixes
        auto server = *TcpStoreServer::start(ex, so);
        auto c = co_await TcpStore::connect(ex, client_options(server->port()));
        CO_REQUIRE(c);
        CO_REQUIRE(co_await (*c)->set("x", pattern(300 * 1024, 1)));
        CO_REQUIRE(co_await (*c)->set("y", pattern(300 * 1024, 2)));
        CO_REQUIRE(co_await (*c)->set("z", pattern(10, 3)));
        auto two = co_await (*c)->multi_get(keys("x", "y"));
        CO_REQUIRE(two);
        CHECK((*two)[0] == pattern(300 * 1024, 1));
        CHECK((*two)[1] == pattern(300 * 1024, 2));

        tcp::socket raw(ex);
        co_await raw_connect(&raw, server->port());
        Bytes req = validate_bytes();
        req.push_back(0x0A);  // MULTI_GET x, y, z: 10 + 8 bytes over the limit
        put64(req, 3);
        put_str(req, "/x");
        put_str(req, "/y");
        put_str(req, "/z");
        co_await send_all(raw, req);
        const bool closed = co_await closed_within(raw, 2s);
        CHECK(closed);

        // APPEND may not grow a value past max_value_size either (its GET reply would be over it).
        so.max_value_size = 1024;
        auto small = *TcpStoreServer::start(ex, so);
        auto d = co_await TcpStore::connect(ex, client_options(small->port()));
        CO_REQUIRE(d);
        CO_REQUIRE(co_await (*d)->set("a", Bytes(1000, 1)));
        CO_REQUIRE(co_await (*d)->append("a", Bytes(24, 2)));
        auto over = co_await (*d)->append("a", Bytes(1, 3));
        const bool append_refused = co_await refused(**d, std::move(over));
        CHECK(append_refused);
        auto e = co_await TcpStore::connect(ex, client_options(small->port()));
        CO_REQUIRE(e);
        auto a = co_await (*e)->get("a");
        REQUIRE(a);
        CHECK(a->size() == 1024);
        co_await require_server_healthy(server->port(), "after-reply-limit");
        (*c)->close();
        (*e)->close();
        server->stop();
        small->stop();
    });
}

TEST_CASE("an allocation failure while buffering a request closes only that connection", "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        Bytes set{0x00};  // legacy SET of a 4 MiB value: the read buffer must grow past 1 MiB
        put_str(set, "/v");
        put_blob(set, Bytes(4 * kMiB, 0x11));
        {
            const alloc_probe::FailAbove fail_above(kMiB);
            tcp::socket offender(ex);
            co_await raw_connect(&offender, server->port());
            // (the server may close before all of it is sent: the write's outcome does not matter)
            auto [ec, n] = co_await asio::async_write(offender, asio::buffer(set), detail::use_nothrow);
            (void)ec;
            (void)n;
            const bool closed = co_await closed_within(offender, 2s);
            CHECK(closed);
        }
        co_await require_server_healthy(server->port(), "after-input-bad-alloc");
        auto conns = co_await wait_for_connections(*server, 0, 2s);
        CHECK(conns == 0);
        server->stop();
    });
}

TEST_CASE("the key space is bounded by max_stored_bytes: a write past it closes only its connection, nothing of it stored",
          "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        TcpStoreServerOptions so;
        so.host = "127.0.0.1";
        so.max_stored_bytes = 1024 * 1024;
        auto server = *TcpStoreServer::start(ex, so);
        auto c = co_await TcpStore::connect(ex, client_options(server->port()));
        CO_REQUIRE(c);
        for (int i = 0; i < 9; ++i) CO_REQUIRE(co_await (*c)->set("k" + std::to_string(i), pattern(100 * 1024, i)));
        auto sent = co_await (*c)->set("big", pattern(200 * 1024, 9));  // 900 KiB + 200 KiB > 1 MiB
        const bool set_refused = co_await refused(**c, std::move(sent));
        CHECK(set_refused);

        // Everyone else is served, and what was stored is intact; the refused key is not there.
        auto d = co_await TcpStore::connect(ex, client_options(server->port()));
        CO_REQUIRE(d);
        auto k0 = co_await (*d)->get("k0");
        REQUIRE(k0);
        CHECK(*k0 == pattern(100 * 1024, 0));
        std::vector<std::string> big_key(1, "big");
        auto has_big = co_await (*d)->check(big_key);
        REQUIRE(has_big);
        CHECK_FALSE(*has_big);

        // A MULTI_SET past the limit (922 KiB held + 160 KiB) stores none of its keys.
        std::vector<Bytes> values;
        values.push_back(pattern(80 * 1024, 10));
        values.push_back(pattern(80 * 1024, 11));
        auto multi = co_await (*d)->multi_set(keys("m1", "m2"), std::move(values));
        const bool multi_refused = co_await refused(**d, std::move(multi));
        CHECK(multi_refused);
        auto e = co_await TcpStore::connect(ex, client_options(server->port()));
        CO_REQUIRE(e);
        std::vector<std::string> m1(1, "m1");
        auto has_m1 = co_await (*e)->check(m1);
        REQUIRE(has_m1);
        CHECK_FALSE(*has_m1);

        // Deleting gives the room back.
        CO_REQUIRE(co_await (*e)->delete_key("k0"));
        CO_REQUIRE(co_await (*e)->delete_key("k1"));
        CO_REQUIRE(co_await (*e)->set("big", pattern(200 * 1024, 9)));
        auto big = co_await (*e)->get("big");
        REQUIRE(big);
        CHECK(*big == pattern(200 * 1024, 9));
        (*e)->close();
        server->stop();
    });
}

TEST_CASE("past max_connections, a client whose connections all sent requests is refused at once, saying the store may be full",
          "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1", .max_connections = 3});
        // Three clients that have spoken (a PING each): none of them makes way.
        Bytes ping = validate_bytes();
        ping.push_back(0x0D);  // PING with a nonce
        for (int i = 0; i < 4; ++i) ping.push_back(static_cast<std::uint8_t>(0x10 + i));
        std::vector<std::unique_ptr<tcp::socket>> open;
        for (int i = 0; i < 3; ++i) {
            open.push_back(std::make_unique<tcp::socket>(ex));
            co_await raw_connect(open.back().get(), server->port());
            co_await send_all(*open.back(), ping);
            auto pong = co_await read_within(*open.back(), 4, 2s);
            CHECK(pong.complete);
        }
        tcp::socket extra(ex);
        co_await raw_connect(&extra, server->port());
        const bool extra_closed = co_await closed_within(extra, 2s);
        CHECK(extra_closed);
        // Our client says why it was closed before any reply.
        std::optional<Error> why;
        auto c = co_await TcpStore::connect(ex, client_options(server->port()));
        if (!c) {
            why = c.error();
        } else {
            auto v = co_await (*c)->get("k");
            if (!v) why = v.error();
            (*c)->close();
        }
        REQUIRE(why);
        INFO(why->to_string());
        CHECK_THAT(why->message(), Catch::Contains("it may be full"));
        // One goes: its place is taken by the next client.
        open[1]->close();
        CHECK(co_await wait_for_connections(*server, 2, 2s) == 2);
        co_await require_server_healthy(server->port(), "after-connection-limit");
        server->stop();
    });
}

TEST_CASE("past max_connections, the oldest connection that has sent nothing makes way for a new one", "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1", .max_connections = 3});
        std::vector<std::unique_ptr<tcp::socket>> silent;
        for (int i = 0; i < 3; ++i) {
            silent.push_back(std::make_unique<tcp::socket>(ex));
            co_await raw_connect(silent.back().get(), server->port());
            CHECK(co_await wait_for_connections(*server, std::size_t(i) + 1, 2s) == std::size_t(i) + 1);
        }
        co_await require_server_healthy(server->port(), "past-silent");  // (in place of the first)
        const bool first_closed = co_await closed_within(*silent[0], 2s);
        CHECK(first_closed);
        asio::error_code ec;
        CHECK(silent[2]->available(ec) == 0);
        CHECK_FALSE(ec);
        server->stop();
    });
}

namespace {

/// Whether the other end has closed the socket `fd` (a FIN or reset is waiting on it).
bool closed_by_server(int fd) {
    char c = 0;
    const auto n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

}  // namespace

TEST_CASE("thousands of silent sockets from one process do not lock other clients out of the store", "[store][fault][hostile]") {
    // The server in its own process, at a quarter of the default max_connections (descriptors):
    // 5,000 silent sockets refused every new client before.
    TcpStoreServerOptions so;
    so.host = "127.0.0.1";
    so.max_connections = 4096;
    std::uint16_t port = 0;
    const pid_t pid = test::spawn_store(port, so);
    rlimit nofile{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &nofile) == 0);
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
    constexpr std::size_t kSilent = 5000;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::vector<int> fds;
    for (std::size_t i = 0; i < kSilent; ++i) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) break;
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
            ::close(fd);
            break;
        }
        fds.push_back(fd);
    }
    CHECK(fds.size() == kSilent);
    // A client that speaks is served among them.
    run_with_deadline(30s, [&]() -> Task<void> { co_await require_server_healthy(port, "among-silent"); });
    std::size_t closed = 0;
    for (int fd : fds) closed += closed_by_server(fd) ? 1 : 0;
    std::printf("MEASURE %zu silent sockets, max_connections %zu: the server closed the oldest %zu, and served a client\n",
                fds.size(), so.max_connections, closed);
    CHECK(closed + so.max_connections >= fds.size());
    for (int fd : fds) ::close(fd);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
}
