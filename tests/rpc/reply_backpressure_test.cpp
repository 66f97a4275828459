// A caller that sends requests and never reads the replies (issue 32): the agent stops reading
// that connection's requests while its replies to it are over the soft bound, and closes the
// connection when they pass the hard bound in more than one reply; everyone else is served
// meanwhile. The caller is its own process (forked before the agents start), as it was found.
#include "rpc/agent_test_util.hpp"
#include "rpc/forked.hpp"
#include "support/sanitizers.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/transport/address.hpp>

#include <asio/posix/stream_descriptor.hpp>

#include "rpc/peer_record.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_reply_backpressure_test {

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

/// What the forked caller does: connects to the address the test writes on its pipe as worker1,
/// queues `count` requests of `handler` with `payload_bytes` each and says 'S' on its status pipe;
/// reads nothing until the test writes 'G', then reads what comes until the connection closes or
/// `count` replies came. Exit code: 0 when the connection was closed by the agent before every
/// reply came (`expect_close`), or when every reply came (otherwise).
struct Caller {
    std::string handler;
    std::size_t count = 0;
    std::size_t payload_bytes = 0;
    bool expect_close = false;
    /// Each request also carries this one tensor (0: none), by reference where the pair chose
    /// cma (offered when set): the agent's echo then answers by reference too.
    std::size_t tensor_bytes = 0;
    bool cma = false;
};

Task<Result<void>> wait_readable(int fd) {
    asio::posix::stream_descriptor d(co_await asio::this_coro::executor, ::dup(fd));
    auto [ec] = co_await d.async_wait(asio::posix::descriptor_base::wait_read, detail::use_nothrow);
    if (ec) co_return fail(from_error_code(ec, "waiting on a descriptor"));
    co_return ok();
}

/// Whether `fd` becomes readable within `limit`: awaited on the event loop (which runs our
/// connection's writer meanwhile), not polled.
Task<bool> readable(int fd, Duration limit) {
    auto r = co_await with_timeout(wait_readable(fd), limit);
    co_return r.has_value();
}

/// The next byte of the pipe `fd` within `limit`, or -1.
Task<int> next_byte(int fd, Duration limit) {
    if (!co_await readable(fd, limit)) co_return -1;
    unsigned char c = 0;
    if (::read(fd, &c, 1) != 1) co_return -1;
    co_return c;
}

/// Counts a handler's calls and wakes the test at each one (an eventfd: a handler may run on
/// another thread than the test).
struct Served {
    std::atomic<std::size_t> n{0};
    int fd = ::eventfd(0, EFD_NONBLOCK);
    Served() = default;
    Served(const Served&) = delete;
    Served& operator=(const Served&) = delete;
    ~Served() { ::close(fd); }
    void one() {
        ++n;
        const std::uint64_t v = 1;
        (void)!::write(fd, &v, sizeof v);
    }
    /// True when another call comes within `limit`.
    Task<bool> next(Duration limit) {
        if (!co_await readable(fd, limit)) co_return false;
        std::uint64_t v = 0;
        (void)!::read(fd, &v, sizeof v);
        co_return true;
    }
};

Task<int> caller(int in_fd, int out_fd, Caller c) {
    char buf[256] = {};
    const auto n = ::read(in_fd, buf, sizeof buf - 1);  // (blocking: the address comes first)
    if (n <= 0) co_return 10;
    ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
    auto address = Address::parse(std::string(buf, static_cast<std::size_t>(n)));
    if (!address) co_return 11;
    HelloInfo hello;
    hello.name = "worker1";
    hello.rank = 1;
    if (c.cma) hello.channels = {ChannelOffer{"cma", "cpu", ""}, ChannelOffer{"basic", "cpu", "any"}};
    // (Untouched: a 64 MiB tensor of zero pages costs this process next to nothing.)
    const Tensor tensor = c.tensor_bytes ? Tensor::cpu(DType::uint8, {static_cast<std::int64_t>(c.tensor_bytes)}) : Tensor{};
    auto connecting = Connection::connect(std::move(*address), hello, ConnectionLimits{}, HandshakeAuth{});
    auto conn = co_await std::move(connecting);
    if (!conn) {
        std::fprintf(stderr, "caller: %s\n", conn.error().to_string().c_str());
        co_return 12;
    }
    const Bytes payload(c.payload_bytes, 0x5a);
    std::size_t sent = 0;
    for (; sent < c.count; ++sent) {
        Frame f;
        f.id = sent + 1;
        f.name = c.handler;
        f.payload = payload;
        if (tensor.defined()) f.tensors = {tensor};
        if (!(*conn)->send(std::move(f), true)) break;
    }
    std::fprintf(stderr, "caller: queued %zu of %zu requests\n", sent, c.count);
    if (::write(out_fd, "S", 1) != 1) co_return 13;
    const int go = co_await next_byte(in_fd, 50s);
    if (go != 'G') co_return 14;
    std::size_t replies = 0;
    for (; replies < c.count; ++replies) {
        auto r = co_await with_timeout((*conn)->receive(), 20s);
        if (!r) {
            std::fprintf(stderr, "caller: reply %zu: %s\n", replies + 1, r.error().to_string().c_str());
            break;
        }
    }
    std::fprintf(stderr, "caller: %zu of %zu replies\n", replies, c.count);
    (*conn)->close();
    if (c.expect_close) co_return replies < c.count ? 0 : 20;
    co_return sent == c.count && replies == c.count ? 0 : 21;
}

/// The forked caller and its pipes: `to` (the address, then 'G'), `from` ('S', non-blocking).
struct CallerProcess {
    pid_t pid = -1;
    int to = -1, from = -1;
    ~CallerProcess() {
        if (to >= 0) ::close(to);
        if (from >= 0) ::close(from);
    }
    void say(std::string_view what) const { REQUIRE(::write(to, what.data(), what.size()) == static_cast<ssize_t>(what.size())); }
    /// Its exit code, awaited (its pidfd) while the event loop runs: the agents serve it meanwhile.
    Task<int> exit_code(Duration limit) const {
        const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        const bool ended = pidfd >= 0 && co_await readable(pidfd, limit);
        if (pidfd >= 0) ::close(pidfd);
        if (!ended) ::kill(pid, SIGKILL);
        int status = 0;
        if (::waitpid(pid, &status, 0) != pid) co_return -1001;
        if (!ended) co_return -1000;
        co_return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
};

CallerProcess fork_caller(Caller c) {
    int to[2], from[2];
    REQUIRE(::pipe(to) == 0);
    REQUIRE(::pipe(from) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(to[1]);
        ::close(from[0]);
        ::_exit(test::run_child(caller(to[0], from[1], std::move(c)), 100s));
    }
    ::close(to[0]);
    ::close(from[1]);
    ::fcntl(from[0], F_SETFL, O_NONBLOCK);
    CallerProcess p;
    p.pid = pid;
    p.to = to[1];
    p.from = from[0];
    return p;
}

/// Registers on every agent of `g` an "echo" that counts its calls in `served`.
void count_echoes(test::AgentGroup& g, Served& served) {
    for (auto& a : g.agents)
        REQUIRE(a->register_handler("echo", [&served](WorkerInfo, Message m) -> Task<Result<Message>> {
            served.one();
            co_return m;
        }));
}

/// worker0's address of `transport` ("uv", "shm"), as the store lists it.
Task<std::string> address_of(Store& store, std::string transport = "uv") {
    auto b = co_await store.get("native_agent/info/0");
    REQUIRE(b);
    auto rec = detail::decode_record(*b);
    REQUIRE(rec);
    for (const auto& o : rec->addresses)
        if (o.name == transport) co_return o.address;
    FAIL("worker0 lists no " << transport << " address");
    co_return std::string();
}

/// Routes the agent's log through `sink` at debug level while it lives; then back to stderr at the
/// level before (also when a REQUIRE ends the test early).
struct LogCapture {
    LogLevel before = log_level();
    explicit LogCapture(LogSink sink) {
        set_log_level(LogLevel::debug);
        set_log_sink(std::move(sink));
    }
    LogCapture(const LogCapture&) = delete;
    LogCapture& operator=(const LogCapture&) = delete;
    ~LogCapture() {
        set_log_sink({});
        set_log_level(before);
    }
};

}  // namespace

TEST_CASE("a caller that never reads its replies stops being read past the soft bound; others are served",
          "[rpc][hostile][memory]") {
    // 256 requests of 1 MiB, echoed: 256 MiB of replies that nobody reads until the test says so.
    const CallerProcess caller = fork_caller(Caller{"echo", 256, std::size_t(1) << 20, false, 0, false});
    Served served;
    int code = -1;
    test::run_with_deadline(120s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        count_echoes(g, served);
        const auto rss0 = rss_bytes();
        caller.say(co_await address_of(*g.store));
        const int queued = co_await next_byte(caller.from, 60s);  // (every request queued on its side)
        REQUIRE(queued == 'S');
        // Until no request has been served for a second: the caller's requests are no longer read.
        while (co_await served.next(1s)) {
        }
        const std::size_t seen = served.n;
        const auto grown = rss_bytes() - rss0;
        std::printf("MEASURE 256 MiB of echo requests whose replies are not read: %zu served, then it stood still; VmRSS %+.1f MiB\n",
                    seen, static_cast<double>(grown) / (1 << 20));
        CHECK(seen < 160);  // (the 64 MiB bound, the replies in the sockets and those read before it held)
        CHECK(grown < std::int64_t(test::kRssGrowthFactor) * (std::int64_t(200) << 20));  // (TSan: its shadow memory too)
        // The real worker1 is served all along, and so is worker0 by it.
        auto r = co_await test::call_echo(*g[1], "worker0");
        CHECK(r);
        auto back = co_await test::call_echo(*g[0], "worker1");
        CHECK(back);
        // The caller reads after all: every reply comes (nothing was dropped).
        caller.say("G");
        code = co_await caller.exit_code(90s);
        std::printf("the caller exited with %d after %zu were served\n", code, served.n.load());
        CHECK(served.n == 258);  // (and the two calls of the real workers above)
        auto s = co_await test::shutdown_all(g, false);
        (void)s;
    });
    CHECK(code == 0);
}

TEST_CASE("a caller that never releases the replies it reads by cma pins at most the held bound of the agent's memory",
          "[rpc][hostile][memory]") {
    // 32 echo requests of a 64 MiB tensor over shm and cma: 2 GiB of replies by reference, which
    // the agent would hold until the caller released them (it never reads, so never releases).
    const CallerProcess caller = fork_caller(Caller{"echo", 32, 16, false, std::size_t(64) << 20, true});
    Served served;
    int code = -1;
    test::run_with_deadline(120s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        count_echoes(g, served);
        const auto rss0 = rss_bytes();
        caller.say(co_await address_of(*g.store, "shm"));
        const int queued = co_await next_byte(caller.from, 60s);
        REQUIRE(queued == 'S');
        while (co_await served.next(1s)) {
        }
        const std::size_t seen = served.n;
        const auto grown = rss_bytes() - rss0;
        std::printf("MEASURE 32 echo requests of 64 MiB by cma whose replies are never released: %zu served, then it stood "
                    "still; VmRSS %+.1f MiB\n",
                    seen, static_cast<double>(grown) / (1 << 20));
        // 256 MiB held by reference, then inline replies up to the 64 MiB soft bound, and the
        // request being read (before the bound: every one served and held, +2 GiB).
        CHECK(seen < 16);
        CHECK(grown < std::int64_t(test::kRssGrowthFactor) * (std::int64_t(800) << 20));
        caller.say("G");  // it reads after all: every reply comes
        code = co_await caller.exit_code(90s);
        CHECK(served.n == 32);
        auto s = co_await test::shutdown_all(g, false);
        (void)s;
    });
    CHECK(code == 0);
}

TEST_CASE("replies past the hard bound, in more than one reply, close that caller's connection only",
          "[rpc][hostile][memory]") {
    // 200 small requests, each answered with 4 MiB: 800 MiB of replies (hard bound 32 MiB here).
    const CallerProcess caller = fork_caller(Caller{"big", 200, 16, true, 0, false});
    detail::NativeAgentTuning tuning;
    // No soft bound here: with one, how many requests are read (and replies queued) before the
    // reader stops depends on how many one read brings, and the hard bound may never be reached.
    tuning.reply_bounds = {0, std::size_t(32) << 20};
    Served big, closed;  // (closed: the agent said it closed the connection over the hard bound)
    const LogCapture capture([&closed](LogLevel level, std::string_view component, std::string_view message) {
        if (message.find("over the hard bound") != std::string_view::npos) closed.one();
        if (level >= LogLevel::warn)
            std::fprintf(stderr, "[%s] %.*s: %.*s\n", to_string(level).data(), static_cast<int>(component.size()), component.data(),
                         static_cast<int>(message.size()), message.data());
    });
    int code = -1;
    test::run_with_deadline(120s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, {}, tuning);
        test::register_echo(g);
        for (auto& a : g.agents)
            REQUIRE(a->register_handler("big", [&big](WorkerInfo, Message) -> Task<Result<Message>> {
                big.one();
                co_return Message{Bytes(std::size_t(4) << 20, 0x42), {}};
            }));
        caller.say(co_await address_of(*g.store));
        const int queued = co_await next_byte(caller.from, 60s);
        REQUIRE(queued == 'S');
        // The agent closes the caller's connection once its replies pass the hard bound.
        const bool over = co_await closed.next(30s);
        CHECK(over);
        std::printf("%zu of 200 requests of 4 MiB replies served when the agent closed the connection\n", big.n.load());
        auto r = co_await test::call_echo(*g[1], "worker0");  // (served meanwhile)
        CHECK(r);
        caller.say("G");
        code = co_await caller.exit_code(60s);  // (0: its connection ended before every reply came)
        auto again = co_await test::call_echo(*g[1], "worker0");  // (and served after)
        CHECK(again);
        auto s = co_await test::shutdown_all(g, false);
        (void)s;
    });
    CHECK(code == 0);
}

}  // namespace tp_reply_backpressure_test
