// Transport negotiation between agents: the default picks shm on one host, `_transports`
// restricts and orders, unknown names are refused up front, no common transport fails init
// naming both workers, the uds listener admits its own user only (SO_PEERCRED), and an idle shm
// connection sleeps instead of spinning.
#include "rpc/agent_test_util.hpp"

#include "transport/frame.hpp"
#include "transport/transport.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <cstring>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_negotiation_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {
using Names = std::optional<std::vector<std::string>>;

test::Configure with(Names transports) {
    return [transports](int, TensorPipeRpcBackendOptions& o) { o.transports = transports; };
}

/// Starts two agents with the given `_transports` each; the results of both.
Task<std::vector<Result<test::AgentPtr>>> start_two(Names first, Names second) {
    auto ex = co_await asio::this_coro::executor;
    auto store = std::make_shared<HashStore>(std::chrono::seconds(5));
    std::vector<Result<test::AgentPtr>> out(2, fail(Errc::internal, "not started"));
    test::Signal done(ex, 2);
    for (int r = 0; r < 2; ++r) {
        auto args = test::init_args(store, r, 2, with(r == 0 ? first : second));
        asio::co_spawn(ex, detail::NativeAgent::create(std::move(args)),
                       [&out, &done, r](std::exception_ptr, Result<test::AgentPtr> a) {
                           out[r] = std::move(a);
                           done.try_send(std::error_code{}, r);
                       });
    }
    for (int i = 0; i < 2; ++i) co_await done.async_receive(asio::use_awaitable);
    co_return out;
}
}  // namespace

/// A hello from "worker0" offering uds (built outside coroutines: GCC 12 and initializer lists).
Bytes uds_hello() {
    HelloInfo h;
    h.name = "worker0";
    h.rank = 0;
    auto uds = detail::transport_named("uds");
    REQUIRE(uds);
    h.transports = {TransportOffer{"uds", (*uds)->domain(), ""}};
    return detail::encode_hello(h);
}

TEST_CASE("by default two workers on one host negotiate shm and the cma channel", "[rpc][agent][negotiation]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("over shm"));
        REQUIRE(r);
        CHECK(r->payload == bytes("over shm"));
        CHECK(g[0]->connection_to(1)->transport() == "shm");
        CHECK(g[1]->connection_to(0)->transport() == "shm");
        auto info = co_await g[0]->get_debug_info();
        REQUIRE(info);
        REQUIRE(info->peers.size() == 1);
        CHECK(info->peers[0].transport == "shm");
        CHECK(info->peers[0].channel == "cpu->cpu:cma");
        // Every listener is published, highest priority first.
        auto urls = g[1]->listen_urls();
        REQUIRE(urls.size() == 3);
        CHECK(urls[0].rfind("shm://", 0) == 0);
        CHECK(urls[1].rfind("uds://", 0) == 0);
        CHECK(urls[2].rfind("tcp://127.0.0.1:", 0) == 0);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("_transports [uds, uv] gives uds: shm is left out when not listed", "[rpc][agent][negotiation]") {
    const auto uds_uv = with(std::vector<std::string>{"uds", "uv"});
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, uds_uv);
        test::register_echo(g);
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("over uds"));
        REQUIRE(r);
        CHECK(g[0]->connection_to(1)->transport() == "uds");
        CHECK(g[1]->connection_to(0)->transport() == "uds");
        co_await test::shutdown_all(g);
    });
}

namespace {
double process_cpu_seconds() {
    timespec t{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}
}  // namespace

TEST_CASE("an idle shm connection sleeps on its doorbell instead of spinning", "[rpc][agent][negotiation][shm]") {
    test::run_with_deadline(15s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        for (int i = 0; i < 100; ++i) {  // both readers have spun and slept many times
            auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("busy"));
            REQUIRE(r);
        }
        REQUIRE(g[0]->connection_to(1)->transport() == "shm");
        REQUIRE(g[1]->connection_to(0)->transport() == "shm");
        // Both agents, and both ends of their shm connections, live in this process: a reader
        // that kept looking would burn a core here.
        const double cpu0 = process_cpu_seconds();
        const auto t0 = Clock::now();
        co_await test::sleep_for(1s);
        const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
        const double used = process_cpu_seconds() - cpu0;
        INFO("CPU " << used << " s over " << wall << " s idle");
        CHECK(used < 0.2 * wall);
        // And it wakes up at once when a call comes.
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("awake"), 2);
        REQUIRE(r);
        CHECK(r->payload == bytes("awake"));
        co_await test::shutdown_all(g);
    });
}

namespace {
Tensor big_tensor() {
    Tensor t = Tensor::cpu(DType::uint8, {3 << 20});
    for (std::size_t i = 0; i < t.nbytes(); ++i) t.data()[i] = static_cast<std::uint8_t>(i * 13 + 5);
    return t;
}

/// Echoes a 3 MiB tensor from worker0 to worker1 and back; checks the bytes, the channel both
/// sides chose, and how many tensors went by reference.
Task<void> echo_big(test::AgentGroup& g, std::string channel, std::uint64_t by_ref) {
    test::register_echo(g);
    Message m = test::text_message("big");
    Tensor t = big_tensor();
    m.tensors.push_back(t);
    auto r = co_await g[0]->rpc_async("worker1", "echo", std::move(m));
    REQUIRE(r);
    REQUIRE(r->tensors.size() == 1);
    CHECK(std::memcmp(r->tensors[0].data(), t.data(), t.nbytes()) == 0);
    auto c = g[0]->connection_to(1);
    REQUIRE(c);
    REQUIRE(c->negotiated().channels.size() == 1);
    CHECK(c->negotiated().channels[0].channel == channel);
    CHECK(tensorplay::detail::channel_stats(*c).cma_sent == by_ref);      // the request
    CHECK(tensorplay::detail::channel_stats(*c).cma_received == by_ref);  // the reply
    CHECK(tensorplay::detail::channel_stats(*c).cma_held == 0);
    co_await test::shutdown_all(g);
}

/// Sets TP_CMA_TEST_BAD_PROBE for the test's lifetime (both in-process agents then advertise a
/// probe target that fails).
struct BadProbe {
    BadProbe() { ::setenv("TP_CMA_TEST_BAD_PROBE", "1", 1); }
    ~BadProbe() { ::unsetenv("TP_CMA_TEST_BAD_PROBE"); }
};
}  // namespace

TEST_CASE("_channels [basic] gives basic even on one host", "[rpc][agent][negotiation]") {
    const test::Configure basic = [](int, TensorPipeRpcBackendOptions& o) { o.channels = std::vector<std::string>{"basic"}; };
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, basic);
        co_await echo_big(g, "basic", 0);
    });
}

TEST_CASE("two workers on one host carry large tensors by cma", "[rpc][agent][negotiation]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        co_await echo_big(g, "cma", 1);
    });
}

TEST_CASE("workers whose cma probe fails fall back to basic silently", "[rpc][agent][negotiation]") {
    BadProbe bad;
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        co_await echo_big(g, "basic", 0);
    });
}

TEST_CASE("_transports [uv] gives TCP even on one host", "[rpc][agent][negotiation]") {
    const auto uv = with(std::vector<std::string>{"uv"});
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, uv);
        test::register_echo(g);
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("over tcp"));
        REQUIRE(r);
        CHECK(g[0]->connection_to(1)->transport() == "uv");
        CHECK(g[1]->listen_urls().size() == 1);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("the server's order decides: one side preferring uv and the other uds", "[rpc][agent][negotiation]") {
    // worker0 ranks uv first, worker1 uds first: each connection takes its server's choice.
    const Names uv_first = std::vector<std::string>{"uv", "uds"}, uds_first = std::vector<std::string>{"uds", "uv"};
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto both = co_await start_two(uv_first, uds_first);
        REQUIRE(both[0]);
        REQUIRE(both[1]);
        CHECK((*both[0])->connection_to(1)->transport() == "uds");  // worker1 served it
        CHECK((*both[1])->connection_to(0)->transport() == "uv");   // worker0 served it
        for (auto& a : both) {
            auto d = co_await (*a)->shutdown(false);
            CHECK(d);
        }
    });
}

TEST_CASE("uds alone needs no TCP listener: the negotiation runs over the Unix socket", "[rpc][agent][negotiation]") {
    const auto uds = with(std::vector<std::string>{"uds"});
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, uds);
        test::register_echo(g);
        auto urls = g[1]->listen_urls();
        REQUIRE(urls.size() == 1);
        CHECK(urls[0].rfind("uds://", 0) == 0);
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("x"));
        CHECK(r);
        CHECK(g[0]->connection_to(1)->transport() == "uds");
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("two workers without a common transport fail init naming both", "[rpc][agent][negotiation]") {
    const Names uds = std::vector<std::string>{"uds"}, uv = std::vector<std::string>{"uv"};
    test::run_with_deadline(15s, [&]() -> Task<void> {
        auto both = co_await start_two(uds, uv);
        for (auto& a : both) {
            REQUIRE_FALSE(a);
            INFO(a.error().to_string());
            CHECK(a.error().code() == Errc::not_supported);
            CHECK(a.error().message().find("no common transport") != std::string::npos);
            CHECK(a.error().message().find("\"worker0\"") != std::string::npos);
            CHECK(a.error().message().find("\"worker1\"") != std::string::npos);
        }
    });
}

TEST_CASE("unknown transport and channel names are invalid_argument when the options are checked", "[rpc][options][negotiation]") {
    TensorPipeRpcBackendOptions o;
    o.transports = std::vector<std::string>{"uv", "carrier_pigeon"};
    auto r = o.validate();
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == Errc::invalid_argument);
    CHECK(r.error().message().find("carrier_pigeon") != std::string::npos);
    o.transports = std::vector<std::string>{"shm", "uds", "ibv", "uv", "tcp"};
    CHECK(o.validate());
    o.channels = std::vector<std::string>{"basic", "teleport"};
    auto c = o.validate();
    REQUIRE_FALSE(c);
    CHECK(c.error().message().find("teleport") != std::string::npos);
}

TEST_CASE("the uds listener closes a peer of another user (SO_PEERCRED)", "[rpc][agent][negotiation][fault]") {
    if (::geteuid() != 0) {
        WARN("not root: cannot connect as another user; skipped");
        return;
    }
    const auto uds_uv = with(std::vector<std::string>{"uds", "uv"});
    const Bytes hello = uds_hello();
    test::run_with_deadline(15s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, uds_uv);
        test::register_echo(g);
        std::string url;
        for (const auto& u : g[1]->listen_urls())
            if (u.rfind("uds://", 0) == 0) url = u;
        REQUIRE(!url.empty());
        const std::string name = url.substr(6);
        // The child turns into nobody, connects, says hello and reports what came back:
        // 0 = the server closed without a word (refused), 1 = it answered, 2 = setup failed.
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
            int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
            sockaddr_un a{};
            a.sun_family = AF_UNIX;
            std::memcpy(a.sun_path + 1, name.data(), name.size());
            auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
            if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) ::_exit(2);
            (void)::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
            char buf[64];
            ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            ::_exit(n > 0 ? 1 : 0);
        }
        int status = 0;
        for (int i = 0; i < 500 && ::waitpid(child, &status, WNOHANG) == 0; ++i) co_await test::sleep_for(10ms);
        REQUIRE(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
        // The agent serves its own user as before.
        auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("still here"));
        CHECK(r);
        co_await test::shutdown_all(g);
    });
}

}  // namespace tp_negotiation_test
