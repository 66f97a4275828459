// Endpoint, on its own: listening on the transports asked for, inbound handshakes with the group's
// key and the owner's admission check, and the two inbound budgets.
#include "rpc/endpoint.hpp"

#include "core/asio_compat.hpp"
#include "core/task_group.hpp"
#include "support/deadline.hpp"
#include "support/raw_wire.hpp"

#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>

#include <catch2/catch.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_endpoint_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

HelloInfo named(std::string name, int rank) {
    HelloInfo h;
    h.name = std::move(name);
    h.rank = rank;
    return h;
}

/// An endpoint as an agent owns one: its handshakes run in `tasks`, the connections that pass
/// are kept in `adopted`, and peers named "mallory" are refused.
struct Owner {
    explicit Owner(Executor ex, detail::InboundLimits limits = {})
        : tasks(ex),
          endpoint("server", limits, ConnectionLimits{},
                   detail::InboundHooks{[this] {
                                            HelloInfo h = named("server", 0);
                                            h.transports = endpoint.offers();
                                            return h;
                                        },
                                        [](const HelloInfo& peer) -> Result<void> {
                                            if (peer.name == "mallory") return fail(Errc::unauthorized, "mallory is not in the group");
                                            return ok();
                                        },
                                        [this](std::shared_ptr<Connection> c) {
                                            endpoint.track(c);
                                            adopted.push_back(std::move(c));
                                        },
                                        [this](Task<void> t, const char* what) { return tasks.spawn(std::move(t), what); }}) {}

    /// Accepts on every listener until closed.
    void start() {
        for (std::size_t i = 0; i < endpoint.listeners(); ++i) (void)tasks.spawn(endpoint.accept_loop(i), "an accept loop");
    }

    Task<void> stop() {
        endpoint.close(Error(Errc::shutdown, "the test is over"));
        tasks.close();
        tasks.cancel();
        co_await tasks.join();
    }

    Address address_of(const std::string& transport) const {
        for (const auto& o : endpoint.offers())
            if (o.name == transport) {
                auto a = Address::parse(o.address);
                REQUIRE(a);
                return *a;
            }
        FAIL("no offer for " << transport);
        return {};
    }

    std::vector<std::shared_ptr<Connection>> adopted;
    detail::TaskGroup tasks;
    detail::Endpoint endpoint;
};

/// `_transports` naming these (built outside coroutines: GCC 12 and initializer lists).
std::optional<std::vector<std::string>> transports(std::string a, std::string b = {}, std::string c = {}) {
    std::vector<std::string> names;
    for (auto* n : {&a, &b, &c})
        if (!n->empty()) names.push_back(*n);
    return names;
}

}  // namespace

TEST_CASE("an endpoint listens on every transport asked for, in the order asked (the priority), and offers each",
          "[rpc][endpoint]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Owner o(ex);
        REQUIRE(o.endpoint.listen(ex, transports("uds", "uv", "shm"), "127.0.0.1"));
        REQUIRE(o.endpoint.offers().size() == 3);
        CHECK(o.endpoint.offers()[0].name == "uds");
        CHECK(o.endpoint.offers()[1].name == "uv");
        CHECK(o.endpoint.offers()[2].name == "shm");
        CHECK(o.endpoint.transports().size() == 3);
        CHECK(o.endpoint.host() == "127.0.0.1");
        CHECK(o.endpoint.port() != 0);
        CHECK(o.endpoint.offers()[1].address == "tcp://127.0.0.1:" + std::to_string(o.endpoint.port()));

        Owner all(ex);  // (none asked for: every one built, shared memory first)
        REQUIRE(all.endpoint.listen(ex, std::nullopt, "127.0.0.1"));
        REQUIRE_FALSE(all.endpoint.offers().empty());
        CHECK(all.endpoint.offers()[0].name == "shm");
        CHECK(all.endpoint.offers().back().name == "uv");

        Owner bad(ex);
        auto r = bad.endpoint.listen(ex, transports("carrier-pigeon"), "");
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::invalid_argument);
        co_await all.stop();
        co_await o.stop();
    });
}

TEST_CASE("an endpoint admits a peer with the key that its owner admits, refuses the others, and closes what it adopted",
          "[rpc][endpoint]") {
    const std::string transport = GENERATE(std::string("uv"), std::string("uds"));
    INFO("over " << transport);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Owner o(ex);
        REQUIRE(o.endpoint.listen(ex, transports(transport), "127.0.0.1"));
        o.endpoint.set_key("the group's secret");
        o.start();
        const Address at = o.address_of(transport);
        auto client_hello = [&](std::string name) {
            HelloInfo h = named(std::move(name), 1);
            h.transports = o.endpoint.offers();
            return h;
        };
        HandshakeAuth keyed;
        keyed.key = "the group's secret";

        auto connecting = Connection::connect(at, client_hello("worker1"), ConnectionLimits{}, keyed);
        auto good = co_await std::move(connecting);
        REQUIRE(good);
        connecting = Connection::connect(at, client_hello("worker2"), ConnectionLimits{}, HandshakeAuth{});
        auto unkeyed = co_await std::move(connecting);
        REQUIRE_FALSE(unkeyed);
        CHECK(unkeyed.error().code() == Errc::unauthorized);
        connecting = Connection::connect(at, client_hello("mallory"), ConnectionLimits{}, keyed);
        auto refused = co_await std::move(connecting);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code() == Errc::unauthorized);
        CHECK(refused.error().message().find("mallory is not in the group") != std::string::npos);

        while (o.adopted.empty()) co_await test::sleep_for(5ms);
        REQUIRE(o.adopted.size() == 1);
        CHECK(o.adopted[0]->peer().name == "worker1");
        while (o.endpoint.inbound_open() > 1) co_await test::sleep_for(5ms);  // (the refused ones gave theirs back)
        CHECK(o.endpoint.inbound_open() == 1);

        o.endpoint.close(Error(Errc::shutdown, "closing the endpoint"));
        CHECK_FALSE(o.adopted[0]->is_open());
        auto r = co_await (*good)->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::connection_lost);
        co_await o.stop();
    });
}

TEST_CASE("an endpoint ends the oldest handshake for one more, and closes sockets beyond its budget at once",
          "[rpc][endpoint][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Owner o(ex, detail::InboundLimits{3, 2});
        REQUIRE(o.endpoint.listen(ex, transports("uv"), "127.0.0.1"));
        o.start();
        const Address at = o.address_of("uv");
        // Two silent sockets fill the handshakes; a third ends the first one's.
        auto first = co_await test::raw_connect(at);
        auto second = co_await test::raw_connect(at);
        while (o.endpoint.inbound_open() < 2) co_await test::sleep_for(5ms);
        auto third = co_await test::raw_connect(at);
        const bool first_ended = co_await test::raw_closed_by_peer(first);
        CHECK(first_ended);
        while (o.endpoint.inbound_open() != 2) co_await test::sleep_for(5ms);

        // The silent ones go; three real peers then fill the budget, and one more socket is closed
        // at once, unread.
        test::raw_close(second);
        test::raw_close(third);
        while (o.endpoint.inbound_open() != 0) co_await test::sleep_for(5ms);
        std::vector<std::shared_ptr<Connection>> peers;
        for (int i = 1; i <= 3; ++i) {
            auto connecting = Connection::connect(at, named("worker" + std::to_string(i), i), ConnectionLimits{}, HandshakeAuth{});
            auto peer = co_await std::move(connecting);
            REQUIRE(peer);
            peers.push_back(std::move(*peer));
        }
        while (o.adopted.size() < 3) co_await test::sleep_for(5ms);
        CHECK(o.endpoint.inbound_open() == 3);
        auto fourth = co_await test::raw_connect(at);
        const bool fourth_closed = co_await test::raw_closed_by_peer(fourth);
        CHECK(fourth_closed);
        CHECK(o.endpoint.inbound_open() == 3);
        for (auto& a : o.adopted) CHECK(a->is_open());
        co_await o.stop();
    });
}

}  // namespace tp_endpoint_test
