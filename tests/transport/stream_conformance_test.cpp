// One body of Connection behaviour run over every byte stream (Catch2 GENERATE over uv, uds and
// shm): frames and tensors of every size, many in flight, dispatch, close, and a raw peer that lies
// in its headers, stops mid-frame, trickles or says nothing. TCP's own mechanisms (edge reads,
// TCP_INQ, resets, gathered writes) have their tests in connection_test and connection_fault_test.
#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"
#include "transport/transport_test_util.hpp"

#include <tensorplay/core/wire.hpp>

#include <numeric>
#include <optional>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_stream_conformance_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

std::string any_stream() { return GENERATE(std::string("uv"), std::string("uds"), std::string("shm")); }

/// 0 B, 1 B, 4 KiB, 1 MiB, 64 MiB (built outside coroutines: GCC 12 and initializer lists).
std::vector<std::size_t> tensor_sizes() { return {0, 1, 4096, std::size_t(1) << 20, std::size_t(64) << 20}; }

/// Records what Connection::dispatch_to hands it, and how.
struct RecordingSink final : FrameSink {
    struct Got {
        bool small = false;
        std::uint64_t id = 0;
        std::string name;
        Bytes payload;
        std::vector<Tensor> tensors;
    };
    explicit RecordingSink(test::SinkEvents& e) : events(e) {}
    test::SinkEvents& events;
    std::vector<Got> got;
    int closed = 0;
    std::optional<Error> why;

    void on_small_frame(const FrameView& f) override {
        got.push_back(Got{true, f.id, std::string(f.name), Bytes(f.payload.begin(), f.payload.end()), {}});
        events.notify();
    }
    void on_frame(Frame&& f) override {
        got.push_back(Got{false, f.id, std::move(f.name), std::move(f.payload), std::move(f.tensors)});
        events.notify();
    }
    void on_closed(const Error& e) override {
        ++closed;
        why = e;
        events.notify();
    }
};

}  // namespace

TEST_CASE("streams: the handshake names both sides and keeps the stream it ran on", "[transport][stream]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::make_pair_over(transport);
        CHECK(p.client->peer().name == "server");
        CHECK(p.server->peer().rank == 0);
        CHECK(p.client->transport() == transport);
        CHECK(p.server->transport() == transport);
        CHECK(p.client->negotiated().transport == transport);
    });
}

TEST_CASE("streams: tensors of 0 B, 1 B, 4 KiB, 1 MiB and 64 MiB and payloads arrive whole and in order",
          "[transport][stream]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto p = co_await test::make_pair_over(transport);
        const std::vector<std::size_t> sizes = tensor_sizes();
        std::vector<Tensor> sent;
        std::uint64_t id = 0;
        for (std::size_t n : sizes) {
            sent.push_back(test::iota_tensor(n, static_cast<std::uint8_t>(id)));
            std::vector<Tensor> ts;
            ts.push_back(sent.back());
            Bytes payload(n % 1000 + id);
            std::iota(payload.begin(), payload.end(), std::uint8_t{1});
            REQUIRE(p.client->send(test::request(++id, "t", std::move(payload), std::move(ts))));
        }
        Bytes big(300 * 1024);  // a payload larger than the read buffer
        std::iota(big.begin(), big.end(), std::uint8_t{3});
        REQUIRE(p.client->send(test::request(++id, "big", big)));
        for (std::size_t i = 0; i < sent.size(); ++i) {
            auto f = co_await p.server->receive();
            REQUIRE(f);
            CHECK(f->id == i + 1);
            CHECK(f->payload.size() == sizes[i] % 1000 + i);
            REQUIRE(f->tensors.size() == 1);
            REQUIRE(f->tensors[0].nbytes() == sizes[i]);
            CHECK(std::equal(sent[i].bytes().begin(), sent[i].bytes().end(), f->tensors[0].bytes().begin()));
        }
        auto f = co_await p.server->receive();
        REQUIRE(f);
        CHECK(f->payload == big);
    });
}

TEST_CASE("streams: 500 requests in flight, answered in reverse order", "[transport][stream]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair_over(transport);
        constexpr int n = 500;
        for (int i = 1; i <= n; ++i) REQUIRE(p.client->send(test::request(i, "echo", bytes(std::to_string(i)))));
        std::vector<Frame> got;
        for (int i = 0; i < n; ++i) {
            auto f = co_await p.server->receive();
            REQUIRE(f);
            got.push_back(std::move(*f));
        }
        for (auto it = got.rbegin(); it != got.rend(); ++it) {
            Frame r;
            r.kind = FrameKind::response;
            r.id = it->id;
            r.payload = it->payload;
            REQUIRE(p.server->send(std::move(r)));
        }
        for (int i = n; i >= 1; --i) {
            auto f = co_await p.client->receive();
            REQUIRE(f);
            CHECK(f->id == std::uint64_t(i));
            CHECK(to_string(f->payload) == std::to_string(i));
        }
    });
}

TEST_CASE("streams: dispatch_to hands over every frame in order, then the close once", "[transport][stream]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair_over(transport);
        test::SinkEvents events(co_await asio::this_coro::executor);
        auto sink = std::make_shared<RecordingSink>(events);
        tensorplay::detail::dispatch_to(*p.server, sink);
        Tensor t = test::iota_tensor(1 << 20, 5);
        std::vector<Tensor> ts;
        ts.push_back(t);
        REQUIRE(p.client->send(test::request(1, "first", bytes("a"))));
        REQUIRE(p.client->send(test::request(2, "tensor", bytes("b"), std::move(ts))));
        constexpr int n = 100;
        for (int i = 0; i < n; ++i) REQUIRE(p.client->send(test::request(3 + i, "many", bytes(std::to_string(i)))));
        co_await events.until([&] { return sink->got.size() == 2 + n; });
        CHECK(sink->got[0].small);  // (parsed where it lies in the read buffer)
        CHECK(sink->got[0].name == "first");
        CHECK_FALSE(sink->got[1].small);
        REQUIRE(sink->got[1].tensors.size() == 1);
        CHECK(std::equal(t.bytes().begin(), t.bytes().end(), sink->got[1].tensors[0].bytes().begin()));
        for (int i = 0; i < n; ++i) {
            CHECK(sink->got[2 + i].small);
            CHECK(sink->got[2 + i].id == std::uint64_t(3 + i));
            CHECK(to_string(sink->got[2 + i].payload) == std::to_string(i));
        }
        p.client->close();
        co_await events.until([&] { return sink->closed > 0; });
        CHECK(sink->why->code() == Errc::connection_lost);
        CHECK_FALSE(p.server->is_open());
        CHECK(sink.use_count() == 1);  // the reader let go of the sink when it reported the close
        CHECK(sink->closed == 1);
    });
}

TEST_CASE("streams: sending after close fails and the peer's receive reports the close", "[transport][stream]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::make_pair_over(transport);
        p.client->close();
        CHECK_FALSE(p.client->send(test::request(1, "x", {})));
        auto r = co_await p.server->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::connection_lost);
    });
}

TEST_CASE("streams: garbage after the handshake closes that connection with a protocol error", "[transport][stream][fault]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::raw_handshaken_over(transport);
        co_await test::raw_write(p.raw, bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        auto r = co_await p.conn->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::protocol_error);
        CHECK_FALSE(p.conn->is_open());
        const bool closed = co_await test::raw_closed_by_peer(p.raw);  // (awaited outside CHECK: under GCC 12 a co_await inside Catch's macro hangs)
        CHECK(closed);
    });
}

TEST_CASE("streams: a huge payload, metadata or tensor count is refused before anything is allocated",
          "[transport][stream][fault]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::raw_handshaken_over(transport);
        co_await test::raw_write(p.raw, test::frame_header(1, 0, 1, std::uint64_t(1) << 60));
        auto r = co_await p.conn->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::protocol_error);
        CHECK(r.error().message().find("exceeds the limit") != std::string::npos);

        auto p2 = co_await test::raw_handshaken_over(transport);
        co_await test::raw_write(p2.raw, test::frame_header(1, 0xFFFFFFF0u, 1, 0));
        auto r2 = co_await p2.conn->receive();
        REQUIRE_FALSE(r2);
        CHECK(r2.error().code() == Errc::protocol_error);

        auto p3 = co_await test::raw_handshaken_over(transport);
        WireWriter meta;
        meta.str32("h").u32(1000000);  // a million tensors announced in a 9-byte block
        auto h = test::frame_header(1, static_cast<std::uint32_t>(meta.size()), 1, 0);
        h.insert(h.end(), meta.data().begin(), meta.data().end());
        co_await test::raw_write(p3.raw, h);
        auto r3 = co_await p3.conn->receive();
        REQUIRE_FALSE(r3);
        CHECK(r3.error().code() == Errc::protocol_error);
    });
}

TEST_CASE("streams: a frame over max_frame_bytes closes the connection before anything is allocated",
          "[transport][stream][fault]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        ConnectionLimits limits;
        limits.max_frame_bytes = 1 << 20;
        auto p = co_await test::raw_handshaken_over(transport, limits);
        co_await test::raw_write(p.raw, test::frame_head(1, 1, "h", 2 << 20));
        auto r = co_await p.conn->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::protocol_error);
        CHECK(r.error().message().find("per frame") != std::string::npos);
        CHECK_FALSE(p.conn->is_open());
    });
}

TEST_CASE("streams: a peer that ends in the middle of a frame or of a tensor gives connection_lost",
          "[transport][stream][fault]") {
    const std::string transport = any_stream();
    const bool in_tensor = GENERATE(false, true);
    INFO("over " << transport << (in_tensor ? ", in a tensor" : ", in the metadata"));
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::raw_handshaken_over(transport);
        Bytes h;
        if (in_tensor) {
            WireWriter meta;
            meta.str32("h").u32(1);
            meta.u8(0).u8(0).u16(0xFFFF).u8(0).u16(0xFFFF).u8(1).i64(1 << 20).u64(1 << 20);
            h = test::frame_header(1, static_cast<std::uint32_t>(meta.size()), 1, 0);
            h.insert(h.end(), meta.data().begin(), meta.data().end());
            h.resize(h.size() + 100000);  // a tenth of the tensor
        } else {
            h = test::frame_header(1, 200, 1, 100);
            h.resize(h.size() + 10);  // 10 of the 200 metadata bytes
        }
        co_await test::raw_write(p.raw, h);
        test::raw_close(p.raw);
        auto r = co_await p.conn->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::connection_lost);
    });
}

TEST_CASE("streams: a peer that sends a frame and ends: the frame, then connection_lost", "[transport][stream][fault]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::raw_handshaken_over(transport);
        auto f = test::frame_head(1, 9, "h", 5);
        for (char c : std::string("hello")) f.push_back(static_cast<std::uint8_t>(c));
        co_await test::raw_write(p.raw, f);
        test::raw_close(p.raw);
        co_await test::sleep_for(20ms);  // (both in before the first read)
        auto got = co_await p.conn->receive();
        REQUIRE(got);
        CHECK(got->id == 9u);
        CHECK(got->payload == bytes("hello"));
        auto r = co_await p.conn->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::connection_lost);
        CHECK_FALSE(p.conn->is_open());
    });
}

TEST_CASE("streams: a slow-loris sender is closed after the frame timeout", "[transport][stream][fault]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        ConnectionLimits limits;
        limits.frame_timeout = 200ms;
        auto p = co_await test::raw_handshaken_over(transport, limits);
        std::optional<Result<Frame>> got;
        asio::co_spawn(ex, p.conn->receive(), [&](std::exception_ptr, Result<Frame> r) { got = std::move(r); });
        const auto t0 = Clock::now();
        Bytes frame = test::frame_head(1, 1, "h", 100);
        frame.resize(frame.size() + 100);  // a byte every 20 ms: 3 s if it were let through
        for (std::size_t i = 0; i < frame.size() && !got; ++i) {
            Bytes one(1, frame[i]);
            co_await test::raw_write(p.raw, std::move(one));
            co_await test::sleep_for(20ms);
        }
        while (!got) co_await test::sleep_for(10ms);
        REQUIRE_FALSE(*got);
        CHECK(got->error().code() == Errc::timeout);
        CHECK(got->error().message().find("frame_timeout") != std::string::npos);
        CHECK(Clock::now() - t0 < 2s);
    });
}

TEST_CASE("streams: an idle timeout closes a silent connection", "[transport][stream][fault]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        ConnectionLimits idle;
        idle.idle_timeout = 150ms;
        auto p = co_await test::raw_handshaken_over(transport, idle);
        const auto t0 = Clock::now();
        auto r = co_await p.conn->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK(r.error().message().find("idle_timeout") != std::string::npos);
        CHECK(Clock::now() - t0 < 2s);
        const bool closed = co_await test::raw_closed_by_peer(p.raw);  // (awaited outside CHECK: under GCC 12 a co_await inside Catch's macro hangs)
        CHECK(closed);
    });
}

TEST_CASE("streams: keep-alives hold a quiet connection open past the peer's idle timeout, and are never handed on",
          "[transport][stream][fault]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        ConnectionLimits limits;
        limits.idle_timeout = 500ms;
        limits.keepalive_interval = 80ms;
        auto p = co_await test::make_pair_over(transport, limits);
        // The server reads by dispatch (the agent's way), the client by receive().
        test::SinkEvents events(ex);
        auto sink = std::make_shared<RecordingSink>(events);
        tensorplay::detail::dispatch_to(*p.server, sink);
        std::optional<Result<Frame>> at_client;
        asio::co_spawn(ex, p.client->receive(), [&](std::exception_ptr, Result<Frame> r) { at_client = std::move(r); });
        co_await test::sleep_for(2000ms);  // four of the idle timeouts, with no frame of ours either way
        CHECK(sink->got.empty());
        CHECK(sink->closed == 0);
        CHECK_FALSE(at_client.has_value());
        CHECK(p.client->stats().keepalives_sent >= 3);
        CHECK(p.server->stats().keepalives_received >= 3);
        CHECK(p.server->stats().keepalives_sent >= 3);
        CHECK(p.client->stats().keepalives_received >= 3);
        REQUIRE(p.client->send(test::request(7, "after", bytes("quiet")), true));
        REQUIRE(p.server->send(test::request(8, "back", bytes("quiet")), true));
        co_await events.until([&] { return !sink->got.empty(); });
        CHECK(sink->got[0].id == 7);
        CHECK(sink->got[0].name == "after");
        while (!at_client) co_await test::sleep_for(5ms);
        REQUIRE(*at_client);
        CHECK((*at_client)->id == 8);
        p.client->close();
        co_await events.until([&] { return sink->closed > 0; });
    });
}

TEST_CASE("streams: without keep-alives from its peer, a quiet connection closes at the idle timeout",
          "[transport][stream][fault]") {
    const std::string transport = any_stream();
    INFO("over " << transport);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        using namespace tensorplay::detail::awaitable_ops;
        // Only the server has the idle timeout (the client's own would race it); neither sends keep-alives.
        ConnectionLimits limits;
        limits.idle_timeout = 300ms;
        auto l = co_await test::listen_over(transport);
        auto accepting = test::accept_over(*l, test::hello_over("server", 1, transport), limits);
        const ConnectionLimits client_limits;
        auto connecting = Connection::connect(l->address(), test::hello_over("client", 0, transport), client_limits,
                                              HandshakeAuth{});
        auto [server, client] = co_await (std::move(accepting) && std::move(connecting));
        REQUIRE(server);
        REQUIRE(client);
        auto r = co_await (*server)->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK((*server)->stats().keepalives_received == 0);
    });
}

}  // namespace tp_stream_conformance_test
