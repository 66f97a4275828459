// Connection: frames, tensors, out-of-order replies and gathered writes over loopback.
#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"
#include "transport/connection_state.hpp"
#include "transport/transport_test_util.hpp"

#include <asio/steady_timer.hpp>

#include <numeric>
#include <optional>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_connection_test {

using namespace tensorplay;
using namespace std::chrono_literals;

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

TEST_CASE("frames queued together are gathered into one write and read back with few reads", "[transport][perf]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await test::make_pair();
        auto writes_before = p.client->stats().writes;
        constexpr int n = 128;
        for (int i = 0; i < n; ++i) REQUIRE(p.client->send(test::request(i, "h", Bytes(32, std::uint8_t(i)))));
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
            REQUIRE(p.client->send(test::request(2 * round, "a", Bytes(16, std::uint8_t(round))), true));
            auto a = co_await p.server->receive();
            REQUIRE(a);
            CHECK(a->id == std::uint64_t(2 * round));
            REQUIRE(p.client->send(test::request(2 * round + 1, "b", Bytes(16, std::uint8_t(round))), true));
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
        REQUIRE(p.client->send(test::request(1, "now", bytes("flushed")), true));
        CHECK(p.client->stats().writes == writes + 1);
        CHECK(p.client->stats().frames_sent == 1);
        auto f = co_await p.server->receive();
        REQUIRE(f);
        CHECK(f->payload == bytes("flushed"));

        // 32 MiB cannot go out in one non-blocking sendmsg: the writer takes the rest, and frames
        // sent after it (flushed or not) follow it on the wire, byte for byte.
        Tensor big = test::iota_tensor(std::size_t(32) << 20, 11);
        std::vector<Tensor> ts;
        ts.push_back(big);
        REQUIRE(p.client->send(test::request(2, "big", bytes("b"), std::move(ts)), true));
        REQUIRE(p.client->send(test::request(3, "after", bytes("x")), true));
        REQUIRE(p.client->send(test::request(4, "queued", bytes("y"))));
        REQUIRE(p.client->send(test::request(5, "last", bytes("z")), true));
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
        const auto& st = tensorplay::detail::ConnectionAccess::state(*p.server);
        CHECK(st.rend == st.rbeg);  // (nothing further is buffered)
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
        auto f = test::request(9, "t", {}, std::vector<Tensor>(1, test::iota_tensor(64, 0)));
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
        REQUIRE(p.client->send(test::request(1, "t", bytes("a"), std::vector<Tensor>(1, test::iota_tensor(100000, 0)))));
        REQUIRE(p.client->send(test::request(2, "u", bytes("b"))));
        auto r1 = co_await p.server->receive();
        REQUIRE(r1);
        REQUIRE(r1->alloc_error);
        CHECK(r1->alloc_error->code() == Errc::device_error);
        auto r2 = co_await p.server->receive();
        REQUIRE(r2);
        CHECK(r2->payload == bytes("b"));
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
        for (int i = 0; i < 10; ++i) REQUIRE(p.client->send(test::request(i, "x", bytes("y"))));
        co_await events.until([&] { return sink->closed > 0; });
        CHECK(sink->frames == 1);  // the frames after the close are not delivered
        CHECK(sink->closed == 1);
        CHECK(sink->why->code() == Errc::shutdown);
    });
}

}  // namespace tp_connection_test
