// Peer authentication in the handshake: the primitives, keyed and keyless pairs, refusals either
// way round, and hostile clients writing the handshake by hand on 127.0.0.1.
#include "transport/auth.hpp"

#include <tensorplay/transport/connection.hpp>

#include "transport/transport_test_util.hpp"

#include <tensorplay/core/wire.hpp>

#include <asio/read.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_auth_test {

using namespace tensorplay;
using namespace std::chrono_literals;
namespace td = tensorplay::detail;

namespace {

HandshakeAuth keyed(std::string key) {
    HandshakeAuth a;
    a.key = std::move(key);
    return a;
}

std::string hex(std::span<const std::uint8_t> b) {
    std::string s;
    char buf[3];
    for (auto c : b) {
        std::snprintf(buf, sizeof buf, "%02x", c);
        s += buf;
    }
    return s;
}

Task<Result<std::shared_ptr<Connection>>> accept_auth(asio::ip::tcp::acceptor& acc, HelloInfo hello, HandshakeAuth auth) {
    auto [ec, s] = co_await acc.async_accept(td::use_nothrow);
    if (ec) co_return fail(from_error_code(ec, "accept"));
    auto accepting = test::accept_socket(std::move(s), std::move(hello), ConnectionLimits{}, std::move(auth));
    co_return co_await std::move(accepting);
}

struct Outcome {
    Result<std::shared_ptr<Connection>> server = fail(Errc::internal, "not run");
    Result<std::shared_ptr<Connection>> client = fail(Errc::internal, "not run");
};

/// A server and a client handshaking over loopback, each with its own auth.
Task<Outcome> handshake(HandshakeAuth server_auth, HandshakeAuth client_auth) {
    using namespace td::awaitable_ops;
    auto ex = co_await asio::this_coro::executor;
    asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
    auto port = acc.local_endpoint().port();
    auto serving = accept_auth(acc, test::hello("server", 1), std::move(server_auth));
    auto connecting = Connection::connect("127.0.0.1", port, test::hello("client", 0), ConnectionLimits{}, std::move(client_auth));
    auto [sv, cl] = co_await (std::move(serving) && std::move(connecting));
    Outcome o;
    o.server = std::move(sv);
    o.client = std::move(cl);
    co_return o;
}

/// Reads a whole hello (prefix and body) off a raw socket.
Task<td::Hello> read_full_hello(asio::ip::tcp::socket& s) {
    Bytes prefix(td::kHelloPrefixSize);
    auto [ec, n] = co_await asio::async_read(s, asio::buffer(prefix), td::use_nothrow);
    REQUIRE(!ec);
    auto p = td::decode_hello_prefix(prefix);
    REQUIRE(p);
    REQUIRE(p->version == kProtocolVersion);
    Bytes body(p->body_len);
    auto [ec2, n2] = co_await asio::async_read(s, asio::buffer(body), td::use_nothrow);
    REQUIRE(!ec2);
    auto h = td::decode_hello_body(body, ConnectionLimits{});
    REQUIRE(h);
    co_return std::move(*h);
}

/// Reads one handshake record off a raw socket.
Task<td::AuthRecord> read_record(asio::ip::tcp::socket& s) {
    Bytes head(td::kAuthRecordHeaderSize);
    auto [ec, n] = co_await asio::async_read(s, asio::buffer(head), td::use_nothrow);
    REQUIRE(!ec);
    auto len = td::decode_auth_record_header(head);
    REQUIRE(len);
    Bytes all = head;
    all.resize(head.size() + *len);
    auto [ec2, n2] = co_await asio::async_read(s, asio::buffer(all.data() + head.size(), *len), td::use_nothrow);
    REQUIRE(!ec2);
    auto r = td::decode_auth_record(all);
    REQUIRE(r);
    co_return std::move(*r);
}

/// True once the peer has closed `s` (EOF or reset), false if it sends something first.
Task<bool> closed_by_peer(asio::ip::tcp::socket& s) {
    std::uint8_t b[256];
    auto [ec, n] = co_await s.async_read_some(asio::buffer(b), td::use_nothrow);
    co_return ec && n == 0;
}

/// Accepts one connection on `acc` as a keyed server named "server" (rank 0) and records its
/// failure in `error` (left empty when it connects).
void spawn_keyed_accept(asio::ip::tcp::acceptor& acc, std::string key, std::optional<Error>& error) {
    asio::co_spawn(acc.get_executor(), accept_auth(acc, test::hello("server", 0), keyed(std::move(key))),
                   [&error](std::exception_ptr, Result<std::shared_ptr<Connection>> r) {
                       if (!r) error = r.error();
                   });
}

/// A keyed client's first hello: its name and rank, no offers (they follow the proofs).
td::Hello keyed_hello(std::string name, int rank) {
    td::Hello h;
    h.info.name = std::move(name);
    h.info.rank = rank;
    h.info.transports.clear();
    h.info.channels.clear();
    h.auth = td::HelloAuth::hmac_sha256;
    auto n = td::make_nonce();
    REQUIRE(n);
    h.nonce = *n;
    return h;
}

Bytes request_frame() {
    Frame f;
    f.kind = FrameKind::request;
    f.id = 1;
    f.name = "echo";
    f.payload = bytes("after the handshake");
    Bytes head;
    bool inl = false;
    REQUIRE(td::encode_frame_head(f, ConnectionLimits{}, head, inl));
    REQUIRE(inl);
    return head;
}

}  // namespace

TEST_CASE("hmac_sha256 matches RFC 4231 test case 2", "[transport][auth]") {
    const std::string key = "Jefe", data = "what do ya want for nothing?";
    auto mac = td::hmac_sha256({reinterpret_cast<const std::uint8_t*>(key.data()), key.size()},
                               {reinterpret_cast<const std::uint8_t*>(data.data()), data.size()});
    REQUIRE(mac);
    CHECK(hex(*mac) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("handshake proofs depend on the direction, both nonces, both identities and the key", "[transport][auth]") {
    const HelloInfo client = test::hello("worker1", 1), server = test::hello("worker0", 0);
    td::Transcript t{kProtocolVersion, &client, &server, {}, {}};
    t.client_nonce[0] = 1;
    t.server_nonce[0] = 2;
    auto base = td::handshake_proof("key", t, td::ProofBy::client);
    REQUIRE(base);
    auto other_dir = td::handshake_proof("key", t, td::ProofBy::server);
    REQUIRE(other_dir);
    CHECK_FALSE(td::same_proof(*base, *other_dir));
    CHECK_FALSE(td::same_proof(*base, *td::handshake_proof("kez", t, td::ProofBy::client)));
    auto t2 = t;
    t2.server_nonce[31] ^= 1;
    CHECK_FALSE(td::same_proof(*base, *td::handshake_proof("key", t2, td::ProofBy::client)));
    const HelloInfo claimed = test::hello("worker2", 1);
    auto t3 = t;
    t3.client = &claimed;
    CHECK_FALSE(td::same_proof(*base, *td::handshake_proof("key", t3, td::ProofBy::client)));
    CHECK(td::same_proof(*base, *td::handshake_proof("key", t, td::ProofBy::client)));
    // Fresh nonces differ.
    auto n1 = td::make_nonce(), n2 = td::make_nonce();
    REQUIRE(n1);
    REQUIRE(n2);
    CHECK(*n1 != *n2);
}

TEST_CASE("peers with the same key (or both without one) connect and exchange frames", "[transport][auth]") {
    const bool with_key = GENERATE(true, false);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        const std::string key = with_key ? "same secret" : "";
        auto o = co_await handshake(keyed(key), keyed(key));
        REQUIRE(o.server);
        REQUIRE(o.client);
        CHECK((*o.server)->peer().name == "client");
        CHECK((*o.client)->peer().name == "server");
        CHECK((*o.client)->peer().rank == 1);
        Frame f;
        f.id = 7;
        f.name = "echo";
        f.payload = bytes("hi");
        REQUIRE((*o.client)->send(std::move(f), true));
        auto got = co_await (*o.server)->receive();
        REQUIRE(got);
        CHECK(got->payload == bytes("hi"));
    });
}

TEST_CASE("different keys are refused on both sides, saying what to fix", "[transport][auth]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto o = co_await handshake(keyed("server secret"), keyed("client secret"));
        REQUIRE_FALSE(o.server);
        REQUIRE_FALSE(o.client);
        CHECK(o.server.error().code() == Errc::unauthorized);
        CHECK(o.client.error().code() == Errc::unauthorized);
        CHECK(o.client.error().message().find("do both sides use the same TP_RPC_AUTH_KEY?") != std::string::npos);
        CHECK(o.server.error().message().find("rejected our proof") != std::string::npos);
        CHECK(o.server.error().message().find("127.0.0.1") != std::string::npos);
        for (const auto* e : {&o.server.error(), &o.client.error()}) {
            CHECK(e->to_string().find("secret") == std::string::npos);
        }
    });
}

TEST_CASE("a key on one side only is refused, either way round", "[transport][auth]") {
    const bool server_keyed = GENERATE(true, false);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto o = co_await handshake(keyed(server_keyed ? "k" : ""), keyed(server_keyed ? "" : "k"));
        REQUIRE_FALSE(o.server);
        REQUIRE_FALSE(o.client);
        CHECK(o.server.error().code() == Errc::unauthorized);
        CHECK(o.client.error().code() == Errc::unauthorized);
        CHECK(o.client.error().message().find("TP_RPC_AUTH_KEY") != std::string::npos);
        CHECK(o.client.error().message().find(server_keyed ? "requires authentication" : "has no shared key") !=
              std::string::npos);
    });
}

TEST_CASE("the server's admit check refuses a peer, and the client is told why", "[transport][auth]") {
    const bool with_key = GENERATE(true, false);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        HandshakeAuth server = keyed(with_key ? "k" : "");
        std::string seen;
        server.admit = [&seen](const HelloInfo& peer) -> Result<void> {
            seen = peer.name;
            return fail(Errc::unauthorized, "rank 0 of the group is worker \"w0\", not \"client\"");
        };
        auto o = co_await handshake(std::move(server), keyed(with_key ? "k" : ""));
        CHECK(seen == "client");
        REQUIRE_FALSE(o.server);
        REQUIRE_FALSE(o.client);
        CHECK(o.server.error().code() == Errc::unauthorized);
        CHECK(o.client.error().code() == Errc::unauthorized);
        CHECK(o.client.error().message().find("not \"client\"") != std::string::npos);
    });
}

TEST_CASE("a raw client with a made-up proof is refused and what it sent next is never read", "[transport][auth][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        asio::ip::tcp::socket raw(ex);
        co_await raw.async_connect(acc.local_endpoint(), td::use_nothrow);
        asio::co_spawn(ex, accept_auth(acc, test::hello("server", 0), keyed("the key")),
                 [&](std::exception_ptr, Result<std::shared_ptr<Connection>> r) {
                     REQUIRE_FALSE(r);
                     CHECK(r.error().code() == Errc::unauthorized);
                     CHECK(r.error().message().find("wrong proof") != std::string::npos);
                 });
        co_await test::raw_write(raw, td::encode_hello(keyed_hello("raw", 1)));
        auto theirs = co_await read_full_hello(raw);
        CHECK(theirs.step == td::HelloStep::proof);
        // Before the client has proven the key the server names itself, nothing it offers: no
        // transport addresses (uds and shm names), no channel identities, no answer.
        CHECK(theirs.info.name == "server");
        CHECK(theirs.info.transports.empty());
        CHECK(theirs.info.channels.empty());
        CHECK_FALSE(theirs.answer.has_value());
        td::AuthRecord proof;
        proof.kind = td::AuthRecordKind::proof;  // all zeros
        Bytes out = td::encode_auth_record(proof);
        const Bytes frame = request_frame();
        out.insert(out.end(), frame.begin(), frame.end());
        co_await test::raw_write(raw, out);
        auto verdict = co_await read_record(raw);
        CHECK(verdict.kind == td::AuthRecordKind::refused);
        CHECK(verdict.reason.find("proof") != std::string::npos);
        const bool closed = co_await closed_by_peer(raw);
        CHECK(closed);
    });
}

TEST_CASE("with a key, a client that offers before the proofs is refused, and a client names no offer before them",
          "[transport][auth][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        // A raw client whose keyed hello carries its offers (as version 6 sent them).
        asio::ip::tcp::socket raw(ex);
        co_await raw.async_connect(acc.local_endpoint(), td::use_nothrow);
        std::optional<Error> server_error;
        spawn_keyed_accept(acc, "the key", server_error);
        auto early = keyed_hello("raw", 1);
        early.info = test::hello("raw", 1);
        REQUIRE_FALSE(early.info.transports.empty());
        co_await test::raw_write(raw, td::encode_hello(early));
        auto theirs = co_await read_full_hello(raw);
        CHECK(theirs.step == td::HelloStep::refused);
        CHECK(theirs.reason.find("before the key was proven") != std::string::npos);
        CHECK(theirs.info.transports.empty());
        CHECK(theirs.info.channels.empty());
        const bool closed = co_await closed_by_peer(raw);
        CHECK(closed);
        REQUIRE(server_error);
        CHECK(server_error->code() == Errc::protocol_error);

        // A keyed client's first hello, read by a raw server: its name, rank and nonce only.
        asio::ip::tcp::acceptor raw_server(ex, {asio::ip::make_address("127.0.0.1"), 0});
        auto port = raw_server.local_endpoint().port();
        asio::co_spawn(ex, Connection::connect("127.0.0.1", port, test::hello("client", 2), ConnectionLimits{}, keyed("the key")),
                       [](std::exception_ptr, Result<std::shared_ptr<Connection>>) {});
        auto [aec, sock] = co_await raw_server.async_accept(td::use_nothrow);
        REQUIRE(!aec);
        auto first = co_await read_full_hello(sock);
        CHECK(first.info.name == "client");
        CHECK(first.info.rank == 2);
        CHECK(first.auth == td::HelloAuth::hmac_sha256);
        CHECK(first.info.transports.empty());
        CHECK(first.info.channels.empty());
        sock.close();
    });
}

TEST_CASE("a client that reflects the server's proof back as its own is refused", "[transport][auth][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        asio::ip::tcp::socket raw(ex);
        co_await raw.async_connect(acc.local_endpoint(), td::use_nothrow);
        bool refused = false;
        asio::co_spawn(ex, accept_auth(acc, test::hello("server", 0), keyed("the key")),
                 [&](std::exception_ptr, Result<std::shared_ptr<Connection>> r) {
                     refused = !r && r.error().code() == Errc::unauthorized;
                 });
        // The same nonce as the server's would make both transcripts alike but for the label.
        auto mine = keyed_hello("raw", 1);
        co_await test::raw_write(raw, td::encode_hello(mine));
        auto theirs = co_await read_full_hello(raw);
        REQUIRE(theirs.step == td::HelloStep::proof);
        td::AuthRecord proof;
        proof.kind = td::AuthRecordKind::proof;
        proof.proof = theirs.proof;
        co_await test::raw_write(raw, td::encode_auth_record(proof));
        auto verdict = co_await read_record(raw);
        CHECK(verdict.kind == td::AuthRecordKind::refused);
        const bool closed = co_await closed_by_peer(raw);
        CHECK(closed);
        CHECK(refused);
    });
}

TEST_CASE("a keyless raw client gets a refusal in the server's hello, which tells nothing more, then the close", "[transport][auth][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        asio::ip::tcp::socket raw(ex);
        co_await raw.async_connect(acc.local_endpoint(), td::use_nothrow);
        asio::co_spawn(ex, accept_auth(acc, test::hello("server", 0), keyed("the key")),
                 [](std::exception_ptr, Result<std::shared_ptr<Connection>> r) { REQUIRE_FALSE(r); });
        Bytes out = td::encode_hello(test::hello("raw", 1));
        const Bytes frame = request_frame();
        out.insert(out.end(), frame.begin(), frame.end());
        co_await test::raw_write(raw, out);
        auto theirs = co_await read_full_hello(raw);
        CHECK(theirs.step == td::HelloStep::refused);
        CHECK(theirs.reason.find("requires authentication") != std::string::npos);
        // It learns who refused and why, none of our offers (addresses, pid, memory addresses).
        CHECK(theirs.info.name == "server");
        CHECK(theirs.info.transports.empty());
        CHECK(theirs.info.channels.empty());
        const bool closed = co_await closed_by_peer(raw);
        CHECK(closed);
    });
}

TEST_CASE("a version 1 peer is told which versions disagree", "[transport][auth][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        asio::ip::tcp::socket raw(ex);
        co_await raw.async_connect(acc.local_endpoint(), td::use_nothrow);
        std::optional<Error> server_error;
        spawn_keyed_accept(acc, "k", server_error);
        // A version 1 hello: the body has no authentication fields.
        WireWriter w;
        w.u32(kProtocolMagic).u16(1).u16(0).u32(0).str32("old").i32(1).u32(1).str32("tcp").u32(1).str32("basic");
        w.patch_u32(8, static_cast<std::uint32_t>(w.size() - td::kHelloPrefixSize));
        co_await test::raw_write(raw, std::move(w).take());
        Bytes prefix(td::kHelloPrefixSize);
        auto [ec, n] = co_await asio::async_read(raw, asio::buffer(prefix), td::use_nothrow);
        REQUIRE(!ec);
        auto p = td::decode_hello_prefix(prefix);
        REQUIRE(p);
        CHECK(p->version == kProtocolVersion);  // what a version 1 client reports
        Bytes body(p->body_len);
        auto [ec2, n2] = co_await asio::async_read(raw, asio::buffer(body), td::use_nothrow);
        REQUIRE(!ec2);
        const bool closed = co_await closed_by_peer(raw);
        CHECK(closed);
        for (int i = 0; i < 1000 && !server_error; ++i) {
            asio::steady_timer t(ex, 1ms);
            co_await t.async_wait(td::use_nothrow);
        }
        REQUIRE(server_error);
        CHECK(server_error->code() == Errc::protocol_error);
        CHECK(server_error->message().find("version 1") != std::string::npos);
    });
}

TEST_CASE("malformed authentication fields are protocol errors", "[transport][auth][fault]") {
    auto body_of = [](const td::Hello& h) {
        Bytes b = td::encode_hello(h);
        return Bytes(b.begin() + td::kHelloPrefixSize, b.end());
    };
    td::Hello h;
    h.info = test::hello("x", 1);
    Bytes b = body_of(h);
    REQUIRE(td::decode_hello_body(b, ConnectionLimits{}));
    // The authentication byte is the second to last of a keyless hello (then the step).
    Bytes bad_auth = b;
    bad_auth[bad_auth.size() - 2] = 7;
    auto r1 = td::decode_hello_body(bad_auth, ConnectionLimits{});
    REQUIRE_FALSE(r1);
    CHECK(r1.error().code() == Errc::protocol_error);
    Bytes bad_step = b;
    bad_step.back() = 9;
    CHECK_FALSE(td::decode_hello_body(bad_step, ConnectionLimits{}));
    Bytes proof_without_auth = b;
    proof_without_auth.back() = static_cast<std::uint8_t>(td::HelloStep::proof);
    proof_without_auth.resize(proof_without_auth.size() + 32);
    CHECK_FALSE(td::decode_hello_body(proof_without_auth, ConnectionLimits{}));
    Bytes cut = body_of(keyed_hello("x", 1));
    cut.resize(cut.size() - 5);  // a nonce cut short
    CHECK_FALSE(td::decode_hello_body(cut, ConnectionLimits{}));
    td::Hello long_reason;
    long_reason.info = test::hello("x", 1);
    long_reason.step = td::HelloStep::refused;
    long_reason.reason = std::string(5000, 'r');  // cut to the limit when encoded
    auto lr = td::decode_hello_body(body_of(long_reason), ConnectionLimits{});
    REQUIRE(lr);
    CHECK(lr->reason.size() == td::kMaxRefusalReason);

    const std::uint8_t short_proof[] = {1, 0, 31, 0};
    CHECK_FALSE(td::decode_auth_record_header(short_proof));
    const std::uint8_t unknown_kind[] = {9, 0, 0, 0};
    CHECK_FALSE(td::decode_auth_record_header(unknown_kind));
    const std::uint8_t long_refusal[] = {3, 0, 0x01, 0x04};  // 1025 bytes
    CHECK_FALSE(td::decode_auth_record_header(long_refusal));
    const std::uint8_t accepted_with_body[] = {2, 0, 1, 0};
    CHECK_FALSE(td::decode_auth_record_header(accepted_with_body));
    const std::uint8_t accepted[] = {2, 0, 0, 0};
    CHECK(td::decode_auth_record_header(accepted));
}

TEST_CASE("a key file is read whole, less trailing newlines; a missing or empty one is an error", "[transport][auth]") {
    char path[] = "/tmp/tp_auth_key_XXXXXX";
    int fd = ::mkstemp(path);
    REQUIRE(fd >= 0);
    const std::string content = "line one\nline two\r\n\n";
    REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
    ::close(fd);
    auto k = td::read_auth_key_file(path);
    REQUIRE(k);
    CHECK(std::string_view(reinterpret_cast<const char*>(k->bytes().data()), k->size()) == "line one\nline two");
    std::FILE* f = std::fopen(path, "w");  // (truncated: empty)
    REQUIRE(f);
    std::fclose(f);
    auto empty = td::read_auth_key_file(path);
    REQUIRE_FALSE(empty);
    CHECK(empty.error().message().find(path) != std::string::npos);
    std::remove(path);
    auto missing = td::read_auth_key_file(path);
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code() == Errc::invalid_argument);
    CHECK(missing.error().message().find(path) != std::string::npos);
}

// Cost of the handshake: run with `transport_auth_test "[.bench]"`.
TEST_CASE("handshake cost with and without a key", "[.bench]") {
    test::run_with_deadline(120s, [&]() -> Task<void> {
        for (const bool with_key : {false, true}) {
            constexpr int n = 1000;
            const auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < n; ++i) {
                auto o = co_await handshake(keyed(with_key ? "bench key" : ""), keyed(with_key ? "bench key" : ""));
                REQUIRE(o.client);
                REQUIRE(o.server);
            }
            const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / n;
            std::printf("{\"handshakes\": %d, \"key\": %s, \"us_per_connect_and_handshake\": %.1f}\n", n, with_key ? "true" : "false", us);
        }
    });
}

}  // namespace tp_auth_test
