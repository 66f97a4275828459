// Connection: frames, tensors, out-of-order replies and gathered writes over loopback.
#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"
#include "transport/transport_test_util.hpp"

#include <asio/steady_timer.hpp>

#include <numeric>
#include <optional>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_connection_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

Tensor iota_tensor(std::size_t n, std::uint8_t seed) {
    Tensor t = Tensor::cpu(DType::uint8, {static_cast<std::int64_t>(n)});
    for (std::size_t i = 0; i < n; ++i) t.data()[i] = static_cast<std::uint8_t>(i * 7 + seed);
    return t;
}

std::vector<std::int64_t> dims(std::int64_t a, std::int64_t b) {
    std::vector<std::int64_t> d;
    d.push_back(a);
    d.push_back(b);
    return d;
}

Frame request(std::uint64_t id, std::string name, Bytes payload, std::vector<Tensor> tensors = {}) {
    Frame f;
    f.kind = FrameKind::request;
    f.id = id;
    f.name = std::move(name);
    f.payload = std::move(payload);
    f.tensors = std::move(tensors);
    return f;
}

}  // namespace

TEST_CASE("the handshake tells each side the other's name and rank", "[transport]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        CHECK(p.client->peer().name == "server");
        CHECK(p.client->peer().rank == 1);
        CHECK(p.server->peer().name == "client");
        CHECK(p.server->peer().rank == 0);
        REQUIRE(p.server->peer().channels.size() == 1);
        CHECK(p.server->peer().channels[0].name == "basic");
        CHECK(p.client->transport() == "uv");
        CHECK(p.client->negotiated().transport == "uv");
    });
}

TEST_CASE("frames arrive whole and in order, with payloads and tensors of every size", "[transport]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        Bytes big(300 * 1024);
        std::iota(big.begin(), big.end(), std::uint8_t{3});
        Tensor t1 = iota_tensor(1 << 20, 1);
        Tensor t2 = Tensor::cpu(DType::float32, dims(3, 5));
        for (int i = 0; i < 15; ++i) reinterpret_cast<float*>(t2.data())[i] = float(i) * 0.5f;
        REQUIRE(p.client->send(request(1, "small", bytes("hello"))));
        REQUIRE(p.client->send(request(2, "big", big)));
        std::vector<Tensor> ts;
        ts.push_back(t1);
        ts.push_back(t2);
        REQUIRE(p.client->send(request(3, "tensors", bytes("x"), std::move(ts))));
        REQUIRE(p.client->send(request(4, "empty", {})));

        auto f1 = co_await p.server->receive();
        REQUIRE(f1);
        CHECK(f1->id == 1);
        CHECK(f1->name == "small");
        CHECK(f1->payload == bytes("hello"));
        auto f2 = co_await p.server->receive();
        REQUIRE(f2);
        CHECK(f2->payload == big);
        auto f3 = co_await p.server->receive();
        REQUIRE(f3);
        REQUIRE(f3->tensors.size() == 2);
        CHECK(f3->tensors[0].nbytes() == t1.nbytes());
        CHECK(std::equal(t1.bytes().begin(), t1.bytes().end(), f3->tensors[0].bytes().begin()));
        CHECK(f3->tensors[1].dtype() == DType::float32);
        CHECK(f3->tensors[1].shape() == dims(3, 5));
        CHECK(reinterpret_cast<float*>(f3->tensors[1].data())[14] == 7.0f);
        CHECK(f3->tensors[0].data() != t1.data());
        auto f4 = co_await p.server->receive();
        REQUIRE(f4);
        CHECK(f4->payload.empty());
        CHECK(f4->name == "empty");
    });
}

TEST_CASE("many requests share one connection and their responses come back out of order", "[transport]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        constexpr int n = 200;
        for (int i = 1; i <= n; ++i) REQUIRE(p.client->send(request(i, "echo", bytes(std::to_string(i)))));
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
            CHECK(f->kind == FrameKind::response);
            CHECK(f->id == std::uint64_t(i));
            CHECK(to_string(f->payload) == std::to_string(i));
        }
    });
}

TEST_CASE("frames queued together are gathered into one write and read back with few reads", "[transport][perf]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        auto writes_before = p.client->stats().writes;
        constexpr int n = 128;
        for (int i = 0; i < n; ++i) REQUIRE(p.client->send(request(i, "h", Bytes(32, std::uint8_t(i)))));
        auto reads_before = p.server->stats().reads;
        for (int i = 0; i < n; ++i) {
            auto f = co_await p.server->receive();
            REQUIRE(f);
            CHECK(f->id == std::uint64_t(i));
        }
        CHECK(p.client->stats().writes - writes_before == 1);
        CHECK(p.client->stats().frames_sent == std::uint64_t(n));
        CHECK(p.server->stats().reads - reads_before <= 8);
    });
}

TEST_CASE("a frame that arrives while no read is pending is not missed after a read drained the socket", "[transport]") {
    // After a short read the reactor is told the socket is empty and skips its next speculative
    // read; a frame whose readiness the event loop reports while nobody reads must still be read.
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        auto ex = co_await asio::this_coro::executor;
        for (int round = 0; round < 20; ++round) {
            REQUIRE(p.client->send(request(2 * round, "a", Bytes(16, std::uint8_t(round))), true));
            auto a = co_await p.server->receive();
            REQUIRE(a);
            CHECK(a->id == std::uint64_t(2 * round));
            REQUIRE(p.client->send(request(2 * round + 1, "b", Bytes(16, std::uint8_t(round))), true));
            asio::steady_timer t(ex, 2ms);  // the event loop runs (and sees the readiness) meanwhile
            co_await t.async_wait(asio::use_awaitable);
            auto b = co_await p.server->receive();
            REQUIRE(b);
            CHECK(b->id == std::uint64_t(2 * round + 1));
        }
    });
}

TEST_CASE("a flushed frame is written by send itself, and a partly written one is finished in order", "[transport]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        // A lone small frame with flush: on the wire when send returns, no writer turn needed.
        auto writes = p.client->stats().writes;
        REQUIRE(p.client->send(request(1, "now", bytes("flushed")), true));
        CHECK(p.client->stats().writes == writes + 1);
        CHECK(p.client->stats().frames_sent == 1);
        auto f = co_await p.server->receive();
        REQUIRE(f);
        CHECK(f->payload == bytes("flushed"));

        // 32 MiB cannot go out in one non-blocking sendmsg: the writer takes the rest, and frames
        // sent after it (flushed or not) follow it on the wire, byte for byte.
        Tensor big = iota_tensor(std::size_t(32) << 20, 11);
        std::vector<Tensor> ts;
        ts.push_back(big);
        REQUIRE(p.client->send(request(2, "big", bytes("b"), std::move(ts)), true));
        REQUIRE(p.client->send(request(3, "after", bytes("x")), true));
        REQUIRE(p.client->send(request(4, "queued", bytes("y"))));
        REQUIRE(p.client->send(request(5, "last", bytes("z")), true));
        auto g = co_await p.server->receive();
        REQUIRE(g);
        CHECK(g->id == 2);
        REQUIRE(g->tensors.size() == 1);
        CHECK(std::equal(big.bytes().begin(), big.bytes().end(), g->tensors[0].bytes().begin()));
        for (std::uint64_t id : {3, 4, 5}) {
            auto h = co_await p.server->receive();
            REQUIRE(h);
            CHECK(h->id == id);
        }
        CHECK(p.client->stats().frames_sent == 5);
        CHECK_FALSE(tensorplay::detail::input_pending(*p.server));
    });
}

TEST_CASE("a tensor lands on the device the allocator chooses", "[transport]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        std::vector<TensorDesc> seen;
        p.server->set_allocator([&](const TensorDesc& d) -> Result<Tensor> {
            seen.push_back(d);
            return Tensor::cpu(d.dtype, d.shape);
        });
        auto f = request(9, "t", {}, std::vector<Tensor>(1, iota_tensor(64, 0)));
        f.targets.push_back(Device::cuda(1));
        REQUIRE(p.client->send(std::move(f)));
        auto r = co_await p.server->receive();
        REQUIRE(r);
        REQUIRE(seen.size() == 1);
        CHECK(seen[0].source == Device::cpu());
        CHECK(seen[0].target == Device::cuda(1));
        CHECK(seen[0].nbytes == 64);
    });
}

TEST_CASE("a refused tensor is skipped and reported, and the connection stays usable", "[transport]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        p.server->set_allocator([](const TensorDesc&) -> Result<Tensor> { return fail(Errc::device_error, "no such device"); });
        REQUIRE(p.client->send(request(1, "t", bytes("a"), std::vector<Tensor>(1, iota_tensor(100000, 0)))));
        REQUIRE(p.client->send(request(2, "u", bytes("b"))));
        auto r1 = co_await p.server->receive();
        REQUIRE(r1);
        REQUIRE(r1->alloc_error);
        CHECK(r1->alloc_error->code() == Errc::device_error);
        auto r2 = co_await p.server->receive();
        REQUIRE(r2);
        CHECK(r2->payload == bytes("b"));
    });
}

TEST_CASE("sending after close fails and receive reports the closed connection", "[transport]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        p.client->close();
        CHECK_FALSE(p.client->send(request(1, "x", {})));
        auto r = co_await p.server->receive();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::connection_lost);
    });
}

namespace {

/// Records what Connection::dispatch_to hands it, and how.
struct RecordingSink final : FrameSink {
    struct Got {
        bool small = false;
        FrameKind kind{};
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
        got.push_back(Got{true, f.kind, f.id, std::string(f.name), Bytes(f.payload.begin(), f.payload.end()), {}});
        events.notify();
    }
    void on_frame(Frame&& f) override {
        got.push_back(Got{false, f.kind, f.id, std::move(f.name), std::move(f.payload), std::move(f.tensors)});
        events.notify();
    }
    void on_closed(const Error& e) override {
        ++closed;
        why = e;
        events.notify();
    }
};

}  // namespace

TEST_CASE("dispatch_to hands over small frames in place and the others whole, in order, then the close once", "[transport]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        test::SinkEvents events(co_await asio::this_coro::executor);
        auto sink = std::make_shared<RecordingSink>(events);
        tensorplay::detail::dispatch_to(*p.server, sink);
        Tensor t = iota_tensor(1 << 20, 5);
        std::vector<Tensor> ts;
        ts.push_back(t);
        Bytes big(300 * 1024);  // larger than the read buffer: the general path
        std::iota(big.begin(), big.end(), std::uint8_t{9});
        REQUIRE(p.client->send(request(1, "first", bytes("a"))));
        REQUIRE(p.client->send(request(2, "tensor", bytes("b"), std::move(ts))));
        REQUIRE(p.client->send(request(3, "big", big)));
        constexpr int n = 100;  // many at once: several parsed from one read
        for (int i = 0; i < n; ++i) REQUIRE(p.client->send(request(4 + i, "many", bytes(std::to_string(i)))));
        co_await events.until([&] { return sink->got.size() == 3 + n; });
        CHECK(sink->got[0].small);
        CHECK(sink->got[0].name == "first");
        CHECK(sink->got[0].payload == bytes("a"));
        CHECK_FALSE(sink->got[1].small);
        CHECK(sink->got[1].id == 2);
        REQUIRE(sink->got[1].tensors.size() == 1);
        CHECK(std::equal(t.bytes().begin(), t.bytes().end(), sink->got[1].tensors[0].bytes().begin()));
        CHECK_FALSE(sink->got[2].small);
        CHECK(sink->got[2].payload == big);
        for (int i = 0; i < n; ++i) {
            const auto& g = sink->got[3 + i];
            CHECK(g.small);
            CHECK(g.id == std::uint64_t(4 + i));
            CHECK(to_string(g.payload) == std::to_string(i));
        }
        CHECK(p.server->stats().reads < std::uint64_t(n));
        CHECK(sink->closed == 0);
        p.client->close();
        co_await events.until([&] { return sink->closed > 0; });
        CHECK(sink->why->code() == Errc::connection_lost);
        CHECK_FALSE(p.server->is_open());
        // The reader let go of the sink when it reported the close (only this test holds it now).
        CHECK(sink.use_count() == 1);
        CHECK(sink->closed == 1);
    });
}

TEST_CASE("dispatch_to: closing the connection from the sink ends the dispatch with the close", "[transport]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        struct Closer final : FrameSink {
            Connection* conn = nullptr;
            test::SinkEvents* events = nullptr;
            int frames = 0, closed = 0;
            std::optional<Error> why;
            void on_small_frame(const FrameView&) override {
                ++frames;
                conn->close(Error(Errc::shutdown, "enough"));
            }
            void on_frame(Frame&&) override { ++frames; }
            void on_closed(const Error& e) override {
                ++closed;
                why = e;
                events->notify();
            }
        };
        test::SinkEvents events(co_await asio::this_coro::executor);
        auto sink = std::make_shared<Closer>();
        sink->conn = p.server.get();
        sink->events = &events;
        tensorplay::detail::dispatch_to(*p.server, sink);
        for (int i = 0; i < 10; ++i) REQUIRE(p.client->send(request(i, "x", bytes("y"))));
        co_await events.until([&] { return sink->closed > 0; });
        CHECK(sink->frames == 1);  // the frames after the close are not delivered
        CHECK(sink->closed == 1);
        CHECK(sink->why->code() == Errc::shutdown);
    });
}

}  // namespace tp_connection_test
