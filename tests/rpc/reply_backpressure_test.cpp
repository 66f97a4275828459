// A caller that sends requests and never reads the replies (issue 32): the agent stops reading
// that connection's requests while its replies to it are over the soft bound, and closes the
// connection when they pass the hard bound in more than one reply; everyone else is served
// meanwhile. The caller is its own process (forked before the agents start), as it was found.
#include "rpc/agent_test_util.hpp"
#include "rpc/forked.hpp"

#include <tensorplay/core/timeout.hpp>
#include <tensorplay/transport/address.hpp>

#include "rpc/peer_record.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

std::int64_t rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    return -1;
}

/// What the forked caller does: connects to `address` as worker1, sends `count` requests of
/// `handler` with `payload_bytes` each, never reading; then, after `hold`, reads what comes until
/// the connection closes or `count` replies came. Exit code: 0 when the connection was closed by
/// the agent before every reply came (`expect_close`), or when every reply came (otherwise).
struct Caller {
    std::string handler;
    std::size_t count = 0;
    std::size_t payload_bytes = 0;
    Duration hold{};
    bool expect_close = false;
};

Task<int> caller(int address_fd, Caller c) {
    char buf[256] = {};
    const auto n = ::read(address_fd, buf, sizeof buf - 1);
    if (n <= 0) co_return 10;
    auto address = Address::parse(std::string(buf, static_cast<std::size_t>(n)));
    if (!address) co_return 11;
    HelloInfo hello;
    hello.name = "worker1";
    hello.rank = 1;
    auto connecting = Connection::connect(std::move(*address), hello, ConnectionLimits{}, HandshakeAuth{});
    auto conn = co_await std::move(connecting);
    if (!conn) {
        std::fprintf(stderr, "caller: %s\n", conn.error().to_string().c_str());
        co_return 12;
    }
    const Bytes payload(c.payload_bytes, 0x5a);
    for (std::size_t i = 0; i < c.count; ++i) {
        Frame f;
        f.id = i + 1;
        f.name = c.handler;
        f.payload = payload;
        if (!(*conn)->send(std::move(f), true)) break;
    }
    asio::steady_timer t(co_await asio::this_coro::executor, c.hold);
    (void)co_await t.async_wait(detail::use_nothrow);
    std::size_t replies = 0;
    for (; replies < c.count; ++replies) {
        auto r = co_await with_timeout((*conn)->receive(), 20s);
        if (!r) break;
    }
    std::fprintf(stderr, "caller: %zu of %zu replies\n", replies, c.count);
    (*conn)->close();
    if (c.expect_close) co_return replies < c.count ? 0 : 20;
    co_return replies == c.count ? 0 : 21;
}

pid_t fork_caller(int& address_fd, Caller c) {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(p[1]);
        ::_exit(test::run_child(caller(p[0], std::move(c)), 60s));
    }
    ::close(p[0]);
    address_fd = p[1];
    return pid;
}

/// worker0's uv address, as the store lists it.
Task<std::string> uv_address(Store& store) {
    auto b = co_await store.get("native_agent/info/0");
    REQUIRE(b);
    auto rec = detail::decode_record(*b);
    REQUIRE(rec);
    for (const auto& o : rec->addresses)
        if (o.name == "uv") co_return o.address;
    FAIL("worker0 lists no uv address");
    co_return std::string();
}

}  // namespace

TEST_CASE("a caller that never reads its replies stops being read past the soft bound; others are served",
          "[rpc][hostile][memory]") {
    int address_fd = -1;
    // 256 requests of 1 MiB, echoed: 256 MiB of replies that nobody reads.
    const pid_t pid = fork_caller(address_fd, Caller{"echo", 256, std::size_t(1) << 20, 6s, false});
    std::size_t served = 0;
    std::int64_t grown = 0;
    test::run_with_deadline(90s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        for (auto& a : g.agents)
            REQUIRE(a->register_handler("echo", [&served](WorkerInfo, Message m) -> Task<Result<Message>> {
                ++served;
                co_return m;
            }));
        const auto rss0 = rss_bytes();
        const std::string address = co_await uv_address(*g.store);
        REQUIRE(::write(address_fd, address.data(), address.size()) == static_cast<ssize_t>(address.size()));
        ::close(address_fd);
        // Until the serving stands still (at most 10 s): the caller's requests stop being read.
        std::size_t seen = 0;
        for (int still = 0, i = 0; still < 5 && i < 100; ++i) {
            co_await test::sleep_for(100ms);
            still = served == seen && served > 0 ? still + 1 : 0;
            seen = served;
        }
        grown = rss_bytes() - rss0;
        std::printf("MEASURE 256 MiB of echo requests whose replies are never read: %zu served, VmRSS %+.1f MiB\n", served,
                    static_cast<double>(grown) / (1 << 20));
        CHECK(served < 160);  // (the 64 MiB bound, the replies in the sockets and those read before it held)
        // The real worker1 is served all along, and so is worker0 by it.
        auto r = co_await test::call_echo(*g[1], "worker0");
        CHECK(r);
        auto back = co_await test::call_echo(*g[0], "worker1");
        CHECK(back);
        // The caller reads after all: every reply comes (nothing was dropped).
        for (int i = 0; i < 300 && served < 258; ++i) co_await test::sleep_for(100ms);
        CHECK(served == 258);  // (and the two calls of the real workers above)
        auto s = co_await test::shutdown_all(g, false);
        (void)s;
    });
    auto codes = test::reap({pid}, 30s);
    CHECK(codes[0] == 0);
    CHECK(grown < (std::int64_t(200) << 20));
}

TEST_CASE("replies past the hard bound, in more than one reply, close that caller's connection only",
          "[rpc][hostile][memory]") {
    int address_fd = -1;
    // 200 small requests, each answered with 4 MiB: 800 MiB of replies (hard bound 32 MiB here).
    const pid_t pid = fork_caller(address_fd, Caller{"big", 200, 16, 2s, true});
    detail::NativeAgentTuning tuning;
    tuning.reply_bounds = {std::size_t(8) << 20, std::size_t(32) << 20};
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, {}, tuning);
        test::register_echo(g);
        for (auto& a : g.agents)
            REQUIRE(a->register_handler("big", [](WorkerInfo, Message) -> Task<Result<Message>> {
                co_return Message{Bytes(std::size_t(4) << 20, 0x42), {}};
            }));
        const std::string address = co_await uv_address(*g.store);
        REQUIRE(::write(address_fd, address.data(), address.size()) == static_cast<ssize_t>(address.size()));
        ::close(address_fd);
        co_await test::sleep_for(1s);
        auto r = co_await test::call_echo(*g[1], "worker0");
        CHECK(r);
        co_await test::sleep_for(2s);
        auto again = co_await test::call_echo(*g[1], "worker0");
        CHECK(again);
        auto s = co_await test::shutdown_all(g, false);
        (void)s;
    });
    auto codes = test::reap({pid}, 30s);
    CHECK(codes[0] == 0);
}
