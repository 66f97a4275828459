// Native agent against hostile and dying peers on its port: cut-off frames, callees that die
// mid-reply, claimed lengths, silent and slow sockets, the connection limit.
#include "rpc/agent_test_util.hpp"
#include "support/raw_wire.hpp"
#include "support/sanitizers.hpp"
#include "support/usage.hpp"
#include "rpc/forked.hpp"

#include <tensorplay/core/wire.hpp>

#include "transport/frame.hpp"
#include "transport/shm/setup.hpp"
#include "transport/transport.hpp"

#include <asio/detached.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <filesystem>
#include <fstream>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_agent_hardening_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

using test::rss_bytes;

std::size_t open_fds() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
}

/// make_group with agent tuning.
Task<test::AgentGroup> make_tuned_group(int n, detail::NativeAgentTuning tuning, test::Configure configure) {
    auto ex = co_await asio::this_coro::executor;
    test::AgentGroup g;
    g.store = std::make_shared<HashStore>(std::chrono::seconds(5));
    g.agents.resize(n);
    std::vector<std::optional<Error>> errors(n);
    detail::Channel<void(std::error_code, int)> done(ex, n);
    for (int r = 0; r < n; ++r) {
        asio::co_spawn(ex, detail::NativeAgent::create(test::init_args(g.store, r, n, configure), tuning),
                       [&g, &errors, &done, r](std::exception_ptr e, Result<test::AgentPtr> a) {
                           if (e) errors[r] = Error(Errc::internal, "exception while starting");
                           else if (a) g.agents[r] = *a;
                           else errors[r] = a.error();
                           done.try_send(std::error_code{}, r);
                       });
    }
    for (int i = 0; i < n; ++i) co_await done.async_receive(asio::use_awaitable);
    for (int r = 0; r < n; ++r)
        if (errors[r]) FAIL("worker" << r << " did not start: " << errors[r]->to_string());
    co_return g;
}

asio::ip::tcp::endpoint endpoint_of(const std::string& address) {
    auto colon = address.rfind(':');
    return {asio::ip::make_address(address.substr(0, colon)), static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1)))};
}

Task<asio::ip::tcp::socket> raw_connect(const std::string& address) {
    asio::ip::tcp::socket s(co_await asio::this_coro::executor);
    auto [ec] = co_await s.async_connect(endpoint_of(address), detail::use_nothrow);
    REQUIRE(!ec);
    co_return s;
}

HelloInfo named(std::string name, int rank) {
    HelloInfo h;
    h.name = std::move(name);
    h.rank = rank;
    return h;
}

/// A server's hello as a version-3 agent answers a TCP client: the negotiation settles on uv.
Bytes server_hello(std::string name, int rank) {
    detail::Hello h;
    h.info = named(std::move(name), rank);
    h.answer = Negotiated{"uv", "", {ChannelChoice{"cpu", "cpu", "basic"}}};
    return detail::encode_hello(h);
}

/// A raw socket that introduced itself to the agent at `address` (worker1's: an agent admits only
/// another member of its group) as worker0, and read its answer.
Task<asio::ip::tcp::socket> raw_handshaken(const std::string& address) {
    auto s = co_await raw_connect(address);
    co_await test::raw_write(s, detail::encode_hello(named("worker0", 0)));
    co_await test::raw_read_hello(s);
    co_return s;
}

/// Ends the stream now: a FIN, or a reset (close with SO_LINGER 0).
void end_now(asio::ip::tcp::socket& s, bool reset) {
    if (reset) {
        s.set_option(asio::socket_base::linger(true, 0));
        s.close();
    } else {
        ::shutdown(s.native_handle(), SHUT_WR);
    }
}

Task<void> wait_until(std::function<bool()> done, std::chrono::milliseconds step = 5ms) {
    while (!done()) co_await test::sleep_for(step);
}

}  // namespace

// The peer's FIN (or reset) arrives with the last bytes of an unfinished frame: the agent must
// close the connection (not keep a CLOSE-WAIT socket, its buffer and the half frame).
TEST_CASE("the agent closes every inbound connection whose peer ends it in the middle of a frame", "[rpc][agent][fault]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        const auto addr = g[1]->listen_address();
        const Bytes cut = [] {
            Bytes b = test::frame_head(1, 1, "echo", 1000);
            b.resize(b.size() + 300);
            return b;
        }();
        // FIN: the peer still reads, and sees the agent's close as EOF.
        for (int i = 0; i < 100; ++i) {
            auto s = co_await raw_handshaken(addr);
            co_await test::sleep_for(0ms);
            test::send_now(s, cut);
            end_now(s, false);
            (void)co_await test::raw_closed_by_peer(s);
        }
        // Reset: the peer is gone; the agent's descriptors must go too.
        const std::size_t fds = open_fds();
        for (int i = 0; i < 100; ++i) {
            auto s = co_await raw_handshaken(addr);
            co_await test::sleep_for(0ms);
            test::send_now(s, cut);
            end_now(s, true);
        }
        co_await wait_until([&] { return open_fds() <= fds; });
        CHECK(open_fds() <= fds);
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("still here"));
        REQUIRE(r);
        CHECK(r->payload == bytes("still here"));
        co_await test::shutdown_all(g);
    });
}

namespace {
/// A callee that introduces itself as worker1, reads one request and dies half-way through its
/// reply (FIN or reset, with the reply's last bytes).
Task<void> dying_callee(asio::ip::tcp::acceptor& acc, bool reset) {
    auto [ec, s] = co_await acc.async_accept(detail::use_nothrow);
    REQUIRE(!ec);
    co_await test::raw_read_hello(s);
    co_await test::raw_write(s, server_hello("worker1", 1));
    Bytes head(detail::kFrameHeaderSize);
    auto [e1, n1] = co_await asio::async_read(s, asio::buffer(head), detail::use_nothrow);
    REQUIRE(!e1);
    auto h = detail::decode_frame_header(head, ConnectionLimits{});
    REQUIRE(h);
    Bytes rest(h->meta_len + h->payload_len);
    auto [e2, n2] = co_await asio::async_read(s, asio::buffer(rest), detail::use_nothrow);
    REQUIRE(!e2);
    Bytes reply = test::frame_head(2, h->id, "", 200);
    reply.resize(reply.size() + 80);  // 80 of the 200 payload bytes
    test::send_now(s, reply);
    end_now(s, reset);
    if (!reset) {
        asio::steady_timer linger(co_await asio::this_coro::executor, 3s);
        co_await linger.async_wait(detail::use_nothrow);  // keeps the socket (half closed) past the check
    }
}
}  // namespace

// The caller's side: the pending call (no timeout) must fail with connection_lost at once.
TEST_CASE("a call whose callee dies while its reply is on the wire fails with connection_lost at once", "[rpc][agent][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        const auto ep = endpoint_of(g[1]->listen_address());
        {
            auto gone = co_await g[1]->shutdown(false);
            REQUIRE(gone);
        }
        // The next call reconnects to worker1's address, where the dying callee now listens.
        asio::ip::tcp::acceptor fake(ex);
        fake.open(ep.protocol());
        fake.set_option(asio::socket_base::reuse_address(true));
        fake.bind(ep);
        fake.listen();
        for (bool reset : {false, true}) {
            INFO((reset ? "reset" : "FIN"));
            std::optional<Result<Message>> result;
            asio::co_spawn(ex, dying_callee(fake, reset), asio::detached);
            co_await test::sleep_for(10ms);
            const auto t0 = Clock::now();
            asio::co_spawn(ex, g[0]->rpc_async("worker1", "echo", test::text_message("x"), 0),
                           [&result](std::exception_ptr, Result<Message> r) { result = std::move(r); });
            co_await wait_until([&] { return result.has_value(); });
            const auto took = Clock::now() - t0;
            REQUIRE_FALSE(*result);
            CHECK(result->error().code() == Errc::connection_lost);
            CHECK(took < 1s);
        }
        auto done = co_await g[0]->shutdown(false);
        CHECK(done);
    });
}

// A 2 GiB payload claim with a few bytes behind it, on the agent's port.
TEST_CASE("a claimed 2 GiB payload costs the agent memory only as its bytes arrive", "[rpc][agent][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        const auto addr = g[1]->listen_address();
        auto warm = co_await g[0]->rpc_async("worker1", "echo", test::text_message("warm"));
        REQUIRE(warm);
        const std::size_t fds = open_fds();
        const std::size_t before = rss_bytes();
        auto s = co_await raw_handshaken(addr);
        Bytes claim = test::frame_head(1, 1, "echo", std::uint64_t(1) << 31);  // exactly the limit
        claim.resize(claim.size() + 64 * 1024);
        co_await test::raw_write(s, claim);
        co_await test::sleep_for(100ms);
        const std::size_t grown = rss_bytes() - before;
        INFO("RSS grew by " << grown / 1024 << " KiB");
        CHECK(grown < (64u << 20));
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("served"));  // the loop is not stalled
        REQUIRE(r);
        CHECK(r->payload == bytes("served"));
        s.close();  // cut: the agent closes its end
        co_await wait_until([&] { return open_fds() <= fds; });
        co_await test::shutdown_all(g);
    });
}

namespace {

/// An shm setup message claiming a ring of `capacity` bytes, with a real (sparse: it costs its
/// sender nothing) sealed memfd of that size behind it, sent on `s` in place of a hello.
void send_ring_claim(asio::generic::stream_protocol::socket& s, std::size_t capacity) {
    auto e = detail::shm::create_local_end(4096);
    REQUIRE(e);
    detail::shm::Fd big(::memfd_create("claim", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    const std::size_t bytes = detail::shm::mapping_bytes(capacity);
    REQUIRE(::ftruncate(big.get(), static_cast<off_t>(bytes)) == 0);
    void* p = ::mmap(nullptr, detail::shm::kDataOffset, PROT_READ | PROT_WRITE, MAP_SHARED, big.get(), 0);
    REQUIRE(p != MAP_FAILED);
    detail::shm::init_ring(p, capacity);
    ::munmap(p, detail::shm::kDataOffset);
    REQUIRE(::fcntl(big.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    detail::shm::SetupMessage m;
    m.capacity = capacity;
    const int fds[detail::shm::kSetupFds] = {big.get(), e->data_bell.get(), e->space_bell.get()};
    auto sent = detail::shm::send_setup(s.native_handle(), m, fds);
    REQUIRE(sent);
    REQUIRE(*sent);
}

}  // namespace

TEST_CASE("an shm peer gets rings only once admitted: 12 claims of 256 MiB rings instead of a hello map nothing",
          "[rpc][agent][fault][hostile]") {
    const test::Configure shm_first = [](int, TensorPipeRpcBackendOptions& o) {
        o.transports = std::vector<std::string>{"shm", "uv"};
    };
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, shm_first);
        test::register_echo(g);
        std::string url;
        for (const auto& u : g[1]->listen_urls())
            if (u.rfind("shm://", 0) == 0) url = u;
        REQUIRE(!url.empty());
        auto warm = co_await g[0]->rpc_async("worker1", "echo", test::text_message("warm"));
        REQUIRE(warm);
        auto address = Address::parse(url);
        REQUIRE(address);
        auto transport = detail::transport_for(*address);
        REQUIRE(transport);
        const auto before = static_cast<std::int64_t>(rss_bytes());
        std::vector<detail::TransportStream> claims;
        for (int i = 0; i < 12; ++i) {
            auto connecting = (*transport)->connect(*address);
            auto s = co_await std::move(connecting);
            REQUIRE(s);
            send_ring_claim(s->socket, std::size_t(256) << 20);
            claims.push_back(std::move(*s));
        }
        // Each is read as a hello (a bad one) and closed; nothing of the claimed rings is mapped.
        for (auto& c : claims) {
            std::array<char, 64> sink;
            auto [ec, n] = co_await c.socket.async_read_some(asio::buffer(sink), detail::use_nothrow);
            while (!ec) std::tie(ec, n) = co_await c.socket.async_read_some(asio::buffer(sink), detail::use_nothrow);
        }
        const auto grown = static_cast<std::int64_t>(rss_bytes()) - before;
        INFO("RSS grew by " << grown / 1024 << " KiB for 12 claimed rings of 256 MiB");
        CHECK(grown < (64 << 20));  // (set up and pre-faulted before the handshake: +3 GiB)
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("served"));
        REQUIRE(r);
        CHECK(r->payload == bytes("served"));
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("500 sockets that never say hello cost the agent little memory", "[rpc][agent][fault]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto g = co_await test::make_group(1);
        const auto ep = endpoint_of(g[0]->listen_address());
        auto ex = co_await asio::this_coro::executor;
        std::vector<asio::ip::tcp::socket> raws;
        for (int i = 0; i < 8; ++i) {  // (warm up allocator arenas and coroutine frames)
            raws.emplace_back(ex);
            raws.back().connect(ep);
        }
        co_await test::sleep_for(50ms);
        const std::size_t before = rss_bytes();
        for (int i = 0; i < 500; ++i) {
            raws.emplace_back(ex);
            raws.back().connect(ep);
            if (i % 50 == 49) co_await test::sleep_for(1ms);  // (let the agent accept them)
        }
        co_await test::sleep_for(200ms);
        const std::size_t grown = rss_bytes() - before;
        INFO("RSS grew by " << grown / 1024 << " KiB for 500 silent sockets");
        CHECK(grown < test::kRssGrowthFactor * (16u << 20));  // (TSan: its shadow memory too)
        for (auto& r : raws) r.close();
        co_await test::shutdown_all(g, false);
    });
}

TEST_CASE("the agent closes a silent socket after the handshake timeout and a slow-loris sender after the frame timeout",
          "[rpc][agent][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        // (Set as users set them: through the options.)
        const test::Configure short_timeouts = [](int, TensorPipeRpcBackendOptions& o) {
            o.handshake_timeout = 0.2;
            o.frame_timeout = 0.2;
        };
        const detail::NativeAgentTuning tuning;
        auto g = co_await make_tuned_group(2, tuning, short_timeouts);
        const auto addr = g[1]->listen_address();

        auto silent = co_await raw_connect(addr);
        auto t0 = Clock::now();
        (void)co_await test::raw_closed_by_peer(silent);
        CHECK(Clock::now() - t0 < 3s);

        // A byte every 20 ms of a 150-byte frame: 3 s if it were let through.
        auto loris = co_await raw_handshaken(addr);
        Bytes frame = test::frame_head(1, 1, "echo", 120);
        frame.resize(frame.size() + 120);
        t0 = Clock::now();
        bool cut = false;
        for (std::size_t i = 0; i < frame.size(); ++i) {
            asio::error_code ec;
            asio::write(loris, asio::buffer(&frame[i], 1), ec);
            if (ec) {  // (the agent closed: this write met its reset)
                cut = true;
                break;
            }
            co_await test::sleep_for(20ms);
        }
        if (!cut) (void)co_await test::raw_closed_by_peer(loris);
        CHECK(Clock::now() - t0 < 2s);
        co_await test::shutdown_all(g, false);
    });
}

TEST_CASE("quiet live peers stay connected past idle_timeout (keep-alives); a silent socket is let go", "[rpc][agent][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        const test::Configure short_idle = [](int, TensorPipeRpcBackendOptions& o) { o.idle_timeout = 0.6; };
        const detail::NativeAgentTuning tuning;
        auto g = co_await make_tuned_group(2, tuning, short_idle);
        test::register_echo(g);
        for (int from = 0; from < 2; ++from) {  // (a connection each way)
            auto r = co_await g[from]->rpc_async(test::worker_name(1 - from), "echo", test::text_message("before"));
            REQUIRE(r);
        }
        co_await test::sleep_for(2500ms);  // four idle timeouts without a call
        for (int from = 0; from < 2; ++from) {
            auto info = co_await g[from]->get_debug_info();
            REQUIRE(info);
            REQUIRE(info->peers.size() == 1);
            CHECK(info->peers[0].rank == 1 - from);
            CHECK(info->peers[0].connected);  // (an idle close would have dropped it)
            CHECK(info->peers[0].calls_failed == 0);
            auto r = co_await g[from]->rpc_async(test::worker_name(1 - from), "echo", test::text_message("after"));
            REQUIRE(r);
        }
        // A handshaken socket that then says nothing (no keep-alives) is closed.
        auto silent = co_await raw_handshaken(g[1]->listen_address());
        const auto t0 = Clock::now();
        (void)co_await test::raw_closed_by_peer(silent);
        CHECK(Clock::now() - t0 < 3s);
        co_await test::shutdown_all(g, false);
    });
}

namespace {
/// A message with one CPU tensor of `n` bytes.
Message with_tensor_of(std::int64_t n) {
    Message m = test::text_message("sized");
    m.tensors.push_back(Tensor::cpu(DType::uint8, {n}));
    return m;
}
}  // namespace

TEST_CASE("bounds set through the options apply: a frame over the receive budget fails alone, one over max_frame_bytes ends its "
          "connection", "[rpc][agent][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        const test::Configure bounded = [](int rank, TensorPipeRpcBackendOptions& o) {
            o.transports = std::vector<std::string>{"uv"};
            o.channels = std::vector<std::string>{"basic"};  // (every byte on the stream)
            if (rank != 1) return;
            o.receive_budget_bytes = std::size_t(256) << 10;
            o.max_frame_bytes = std::size_t(1) << 20;
        };
        const detail::NativeAgentTuning tuning;
        auto g = co_await make_tuned_group(2, tuning, bounded);
        test::register_echo(g);
        const std::string to = "worker1", handler = "echo";
        Message m512 = with_tensor_of(512 << 10);
        auto over_budget = co_await g[0]->rpc_async(to, handler, std::move(m512));
        REQUIRE_FALSE(over_budget);
        INFO(over_budget.error().to_string());
        CHECK(over_budget.error().message().find("receive budget (262144 bytes") != std::string::npos);
        auto small = co_await g[0]->rpc_async(to, handler, test::text_message("still served"));
        CHECK(small);  // (the same connection: only that frame failed)
        Message m2 = with_tensor_of(2 << 20);
        auto over_frame = co_await g[0]->rpc_async(to, handler, std::move(m2));
        REQUIRE_FALSE(over_frame);
        INFO(over_frame.error().to_string());
        CHECK(over_frame.error().code() == Errc::connection_lost);
        co_await test::shutdown_all(g, false);
    });
}

TEST_CASE("beyond max_inbound_connections the agent closes new sockets at once and keeps the others", "[rpc][agent][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        const test::Configure four = [](int, TensorPipeRpcBackendOptions& o) {
            o.max_inbound_connections = 4;  // worker0's connection and three more
        };
        const detail::NativeAgentTuning tuning;
        auto g = co_await make_tuned_group(2, tuning, four);
        test::register_echo(g);
        const auto addr = g[1]->listen_address();
        std::vector<asio::ip::tcp::socket> held;
        for (int i = 0; i < 3; ++i) held.push_back(co_await raw_connect(addr));
        co_await test::sleep_for(50ms);
        auto refused = co_await raw_connect(addr);
        const auto t0 = Clock::now();
        (void)co_await test::raw_closed_by_peer(refused);
        CHECK(Clock::now() - t0 < 2s);  // at once, not at the 10 s handshake timeout
        for (auto& h : held) {
            asio::error_code ec;
            CHECK(h.available(ec) == 0);
            CHECK(!ec);
        }
        held.pop_back();  // one goes: room for a new one, which can introduce itself
        co_await test::sleep_for(50ms);
        auto s = co_await raw_handshaken(addr);
        CHECK(s.is_open());
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("ok"));
        REQUIRE(r);
        co_await test::shutdown_all(g, false);
    });
}

namespace {

/// A forked process that opens `n` TCP sockets to `ep`, says nothing on them, writes 'S' on `out`,
/// waits for a byte on `in`, then writes how many of its sockets the agent has closed (a
/// std::size_t) and exits. Only system calls in the child (the parent has threads).
pid_t fork_silent_sockets(const asio::ip::tcp::endpoint& ep, std::size_t n, int in, int out) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid != 0) return pid;
    rlimit nofile{};
    if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
        nofile.rlim_cur = nofile.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &nofile);
    }
    static int fds[8192];
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(ep.port());
    addr.sin_addr.s_addr = htonl(ep.address().to_v4().to_uint());
    std::size_t opened = 0;
    for (; opened < n && opened < 8192; ++opened) {
        fds[opened] = ::socket(AF_INET, SOCK_STREAM, 0);
        if (fds[opened] < 0 || ::connect(fds[opened], reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) break;
    }
    if (opened < n) ::_exit(2);
    if (::write(out, "S", 1) != 1) ::_exit(3);
    char go = 0;
    if (::read(in, &go, 1) != 1) ::_exit(4);
    std::size_t closed = 0;
    for (std::size_t i = 0; i < opened; ++i) {
        char c = 0;
        const auto r = ::recv(fds[i], &c, 1, MSG_PEEK | MSG_DONTWAIT);
        closed += (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ? 1 : 0;
    }
    if (::write(out, &closed, sizeof closed) != sizeof closed) ::_exit(5);
    ::_exit(0);
}

/// Reads `n` bytes of the pipe `fd` on the event loop (the agents run meanwhile).
Task<bool> read_pipe(int fd, void* to, std::size_t n) {
    asio::posix::stream_descriptor d(co_await asio::this_coro::executor, ::dup(fd));
    auto [ec, got] = co_await asio::async_read(d, asio::buffer(to, n), detail::use_nothrow);
    co_return !ec && got == n;
}

}  // namespace

TEST_CASE("4,100 silent sockets from another process do not lock peers out of the agent", "[rpc][agent][fault][hostile]") {
    int to_child[2], from_child[2];
    REQUIRE(::pipe(to_child) == 0);
    REQUIRE(::pipe(from_child) == 0);
    constexpr std::size_t kSilent = 4100;  // (past max_inbound_connections, 4096)
    detail::NativeAgentTuning tuning;
    std::size_t closed = 0;
    pid_t pid = -1;
    test::run_with_deadline(60s, [&]() -> Task<void> {
        const test::Configure none;
        auto g = co_await make_tuned_group(2, tuning, none);
        test::register_echo(g);
        const auto addr = g[1]->listen_address();
        pid = fork_silent_sockets(endpoint_of(addr), kSilent, to_child[0], from_child[1]);
        char started = 0;
        const bool opened = co_await read_pipe(from_child[0], &started, 1);
        REQUIRE(opened);
        REQUIRE(started == 'S');
        // New peers still get through their handshakes, one after another.
        std::vector<asio::ip::tcp::socket> peers;
        for (int i = 0; i < 24; ++i) peers.push_back(co_await raw_handshaken(addr));
        CHECK(peers.size() == 24);
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("ok"));
        CHECK(r);
        REQUIRE(::write(to_child[1], "G", 1) == 1);
        const bool counted = co_await read_pipe(from_child[0], &closed, sizeof closed);
        CHECK(counted);
        std::printf("MEASURE %zu silent sockets: the agent ended %zu handshakes (at most %zu in progress at once), and let 24 "
                    "peers in\n",
                    kSilent, closed, tuning.max_inbound_handshakes);
        co_await test::shutdown_all(g, false);
    });
    const auto codes = test::reap({pid}, std::chrono::seconds(10));
    CHECK(codes[0] == 0);
    // All but the newest max_inbound_handshakes were ended when later ones came.
    CHECK(closed + tuning.max_inbound_handshakes >= kSilent);
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
}

}  // namespace tp_agent_hardening_test
