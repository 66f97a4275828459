// ConnectionListener and Address as a user of the transport layer writes them: listen at an
// Address of any transport, accept connections whose handshake ran, close; schemes resolved by
// the transports (an unknown one refused by name).
#include <tensorplay/transport/address.hpp>
#include <tensorplay/transport/connection.hpp>
#include <tensorplay/transport/listener.hpp>

#include "transport/transport_test_util.hpp"

#include <unistd.h>

#include <cstring>
#include <optional>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_listener_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

/// Where a test listens over `transport`: loopback TCP on a free port, or a fresh abstract name.
Address listen_at(const std::string& transport) {
    if (transport == "uv") return Address::tcp("127.0.0.1", 0);
    Address a;
    a.scheme = transport;  // (uds, shm: their schemes are their names; an empty name is a fresh one)
    return a;
}

/// A few payload bytes (outside coroutines: GCC 12 and initializer lists).
Bytes some_bytes() { return Bytes{1, 2, 3}; }

}  // namespace

TEST_CASE("a ConnectionListener accepts over every transport; frames and tensors go both ways", "[transport][listener]") {
    const std::string transport = GENERATE(std::string("uv"), std::string("uds"), std::string("shm"));
    CAPTURE(transport);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        using namespace detail::awaitable_ops;
        auto ex = co_await asio::this_coro::executor;
        auto listener = ConnectionListener::listen(ex, listen_at(transport));
        REQUIRE(listener);
        const Address at = (*listener)->address();
        CHECK(at.transport() == (transport == "uv" ? std::string_view("uv") : std::string_view(transport)));
        if (transport == "uv") CHECK(at.port != 0);
        else CHECK(!at.name.empty());
        auto parsed = Address::parse(at.str());  // (what a peer reads from a store)
        REQUIRE(parsed);
        CHECK(*parsed == at);

        auto accepting = (*listener)->accept(test::hello_over("server", 1, transport));
        auto connecting = Connection::connect(*parsed, test::hello_over("client", 0, transport), ConnectionLimits{}, HandshakeAuth{});
        auto [sv, cl] = co_await (std::move(accepting) && std::move(connecting));
        REQUIRE(sv);
        REQUIRE(cl);
        CHECK((*sv)->transport() == transport);
        CHECK((*cl)->transport() == transport);
        CHECK((*sv)->peer().name == "client");

        const Tensor t = test::iota_tensor(100000, 3);
        std::vector<Tensor> tensors(1, t);
        REQUIRE((*cl)->send(test::request(7, "echo", some_bytes(), std::move(tensors))));
        auto got = co_await (*sv)->receive();
        REQUIRE(got);
        CHECK(got->id == 7);
        CHECK(got->payload == some_bytes());
        REQUIRE(got->tensors.size() == 1);
        CHECK(std::memcmp(got->tensors[0].data(), t.data(), t.nbytes()) == 0);
        Frame reply = test::request(7, "echo", some_bytes());
        reply.kind = FrameKind::response;
        REQUIRE((*sv)->send(std::move(reply)));
        auto back = co_await (*cl)->receive();
        REQUIRE(back);
        CHECK(back->kind == FrameKind::response);
        (*cl)->close();
        (*sv)->close();
    });
}

TEST_CASE("a listener goes on after a peer's failed handshake, and close() ends a pending accept", "[transport][listener]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        using namespace detail::awaitable_ops;
        auto ex = co_await asio::this_coro::executor;
        auto listener = ConnectionListener::listen(ex, Address::tcp("127.0.0.1", 0));
        REQUIRE(listener);
        // A peer that says garbage instead of a hello: that accept fails, naming the protocol.
        auto accepting = (*listener)->accept(test::hello("server", 1));
        auto raw = co_await test::raw_connect((*listener)->address());
        co_await test::raw_write(raw.socket, Bytes(64, 0x5a));
        auto bad = co_await std::move(accepting);
        REQUIRE_FALSE(bad);
        CHECK(bad.error().code() == Errc::protocol_error);
        // The next peer is served as if nothing happened.
        auto accepting2 = (*listener)->accept(test::hello("server", 1));
        auto connecting = Connection::connect("127.0.0.1", (*listener)->address().port, test::hello("client", 0));
        auto [sv, cl] = co_await (std::move(accepting2) && std::move(connecting));
        REQUIRE(sv);
        REQUIRE(cl);
        // close() while an accept waits: it ends with cancelled.
        std::optional<Result<std::shared_ptr<Connection>>> pending;
        test::SinkEvents ended(ex);
        asio::co_spawn(
            ex,
            [&]() -> Task<void> {
                auto waiting = (*listener)->accept(test::hello("server", 1));
                pending = co_await std::move(waiting);
                ended.notify();
            },
            asio::detached);
        co_await asio::post(ex, asio::use_awaitable);  // (one turn: the accept is waiting now)
        CHECK_FALSE(pending);
        (*listener)->close();
        co_await ended.until([&] { return pending.has_value(); });
        REQUIRE(pending);
        REQUIRE_FALSE(*pending);
        CHECK(pending->error().code() == Errc::cancelled);
    });
}

TEST_CASE("a listener at a given name: that name is its address, and a second listener there fails naming it", "[transport][listener]") {
    const std::string transport = GENERATE(std::string("uds"), std::string("shm"));
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto at = Address::parse(transport + "://tp-listener-test-" + std::to_string(::getpid()));
        REQUIRE(at);
        auto first = ConnectionListener::listen(ex, *at);
        REQUIRE(first);
        CHECK((*first)->address() == *at);
        auto second = ConnectionListener::listen(ex, *at);
        REQUIRE_FALSE(second);
        CHECK(second.error().message().find(at->str()) != std::string::npos);
        // A TCP port taken: the same.
        auto tcp = ConnectionListener::listen(ex, Address::tcp("127.0.0.1", 0));
        REQUIRE(tcp);
        auto again = ConnectionListener::listen(ex, (*tcp)->address());
        REQUIRE_FALSE(again);
        // A host that is no IP address is refused before anything is bound.
        auto named = ConnectionListener::listen(ex, Address::tcp("not an address", 0));
        REQUIRE_FALSE(named);
        CHECK(named.error().code() == Errc::invalid_argument);
        co_return;
    });
}

TEST_CASE("addresses are open: schemes resolve through the transports, an unknown one is refused by name", "[transport][listener]") {
    auto shm = Address::parse("shm://ring-7");
    REQUIRE(shm);
    CHECK(shm->scheme == "shm");
    CHECK(shm->transport() == "shm");
    CHECK(shm->str() == "shm://ring-7");
    CHECK(shm->where() == "shm://ring-7");
    CHECK(Address::tcp("::1", 9).str() == "tcp://[::1]:9");
    CHECK(Address::tcp("10.1.2.3", 9).where() == "10.1.2.3:9");
    // The transport is named uv on the wire; its addresses say tcp.
    CHECK(Address::parse("uv://10.0.0.1:1").error().message().find("tcp://") != std::string::npos);
    auto unknown = Address::parse("ibv://mlx5_0");
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code() == Errc::invalid_argument);
    CHECK(unknown.error().message().find("unknown scheme \"ibv\"") != std::string::npos);
    CHECK(unknown.error().message().find("uds://") != std::string::npos);
    Address made;
    made.scheme = "carrier-pigeon";
    CHECK(made.transport().empty());
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto l = ConnectionListener::listen(ex, made);
        REQUIRE_FALSE(l);
        CHECK(l.error().message().find("carrier-pigeon") != std::string::npos);
        auto connecting = Connection::connect(made, test::hello("client", 0), ConnectionLimits{}, HandshakeAuth{});
        auto c = co_await std::move(connecting);
        REQUIRE_FALSE(c);
    });
}

}  // namespace tp_listener_test
