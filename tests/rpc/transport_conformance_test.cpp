// One body of agent behaviour run over every transport (Catch2 GENERATE), as TensorPipe's
// conformance suites do: echo, out-of-order calls, timeouts, handler errors, graceful shutdown,
// hostile bytes on each transport's own listener, and a peer process killed mid-call.
#include "rpc/agent_test_util.hpp"
#include "support/raw_wire.hpp"

#include <tensorplay/core/wire.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include "transport/frame.hpp"
#include "transport/transport.hpp"

#include <asio/io_context.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_transport_conformance_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

/// Options for a group that talks over `transport` (and, when given, `channel`): uds or shm is
/// preferred to uv, so that the negotiation runs over TCP and the data moves to the same-host
/// transport; uv alone stays on TCP.
test::Configure over(std::string transport, std::string channel = {}) {
    return [transport, channel](int, TensorPipeRpcBackendOptions& o) {
        if (transport == "uv") o.transports = std::vector<std::string>{transport};
        else o.transports = std::vector<std::string>{transport, "uv"};
        if (!channel.empty()) o.channels = std::vector<std::string>{channel};
    };
}

/// A 1 MiB tensor with a pattern: the cma channel carries it by reference.
Tensor large_tensor() {
    Tensor t = Tensor::cpu(DType::uint8, {1 << 20});
    for (std::size_t i = 0; i < t.nbytes(); ++i) t.data()[i] = static_cast<std::uint8_t>((i * 131) >> 4);
    return t;
}

/// The listening URL of `agent` for `transport`.
std::string url_of(const test::AgentPtr& agent, const std::string& transport) {
    for (const auto& u : agent->listen_urls())
        if (auto a = Address::parse(u); a && a->transport() == transport) return u;
    FAIL("no listener for " << transport);
    return {};
}

Task<detail::TransportStream> raw_connect(std::string url) {
    auto a = Address::parse(url);
    REQUIRE(a);
    co_return co_await test::raw_connect(std::move(*a));
}

/// After our hello on a raw shm stream: reads the agent's hello off the socket, then sets the rings
/// up as a member would, so that what follows runs over them. Nothing for other transports.
Task<void> rings_after_hello(detail::TransportStream& s) {
    if (s.transport != "shm") co_return;
    co_await test::raw_read_hello(s);
    co_await test::finish_raw(s);
}

Bytes frame_header(std::uint32_t meta_len, std::uint64_t payload_len) { return test::frame_header(1, meta_len, 1, payload_len); }

/// A 4 KiB tensor with a pattern (built outside coroutines: GCC 12 and initializer lists).
Tensor pattern_tensor() {
    Tensor t = Tensor::cpu(DType::float32, {4, 256});
    for (std::size_t i = 0; i < t.nbytes(); ++i) t.data()[i] = static_cast<std::uint8_t>(i * 7);
    return t;
}

/// A hello as a worker of the group on `transport` would send it (so that only the frame that
/// follows is at fault).
Bytes member_hello(const std::string& transport, const test::AgentPtr& server) {
    HelloInfo h;
    h.name = "worker0";
    h.rank = 0;
    auto t = detail::transport_named(transport);
    REQUIRE(t);
    h.transports = {TransportOffer{transport, (*t)->domain(), ""}};
    (void)server;
    return detail::encode_hello(h);
}

}  // namespace

TEST_CASE("an agent conforms over every transport and channel", "[rpc][agent][transport]") {
    const std::string transport = GENERATE(std::string("uv"), std::string("uds"), std::string("shm"));
    const std::string channel = GENERATE(std::string("basic"), std::string("cma"));
    INFO("transport " << transport << ", channel " << channel);
    const test::Configure cfg = over(transport, channel);

    SECTION("echo of a payload and tensors, over the negotiated transport and channel") {
        test::run_with_deadline(10s, [&]() -> Task<void> {
            auto g = co_await test::make_group(2, cfg);
            test::register_echo(g);
            Message m = test::text_message("hello");
            Tensor t = pattern_tensor(), big = large_tensor();
            m.tensors.push_back(t);
            m.tensors.push_back(big);
            auto r = co_await g[0]->rpc_async("worker1", "echo", std::move(m));
            REQUIRE(r);
            CHECK(r->payload == bytes("hello"));
            REQUIRE(r->tensors.size() == 2);
            CHECK(std::memcmp(r->tensors[0].data(), t.data(), t.nbytes()) == 0);
            CHECK(std::memcmp(r->tensors[1].data(), big.data(), big.nbytes()) == 0);
            auto c = g[0]->connection_to(1);
            REQUIRE(c);
            CHECK(c->transport() == transport);
            REQUIRE(c->negotiated().channels.size() == 1);
            CHECK(c->negotiated().channels[0] == ChannelChoice{"cpu", "cpu", channel});
            CHECK(tensorplay::detail::channel_stats(*c).cma_sent == (channel == "cma" ? 1u : 0u));
            CHECK(tensorplay::detail::channel_stats(*c).cma_received == (channel == "cma" ? 1u : 0u));
            co_await test::shutdown_all(g);
        });
    }

    SECTION("1,000 calls in flight complete out of order") {
        test::run_with_deadline(20s, [&]() -> Task<void> {
            auto g = co_await test::make_group(2, cfg);
            auto ex = co_await asio::this_coro::executor;
            // Each call waits (id % 5) ms: replies come back in another order than the requests.
            REQUIRE(g[1]->register_handler("delay", [](WorkerInfo, Message m) -> Task<Result<Message>> {
                const int ms = m.payload.empty() ? 0 : m.payload[0] % 5;
                co_await test::sleep_for(std::chrono::milliseconds(ms));
                co_return m;
            }));
            constexpr int n = 1000;
            int ok = 0, done = 0;
            std::vector<int> order;
            test::Signal all(ex, 1);
            for (int i = 0; i < n; ++i) {
                Message m;
                m.payload.push_back(static_cast<std::uint8_t>(i & 0xff));
                m.payload.push_back(static_cast<std::uint8_t>(i >> 8));
                asio::co_spawn(ex, g[0]->rpc_async("worker1", "delay", std::move(m), 15),
                               [&, i](std::exception_ptr, Result<Message> r) {
                                   if (r && r->payload.size() == 2 && r->payload[0] == (i & 0xff) && r->payload[1] == (i >> 8)) ++ok;
                                   order.push_back(i);
                                   if (++done == n) all.try_send(std::error_code{}, 0);
                               });
            }
            co_await all.async_receive(asio::use_awaitable);
            CHECK(ok == n);
            CHECK_FALSE(std::is_sorted(order.begin(), order.end()));
            CHECK(g[0]->connection_to(1)->transport() == transport);
            co_await test::shutdown_all(g);
        });
    }

    SECTION("a timeout, an unknown handler and a failing handler each fail that call only") {
        test::run_with_deadline(10s, [&]() -> Task<void> {
            auto g = co_await test::make_group(2, cfg);
            test::register_echo(g);
            REQUIRE(g[1]->register_handler("slow", [](WorkerInfo, Message m) -> Task<Result<Message>> {
                co_await test::sleep_for(500ms);
                co_return m;
            }));
            REQUIRE(g[1]->register_handler("fails", [](WorkerInfo, Message) -> Task<Result<Message>> {
                co_return fail(Errc::invalid_argument, "no thanks");
            }));
            auto late = co_await g[0]->rpc_async("worker1", "slow", {}, 0.1);
            REQUIRE_FALSE(late);
            CHECK(late.error().code() == Errc::timeout);
            auto unknown = co_await g[0]->rpc_async("worker1", "nobody", {});
            REQUIRE_FALSE(unknown);
            CHECK(unknown.error().code() == Errc::not_found);
            CHECK(unknown.error().message().find("nobody") != std::string::npos);
            auto failed = co_await g[0]->rpc_async("worker1", "fails", {});
            REQUIRE_FALSE(failed);
            CHECK(failed.error().code() == Errc::remote_error);
            CHECK(failed.error().message().find("no thanks") != std::string::npos);
            auto still = co_await g[0]->rpc_async("worker1", "echo", test::text_message("x"));
            CHECK(still);
            co_await test::shutdown_all(g);
        });
    }

    SECTION("a graceful shutdown lets the calls in flight finish") {
        test::run_with_deadline(10s, [&]() -> Task<void> {
            auto g = co_await test::make_group(2, cfg);
            auto ex = co_await asio::this_coro::executor;
            REQUIRE(g[1]->register_handler("slow", [](WorkerInfo, Message m) -> Task<Result<Message>> {
                co_await test::sleep_for(200ms);
                co_return m;
            }));
            int ok = 0, done = 0;
            test::Signal finished(ex, 10);
            for (int i = 0; i < 10; ++i)
                asio::co_spawn(ex, g[0]->rpc_async("worker1", "slow", test::text_message("in flight")),
                               [&](std::exception_ptr, Result<Message> r) {
                                   if (r) ++ok;
                                   ++done;
                                   finished.try_send(std::error_code{}, 0);
                               });
            co_await test::sleep_for(20ms);  // the requests are out
            auto downs = co_await test::shutdown_all(g, true, 5);
            for (auto& d : downs) CHECK(d);
            while (done < 10) co_await finished.async_receive(asio::use_awaitable);
            CHECK(ok == 10);
        });
    }

    SECTION("garbage, a huge length or half a frame on the transport's own listener closes that connection only") {
        test::run_with_deadline(10s, [&]() -> Task<void> {
            auto g = co_await test::make_group(2, cfg);
            test::register_echo(g);
            const std::string url = url_of(g[1], transport);

            auto garbage = co_await raw_connect(url);
            co_await test::raw_write(garbage, bytes("this is not a hello, it is garbage........"));
            {
                auto awaited = co_await test::raw_closed_by_peer(garbage);
                CHECK(awaited);
            }
            auto huge = co_await raw_connect(url);
            co_await test::raw_write(huge, member_hello(transport, g[1]));
            co_await rings_after_hello(huge);
            co_await test::raw_write(huge, frame_header(0, std::uint64_t(1) << 50));
            {
                auto awaited = co_await test::raw_closed_by_peer(huge);
                CHECK(awaited);
            }
            auto half = co_await raw_connect(url);
            co_await test::raw_write(half, member_hello(transport, g[1]));
            co_await rings_after_hello(half);
            auto h = frame_header(40, 1000);
            h.resize(h.size() + 20);
            co_await test::raw_write(half, h);
            test::raw_close(half);

            auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("still here"));
            REQUIRE(r);
            CHECK(r->payload == bytes("still here"));
            co_await test::shutdown_all(g);
        });
    }
}

namespace {

/// The killed peer's process: hosts nothing, joins as rank 1 over the parent's store and serves
/// "never" (a call that does not return) until it is killed.
int killed_peer_child(std::uint16_t store_port, const std::string& transport, int ready_fd) {
    asio::io_context ctx(1);
    int rc = 3;
    asio::co_spawn(
        ctx,
        [&]() -> Task<void> {
            auto ex = co_await asio::this_coro::executor;
            TcpStoreOptions so;
            so.host = "127.0.0.1";
            so.port = store_port;
            so.timeout = 10s;
            auto store = co_await TcpStore::connect(ex, so);
            if (!store) co_return;
            const auto cfg = over(transport);
            auto args = test::init_args(*store, 1, 2, cfg);
            auto agent = co_await detail::NativeAgent::create(std::move(args));
            if (!agent) co_return;
            (void)(*agent)->register_handler("never", [](WorkerInfo, Message) -> Task<Result<Message>> {
                co_await test::sleep_for(60s);
                co_return Message{};
            });
            char c = 'r';
            if (::write(ready_fd, &c, 1) != 1) co_return;
            co_await test::sleep_for(60s);  // until killed
            rc = 0;
        },
        [](std::exception_ptr) {});
    ctx.run();
    return rc;
}

}  // namespace

TEST_CASE("calls pending on a killed peer process fail within a second over every transport", "[rpc][agent][transport][fault]") {
    const std::string transport = GENERATE(std::string("uv"), std::string("uds"), std::string("shm"));
    INFO("transport " << transport);
    // The store's port comes back from the parent's server; the child is forked before any event
    // loop runs in this process.
    int port_pipe[2], ready_pipe[2];
    REQUIRE(::pipe(port_pipe) == 0);
    REQUIRE(::pipe(ready_pipe) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(port_pipe[1]);
        ::close(ready_pipe[0]);
        std::uint16_t port = 0;
        if (::read(port_pipe[0], &port, sizeof port) != sizeof port) ::_exit(2);
        ::_exit(killed_peer_child(port, transport, ready_pipe[1]));
    }
    ::close(port_pipe[0]);
    ::close(ready_pipe[1]);
    const test::Configure cfg = over(transport);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        TcpStoreServerOptions sopt;
        sopt.host = "127.0.0.1";
        auto server = TcpStoreServer::start(ex, sopt);
        REQUIRE(server);
        const std::uint16_t port = (*server)->port();
        REQUIRE(::write(port_pipe[1], &port, sizeof port) == sizeof port);
        TcpStoreOptions so;
        so.host = "127.0.0.1";
        so.port = port;
        so.timeout = 10s;
        auto store = co_await TcpStore::connect(ex, so);
        REQUIRE(store);
        auto args = test::init_args(*store, 0, 2, cfg);
        auto agent = co_await detail::NativeAgent::create(std::move(args));
        REQUIRE(agent);
        pollfd p{ready_pipe[0], POLLIN, 0};
        while (::poll(&p, 1, 0) == 0) co_await test::sleep_for(10ms);  // the child's handler is in
        char c = 0;
        REQUIRE(::read(ready_pipe[0], &c, 1) == 1);
        CHECK((*agent)->connection_to(1)->transport() == transport);
        constexpr int n = 5;
        std::vector<std::optional<Result<Message>>> results(n);
        test::Signal finished(ex, n);
        for (int i = 0; i < n; ++i)
            asio::co_spawn(ex, (*agent)->rpc_async("worker1", "never", {}, 30), [&, i](std::exception_ptr, Result<Message> r) {
                results[i] = std::move(r);
                finished.try_send(std::error_code{}, i);
            });
        co_await test::sleep_for(100ms);  // the requests are out
        const auto t0 = Clock::now();
        ::kill(child, SIGKILL);
        for (int i = 0; i < n; ++i) co_await finished.async_receive(asio::use_awaitable);
        CHECK(Clock::now() - t0 < 1s);
        for (auto& r : results) {
            REQUIRE(r);
            REQUIRE_FALSE(*r);
            CHECK(r->error().code() == Errc::connection_lost);
        }
        auto down = co_await (*agent)->shutdown(false);
        CHECK(down);
        (*server)->stop();
    });
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFSIGNALED(status));
    ::close(port_pipe[1]);
    ::close(ready_pipe[0]);
}

}  // namespace tp_transport_conformance_test
