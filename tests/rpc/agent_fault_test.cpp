// Native agent under faults: garbage on its port, lost connections, device maps through the sim backend.
#include "rpc/agent_test_util.hpp"

#include <tensorplay/core/wire.hpp>
#include <tensorplay/device/backend.hpp>

#include "transport/frame.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_agent_fault_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

Task<asio::ip::tcp::socket> raw_connect(const std::string& address) {
    auto ex = co_await asio::this_coro::executor;
    auto colon = address.rfind(':');
    asio::ip::tcp::endpoint ep(asio::ip::make_address(address.substr(0, colon)),
                               static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
    asio::ip::tcp::socket s(ex);
    auto [ec] = co_await s.async_connect(ep, detail::use_nothrow);
    REQUIRE(!ec);
    co_return s;
}

Task<void> send_raw(asio::ip::tcp::socket& s, Bytes b) {
    auto [ec, n] = co_await asio::async_write(s, asio::buffer(b), detail::use_nothrow);
    REQUIRE(!ec);
}

/// Waits until the agent has closed the raw socket (read returns an error).
Task<bool> closed_by_peer(asio::ip::tcp::socket& s) {
    Bytes sink(1 << 16);
    for (;;) {
        auto [ec, n] = co_await s.async_read_some(asio::buffer(sink), detail::use_nothrow);
        if (ec) co_return true;
    }
}

HelloInfo raw_hello() {
    HelloInfo h;
    h.name = "intruder";
    h.rank = 99;
    return h;
}

Bytes frame_header(std::uint32_t meta_len, std::uint64_t payload_len) {
    WireWriter w;
    w.u16(detail::kFrameMarker).u8(1).u8(0).u32(meta_len).u64(1).u64(payload_len);
    return std::move(w).take();
}

}  // namespace

TEST_CASE("garbage, a huge length or half a frame closes that connection and the agent keeps serving", "[rpc][agent][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto addr = g[1]->listen_address();

        auto garbage = co_await raw_connect(addr);
        co_await send_raw(garbage, bytes("this is not a hello, it is garbage........"));
        {
            auto awaited = co_await closed_by_peer(garbage);
            CHECK(awaited);
        }

        auto huge = co_await raw_connect(addr);
        co_await send_raw(huge, detail::encode_hello(raw_hello()));
        co_await send_raw(huge, frame_header(0, std::uint64_t(1) << 50));
        {
            auto awaited = co_await closed_by_peer(huge);
            CHECK(awaited);
        }

        auto half = co_await raw_connect(addr);
        co_await send_raw(half, detail::encode_hello(raw_hello()));
        auto h = frame_header(40, 1000);
        h.resize(h.size() + 20);
        co_await send_raw(half, h);
        half.close();

        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("still here"));
        REQUIRE(r);
        CHECK(r->payload == bytes("still here"));
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("when a peer goes away its pending calls fail with connection_lost at once", "[rpc][agent][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(3);
        test::register_echo(g);
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 5), finished(ex, 5), release(ex, 5);
        REQUIRE(g[1]->register_handler("never", test::held_handler(entered, release)));  // held until the test ends
        std::vector<std::optional<Result<Message>>> pending(5);
        for (int i = 0; i < 5; ++i)
            asio::co_spawn(ex, g[0]->rpc_async("worker1", "never", {}, 30),
                           [&pending, &finished, i](std::exception_ptr, Result<Message> r) {
                               pending[i] = std::move(r);
                               finished.try_send(std::error_code{}, i);
                           });
        for (int i = 0; i < 5; ++i) co_await entered.async_receive(asio::use_awaitable);  // all five are in the handler
        auto t0 = Clock::now();
        auto gone = co_await g[1]->shutdown(false);  // worker1 vanishes without a goodbye
        REQUIRE(gone);
        for (int i = 0; i < 5; ++i) co_await finished.async_receive(asio::use_awaitable);
        CHECK(Clock::now() - t0 < 1s);  // at once, not at the 30 s timeout
        for (auto& p : pending) {
            REQUIRE(p);
            REQUIRE_FALSE(*p);
            CHECK(p->error().code() == Errc::connection_lost);
            CHECK(p->error().message().find("worker1") != std::string::npos);
        }
        // Calls to others are unaffected; a new call to the dead worker fails fast.
        {
            auto awaited = co_await g[0]->rpc_async("worker2", "echo", {});
            CHECK(awaited);
        }
        auto dead = co_await g[0]->rpc_async("worker1", "echo", {}, 2);
        REQUIRE_FALSE(dead);
        CHECK(dead.error().code() == Errc::connection_lost);
        for (int i = 0; i < 5; ++i) release.try_send(std::error_code{}, 0);  // the handlers end now
        {
            auto awaited = co_await g[0]->shutdown(false);
            REQUIRE(awaited);
        }
        {
            auto awaited = co_await g[2]->shutdown(false);
            REQUIRE(awaited);
        }
    });
}

TEST_CASE("the next call reconnects after a connection was lost", "[rpc][agent][fault]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto first = g[0]->connection_to(1);
        REQUIRE(first);
        first->close();  // the next call finds it closed at once, without waiting for the reader
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("again"));
        REQUIRE(r);
        CHECK(r->payload == bytes("again"));
        CHECK(g[0]->connection_to(1) != first);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("tensors land on the mapped device and replies come back through the reverse map", "[rpc][agent][device]") {
    install_sim_backend(2);
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, [](int rank, TensorPipeRpcBackendOptions& o) {
            o.devices = {Device::cuda(0), Device::cuda(1)};
            if (rank == 0) {
                DeviceMap m;
                m[Device::cuda(0)] = Device::cuda(1);
                REQUIRE(o.set_device_map("worker1", m));
            }
        });
        std::vector<Device> seen;
        REQUIRE(g[1]->register_handler("where", [&seen](WorkerInfo, Message m) -> Task<Result<Message>> {
            for (auto& t : m.tensors) seen.push_back(t.device());
            co_return m;
        }));
        auto t = empty(Device::cuda(0), DType::float32, std::vector<std::int64_t>(1, 256));
        REQUIRE(t);
        for (int i = 0; i < 256; ++i) reinterpret_cast<float*>(t->data())[i] = float(i);
        Message m;
        m.tensors.push_back(*t);
        m.tensors.push_back(Tensor::cpu(DType::uint8, std::vector<std::int64_t>(1, 4)));
        auto r = co_await g[0]->rpc_async("worker1", "where", m);
        REQUIRE(r);
        REQUIRE(seen.size() == 2);
        CHECK(seen[0] == Device::cuda(1));
        CHECK(seen[1] == Device::cpu());
        REQUIRE(r->tensors.size() == 2);
        CHECK(r->tensors[0].device() == Device::cuda(0));
        CHECK(r->tensors[1].device() == Device::cpu());
        CHECK(reinterpret_cast<float*>(r->tensors[0].data())[255] == 255.0f);

        // cuda:1 has no map to worker1: refused locally, naming worker and device.
        auto unmapped = empty(Device::cuda(1), DType::uint8, std::vector<std::int64_t>(1, 8));
        REQUIRE(unmapped);
        Message bad;
        bad.tensors.push_back(*unmapped);
        auto e = co_await g[0]->rpc_async("worker1", "where", bad);
        REQUIRE_FALSE(e);
        CHECK(e.error().code() == Errc::device_error);
        CHECK(e.error().message().find("worker1") != std::string::npos);
        CHECK(e.error().message().find("cuda:1") != std::string::npos);

        // worker1 has no map to worker0 at all: a reply tensor on cuda:0 of worker1 cannot go back.
        REQUIRE(g[1]->register_handler("make", [](WorkerInfo, Message) -> Task<Result<Message>> {
            Message out;
            out.tensors.push_back(*empty(Device::cuda(1), DType::uint8, std::vector<std::int64_t>(1, 8)));
            out.tensors.push_back(*empty(Device::cuda(0), DType::uint8, std::vector<std::int64_t>(1, 8)));
            co_return out;
        }));
        auto back = co_await g[0]->rpc_async("worker1", "make", {});
        REQUIRE_FALSE(back);
        CHECK(back.error().code() == Errc::device_error);
        CHECK(back.error().message().find("cuda:0") != std::string::npos);
        co_await test::shutdown_all(g);
    });
    uninstall_sim_backend();
}

}  // namespace tp_agent_fault_test
