// ShmConnection: bytes through the rings in order (wrap-around, more than a ring at once, many
// small messages across processes), the spin-then-sleep waits, a peer that dies, a hostile setup,
// and an idle connection that costs no CPU.
#include "shm_test_util.hpp"

#include "support/usage.hpp"
#include "transport/shm/setup.hpp"

#include <tensorplay/core/timeout.hpp>

#include <asio/steady_timer.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_shm_connection_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;
namespace shm = tensorplay::detail::shm;

namespace {

/// Whether process `pid`'s main thread is blocked in the kernel (state S in /proc/PID/stat).
bool blocked(pid_t pid) {
    std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    if (!f) return false;
    char line[512] = {};
    const bool read = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    const char* end = read ? std::strrchr(line, ')') : nullptr;  // (the name may hold spaces)
    return end && end[1] == ' ' && end[2] == 'S';
}

std::uint8_t pattern(std::uint64_t i) { return static_cast<std::uint8_t>((i * 2654435761u) >> 11); }


Task<Result<void>> stream_through(ShmConnection& from, ShmConnection& to, std::size_t total) {
    using namespace detail::awaitable_ops;
    std::vector<std::uint8_t> src(total), dst(total);
    for (std::size_t i = 0; i < total; ++i) src[i] = pattern(i);
    // Writes of 10000 bytes and reads of 777 through a 4 KiB ring: every write is larger than
    // the ring, every position of the ring is crossed.
    auto [w, r] = co_await (send_all(from, src.data(), total, 10000) && recv_all(to, dst.data(), total, 777));
    if (!w) co_return w;
    if (!r) co_return r;
    if (src != dst) co_return fail(Errc::internal, "bytes arrived out of order or changed");
    co_return ok();
}

}  // namespace

TEST_CASE("bytes cross an shm connection in order, wrapping a ring smaller than each write", "[shm]") {
    run_with_deadline(20s, [&]() -> Task<void> {
        auto p = co_await make_shm_pair(shm_options(4096, 5us));
        auto r = co_await stream_through(*p.a, *p.b, 1u << 20);
        INFO((r ? std::string() : r.error().to_string()));
        REQUIRE(r);
        auto back = co_await stream_through(*p.b, *p.a, 1u << 20);
        REQUIRE(back);
    });
}

TEST_CASE("a reader that sleeps past its spin is woken by a writer that comes later", "[shm]") {
    run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await make_shm_pair(shm_options(4096, 20us));
        auto ex = co_await asio::this_coro::executor;
        asio::co_spawn(
            ex,
            [&]() -> Task<void> {
                asio::steady_timer t(ex, 100ms);
                co_await t.async_wait(detail::use_nothrow);
                const std::uint8_t msg[3] = {1, 2, 3};
                auto s = co_await send_all(*p.a, msg, 3);
                REQUIRE(s);
            },
            asio::detached);
        const auto t0 = std::chrono::steady_clock::now();
        auto w = co_await p.b->wait_readable();
        REQUIRE(w);
        REQUIRE(std::chrono::steady_clock::now() - t0 >= 90ms);
        std::uint8_t got[3] = {};
        REQUIRE(*p.b->read_some(got) == 3);
        REQUIRE(got[2] == 3);
        REQUIRE(p.b->stats().sleeps >= 1);     // it slept on the doorbell
        REQUIRE(p.a->stats().bells_rung >= 1);  // and the writer rang it
    });
}

TEST_CASE("a writer that waits for space sleeps until the reader frees some", "[shm]") {
    run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await make_shm_pair(shm_options(4096, 20us));
        std::vector<std::uint8_t> big(4096, 7);
        auto r1 = co_await send_all(*p.a, big.data(), big.size());
        INFO((r1 ? std::string() : r1.error().to_string()));
        REQUIRE(r1);
        auto ex = co_await asio::this_coro::executor;
        asio::co_spawn(
            ex,
            [&]() -> Task<void> {
                asio::steady_timer t(ex, 100ms);
                co_await t.async_wait(detail::use_nothrow);
                std::uint8_t sink[100];
                REQUIRE(*p.b->read_some(sink) == 100);
            },
            asio::detached);
        auto w = co_await p.a->wait_writable();
        REQUIRE(w);
        REQUIRE(p.a->stats().sleeps >= 1);
        std::uint8_t more[200] = {};
        iovec v{more, sizeof more};
        REQUIRE(*p.a->write_some(std::span<const iovec>(&v, 1)) == 100);
    });
}

TEST_CASE("many small messages ping-pong with a peer process in order", "[shm]") {
    constexpr int rounds = 20000;
    auto peer = fork_peer(shm_options(std::size_t(64) << 10, 50us), [](ShmConnection& c) -> Task<void> {
        for (int i = 0; i < rounds; ++i) {
            std::uint64_t v = 0;
            auto c1 = co_await recv_all(c, reinterpret_cast<std::uint8_t*>(&v), sizeof v);
            if (!c1) ::_exit(4);
            v += 1;
            auto c2 = co_await send_all(c, reinterpret_cast<std::uint8_t*>(&v), sizeof v);
            if (!c2) ::_exit(5);
        }
    });
    run_with_deadline(30s, [&, fd = peer.fd]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto c = co_await ShmConnection::establish(asio::local::stream_protocol::socket(ex, asio::local::stream_protocol(), fd),
                                                   shm_options(std::size_t(64) << 10, 50us));
        REQUIRE(c);
        for (std::uint64_t i = 0; i < rounds; ++i) {
            std::uint64_t v = i * 2;
            auto r2 = co_await send_all(**c, reinterpret_cast<std::uint8_t*>(&v), sizeof v);
            INFO((r2 ? std::string() : r2.error().to_string()));
            REQUIRE(r2);
            auto r3 = co_await recv_all(**c, reinterpret_cast<std::uint8_t*>(&v), sizeof v);
            INFO((r3 ? std::string() : r3.error().to_string()));
            REQUIRE(r3);
            REQUIRE(v == i * 2 + 1);
        }
    });
    REQUIRE(peer.wait() == 0);
}

TEST_CASE("a peer process that sleeps longer than the spin wakes the reader across processes", "[shm]") {
    auto peer = fork_peer(shm_options(4096, 20us), [](ShmConnection& c) -> Task<void> {
        // Past the spin: the reader has said it will sleep (its flag in our outbox) and its
        // process is blocked (in the event loop's wait on the doorbell, not between the two).
        while (!c.peer_reader_asleep() || !blocked(::getppid())) ::usleep(100);
        std::uint64_t v = 42;
        auto c3 = co_await send_all(c, reinterpret_cast<std::uint8_t*>(&v), sizeof v);
        if (!c3) ::_exit(4);
        std::uint8_t bye;
        auto until_closed = co_await recv_all(c, &bye, 1);  // the parent closes
        (void)until_closed;
    });
    run_with_deadline(10s, [&, fd = peer.fd]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto c = co_await ShmConnection::establish(asio::local::stream_protocol::socket(ex, asio::local::stream_protocol(), fd),
                                                   shm_options(4096, 20us));
        REQUIRE(c);
        std::uint64_t v = 0;
        auto r4 = co_await recv_all(**c, reinterpret_cast<std::uint8_t*>(&v), sizeof v);
        INFO((r4 ? std::string() : r4.error().to_string()));
        REQUIRE(r4);
        REQUIRE(v == 42);
        REQUIRE((*c)->stats().sleeps >= 1);
        (*c)->close();
    });
    REQUIRE(peer.wait() == 0);
}

TEST_CASE("a peer process that is killed is seen as connection_lost within a second", "[shm][fault]") {
    const bool writer_waits = GENERATE(false, true);
    auto peer = fork_peer(shm_options(4096, 20us), [](ShmConnection&) -> Task<void> {
        for (;;) ::pause();  // never reads, never writes: killed by the parent
        co_return;
    });
    run_with_deadline(10s, [&, pid = peer.pid, fd = peer.fd]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto c = co_await ShmConnection::establish(asio::local::stream_protocol::socket(ex, asio::local::stream_protocol(), fd),
                                                   shm_options(4096, 20us));
        REQUIRE(c);
        if (writer_waits) {  // fill the peer's inbox, so that the wait below is for space
            std::vector<std::uint8_t> big(4096, 1);
            iovec v{big.data(), big.size()};
            REQUIRE(*(*c)->write_some(std::span<const iovec>(&v, 1)) == 4096);
        }
        std::chrono::steady_clock::time_point killed;
        asio::co_spawn(
            ex,
            [&]() -> Task<void> {
                asio::steady_timer t(ex, 200ms);
                co_await t.async_wait(detail::use_nothrow);
                killed = std::chrono::steady_clock::now();
                ::kill(pid, SIGKILL);
            },
            asio::detached);
        Result<void> w;
        if (writer_waits)
            w = co_await (*c)->wait_writable();
        else
            w = co_await (*c)->wait_readable();
        const auto seen = std::chrono::steady_clock::now() - killed;
        REQUIRE(!w);
        INFO(w.error().to_string());
        REQUIRE(w.error().code() == Errc::connection_lost);
        REQUIRE(seen < 1s);
        REQUIRE(!(*c)->is_open());
        std::uint8_t b[1];
        iovec v{b, 1};
        REQUIRE((*c)->write_some(std::span<const iovec>(&v, 1)).error().code() == Errc::connection_lost);
    });
}

TEST_CASE("bytes a peer wrote before it exited are read, then connection_lost", "[shm][fault]") {
    auto peer = fork_peer(shm_options(4096, 20us), [](ShmConnection& c) -> Task<void> {
        const std::uint8_t msg[5] = {'h', 'e', 'l', 'l', 'o'};
        auto c4 = co_await send_all(c, msg, 5);
        if (!c4) ::_exit(4);
        ::_exit(0);  // gone without closing
    });
    run_with_deadline(10s, [&, fd = peer.fd]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto c = co_await ShmConnection::establish(asio::local::stream_protocol::socket(ex, asio::local::stream_protocol(), fd),
                                                   shm_options(4096, 20us));
        // The child sent its setup and ack before it wrote; its exit after is seen later.
        REQUIRE(c);
        std::uint8_t got[5] = {};
        auto r5 = co_await recv_all(**c, got, 5);
        INFO((r5 ? std::string() : r5.error().to_string()));
        REQUIRE(r5);
        REQUIRE(std::memcmp(got, "hello", 5) == 0);
        auto w = co_await (*c)->wait_readable();
        REQUIRE(!w);
        REQUIRE(w.error().code() == Errc::connection_lost);
        REQUIRE(w.error().message().find("exited") != std::string::npos);
    });
    REQUIRE(peer.wait() == 0);
}

namespace {

/// A hostile setup: what the peer sends instead of a good one.
struct Hostile {
    const char* name;
    Errc code;
    const char* phrase;
    std::function<void(int sock)> act;
};

shm::Fd memfd_of(std::size_t bytes, bool seal, bool header) {
    shm::Fd fd(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
    if (header) {
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
        shm::init_ring(p, bytes - shm::kDataOffset);
        ::munmap(p, bytes);
    }
    if (seal) REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    return fd;
}

void send_with(int sock, shm::SetupMessage msg, std::vector<int> fds) { REQUIRE(*shm::send_setup(sock, msg, fds)); }

std::vector<Hostile> hostile_cases() {
    using shm::SetupMessage;
    auto good_msg = [] {
        SetupMessage m;
        m.capacity = 4096;
        return m;
    };
    std::vector<Hostile> v;
    v.push_back({"two descriptors", Errc::protocol_error, "carried 2 descriptors", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     auto m = good_msg();
                     m.fd_count = 2;
                     send_with(s, m, {e.memfd.get(), e.data_bell.get()});
                 }});
    v.push_back({"five descriptors", Errc::protocol_error, "carried 5 descriptors", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     send_with(s, good_msg(), {e.memfd.get(), e.data_bell.get(), e.space_bell.get(), 0, 1});
                 }});
    v.push_back({"a short memfd", Errc::protocol_error, "needs 8192", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     auto m = memfd_of(4096, true, false);
                     send_with(s, good_msg(), {m.get(), e.data_bell.get(), e.space_bell.get()});
                 }});
    v.push_back({"an unsealed memfd", Errc::protocol_error, "not sealed", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     auto m = memfd_of(8192, false, true);
                     send_with(s, good_msg(), {m.get(), e.data_bell.get(), e.space_bell.get()});
                 }});
    v.push_back({"a ring without its header", Errc::protocol_error, "bad magic (not a tensorplay ring)", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     auto m = memfd_of(8192, true, false);
                     send_with(s, good_msg(), {m.get(), e.data_bell.get(), e.space_bell.get()});
                 }});
    v.push_back({"a bad setup magic", Errc::protocol_error, "not a tensorplay peer", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     auto m = good_msg();
                     m.magic = 0x1234;
                     send_with(s, m, {e.memfd.get(), e.data_bell.get(), e.space_bell.get()});
                 }});
    v.push_back({"a huge claimed ring", Errc::protocol_error, "claims a ring", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     auto m = good_msg();
                     m.capacity = std::uint64_t(1) << 40;
                     send_with(s, m, {e.memfd.get(), e.data_bell.get(), e.space_bell.get()});
                 }});
    v.push_back({"a ring over the 16 MiB a peer may claim", Errc::protocol_error, "between 4096 and 16777216", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     auto m = good_msg();
                     m.capacity = std::uint64_t(32) << 20;
                     send_with(s, m, {e.memfd.get(), e.data_bell.get(), e.space_bell.get()});
                 }});
    v.push_back({"pipes for doorbells", Errc::protocol_error, "not an eventfd", [=](int s) {
                     auto e = *shm::create_local_end(4096);
                     int p[2];
                     REQUIRE(::pipe(p) == 0);
                     send_with(s, good_msg(), {e.memfd.get(), p[0], p[1]});
                     ::close(p[0]);
                     ::close(p[1]);
                 }});
    v.push_back({"a peer that closes at once", Errc::connection_lost, "closed the socket", [](int s) { ::shutdown(s, SHUT_RDWR); }});
    v.push_back({"a peer that says nothing", Errc::timeout, "timed out", [](int) {}});
    return v;
}

}  // namespace

TEST_CASE("a hostile setup is refused with a clear error", "[shm][fault]") {
    auto cases = hostile_cases();
    const auto i = GENERATE(range(0, 11));
    const auto& h = cases[static_cast<std::size_t>(i)];
    INFO(h.name);
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    h.act(sv[1]);
    auto options = shm_options(4096, 20us);
    options.setup_timeout = 300ms;
    run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto c = co_await ShmConnection::establish(asio::local::stream_protocol::socket(ex, asio::local::stream_protocol(), sv[0]),
                                                   options);
        REQUIRE(!c);
        INFO(c.error().to_string());
        REQUIRE(c.error().code() == h.code);
        REQUIRE(c.error().message().find(h.phrase) != std::string::npos);
    });
    ::close(sv[1]);
}

namespace {

/// A peer (a forked child's body) that sets up properly on `sock`, then rings our data doorbell
/// in a loop for `d` without writing a byte. Returns its exit status (0: it rang).
int ring_in_a_loop(int sock, std::chrono::milliseconds d) {
    auto e = shm::create_local_end(4096);
    if (!e) return 2;
    shm::SetupMessage m;
    m.capacity = 4096;
    const int fds[shm::kSetupFds] = {e->memfd.get(), e->data_bell.get(), e->space_bell.get()};
    if (!shm::send_setup(sock, m, fds).value_or(false)) return 3;
    shm::SetupReceiver rx;
    for (;;) {
        auto got = rx.poll(sock);
        if (!got) return 4;
        if (*got) break;
        pollfd pf{sock, POLLIN, 0};
        ::poll(&pf, 1, 1000);
    }
    auto peer = rx.finish(std::size_t(1) << 20);
    if (!peer) return 5;
    const std::uint8_t ack = shm::kSetupAck;
    std::uint8_t back = 0;
    if (::send(sock, &ack, 1, MSG_NOSIGNAL) != 1 || ::recv(sock, &back, 1, 0) != 1) return 6;
    const auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) shm::ring_bell(peer->data_bell.get());
    return 0;
}

}  // namespace

TEST_CASE("a peer ringing our doorbell in a loop costs the waiting side little CPU", "[shm][fault]") {
    PeerChild child = fork_raw_peer([](int sock) { return ring_in_a_loop(sock, 1500ms); });
    const auto options = shm_options(4096, 0us);
    run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto c = co_await ShmConnection::establish(asio::local::stream_protocol::socket(ex, asio::local::stream_protocol(), child.fd),
                                                   options);
        REQUIRE(c);
        const double before = cpu_seconds();
        auto w = co_await with_timeout((*c)->wait_readable(), 1s);
        const double used = cpu_seconds() - before;
        REQUIRE(!w);
        REQUIRE(w.error().code() == Errc::timeout);
        const auto st = (*c)->stats();
        INFO("CPU over 1 s of a doorbell storm: " << used << " s; " << st.idle_bells << " idle bells, " << st.backoffs
                                                  << " pauses");
        CHECK(st.backoffs > 0);
        // (Before the pauses: a whole core, as long as the peer rang; with them about a tenth, more
        // under the sanitizers, whose TSan build used 0.25 s once: half a core tells them apart.)
        CHECK(used < 0.5);
    });
    CHECK(child.wait() == 0);
}

TEST_CASE("an idle waiting connection uses almost no CPU", "[shm][slow]") {
    run_with_deadline(10s, [&]() -> Task<void> {
        auto p = co_await make_shm_pair(shm_options(4096, 50us));
        const double before = cpu_seconds();
        // Both sides idle for 2 s, one of them waiting to read: the wait ends by the deadline
        // (its cancellation), not by spinning.
        auto w = co_await with_timeout(p.b->wait_readable(), 2s);
        const double used = cpu_seconds() - before;
        REQUIRE(!w);
        REQUIRE(w.error().code() == Errc::timeout);
        INFO("CPU over 2 s idle: " << used << " s");
        REQUIRE(used < 0.1);  // under 5% of a core
        REQUIRE(p.b->stats().sleeps == 1);
    });
}

TEST_CASE("a wait on a closed connection ends with connection_lost", "[shm]") {
    run_with_deadline(5s, [&]() -> Task<void> {
        auto p = co_await make_shm_pair(shm_options(4096, 5us));
        auto ex = co_await asio::this_coro::executor;
        asio::co_spawn(
            ex,
            [&]() -> Task<void> {
                asio::steady_timer t(ex, 50ms);
                co_await t.async_wait(detail::use_nothrow);
                p.b->close();
            },
            asio::detached);
        auto w = co_await p.b->wait_readable();
        REQUIRE(!w);
        REQUIRE(w.error().code() == Errc::connection_lost);
        // The other side sees the close as its peer's end.
        auto other = co_await p.a->wait_readable();
        REQUIRE(!other);
        REQUIRE(other.error().code() == Errc::connection_lost);
    });
}

}  // namespace tp_shm_connection_test
