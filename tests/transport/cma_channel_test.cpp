// The cma channel over real connections: tensors of every size round-trip byte for byte (in one
// process and between two), large ones by reference and small ones inline; a peer whose probe
// fails falls back to basic (on either side, with and without a key); the peer's memory or
// process going away fails that frame alone with a clear error; holds go back to 0 after the
// reads and on close; a peer that sends by reference without cma, or releases what we do not
// hold, is a protocol error.
#include <tensorplay/transport/connection.hpp>

#include "transport/channels/channel.hpp"
#include "transport/channels/cma/cma_offer.hpp"
#include "transport/connection_ext.hpp"
#include "transport/channels/cma/cma_lease.hpp"
#include "transport/channels/cma/cma_offload.hpp"
#include "transport/transport_test_util.hpp"

#include <tensorplay/core/wire.hpp>

#include <asio/io_context.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_cma_channel_test {

using namespace tensorplay;
using namespace std::chrono_literals;
namespace td = tensorplay::detail;

namespace {

/// A hello offering cma then basic. `params` empty: the connection fills them (this process).
HelloInfo cma_hello(std::string name, int rank, std::string params = {}, std::string domain = {}) {
    HelloInfo h = test::hello(std::move(name), rank);
    h.channels = {ChannelOffer{"cma", "cpu", std::move(domain), std::move(params)}, ChannelOffer{"basic", "cpu", "any"}};
    return h;
}

/// cma parameters naming `pid` (this process's identity otherwise) and its probe buffer, whose
/// expected bytes are wrong when `bad_probe`: the test seam for a peer whose probe fails.
HelloInfo cma_hello_as(std::string name, int rank, int pid, bool bad_probe) {
    auto id = td::cma::local_identity();
    REQUIRE(id);
    td::CmaParams p{*id, td::cma::local_probe_target(), td::cma::lease_table_address()};
    p.identity.pid = pid;
    p.probe.pid = pid;
    if (bad_probe) p.probe.expected[0] ^= 0xff;
    return cma_hello(std::move(name), rank, td::encode_cma_params(p), td::cma_domain(p.identity));
}

Tensor pattern_tensor(std::size_t n, unsigned seed) {
    Tensor t = Tensor::cpu(DType::uint8, {static_cast<std::int64_t>(n)});
    for (std::size_t i = 0; i < n; ++i) t.data()[i] = static_cast<std::uint8_t>((i * 131 + seed * 7) >> 3);
    return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

/// Sizes below, at and above the inline threshold, and 0.
std::vector<std::size_t> sizes() {
    return {0, 1, 1000, td::kCmaMinBytes - 1, td::kCmaMinBytes, (1u << 20) + 3, 8u << 20};
}
std::size_t by_ref_count(const std::vector<std::size_t>& s) {
    std::size_t n = 0;
    for (auto x : s) n += x >= td::kCmaMinBytes;
    return n;
}

Task<Result<std::shared_ptr<Connection>>> accept_keyed(asio::ip::tcp::acceptor& acc, HelloInfo hello, HandshakeAuth auth) {
    auto [ec, s] = co_await acc.async_accept(td::use_nothrow);
    if (ec) co_return fail(from_error_code(ec, "accept"));
    auto accepting = test::accept_socket(std::move(s), std::move(hello), ConnectionLimits{}, std::move(auth));
    co_return co_await std::move(accepting);
}

/// A client and a server with the given hellos (and key), over loopback; the client's limits
/// `client_limits`.
Task<test::ConnPair> pair_of(const HelloInfo& client, const HelloInfo& server, const std::string& key,
                             ConnectionLimits client_limits) {
    using namespace td::awaitable_ops;
    auto ex = co_await asio::this_coro::executor;
    asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
    const auto port = acc.local_endpoint().port();
    HandshakeAuth a, b;
    a.key = key;
    b.key = key;
    auto [sv, cl] = co_await (accept_keyed(acc, server, a) && Connection::connect("127.0.0.1", port, client, client_limits, b));
    REQUIRE(sv);
    REQUIRE(cl);
    co_return test::ConnPair{*cl, *sv};
}

Task<test::ConnPair> pair_of(const HelloInfo& client, const HelloInfo& server, const std::string& key) {
    return pair_of(client, server, key, ConnectionLimits{});
}

Frame frame_of(FrameKind kind, std::uint64_t id, std::vector<Tensor> tensors) {
    Frame f;
    f.kind = kind;
    f.id = id;
    f.name = kind == FrameKind::request ? "echo" : "";
    f.payload = bytes("payload");
    f.tensors = std::move(tensors);
    return f;
}

std::string channel_of(const Connection& c) {
    for (const auto& ch : c.negotiated().channels)
        if (ch.client_device == "cpu" && ch.server_device == "cpu") return ch.channel;
    return "none";
}

/// Sends `tensors` from client to server and back (the server echoes), checks every byte, and
/// that both sides' holds are back to 0 afterwards.
Task<void> echo_and_check(test::ConnPair& p, const std::vector<Tensor>& tensors) {
    REQUIRE(p.client->send(frame_of(FrameKind::request, 1, tensors), true));
    auto got = co_await p.server->receive();
    REQUIRE(got);
    REQUIRE_FALSE(got->alloc_error);
    REQUIRE(got->tensors.size() == tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) CHECK(same_bytes(got->tensors[i], tensors[i]));
    REQUIRE(p.server->send(frame_of(FrameKind::response, 1, got->tensors), true));
    auto back = co_await p.client->receive();
    REQUIRE(back);
    REQUIRE_FALSE(back->alloc_error);
    REQUIRE(back->tensors.size() == tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) CHECK(same_bytes(back->tensors[i], tensors[i]));
    // The server's release of the request came before its reply; ours of the reply comes before
    // the next frame.
    CHECK(tensorplay::detail::channel_stats(*p.client).cma_held == 0);
    REQUIRE(p.client->send(frame_of(FrameKind::request, 2, {}), true));
    auto last = co_await p.server->receive();
    REQUIRE(last);
    CHECK(tensorplay::detail::channel_stats(*p.server).cma_held == 0);
}

}  // namespace

TEST_CASE("cma carries large tensors by reference and small ones inline, byte for byte", "[transport][cma]") {
    const bool keyed = GENERATE(false, true);
    INFO("with a key: " << keyed);
    const HelloInfo client = cma_hello("client", 0), server = cma_hello("server", 1);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto p = co_await pair_of(client, server, keyed ? "k3y" : "");
        CHECK(channel_of(*p.client) == "cma");
        CHECK(p.client->negotiated() == p.server->negotiated());
        std::vector<Tensor> ts;
        const auto s = sizes();
        for (std::size_t i = 0; i < s.size(); ++i) ts.push_back(pattern_tensor(s[i], static_cast<unsigned>(i)));
        co_await echo_and_check(p, ts);
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_sent == by_ref_count(s));
        CHECK(tensorplay::detail::channel_stats(*p.server).cma_received == by_ref_count(s));
        CHECK(tensorplay::detail::channel_stats(*p.server).cma_sent == by_ref_count(s));
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_received == by_ref_count(s));
    });
}

TEST_CASE("cma: many tensors in one frame, by reference and inline interleaved", "[transport][cma]") {
    const HelloInfo client = cma_hello("client", 0), server = cma_hello("server", 1);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto p = co_await pair_of(client, server, "");
        std::vector<Tensor> ts;
        for (unsigned i = 0; i < 300; ++i) ts.push_back(pattern_tensor(i % 2 ? td::kCmaMinBytes + i : i, i));
        co_await echo_and_check(p, ts);
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_sent == 150);
    });
}

TEST_CASE("a peer whose cma probe fails falls back to basic, on either side", "[transport][cma]") {
    const bool client_bad = GENERATE(true, false);
    const bool keyed = GENERATE(false, true);
    INFO("the bad probe target is the " << (client_bad ? "client's" : "server's") << "; key: " << keyed);
    // A wrong client target fails the server's probe (it offers no cma); a wrong server target
    // fails the client's (its verdict turns the cma answer into basic on both sides).
    const HelloInfo client = cma_hello_as("client", 0, ::getpid(), client_bad);
    const HelloInfo server = cma_hello_as("server", 1, ::getpid(), !client_bad);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto p = co_await pair_of(client, server, keyed ? "k3y" : "");
        CHECK(channel_of(*p.client) == "basic");
        CHECK(channel_of(*p.server) == "basic");
        CHECK(p.client->negotiated() == p.server->negotiated());
        std::vector<Tensor> ts{pattern_tensor(1u << 20, 1), pattern_tensor(10, 2)};
        co_await echo_and_check(p, ts);
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_sent == 0);
        CHECK(tensorplay::detail::channel_stats(*p.server).cma_received == 0);
    });
}

TEST_CASE("only basic offered: basic, even on one host", "[transport][cma]") {
    const HelloInfo client = cma_hello("client", 0), server = test::hello("server", 1);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await pair_of(client, server, "");
        CHECK(channel_of(*p.client) == "basic");
        std::vector<Tensor> ts{pattern_tensor(1u << 20, 1)};
        co_await echo_and_check(p, ts);
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_sent == 0);
    });
}

namespace {
/// A forked child that only waits (its memory is a copy of ours at fork time: our probe buffer
/// is there, tensors allocated later are not); killed when done.
struct Idle {
    pid_t pid = -1;
    int fd = -1;
    Idle() {
        int p[2];
        REQUIRE(::pipe(p) == 0);
        int q[2];
        REQUIRE(::pipe(q) == 0);
        pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::close(p[1]);
            ::close(q[0]);
            // Each command: an address and a length to unmap (it answers one byte); EOF: exit.
            std::uint64_t cmd[2];
            while (::read(p[0], cmd, sizeof cmd) == sizeof cmd) {
                const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
                const std::uint64_t beg = cmd[0] & ~(page - 1), end = (cmd[0] + cmd[1] + page - 1) & ~(page - 1);
                ::munmap(reinterpret_cast<void*>(beg), end - beg);
                char ok = 1;
                (void)::write(q[1], &ok, 1);
            }
            ::_exit(0);
        }
        ::close(p[0]);
        ::close(q[1]);
        fd = p[1];
        reply = q[0];
    }
    int reply = -1;
    /// Makes sure `t`'s bytes are not mapped in the child (its copy of our heap may hold them).
    void unmap(const Tensor& t) {
        const std::uint64_t cmd[2] = {reinterpret_cast<std::uint64_t>(t.data()), t.nbytes()};
        REQUIRE(::write(fd, cmd, sizeof cmd) == sizeof cmd);
        char c = 0;
        REQUIRE(::read(reply, &c, 1) == 1);
    }
    void kill() {
        if (pid <= 0) return;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
    }
    ~Idle() {
        if (fd >= 0) ::close(fd);
        if (reply >= 0) ::close(reply);
        kill();
    }
};
}  // namespace

namespace {
/// The sending side of the memory-going-away case, in a forked child: connects to `port`, sends
/// a frame whose 1 MiB tensor goes by reference, then takes that memory away before the parent
/// reads it: unmaps its pages (then sends a small frame and waits for its reply), or exits at once
/// (`gone`). Exit code 0 when everything it did worked.
int vanishing_sender(std::uint16_t port, bool gone, int go_fd) {
    asio::io_context ctx(1);
    bool ok = false;
    asio::co_spawn(ctx, [&]() -> Task<void> {
        auto c = co_await Connection::connect("127.0.0.1", port, cma_hello("client", 0), ConnectionLimits{});
        if (!c || channel_of(**c) != "cma") co_return;
        std::vector<Tensor> ts{pattern_tensor(1u << 20, 1), pattern_tensor(10, 2)};
        if (!(*c)->send(frame_of(FrameKind::request, 1, ts), true)) co_return;
        if (gone) ::_exit(0);  // the process goes with the frame unread
        // Unmap the pages (the storage is never freed: this process ends with _exit).
        const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
        const auto beg = reinterpret_cast<std::uintptr_t>(ts[0].data()) & ~(page - 1);
        const auto end = (reinterpret_cast<std::uintptr_t>(ts[0].data()) + ts[0].nbytes() + page - 1) & ~(page - 1);
        if (::munmap(reinterpret_cast<void*>(beg), end - beg) != 0) co_return;
        char b = 1;
        if (::write(go_fd, &b, 1) != 1) co_return;  // tell the parent to read now
        std::vector<Tensor> small{pattern_tensor(100, 3)};
        if (!(*c)->send(frame_of(FrameKind::request, 2, small), true)) co_return;
        auto reply = co_await (*c)->receive();
        ok = reply && reply->id == 2;
    }, [&](std::exception_ptr) {});
    ctx.run_for(20s);
    ::_exit(ok ? 0 : 1);
}
}  // namespace

TEST_CASE("the sender's memory going away during a cma read fails that frame alone", "[transport][cma][process]") {
    const bool gone = GENERATE(false, true);
    INFO((gone ? "the process is gone" : "the range is not mapped there"));
    // The listening socket exists before the fork (the child connects to it); the parent's
    // event loop takes it over afterwards.
    asio::io_context setup(1);
    asio::ip::tcp::acceptor listening(setup, {asio::ip::make_address("127.0.0.1"), 0});
    const auto port = listening.local_endpoint().port();
    int go[2];
    REQUIRE(::pipe(go) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(go[0]);
        vanishing_sender(port, gone, go[1]);
    }
    ::close(go[1]);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        asio::ip::tcp::acceptor acc(co_await asio::this_coro::executor, asio::ip::tcp::v4(), listening.release());
        auto c = co_await test::accept_one(acc, cma_hello("server", 1), ConnectionLimits{});
        REQUIRE(c);
        REQUIRE(channel_of(**c) == "cma");
        if (gone) {
            REQUIRE(::waitpid(pid, nullptr, 0) == pid);  // the sender has exited: its memory is gone
        } else {
            char b = 0;
            REQUIRE(::read(go[0], &b, 1) == 1);  // its pages are unmapped
        }
        auto got = co_await (*c)->receive();
        REQUIRE(got);  // the frame arrives, failed
        REQUIRE(got->alloc_error);
        INFO(got->alloc_error->to_string());
        CHECK(got->alloc_error->code() == (gone ? Errc::connection_lost : Errc::io_error));
        CHECK(got->alloc_error->message().find("by cma") != std::string::npos);
        CHECK(got->alloc_error->message().find("worker \"client\"") != std::string::npos);
        if (gone) co_return;  // (the peer's end closed with it)
        // The connection stays and carries the next frame (inline); the hold was released anyway.
        CHECK((*c)->is_open());
        auto next = co_await (*c)->receive();
        REQUIRE(next);
        REQUIRE_FALSE(next->alloc_error);
        REQUIRE(next->tensors.size() == 1);
        CHECK(same_bytes(next->tensors[0], pattern_tensor(100, 3)));
        REQUIRE((*c)->send(frame_of(FrameKind::response, 2, {}), true));
    });
    ::close(go[0]);
    if (!gone) {
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
    }
}

TEST_CASE("a peer whose cma offer names another process (one that passes the probe) gets basic", "[transport][cma][fault]") {
    const bool client_lies = GENERATE(true, false);
    const bool keyed = GENERATE(false, true);
    INFO((client_lies ? "the client" : "the server") << " names a forked child's pid; key: " << keyed);
    // The child has our probe buffer (forked), so the probe alone would pass and we would read
    // the child's memory for that peer's tensors: the pid is not the connection's other end.
    Idle child;
    const HelloInfo client = client_lies ? cma_hello_as("client", 0, child.pid, false) : cma_hello("client", 0);
    const HelloInfo server = client_lies ? cma_hello("server", 1) : cma_hello_as("server", 1, child.pid, false);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto p = co_await pair_of(client, server, keyed ? "k3y" : "");
        CHECK(channel_of(*p.client) == "basic");
        CHECK(channel_of(*p.server) == "basic");
        CHECK(p.client->negotiated() == p.server->negotiated());
        std::vector<Tensor> ts{pattern_tensor(1u << 20, 1)};
        co_await echo_and_check(p, ts);
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_sent == 0);
        CHECK(tensorplay::detail::channel_stats(*p.server).cma_received == 0);
    });
}

TEST_CASE("cma holds are dropped when the connection closes", "[transport][cma]") {
    const HelloInfo client = cma_hello("client", 0), server = cma_hello("server", 1);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await pair_of(client, server, "");
        Tensor t = pattern_tensor(1u << 20, 4);
        std::vector<Tensor> ts{t, t};
        REQUIRE(p.client->send(frame_of(FrameKind::request, 1, ts), true));
        ts.clear();
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_held == 1);
        CHECK(t.storage().use_count() == 3);  // ours and the hold's two
        p.client->close();
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_held == 0);
        CHECK(t.storage().use_count() == 1);
    });
}

TEST_CASE("bytes a peer holds by reference are bounded: past the bound, tensors go inline", "[transport][cma][fault]") {
    const HelloInfo client = cma_hello("client", 0), server = cma_hello("server", 1);
    std::vector<Tensor> ts;
    for (unsigned i = 0; i < 4; ++i) ts.push_back(pattern_tensor(1u << 20, 10 + i));
    test::run_with_deadline(10s, [&]() -> Task<void> {
        ConnectionLimits bounded;
        bounded.max_held_bytes = (2u << 20) + 100;
        auto p = co_await pair_of(client, server, "", bounded);
        REQUIRE(channel_of(*p.client) == "cma");
        for (unsigned i = 0; i < 4; ++i) REQUIRE(p.client->send(frame_of(FrameKind::request, i + 1, {ts[i]}), true));
        // Nothing is released yet (the server has read nothing): two fit the bound, two go inline.
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_sent == 2);
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_held == 2);
        for (unsigned i = 0; i < 4; ++i) {
            auto got = co_await p.server->receive();
            REQUIRE(got);
            REQUIRE_FALSE(got->alloc_error);
            REQUIRE(got->tensors.size() == 1);
            CHECK(same_bytes(got->tensors[0], ts[i]));
        }
        CHECK(tensorplay::detail::channel_stats(*p.server).cma_received == 2);
        // The releases came before this reply: the bound has room again.
        REQUIRE(p.server->send(frame_of(FrameKind::response, 1, {}), true));
        auto reply = co_await p.client->receive();
        REQUIRE(reply);
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_held == 0);
        REQUIRE(p.client->send(frame_of(FrameKind::request, 5, {ts[0]}), true));
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_sent == 3);
        auto last = co_await p.server->receive();
        REQUIRE(last);
        CHECK(same_bytes(last->tensors.at(0), ts[0]));
    });
}

TEST_CASE("a frame whose sender let go of its tensors before they were read fails; nothing of it is delivered", "[transport][cma]") {
    const HelloInfo client = cma_hello("client", 0), server = cma_hello("server", 1);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await pair_of(client, server, "");
        REQUIRE(channel_of(*p.client) == "cma");
        Tensor t = pattern_tensor(1u << 20, 5);
        REQUIRE(p.client->send(frame_of(FrameKind::request, 1, {t}), true));
        CHECK(tensorplay::detail::channel_stats(*p.client).cma_held == 1);
        // The sender closes with the frame on the wire, unread, and reuses the memory (the test
        // keeps it mapped, so the read itself succeeds: only the lease tells).
        p.client->close();
        std::memset(t.data(), 0xee, t.nbytes());
        auto got = co_await p.server->receive();
        REQUIRE(got);
        REQUIRE(got->alloc_error);
        INFO(got->alloc_error->to_string());
        CHECK(got->alloc_error->code() == Errc::connection_lost);
        CHECK(got->alloc_error->message().find("let go of its tensors") != std::string::npos);
        CHECK(got->tensors.empty());
    });
}

TEST_CASE("a large cma read leaves the event loop serving its other work", "[transport][cma]") {
    const HelloInfo client = cma_hello("client", 0), server = cma_hello("server", 1);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        using namespace td::awaitable_ops;
        auto p = co_await pair_of(client, server, "");
        REQUIRE(channel_of(*p.client) == "cma");
        const Tensor big = pattern_tensor(64u << 20, 6);
        const auto before = td::cma::reads_off_loop();
        REQUIRE(p.client->send(frame_of(FrameKind::request, 1, {big}), true));
        // Turns of the event loop while the server reads the frame: a read on the loop itself
        // (some 20 ms for 64 MiB here) would leave next to none.
        bool received = false;
        std::size_t turns = 0;
        auto count_turns = [&]() -> Task<void> {
            auto ex = co_await asio::this_coro::executor;
            while (!received) {
                co_await asio::post(ex, td::use_nothrow);
                ++turns;
            }
        };
        auto receive = [&]() -> Task<Result<Frame>> {
            auto f = co_await p.server->receive();
            received = true;
            co_return f;
        };
        auto got = co_await (receive() && count_turns());
        REQUIRE(got);
        REQUIRE_FALSE(got->alloc_error);
        REQUIRE(got->tensors.size() == 1);
        CHECK(same_bytes(got->tensors[0], big));
        CHECK(td::cma::reads_off_loop() == before + 1);
        INFO("event loop turns during the read: " << turns);
        CHECK(turns >= 100);
    });
}

TEST_CASE("cma leases: unique ids, read back by a peer, let go on release, and a bounded table", "[transport][cma]") {
    namespace cma = td::cma;
    const int self = ::getpid();
    const auto table = cma::lease_table_address();
    auto a = cma::Lease::acquire(), b = cma::Lease::acquire();
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->id() != b->id());
    CHECK(cma::lease_held(self, table, a->id()));
    const auto old = a->id();
    a->release();
    CHECK_FALSE(cma::lease_held(self, table, old));
    CHECK(cma::lease_held(self, table, b->id()));
    // A new lease may take the same slot; the old id never reads as held again.
    auto c = cma::Lease::acquire();
    REQUIRE(c);
    CHECK(c->id() != old);
    CHECK_FALSE(cma::lease_held(self, table, old));
    CHECK_FALSE(cma::lease_held(self, 0, c->id()));
    // Every slot taken: acquire says so (the sender then goes inline); one freed, one more.
    std::vector<cma::Lease> all;
    while (auto l = cma::Lease::acquire()) all.push_back(std::move(*l));
    CHECK(all.size() + 2 == cma::kLeaseSlots);  // b and c hold the other two
    const auto moved = all.back().id();
    cma::Lease m = std::move(all.back());
    all.pop_back();
    CHECK(cma::lease_held(self, table, moved));  // a move keeps it held
    m.release();
    CHECK(cma::Lease::acquire());
}

namespace {
/// A raw client that finished a plain (basic) handshake with a server Connection.
struct Raw {
    asio::ip::tcp::acceptor acc;
    asio::ip::tcp::socket sock;
};
Task<std::shared_ptr<Connection>> raw_handshake(Raw& r, const Bytes& client_hello, const HelloInfo& server) {
    using namespace td::awaitable_ops;
    auto [ec] = co_await r.sock.async_connect(r.acc.local_endpoint(), td::use_nothrow);
    REQUIRE(!ec);
    co_await test::raw_write(r.sock, client_hello);
    auto conn = co_await (test::accept_one(r.acc, server, ConnectionLimits{}) && test::raw_read_hello(r.sock));
    REQUIRE(conn);
    co_return *conn;
}
Bytes by_reference_frame() {
    WireWriter meta;
    meta.str32("echo").u32(1);
    meta.u8(0).u8(0).u16(0xffff).u8(0).u16(0xffff).u8(1).u64(1u << 20).u64(1u << 20);  // uint8 [1 MiB] cpu -> cpu
    meta.u64(0x10000).u64(1);                                                            // address, hold
    WireWriter w;
    w.u16(td::kFrameMarker).u8(1).u8(td::kFrameByReference).u32(static_cast<std::uint32_t>(meta.size())).u64(1).u64(0);
    w.raw(meta.data());
    return std::move(w).take();
}
}  // namespace

TEST_CASE("a peer that sends by reference without cma, or releases an unknown hold, is a protocol error", "[transport][cma][fault]") {
    const bool release = GENERATE(false, true);
    INFO((release ? "release of an unknown hold" : "tensor by reference on a basic pair"));
    const Bytes client_hello = td::encode_hello(test::hello("raw", 7));
    const HelloInfo server = cma_hello("server", 0);
    const Bytes bad = release ? td::encode_release(42) : by_reference_frame();
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Raw r{asio::ip::tcp::acceptor(ex, {asio::ip::make_address("127.0.0.1"), 0}), asio::ip::tcp::socket(ex)};
        auto conn = co_await raw_handshake(r, client_hello, server);
        REQUIRE(channel_of(*conn) == "basic");  // the raw client offered basic only
        co_await test::raw_write(r.sock, bad);
        auto f = co_await conn->receive();
        REQUIRE_FALSE(f);
        INFO(f.error().to_string());
        CHECK(f.error().code() == Errc::protocol_error);
        CHECK(f.error().message().find(release ? "do not hold" : "chose no channel that does") != std::string::npos);
        CHECK_FALSE(conn->is_open());
    });
}

namespace {
/// The child's side of the two-process test: accepts one connection on `acc_fd`'s port and echoes
/// every frame back until the peer closes. Exit status 0 when it served at least one frame.
int echo_server(std::uint16_t port_out_fd) {
    asio::io_context ctx(1);
    int served = 0;
    bool ok = true;
    asio::ip::tcp::acceptor acc(ctx, {asio::ip::make_address("127.0.0.1"), 0});
    const std::uint16_t port = acc.local_endpoint().port();
    if (::write(port_out_fd, &port, sizeof port) != sizeof port) return 3;
    const HelloInfo hello = cma_hello("server", 1);
    asio::co_spawn(ctx, [&]() -> Task<void> {
        auto c = co_await test::accept_one(acc, hello, ConnectionLimits{});
        if (!c) {
            ok = false;
            co_return;
        }
        for (;;) {
            auto f = co_await (*c)->receive();
            if (!f) break;
            if (f->alloc_error) ok = false;
            Frame back = frame_of(FrameKind::response, f->id, std::move(f->tensors));
            if (!(*c)->send(std::move(back), true)) break;
            ++served;
        }
    }, [&](std::exception_ptr e) { ok = ok && !e; });
    ctx.run_for(20s);
    return ok && served > 0 ? 0 : 1;
}
}  // namespace

TEST_CASE("cma between two processes: tensors of every size round-trip byte for byte", "[transport][cma][process]") {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(p[0]);
        ::_exit(echo_server(static_cast<std::uint16_t>(p[1])));
    }
    ::close(p[1]);
    std::uint16_t port = 0;
    REQUIRE(::read(p[0], &port, sizeof port) == sizeof port);
    ::close(p[0]);
    const HelloInfo client = cma_hello("client", 0);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto c = co_await Connection::connect("127.0.0.1", port, client, ConnectionLimits{});
        REQUIRE(c);
        CHECK(channel_of(**c) == "cma");
        const auto s = sizes();
        std::vector<Tensor> ts;
        for (std::size_t i = 0; i < s.size(); ++i) ts.push_back(pattern_tensor(s[i], static_cast<unsigned>(i) + 9));
        for (unsigned i = 0; i < 100; ++i) ts.push_back(pattern_tensor(i % 3 ? 100 + i : (td::kCmaMinBytes << 1) + i, i));
        for (std::uint64_t round = 1; round <= 3; ++round) {
            REQUIRE((*c)->send(frame_of(FrameKind::request, round, ts), true));
            auto back = co_await (*c)->receive();
            REQUIRE(back);
            REQUIRE_FALSE(back->alloc_error);
            REQUIRE(back->tensors.size() == ts.size());
            for (std::size_t i = 0; i < ts.size(); ++i) CHECK(same_bytes(back->tensors[i], ts[i]));
            CHECK(tensorplay::detail::channel_stats(**c).cma_held == 0);  // the child's release came before its reply
        }
        CHECK(tensorplay::detail::channel_stats(**c).cma_received > 0);
        (*c)->close();
    });
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace tp_cma_channel_test
