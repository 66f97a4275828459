// Connection under attack and failure: garbage, huge lengths, half frames, bad handshakes, timeouts.
#include <tensorplay/transport/connection.hpp>
#include <tensorplay/device/backend.hpp>

#include "transport/connection_ext.hpp"
#include "transport/transport_test_util.hpp"

#include <tensorplay/core/wire.hpp>

#include <asio/steady_timer.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_connection_fault_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

struct RawClient {
    asio::ip::tcp::acceptor acc;
    asio::ip::tcp::socket raw;
};

/// A raw socket connected to an acceptor; `accepted` runs the server handshake (test::accept_socket) on the other end.
Task<std::unique_ptr<RawClient>> raw_client() {
    auto ex = co_await asio::this_coro::executor;
    auto rc = std::make_unique<RawClient>(RawClient{asio::ip::tcp::acceptor(ex, {asio::ip::make_address("127.0.0.1"), 0}),
                                                    asio::ip::tcp::socket(ex)});
    auto [ec] = co_await rc->raw.async_connect(rc->acc.local_endpoint(), tensorplay::detail::use_nothrow);
    REQUIRE(!ec);
    co_return rc;
}

/// Raw client that completed a valid handshake; returns the server-side Connection.
Task<std::shared_ptr<Connection>> handshaken(RawClient& rc, ConnectionLimits limits = {}) {
    using namespace tensorplay::detail::awaitable_ops;
    co_await test::raw_write(rc.raw, tensorplay::detail::encode_hello(test::hello("raw", 7)));
    auto conn = co_await (test::accept_one(rc.acc, test::hello("server", 0), limits) && test::raw_read_hello(rc.raw));
    REQUIRE(conn);
    co_return *conn;
}

}  // namespace

TEST_CASE("garbage after a good frame: dispatch_to hands over the frame, then the protocol error", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        struct Sink final : FrameSink {
            test::SinkEvents* events = nullptr;
            std::vector<std::uint64_t> ids;
            std::optional<Error> why;
            void on_small_frame(const FrameView& f) override { ids.push_back(f.id); }
            void on_frame(Frame&& f) override { ids.push_back(f.id); }
            void on_closed(const Error& e) override {
                why = e;
                events->notify();
            }
        };
        auto rc = co_await raw_client();
        auto conn = co_await handshaken(*rc);
        test::SinkEvents events(co_await asio::this_coro::executor);
        auto sink = std::make_shared<Sink>();
        sink->events = &events;
        tensorplay::detail::dispatch_to(*conn, sink);
        Frame f;
        f.id = 42;
        f.name = "ok";
        f.payload = bytes("fine");
        Bytes wire;
        bool inl = false;
        REQUIRE(tensorplay::detail::encode_frame_head(f, ConnectionLimits{}, wire, inl));
        REQUIRE(inl);
        const Bytes junk = bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n");  // (longer than a frame header)
        wire.insert(wire.end(), junk.begin(), junk.end());
        co_await test::raw_write(rc->raw, wire);
        co_await events.until([&] { return sink->why.has_value(); });
        REQUIRE(sink->ids.size() == 1);
        CHECK(sink->ids[0] == 42);
        CHECK(sink->why->code() == Errc::protocol_error);
        CHECK_FALSE(conn->is_open());
    });
}

TEST_CASE("a tensor whose byte count disagrees with its shape is refused", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto rc = co_await raw_client();
        auto conn = co_await handshaken(*rc);
        WireWriter meta;
        meta.str32("h").u32(1);
        meta.u8(static_cast<std::uint8_t>(DType::float32)).u8(0).u16(0xFFFF).u8(0).u16(0xFFFF).u8(1).i64(4).u64(1 << 30);
        auto h = test::frame_header(1, static_cast<std::uint32_t>(meta.size()), 1, 0);
        h.insert(h.end(), meta.data().begin(), meta.data().end());
        co_await test::raw_write(rc->raw, h);
        auto r = co_await conn->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::protocol_error);
        CHECK(r.error().message().find("does not match") != std::string::npos);
    });
}

namespace {
/// A whole frame with a 5-byte payload and no tensors.
Bytes small_frame(std::uint64_t id) {
    WireWriter meta;
    meta.str32("h").u32(0);
    auto f = test::frame_header(1, static_cast<std::uint32_t>(meta.size()), id, 5);
    f.insert(f.end(), meta.data().begin(), meta.data().end());
    for (char c : std::string("hello")) f.push_back(static_cast<std::uint8_t>(c));
    return f;
}
}  // namespace

namespace {
/// The peer sends a whole frame and then closes (`reset`: with an RST instead of a FIN); both are
/// in before the first read. The frame must come out, then the end of the connection, at once.
/// `reply`: answer the frame before reading on (the reader then waits for the next edge, and the
/// reset that the reply provokes ends it).
Task<void> frame_then_end(bool reset, bool short_reads = false, bool reply = false) {
    auto rc = co_await raw_client();
    auto conn = co_await handshaken(*rc);
    tensorplay::detail::set_short_reads(*conn, short_reads);
    co_await test::raw_write(rc->raw, small_frame(9));
    if (reset) rc->raw.set_option(asio::socket_base::linger(true, 0));  // close sends RST
    rc->raw.close();
    asio::steady_timer t(co_await asio::this_coro::executor, 20ms);
    co_await t.async_wait(asio::use_awaitable);
    auto f = co_await conn->receive();
    REQUIRE(f);
    CHECK(f->id == 9u);
    if (reply) {
        Frame back;
        back.kind = FrameKind::response;
        back.id = 9;
        REQUIRE(conn->send(std::move(back), true));  // the peer's socket is gone: it answers with a reset
    }
    auto r = co_await conn->receive();
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == Errc::connection_lost);
    CHECK_FALSE(conn->is_open());
}
}  // namespace

// The read that takes the frame drains the socket; the FIN left behind has spent its readiness
// edge, and the kernel's TCP_INQ count (which includes a FIN) must keep the reader looking.
TEST_CASE("a peer that sends a frame and closes: the frame, then connection_lost", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> { co_await frame_then_end(false); });
}

// A reset is not counted by TCP_INQ: a receive() that waits with nothing sent since looks again.
TEST_CASE("a peer that sends a frame and resets: the frame, then an error", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> { co_await frame_then_end(true); });
}

// Short reads: a FIN is found like a reset, at once by a receive() that waits...
TEST_CASE("short reads: a peer that sends a frame and closes: the frame, then connection_lost", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> { co_await frame_then_end(false, true); });
}

TEST_CASE("short reads: a peer that sends a frame and resets: the frame, then an error", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> { co_await frame_then_end(true, true); });
}

// ...and after a send by the reset that send provokes.
TEST_CASE("short reads: a FIN that came with the last frame is found by the next send", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> { co_await frame_then_end(false, true, true); });
}

TEST_CASE("a handshake with a bad magic is refused", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto rc = co_await raw_client();
        co_await test::raw_write(rc->raw, tensorplay::detail::encode_hello(test::hello("raw", 0), 0xDEADBEEF));
        auto c = co_await test::accept_one(rc->acc, test::hello("server", 0), {});
        REQUIRE_FALSE(c);
        CHECK(c.error().code() == Errc::protocol_error);
        CHECK(c.error().message().find("magic") != std::string::npos);
    });
}

TEST_CASE("a handshake with another protocol version is refused on both sides", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto rc = co_await raw_client();
        co_await test::raw_write(rc->raw, tensorplay::detail::encode_hello(test::hello("raw", 0), kProtocolMagic, 99));
        auto c = co_await test::accept_one(rc->acc, test::hello("server", 0), {});
        REQUIRE_FALSE(c);
        CHECK(c.error().code() == Errc::protocol_error);
        CHECK(c.error().message().find("version 99") != std::string::npos);

        // A server that answers with a later version: the client refuses it and names both versions.
        auto ex = co_await asio::this_coro::executor;
        asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
        auto port = acc.local_endpoint().port();
        using namespace tensorplay::detail::awaitable_ops;
        auto fake_server = [&acc]() -> Task<void> {
            auto [ec, s] = co_await acc.async_accept(tensorplay::detail::use_nothrow);
            REQUIRE(!ec);
            co_await test::raw_read_hello(s);
            co_await test::raw_write(s, tensorplay::detail::encode_hello(test::hello("future", 1), kProtocolMagic, kProtocolVersion + 1));
        };
        auto cl = co_await (asio::co_spawn(ex, fake_server, asio::use_awaitable) &&
                                      Connection::connect("127.0.0.1", port, test::hello("client", 0)));
        REQUIRE_FALSE(cl);
        CHECK(cl.error().code() == Errc::protocol_error);
        CHECK(cl.error().message().find("version " + std::to_string(kProtocolVersion + 1)) != std::string::npos);
    });
}

TEST_CASE("a peer that never completes the handshake times out", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto rc = co_await raw_client();
        ConnectionLimits limits;
        limits.handshake_timeout = 100ms;
        co_await test::raw_write(rc->raw, Bytes(2, std::uint8_t{0x54}));  // two bytes of a hello, then silence
        auto c = co_await test::accept_one(rc->acc, test::hello("server", 0), limits);
        REQUIRE_FALSE(c);
        CHECK(c.error().code() == Errc::timeout);
    });
}

TEST_CASE("connecting to a closed port fails quickly", "[transport][fault]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        std::uint16_t port;
        {
            asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
            port = acc.local_endpoint().port();
        }
        auto c = co_await Connection::connect("127.0.0.1", port, test::hello("client", 0));
        REQUIRE_FALSE(c);
        CHECK(c.error().message().find("127.0.0.1") != std::string::npos);
    });
}

namespace {

Bytes encoded(std::uint64_t id, std::string name, Bytes payload) {
    Frame f;
    f.id = id;
    f.name = std::move(name);
    f.payload = std::move(payload);
    Bytes out;
    bool inl = false;
    REQUIRE(tensorplay::detail::encode_frame_head(f, ConnectionLimits{}, out, inl));
    if (!inl) out.insert(out.end(), f.payload.begin(), f.payload.end());
    return out;
}

Bytes payload_of(std::uint64_t id) { return Bytes((id * 37) % 300, static_cast<std::uint8_t>(id)); }

/// Writes `b` in pieces of `step` bytes, each only once the connection has read the one before
/// (its read count went up): every frame then arrives split across reads.
Task<void> dribble(asio::ip::tcp::socket& raw, const Connection& conn, Bytes b, std::size_t step) {
    auto ex = co_await asio::this_coro::executor;
    asio::steady_timer tick(ex);
    for (std::size_t off = 0; off < b.size(); off += step) {
        const auto reads = conn.stats().reads;
        Bytes piece(b.begin() + off, b.begin() + std::min(b.size(), off + step));
        co_await test::raw_write(raw, std::move(piece));
        while (conn.stats().reads == reads) {
            tick.expires_after(std::chrono::microseconds(200));
            co_await tick.async_wait(tensorplay::detail::use_nothrow);
        }
    }
}

Task<std::vector<Frame>> receive_n(Connection& conn, std::size_t n) {
    std::vector<Frame> got;
    while (got.size() < n) {
        auto f = co_await conn.receive();
        REQUIRE(f);
        got.push_back(std::move(*f));
    }
    co_return got;
}

}  // namespace

// Both ways of telling a drained socket (set_short_reads): with short reads, a read
// that fills the buffer exactly must be followed by another before the reader waits.
TEST_CASE("frames split across reads, and frames straddling the end of the read buffer, arrive whole", "[transport]") {
    test::run_with_deadline(40s, [&]() -> Task<void> {
        for (int mode = 0; mode < 2; ++mode) {
            using namespace tensorplay::detail::awaitable_ops;
            auto rc = co_await raw_client();
            auto conn = co_await handshaken(*rc);
            tensorplay::detail::set_short_reads(*conn, mode == 1);

            // Two frames, 7 bytes per read: headers, names and payloads all arrive in pieces.
            Bytes two = encoded(1, "first", payload_of(1));
            Bytes second = encoded(2, "second", payload_of(2));
            two.insert(two.end(), second.begin(), second.end());
            auto reader = receive_n(*conn, 2);
            auto writer = dribble(rc->raw, *conn, std::move(two), 7);
            auto pieces = co_await (std::move(reader) && std::move(writer));
            REQUIRE(pieces.size() == 2);
            CHECK(pieces[0].id == 1);
            CHECK(pieces[0].name == "first");
            CHECK(pieces[0].payload == payload_of(1));
            CHECK(pieces[1].name == "second");
            CHECK(pieces[1].payload == payload_of(2));

            // 4,000 frames (about 700 KiB) in one write: several cross the end of the 256 KiB buffer.
            Bytes many;
            for (std::uint64_t id = 10; id < 4010; ++id) {
                Bytes one = encoded(id, "n" + std::to_string(id), payload_of(id));
                many.insert(many.end(), one.begin(), one.end());
            }
            REQUIRE(many.size() > 512 * 1024);
            auto bulk_reader = receive_n(*conn, 4000);
            auto bulk_writer = test::raw_write(rc->raw, std::move(many));
            auto frames = co_await (std::move(bulk_reader) && std::move(bulk_writer));
            REQUIRE(frames.size() == 4000);
            bool all_match = true;
            for (std::size_t i = 0; i < frames.size(); ++i) {
                const std::uint64_t id = 10 + i;
                if (frames[i].id != id || frames[i].name != "n" + std::to_string(id) || frames[i].payload != payload_of(id))
                    all_match = false;
            }
            CHECK(all_match);
            CHECK(conn->is_open());
        }
    });
}

namespace {
/// Counts what a dispatch hands over.
struct CountingSink final : FrameSink {
    int frames = 0, closed = 0;
    std::optional<Error> why;
    void on_small_frame(const FrameView&) override { ++frames; }
    void on_frame(Frame&&) override { ++frames; }
    void on_closed(const Error& e) override {
        ++closed;
        why = e;
    }
};

Task<Result<void>> joined(std::shared_ptr<Connection> c) {
    co_await c->join();
    co_return ok();
}
}  // namespace

TEST_CASE("join: a connection closed with its writer blocked on a peer that does not read and a dispatch mid-frame "
          "ends every coroutine",
          "[transport][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto rc = co_await raw_client();
        auto conn = co_await handshaken(*rc);
        auto sink = std::make_shared<CountingSink>();
        tensorplay::detail::dispatch_to(*conn, sink);
        // Half a frame with a 1 MiB tensor: the dispatch's general reader waits for the rest.
        WireWriter meta;
        meta.str32("h").u32(1);
        meta.u8(0).u8(0).u16(0xFFFF).u8(0).u16(0xFFFF).u8(1).i64(1 << 20).u64(1 << 20);
        auto h = test::frame_header(1, static_cast<std::uint32_t>(meta.size()), 1, 0);
        h.insert(h.end(), meta.data().begin(), meta.data().end());
        h.resize(h.size() + 100000);
        co_await test::raw_write(rc->raw, h);
        // 64 MiB queued to a peer that never reads: the writer blocks in its write.
        for (std::uint64_t i = 0; i < 64; ++i) {
            Frame f;
            f.id = i;
            f.name = "x";
            f.payload.resize(1 << 20);
            REQUIRE(conn->send(std::move(f)));
        }
        asio::steady_timer t(ex, 100ms);
        co_await t.async_wait(asio::use_awaitable);
        REQUIRE(conn->is_open());
        CHECK(sink->frames == 0);
        CHECK(conn->stats().reads >= 1);  // (the frame's head was read)

        conn->close(Error(Errc::shutdown, "closed by the test"));
        auto j = co_await with_timeout(joined(conn), 2s);
        REQUIRE(j);  // not Errc::timeout: every coroutine ended
        CHECK(sink->closed == 1);
        CHECK(sink->why->code() == Errc::shutdown);
        const auto stats = conn->stats();
        t.expires_after(50ms);
        co_await t.async_wait(asio::use_awaitable);
        // Nothing of the connection ran after the join: no read, no write, no sink call; the
        // reader let go of the sink.
        CHECK(conn->stats().reads == stats.reads);
        CHECK(conn->stats().writes == stats.writes);
        CHECK(sink->closed == 1);
        CHECK(sink->frames == 0);
        CHECK(sink.use_count() == 1);
    });
}

TEST_CASE("join waits while the connection is open and completes when the peer goes", "[transport][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto rc = co_await raw_client();
        auto conn = co_await handshaken(*rc);
        auto sink = std::make_shared<CountingSink>();
        tensorplay::detail::dispatch_to(*conn, sink);
        auto early = co_await with_timeout(joined(conn), 100ms);
        REQUIRE_FALSE(early);  // open: its writer and reader still run
        CHECK(early.error().code() == Errc::timeout);
        CHECK(conn->is_open());
        rc->raw.close();
        auto j = co_await with_timeout(joined(conn), 2s);
        REQUIRE(j);
        CHECK(sink->closed == 1);
        CHECK_FALSE(conn->is_open());
        (void)ex;
    });
}

namespace {
/// A tensor's bytes in pieces of `piece` bytes, each after a turn of the event loop (as a device
/// copy completes); `fail_at`: the piece whose production fails instead; `short_by`: bytes left
/// out at the end.
struct PieceSource final : tensorplay::detail::ByteSource {
    Bytes bytes;
    std::size_t piece, at = 0, fail_at = SIZE_MAX, short_by = 0;
    int calls = 0;
    PieceSource(Bytes b, std::size_t p) : bytes(std::move(b)), piece(p) {}
    Task<Result<std::span<const std::uint8_t>>> next() override {
        asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
        auto [ec] = co_await t.async_wait(tensorplay::detail::use_nothrow);
        if (ec) co_return fail(Errc::cancelled, "the connection closed");
        if (calls++ == static_cast<int>(fail_at)) co_return fail(Errc::device_error, "the copy of a piece failed");
        const std::size_t end = bytes.size() - short_by;
        const std::size_t n = std::min(piece, end - at);
        std::span<const std::uint8_t> s(bytes.data() + at, n);
        at += n;
        co_return s;
    }
};

Frame small(std::uint64_t id, std::string name) {
    Frame f;
    f.id = id;
    f.payload = bytes(name);
    f.name = std::move(name);
    return f;
}

Bytes counted(std::size_t n, int seed) {
    Bytes b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>((i * 7 + static_cast<std::size_t>(seed)) % 251);
    return b;
}

/// Sends `id` with one tensor of `n` bytes whose bytes come from `src`, behind and before plain frames.
Result<void> send_streamed(Connection& c, std::uint64_t id, std::size_t n, std::shared_ptr<tensorplay::detail::ByteSource> src) {
    auto t = empty(Device::cpu(), DType::uint8, {static_cast<std::int64_t>(n)});
    REQUIRE(t);
    std::vector<Tensor> tensors{*t};
    tensorplay::detail::SendPlan parts;
    parts.streamed.push_back(std::move(src));
    Bytes payload = bytes("streamed");
    const std::string name = "s";
    return tensorplay::detail::send_parts(c, FrameKind::request, id, name, payload, tensors, {}, parts, tensorplay::detail::Flush::now);
}
}  // namespace

TEST_CASE("a tensor written from a source in pieces arrives whole and in order with the frames around it", "[transport]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        const std::size_t n = (std::size_t{1} << 20) + 13;
        const Bytes want = counted(n, 3);
        REQUIRE(p.client->send(small(1, "before")));
        REQUIRE(send_streamed(*p.client, 2, n, std::make_shared<PieceSource>(want, 100000)));
        REQUIRE(p.client->send(small(3, "after")));
        std::vector<Frame> got;
        for (int i = 0; i < 3; ++i) {
            auto f = co_await p.server->receive();
            REQUIRE(f);
            got.push_back(std::move(*f));
        }
        CHECK(got[0].id == 1);
        CHECK(got[1].id == 2);
        CHECK(got[2].id == 3);
        REQUIRE(got[1].tensors.size() == 1);
        const Tensor& t = got[1].tensors[0];
        CHECK(Bytes(t.data(), t.data() + t.nbytes()) == want);
        CHECK(got[1].payload == bytes("streamed"));
        CHECK(p.client->is_open());
    });
}

TEST_CASE("a source that fails, or ends short, closes that connection with the error and no other", "[transport][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        for (int mode = 0; mode < 2; ++mode) {
            auto p = co_await test::make_pair();
            auto other = co_await test::make_pair();
            const std::size_t n = 300000;
            auto src = std::make_shared<PieceSource>(counted(n, 1), 100000);
            if (mode == 0) src->fail_at = 1;
            else src->short_by = 5;
            REQUIRE(send_streamed(*p.client, 7, n, src));
            auto f = co_await p.server->receive();
            CHECK(!f);  // (the frame never arrives whole: its connection ends)
            auto sent = p.client->send(small(8, "x"));
            REQUIRE(!sent);
            INFO(sent.error().to_string());
            CHECK(sent.error().message().find(mode == 0 ? "the copy of a piece failed" : "5 bytes short") != std::string::npos);
            // Another connection goes on.
            REQUIRE(other.client->send(small(9, "y")));
            auto g = co_await other.server->receive();
            REQUIRE(g);
            CHECK(g->id == 9);
        }
    });
}

namespace {
/// Takes a tensor's bytes in pieces of at most `piece` bytes; `fail_at`: the piece it refuses.
struct PieceSink final : tensorplay::detail::ByteSink {
    Bytes got;
    std::size_t piece, handed = 0, fail_at = SIZE_MAX;
    int calls = 0;
    explicit PieceSink(std::size_t p) : piece(p) {}
    Task<Result<std::span<std::uint8_t>>> next() override {
        if (calls++ == static_cast<int>(fail_at)) co_return fail(Errc::device_error, "no room for a piece");
        const std::size_t at = got.size();
        got.resize(at + piece);
        handed = piece;
        co_return std::span<std::uint8_t>(got.data() + at, piece);
    }
    Result<Tensor> finish() override {
        auto t = empty(Device::cpu(), DType::uint8, {static_cast<std::int64_t>(got.size())});
        if (t) std::memcpy(t->data(), got.data(), got.size());
        return t;
    }
};
}  // namespace

TEST_CASE("a sink takes a tensor's bytes in pieces; one that refuses fails that frame only", "[transport][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        std::shared_ptr<PieceSink> sink;
        using SinkPtr = std::shared_ptr<tensorplay::detail::ByteSink>;
        tensorplay::detail::set_sink_allocator(*p.server, [&sink](const TensorDesc& d) -> Result<SinkPtr> {
            if (d.nbytes < 1000) return SinkPtr();  // (the allocator's)
            return SinkPtr(sink);
        });
        for (int mode = 0; mode < 2; ++mode) {
            const std::size_t n = 40000;
            sink = std::make_shared<PieceSink>(n / 4);
            if (mode == 1) sink->fail_at = 2;
            const Bytes want = counted(n, 5 + mode);
            auto small_t = empty(Device::cpu(), DType::uint8, {3});
            auto big_t = empty(Device::cpu(), DType::uint8, {static_cast<std::int64_t>(n)});
            REQUIRE(small_t);
            REQUIRE(big_t);
            std::memcpy(big_t->data(), want.data(), n);
            Frame f = small(10 + static_cast<std::uint64_t>(mode), "t");
            f.tensors = {*small_t, *big_t};
            REQUIRE(p.client->send(std::move(f)));
            REQUIRE(p.client->send(small(20 + static_cast<std::uint64_t>(mode), "next")));
            auto got = co_await p.server->receive();
            REQUIRE(got);
            if (mode == 0) {
                CHECK(!got->alloc_error);
                REQUIRE(got->tensors.size() == 2);
                CHECK(Bytes(got->tensors[1].data(), got->tensors[1].data() + n) == want);
                CHECK(sink->calls == 4);
            } else {
                REQUIRE(got->alloc_error);
                CHECK(got->alloc_error->message().find("no room for a piece") != std::string::npos);
            }
            auto after = co_await p.server->receive();  // (the stream is intact)
            REQUIRE(after);
            CHECK(after->id == 20 + static_cast<std::uint64_t>(mode));
        }
        CHECK(p.server->is_open());
    });
}

}  // namespace tp_connection_fault_test
