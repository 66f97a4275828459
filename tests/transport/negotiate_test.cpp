// The transport seam below the agent: addresses, the negotiation's decision, the version-3 hello,
// and Connections over uds, including the redirect from a TCP negotiation to a Unix socket.
#include "transport/negotiate.hpp"

#include "transport/auth.hpp"
#include "transport/frame.hpp"
#include "transport/transport.hpp"
#include "transport/transport_test_util.hpp"

#include <tensorplay/config.hpp>

#include <asio/detached.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_negotiate_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

HelloInfo side(std::string name, int rank, std::vector<TransportOffer> transports) {
    HelloInfo h;
    h.name = std::move(name);
    h.rank = rank;
    h.transports = std::move(transports);
    return h;
}

const std::string kHost = "uds:boot/4026531833/0";

/// Offers of uds then uv (built outside coroutines: GCC 12 and initializer lists).
HelloInfo both(std::string name, int rank, const std::string& domain, std::string uds_at, std::string tcp_at) {
    return side(std::move(name), rank, {{"uds", domain, std::move(uds_at)}, {"uv", "uv", std::move(tcp_at)}});
}

Task<void> nap() {
    asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
    co_await t.async_wait(detail::use_nothrow);
}

}  // namespace

TEST_CASE("addresses parse and print back", "[transport][negotiation]") {
    auto t = Address::parse("tcp://10.0.0.2:4242");
    REQUIRE(t);
    CHECK(t->scheme == "tcp");
    CHECK(t->host == "10.0.0.2");
    CHECK(t->port == 4242);
    CHECK(t->transport() == "uv");
    CHECK(Address::parse(t->str()) == t);
    auto v6 = Address::parse("tcp://[::1]:80");
    REQUIRE(v6);
    CHECK(v6->host == "::1");
    CHECK(v6->str() == "tcp://[::1]:80");
    auto u = Address::parse("uds://tensorplay-1-ab");
    REQUIRE(u);
    CHECK(u->transport() == "uds");
    CHECK(u->name == "tensorplay-1-ab");
    for (const char* bad : {"10.0.0.2:4242", "tcp://host", "tcp://host:99999", "tcp://:1", "uds://", "ftp://x:1"}) {
        INFO(bad);
        auto r = Address::parse(bad);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::invalid_argument);
    }
    CHECK_FALSE(Address::parse("uds://" + std::string(200, 'x')));
}

TEST_CASE("the server's first viable transport wins, and per device pair its best common channel", "[transport][negotiation]") {
    auto server = side("s", 1, {{"uds", kHost, "uds://srv"}, {"uv", "uv", "tcp://127.0.0.1:1"}});
    auto client = side("c", 0, {{"uv", "uv", ""}, {"uds", kHost, ""}});
    server.channels = {{"cma", "cpu", "x"}, {"basic", "cpu", "any"}, {"cuda_basic", "cuda", "any"}};
    client.channels = {{"basic", "cpu", "any"}, {"cuda_basic", "cuda", "any"}};
    auto n = detail::negotiate(server, client, "uv");
    REQUIRE(n);
    CHECK(n->transport == "uds");  // the server's order, not the client's
    CHECK(n->address == "uds://srv");
    REQUIRE(n->channels.size() == 2);
    CHECK(n->channels[0] == ChannelChoice{"cpu", "cpu", "basic"});  // cma: another domain
    CHECK(n->channels[1] == ChannelChoice{"cuda", "cuda", "cuda_basic"});

    SECTION("a uds domain of another host, namespace or user leaves uv, on the connection itself") {
        client.transports[1].domain = "uds:boot/4026532000/0";
        auto m = detail::negotiate(server, client, "uv");
        REQUIRE(m);
        CHECK(m->transport == "uv");
        CHECK(m->address.empty());  // no reconnect: the negotiation's stream carries the frames
    }
    SECTION("the transport the connection is on needs no address") {
        server.transports[0].address.clear();
        auto m = detail::negotiate(server, client, "uds");
        REQUIRE(m);
        CHECK(m->transport == "uds");
        CHECK(m->address.empty());
    }
    SECTION("nothing common is not_supported and names both workers") {
        client.transports = {{"ibv", "ibv:x", ""}};
        auto m = detail::negotiate(server, client, "uv");
        REQUIRE_FALSE(m);
        CHECK(m.error().code() == Errc::not_supported);
        CHECK(m.error().message().find("\"c\" (rank 0) (offers ibv)") != std::string::npos);
        CHECK(m.error().message().find("\"s\" (rank 1) (offers uds, uv") != std::string::npos);
    }
}

TEST_CASE("a hello (version 4 layout, version 7 protocol) carries the offers (channel params included) and the answer, and bounds their counts", "[transport][negotiation]") {
    detail::Hello h;
    h.info = side("w", 3, {{"uds", kHost, "uds://a"}, {"uv", "uv", "tcp://1.2.3.4:5"}});
    h.info.channels.insert(h.info.channels.begin(), ChannelOffer{"cma", "cpu", "cma:host", std::string("\0\1params", 8)});
    h.answer = Negotiated{"uds", "uds://a", {ChannelChoice{"cpu", "cpu", "basic"}}};
    const Bytes b = detail::encode_hello(h);
    auto p = detail::decode_hello_prefix(b);
    REQUIRE(p);
    CHECK(p->version == 7);
    auto d = detail::decode_hello_body(std::span(b).subspan(detail::kHelloPrefixSize), ConnectionLimits{});
    REQUIRE(d);
    REQUIRE(d->info.channels.size() == h.info.channels.size());
    CHECK(d->info.channels[0].params == h.info.channels[0].params);
    CHECK(d->info.channels[0].domain == "cma:host");
    REQUIRE(d->info.transports.size() == 2);
    CHECK(d->info.transports[0].domain == kHost);
    CHECK(d->info.transports[1].address == "tcp://1.2.3.4:5");
    REQUIRE(d->answer);
    CHECK(*d->answer == *h.answer);

    h.info.transports.resize(detail::kMaxHelloTransports + 1);
    const Bytes many = detail::encode_hello(h);
    auto bad = detail::decode_hello_body(std::span(many).subspan(detail::kHelloPrefixSize), ConnectionLimits{});
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code() == Errc::protocol_error);
}

TEST_CASE("unknown names are invalid_argument; ibv is recognised but not_supported", "[transport][negotiation]") {
    CHECK(detail::transport_named("uv"));
    CHECK((*detail::transport_named("tcp"))->name() == "uv");
    CHECK(detail::transport_named("uds"));
    REQUIRE(detail::transport_named("shm"));
    CHECK((*detail::transport_named("shm"))->priority() == 200);
    CHECK((*detail::transport_named("shm"))->domain() == "shm:" + detail::same_host_domain());
    CHECK(detail::transport_named("ibv").error().code() == Errc::not_supported);
    CHECK(detail::transport_named("smoke").error().code() == Errc::invalid_argument);
    auto all = detail::select_transports(std::nullopt);
    REQUIRE(all);
    REQUIRE(all->size() == 3);
    CHECK((*all)[0]->name() == "shm");  // shm > uds > uv
    CHECK((*all)[1]->name() == "uds");
    CHECK((*all)[2]->name() == "uv");
    auto only = detail::select_transports(std::vector<std::string>{"ibv"});
    REQUIRE_FALSE(only);
    CHECK(only.error().code() == Errc::not_supported);
}

TEST_CASE("a TCP negotiation that chooses uds reconnects over the Unix socket", "[transport][negotiation]") {
    // Server: listens on uds and TCP; its hello offers both with their addresses.
    auto uds = detail::transport_named("uds");
    auto uv = detail::transport_named("uv");
    REQUIRE(uds);
    REQUIRE(uv);
    detail::ListenSpec spec;
    spec.tcp_address = "127.0.0.1";
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto ul = (*uds)->listen(ex, spec);
        auto tl = (*uv)->listen(ex, spec);
        REQUIRE(ul);
        REQUIRE(tl);
        const HelloInfo server = both("server", 1, (*uds)->domain(), (*ul)->address().str(), (*tl)->address().str());
        const HelloInfo client = both("client", 0, (*uds)->domain(), "", "");
        const ConnectionLimits limits;
        const HandshakeAuth auth;
        std::optional<Result<std::shared_ptr<Connection>>> redirected, settled;
        // Accept one over TCP (negotiation only), then one over the Unix socket (the data).
        asio::co_spawn(
            ex,
            [&]() -> Task<void> {
                auto s1 = co_await (*tl)->accept();
                REQUIRE(s1);
                auto a1 = detail::accept_stream(std::move(*s1), server, limits, auth);
                redirected = co_await std::move(a1);
                auto s2 = co_await (*ul)->accept();
                REQUIRE(s2);
                auto a2 = detail::accept_stream(std::move(*s2), server, limits, auth);
                settled = co_await std::move(a2);
            },
            asio::detached);
        auto connecting = Connection::connect((*tl)->address(), client, limits, auth);
        auto c = co_await std::move(connecting);
        REQUIRE(c);
        CHECK((*c)->transport() == "uds");
        CHECK((*c)->negotiated().transport == "uds");
        while (!settled) co_await nap();
        REQUIRE(redirected);
        REQUIRE(*redirected);
        CHECK((**redirected)->redirected());
        CHECK_FALSE((**redirected)->is_open());
        REQUIRE(*settled);
        CHECK((**settled)->transport() == "uds");
        // Frames flow over the Unix socket.
        Frame f;
        f.id = 7;
        f.name = "over uds";
        REQUIRE((*c)->send(std::move(f), true));
        auto got = co_await (**settled)->receive();
        REQUIRE(got);
        CHECK(got->id == 7);
        CHECK(got->name == "over uds");
        (*ul)->close();
        (*tl)->close();
    });
}

TEST_CASE("channels: cma before basic by default, _channels restricts and orders", "[transport][negotiation]") {
    CHECK(detail::channel_available("cma"));
    CHECK(detail::channel_available("basic"));
    auto all = detail::select_channels(std::nullopt);
    REQUIRE(all);
#if TP_HAS_CUDA
    // (The device channels are built with CUDA; the agent offers them when it has cuda devices.)
    CHECK(detail::channel_available("cuda_ipc"));
    CHECK(*all == std::vector<std::string>{"cma", "basic", "cuda_ipc", "cuda_basic"});
#else
    CHECK_FALSE(detail::channel_available("cuda_ipc"));
    CHECK(*all == std::vector<std::string>{"cma", "basic"});
#endif
    auto basic = detail::select_channels(std::vector<std::string>{"basic"});
    REQUIRE(basic);
    CHECK(*basic == std::vector<std::string>{"basic"});
    auto ordered = detail::select_channels(std::vector<std::string>{"basic", "cma"});
    REQUIRE(ordered);
    CHECK(*ordered == std::vector<std::string>{"basic", "cma"});
}

TEST_CASE("the handshake proofs cover the channel offers' params (a forged cma probe target fails them)", "[transport][negotiation]") {
    HelloInfo client, server, forged;
    client.name = "c";
    server.name = "s";
    client.channels = {ChannelOffer{"cma", "cpu", "cma:host", "probe A"}, ChannelOffer{"basic", "cpu", "any"}};
    forged = client;
    forged.channels[0].params = "probe B";
    const detail::Transcript a{kProtocolVersion, &client, &server, {}, {}, nullptr};
    const detail::Transcript b{kProtocolVersion, &forged, &server, {}, {}, nullptr};
    CHECK(detail::transcript_bytes(a, detail::ProofBy::client) != detail::transcript_bytes(b, detail::ProofBy::client));
}

}  // namespace tp_negotiate_test
