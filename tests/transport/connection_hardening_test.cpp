// Connection against hostile and dying peers: ends that come with the last bytes, claimed lengths,
// per-socket memory, slow senders.
#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"
#include "transport/frame.hpp"
#include "support/sanitizers.hpp"
#include "support/usage.hpp"
#include "transport/transport_test_util.hpp"

#include <tensorplay/core/wire.hpp>

#include <asio/steady_timer.hpp>

#include <sys/socket.h>

#include <fstream>
#include <string>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_connection_hardening_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

/// VmRSS of this process in bytes.
using test::rss_bytes;

using test::sleep_for;

struct Peer {
    asio::ip::tcp::socket raw;
    std::shared_ptr<Connection> conn;
};

/// A raw socket that completed a valid handshake, and the server's Connection for it.
Task<Peer> handshaken(asio::ip::tcp::acceptor& acc, ConnectionLimits limits = {}) {
    using namespace tensorplay::detail::awaitable_ops;
    auto ex = co_await asio::this_coro::executor;
    asio::ip::tcp::socket raw(ex);
    auto [ec] = co_await raw.async_connect(acc.local_endpoint(), tensorplay::detail::use_nothrow);
    REQUIRE(!ec);
    co_await test::raw_write(raw, tensorplay::detail::encode_hello(test::hello("raw", 7)));
    auto conn = co_await (test::accept_one(acc, test::hello("server", 0), limits) && test::raw_read_hello(raw));
    REQUIRE(conn);
    co_return Peer{std::move(raw), *conn};
}

/// Ends the stream now: a FIN (shutdown) or a reset (close with SO_LINGER 0).
void end_now(asio::ip::tcp::socket& s, bool reset) {
    if (reset) {
        s.set_option(asio::socket_base::linger(true, 0));
        s.close();
    } else {
        ::shutdown(s.native_handle(), SHUT_WR);
    }
}

/// Counts what a connection hands over; `awaits`: says it waits for input (as a caller's does).
struct CountingSink final : FrameSink {
    test::SinkEvents* events = nullptr;
    bool awaits = false;
    int frames = 0;
    std::optional<Frame> last;
    std::optional<Error> closed;
    void on_small_frame(const FrameView&) override {
        ++frames;
        events->notify();
    }
    void on_frame(Frame&& f) override {
        ++frames;
        last = std::move(f);
        events->notify();
    }
    void on_closed(const Error& e) override {
        closed = e;
        events->notify();
    }
    bool awaiting_input() const override { return awaits; }
};

}  // namespace

// The peer's last bytes and its FIN (or RST) arrive in one readiness edge; the read that takes the
// bytes drains the socket. Without a second look, nothing would ever report the end: the server
// would hold the socket in CLOSE-WAIT with its buffers, forever.
TEST_CASE("a frame cut off by a FIN or reset that comes with its last bytes closes the connection", "[transport][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        test::SinkEvents events(ex);
        int closed = 0;
        for (int round = 0; round < 400; ++round) {
            const bool reset = round % 2 == 1;
            const bool short_reads = round % 4 >= 2;
            auto p = co_await handshaken(acc);
            tensorplay::detail::set_short_reads(*p.conn, short_reads);
            auto sink = std::make_shared<CountingSink>();
            sink->events = &events;
            tensorplay::detail::dispatch_to(*p.conn, sink);
            co_await sleep_for(0ms);  // (the reader is now waiting for the next edge)
            Bytes cut = test::frame_head(1, 1, "h", 1000);
            cut.resize(cut.size() + 300);  // 300 of the 1,000 payload bytes
            test::send_now(p.raw, cut);
            end_now(p.raw, reset);
            co_await events.until([&] { return sink->closed.has_value(); });
            CHECK(sink->frames == 0);
            CHECK(sink->closed->code() == Errc::connection_lost);
            CHECK_FALSE(p.conn->is_open());
            ++closed;
        }
        CHECK(closed == 400);
    });
}

// A caller's connection: a reply that is whole, with the peer's reset right behind it, while
// another call still waits. The sink says it awaits input, so the reader looks once more.
TEST_CASE("a sink that awaits input sees a reset that came with a whole frame at once", "[transport][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        test::SinkEvents events(ex);
        for (int round = 0; round < 50; ++round) {
            auto p = co_await handshaken(acc);
            tensorplay::detail::set_short_reads(*p.conn, true);
            auto sink = std::make_shared<CountingSink>();
            sink->events = &events;
            sink->awaits = true;
            tensorplay::detail::dispatch_to(*p.conn, sink);
            co_await sleep_for(0ms);
            Bytes whole = test::frame_head(1, 1, "h", 4);
            whole.resize(whole.size() + 4);
            test::send_now(p.raw, whole);
            end_now(p.raw, true);
            co_await events.until([&] { return sink->closed.has_value(); });
            CHECK(sink->frames == 1);
        }
    });
}

// A 2 GiB claim with a few bytes behind it: memory follows the bytes that arrived, the loop keeps
// serving others, and the cut connection gives everything back.
TEST_CASE("a payload length claimed in a header costs memory only as its bytes arrive", "[transport][fault]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        test::SinkEvents events(ex);
        auto p = co_await handshaken(acc);
        auto sink = std::make_shared<CountingSink>();
        sink->events = &events;
        tensorplay::detail::dispatch_to(*p.conn, sink);
        const std::size_t before = rss_bytes();
        Bytes head = test::frame_head(1, 1, "h", std::uint64_t(1) << 31);  // exactly the limit
        head.resize(head.size() + 64 * 1024);
        const auto reads = p.conn->stats().reads;
        co_await test::raw_write(p.raw, head);
        while (p.conn->stats().reads == reads) co_await sleep_for(1ms);
        co_await sleep_for(50ms);
        const std::size_t grown = rss_bytes() - before;
        INFO("RSS grew by " << grown / 1024 << " KiB");
        CHECK(grown < (64u << 20));
        CHECK(p.conn->is_open());

        // Another connection is served meanwhile.
        auto pair = co_await test::make_pair();
        Frame f;
        f.id = 5;
        f.name = "other";
        REQUIRE(pair.client->send(std::move(f), true));
        auto got = co_await pair.server->receive();
        REQUIRE(got);
        CHECK(got->id == 5u);

        p.raw.close();
        co_await events.until([&] { return sink->closed.has_value(); });
        CHECK(sink->closed->code() == Errc::connection_lost);
    });
}

TEST_CASE("a frame over the shared receive budget is answered with an error and the connection goes on", "[transport][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        ConnectionLimits limits;
        limits.budget = std::make_shared<ReceiveBudget>(1 << 20);
        auto p = co_await handshaken(acc, limits);
        Bytes big = test::frame_head(1, 1, "h", 4 << 20);
        big.resize(big.size() + (4 << 20), 0xAB);
        Bytes small = test::frame_head(1, 1, "h", 3);
        small.resize(small.size() + 3, 0x01);
        big.insert(big.end(), small.begin(), small.end());
        using namespace tensorplay::detail::awaitable_ops;
        auto reading = p.conn->receive();
        auto writing = test::raw_write(p.raw, big);
        auto r = co_await (std::move(reading) && std::move(writing));
        REQUIRE(r);
        REQUIRE(r->alloc_error);
        CHECK(r->alloc_error->message().find("receive budget") != std::string::npos);
        CHECK(limits.budget->used() == 0);
        auto next = co_await p.conn->receive();
        REQUIRE(next);
        CHECK(next->payload == Bytes(3, 0x01));
        CHECK(p.conn->is_open());

        // Within the budget: a tensor frame takes from it while arriving and gives it back.
        auto pair = co_await test::make_pair(limits);
        Frame f;
        f.id = 8;
        f.tensors.push_back(Tensor::cpu(DType::uint8, {512 * 1024}));
        REQUIRE(pair.client->send(std::move(f), true));
        auto t = co_await pair.server->receive();
        REQUIRE(t);
        CHECK_FALSE(t->alloc_error);
        REQUIRE(t->tensors.size() == 1);
        CHECK(limits.budget->used() == 0);
    });
}

// Before its handshake a socket holds a small buffer, not the 256 KiB read buffer.
TEST_CASE("500 sockets that never say hello cost little memory", "[transport][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        acc.listen(1024);
        constexpr int n = 500;
        std::vector<asio::ip::tcp::socket> raws;
        int accepted = 0, ended = 0;
        // Warm up (allocator arenas, coroutine frames) before measuring.
        for (int i = 0; i < 8; ++i) {
            raws.emplace_back(ex);
            raws.back().connect(acc.local_endpoint());
        }
        ConnectionLimits limits;
        limits.handshake_timeout = 20s;
        auto accept_all = [&](int count) -> Task<void> {
            for (int i = 0; i < count; ++i) {
                auto [ec, s] = co_await acc.async_accept(tensorplay::detail::use_nothrow);
                REQUIRE(!ec);
                ++accepted;
                asio::co_spawn(ex, test::accept_socket(std::move(s), test::hello("server", 0), limits),
                               [&ended](std::exception_ptr, Result<std::shared_ptr<Connection>>) { ++ended; });
            }
        };
        co_await asio::co_spawn(ex, accept_all(8), asio::use_awaitable);
        co_await sleep_for(20ms);
        const std::size_t before = rss_bytes();
        for (int i = 0; i < n; ++i) {
            raws.emplace_back(ex);
            raws.back().connect(acc.local_endpoint());
        }
        co_await asio::co_spawn(ex, accept_all(n), asio::use_awaitable);
        co_await sleep_for(50ms);
        const std::size_t grown = rss_bytes() - before;
        INFO("RSS grew by " << grown / 1024 << " KiB for " << n << " silent sockets");
        CHECK(accepted == n + 8);
        CHECK(grown < test::kRssGrowthFactor * (16u << 20));  // (TSan: its shadow memory too)
        for (auto& r : raws) r.close();
        while (ended < n + 8) co_await sleep_for(5ms);
    });
}

TEST_CASE("frames that keep arriving are not cut by the frame timeout; an idle timeout closes a silent connection", "[transport][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        ConnectionLimits limits;
        limits.frame_timeout = 100ms;
        auto pair = co_await test::make_pair(limits);
        for (int i = 0; i < 30; ++i) {  // 600 ms of small frames, each whole at once
            Frame f;
            f.id = static_cast<std::uint64_t>(i);
            REQUIRE(pair.client->send(std::move(f), true));
            auto got = co_await pair.server->receive();
            REQUIRE(got);
            co_await sleep_for(20ms);
        }
        CHECK(pair.server->is_open());

        // Only the server has the idle timeout (the client's own close would end it first).
        using namespace tensorplay::detail::awaitable_ops;
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        ConnectionLimits idle;
        idle.idle_timeout = 150ms;
        auto accepting = test::accept_one(acc, test::hello("server", 1), idle);
        auto connecting = Connection::connect("127.0.0.1", acc.local_endpoint().port(), test::hello("client", 0));
        auto [server, client] = co_await (std::move(accepting) && std::move(connecting));
        REQUIRE(server);
        REQUIRE(client);
        const auto t0 = Clock::now();
        auto r = co_await (*server)->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK(r.error().message().find("idle_timeout") != std::string::npos);
        CHECK(Clock::now() - t0 < 2s);
    });
}

namespace {
/// The metadata block of one tensor of `dtype` and `shape` announcing `nbytes`.
Bytes tensor_meta(DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t nbytes) {
    WireWriter meta;
    meta.str32("h").u32(1);
    meta.u8(static_cast<std::uint8_t>(dtype)).u8(0).u16(0xFFFF).u8(0).u16(0xFFFF).u8(static_cast<std::uint8_t>(shape.size()));
    for (auto d : shape) meta.i64(d);
    meta.u64(nbytes);
    return std::move(meta).take();
}
}  // namespace

// decode_frame_meta used to accept shapes that checked_nbytes refuses (the frame then failed as a
// device_error, and numel() overflowed): a protocol error, decided when the metadata is read.
TEST_CASE("a tensor shape whose size overflows is a protocol error", "[transport][fault]") {
    struct Case {
        DType dtype;
        std::vector<std::int64_t> shape;
    };
    const std::vector<Case> cases{{DType::uint8, {std::int64_t(1) << 32, std::int64_t(1) << 31, 0}},
                                  {DType::int64, {(std::int64_t(1) << 62) + 1, 0}}};
    for (const auto& c : cases) {
        auto m = tensorplay::detail::decode_frame_meta(tensor_meta(c.dtype, c.shape, 0), ConnectionLimits{});
        REQUIRE_FALSE(m);
        CHECK(m.error().code() == Errc::protocol_error);
        CHECK(m.error().message().find("overflows") != std::string::npos);
    }
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        auto p = co_await handshaken(acc);
        const Bytes meta = tensor_meta(DType::uint8, cases[0].shape, 0);
        Bytes f = test::frame_header(1, static_cast<std::uint32_t>(meta.size()), 3, 0);
        f.insert(f.end(), meta.begin(), meta.end());
        co_await test::raw_write(p.raw, f);
        auto r = co_await p.conn->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::protocol_error);
        CHECK_FALSE(p.conn->is_open());
    });
}

TEST_CASE("a bad frame marker is named in hex", "[transport][fault]") {
    Bytes header(detail::kFrameHeaderSize, 0);
    header[0] = 0xef;  // 0xbeef, little-endian
    header[1] = 0xbe;
    auto h = detail::decode_frame_header(header, ConnectionLimits{});
    REQUIRE_FALSE(h);
    CHECK_THAT(h.error().message(), Catch::Contains("bad frame marker 0xbeef"));
}

}  // namespace tp_connection_hardening_test
