// cma against a real forked child: viability and the probe, reads small and 64 MiB, more ranges
// than IOV_MAX, and the child's memory going away before or during a read (a clear error, no hang).
#include "transport/channels/cma/cma.hpp"

#include <catch2/catch.hpp>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <cstddef>
#include <string>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_cma_test {

using namespace tensorplay;
namespace cma = tensorplay::detail::cma;

namespace {

std::uint8_t pattern(std::uint64_t i) { return static_cast<std::uint8_t>((i * 2654435761u) >> 9); }

/// A child that maps `bytes` (filled with the pattern), tells the parent the address, then obeys
/// one-byte commands: 'u' unmaps the region's second half, 'U' all of it, 'x' exits.
struct Child {
    pid_t pid = -1;
    int cmd = -1, reply = -1;
    std::uint64_t addr = 0;
    std::size_t bytes = 0;

    explicit Child(std::size_t n) : bytes(n) {
        int down[2], up[2];
        REQUIRE(::pipe(down) == 0);
        REQUIRE(::pipe(up) == 0);
        pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::close(down[1]);
            ::close(up[0]);
            auto* p = static_cast<std::uint8_t*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
            if (p == MAP_FAILED) ::_exit(2);
            for (std::size_t i = 0; i < n; ++i) p[i] = pattern(i);
            auto a = reinterpret_cast<std::uint64_t>(p);
            if (::write(up[1], &a, sizeof a) != sizeof a) ::_exit(2);
            char c;
            while (::read(down[0], &c, 1) == 1) {
                if (c == 'u') ::munmap(p + n / 2, n - n / 2);
                if (c == 'U') ::munmap(p, n);
                if (c == 'x') ::_exit(0);
                if (::write(up[1], &c, 1) != 1) ::_exit(2);
            }
            ::_exit(0);
        }
        ::close(down[0]);
        ::close(up[1]);
        cmd = down[1];
        reply = up[0];
        REQUIRE(::read(reply, &addr, sizeof addr) == sizeof addr);
    }
    void tell(char c) {
        REQUIRE(::write(cmd, &c, 1) == 1);
        if (c == 'x') return;
        char back;
        REQUIRE(::read(reply, &back, 1) == 1);
    }
    void reap() {
        if (pid > 0) ::waitpid(pid, nullptr, 0);
        pid = -1;
    }
    ~Child() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
        ::close(cmd);
        ::close(reply);
    }
};

bool matches(const std::vector<std::uint8_t>& v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
        if (v[i] != pattern(i)) return false;
    return true;
}

}  // namespace

TEST_CASE("this process and a forked child may read each other, and the probe agrees", "[cma]") {
    auto me = cma::local_identity();
    REQUIRE(me);
    REQUIRE(!me->boot_id.empty());
    REQUIRE(me->pid_ns.rfind("pid:[", 0) == 0);
    REQUIRE(cma::check_viable(*me, *me));

    int up[2];
    REQUIRE(::pipe(up) == 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
        auto t = cma::local_probe_target();
        auto id = cma::local_identity();
        const bool ok = id && ::write(up[1], &t, sizeof t) == sizeof t;
        ::pause();
        ::_exit(ok ? 0 : 2);
    }
    cma::ProbeTarget t;
    REQUIRE(::read(up[0], &t, sizeof t) == sizeof t);
    REQUIRE(t.pid == pid);
    REQUIRE(cma::probe(t));
    auto wrong = t;
    wrong.expected[0] ^= 1;
    REQUIRE(!cma::probe(wrong));  // bytes that do not match are no proof
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    REQUIRE(!cma::probe(t));  // the child is gone
    ::close(up[0]);
    ::close(up[1]);
}

TEST_CASE("identities that differ make cma not viable, saying why", "[cma]") {
    auto me = *cma::local_identity();
    auto refused = [&](cma::Identity reader, cma::Identity target, const char* phrase) {
        auto r = cma::check_viable(reader, target);
        REQUIRE(!r);
        REQUIRE(r.error().code() == Errc::not_supported);
        INFO(r.error().message());
        REQUIRE(r.error().message().find(phrase) != std::string::npos);
    };
    auto other = me;
    other.boot_id = "another";
    refused(me, other, "boot");
    other = me;
    other.pid_ns = "pid:[1]";
    refused(me, other, "pid namespace");
    other = me;
    other.user_ns = "user:[1]";
    refused(me, other, "user namespace");
    auto reader = me;
    reader.cap_sys_ptrace = false;
    other = reader;
    other.uid += 1;
    other.euid += 1;
    refused(reader, other, "another user");
    other = reader;
    other.dumpable = false;
    refused(reader, other, "dumpable");
    reader.ptrace_scope = 1;
    refused(reader, reader, "ptrace_scope is 1");
    auto allowed = reader;
    allowed.readers_allowed = true;
    REQUIRE(cma::check_viable(reader, allowed));
    reader.ptrace_scope = 2;
    refused(reader, reader, "ptrace_scope is 2");
    reader.cap_sys_ptrace = true;
    REQUIRE(cma::check_viable(reader, reader));
    reader.ptrace_scope = 3;
    refused(reader, reader, "ptrace_scope is 3");
}

TEST_CASE("a read copies a child's buffer, in chunks and past partial reads", "[cma]") {
    constexpr std::size_t n = std::size_t(64) << 20;
    Child child(n);
    std::vector<std::uint8_t> dst(n);
    SECTION("64 MiB in the default chunks") {
        auto r = cma::read(child.pid, child.addr, n, dst.data());
        INFO((r ? std::string() : r.error().to_string()));
        REQUIRE(r);
        REQUIRE(matches(dst, n));
    }
    SECTION("64 MiB in 1 MiB calls") {
        auto r = cma::read(child.pid, child.addr, n, dst.data(), std::size_t(1) << 20);
        REQUIRE(r);
        REQUIRE(matches(dst, n));
    }
    SECTION("3000 ranges, more than IOV_MAX") {
        std::vector<cma::RemoteRange> ranges;
        std::size_t total = 0;
        for (std::size_t i = 0; i < 3000; ++i) {
            ranges.push_back({child.addr + i * 4096, 100 + i % 900});
            total += 100 + i % 900;
        }
        auto r = cma::read_ranges(child.pid, ranges, dst.data());
        REQUIRE(r);
        std::size_t off = 0, bad = 0;
        for (std::size_t i = 0; i < 3000; ++i)
            for (std::size_t k = 0; k < 100 + i % 900; ++k) bad += dst[off++] != pattern(i * 4096 + k);
        REQUIRE(off == total);
        REQUIRE(bad == 0);
    }
}

TEST_CASE("memory that went away fails a read with an error naming pid and address", "[cma][fault]") {
    constexpr std::size_t n = std::size_t(8) << 20;
    Child child(n);
    std::vector<std::uint8_t> dst(n);
    char addr[32];
    SECTION("unmapped before the read") {
        child.tell('U');
        auto r = cma::read(child.pid, child.addr, n, dst.data());
        REQUIRE(!r);
        INFO(r.error().to_string());
        REQUIRE(r.error().code() == Errc::io_error);
        std::snprintf(addr, sizeof addr, "0x%llx", static_cast<unsigned long long>(child.addr));
        REQUIRE(r.error().message().find(addr) != std::string::npos);
        REQUIRE(r.error().message().find(std::to_string(child.pid)) != std::string::npos);
    }
    SECTION("half unmapped: the first half is read, then the error names where it stopped") {
        child.tell('u');
        auto r = cma::read(child.pid, child.addr, n, dst.data(), n);  // one call, a partial read
        REQUIRE(!r);
        REQUIRE(r.error().code() == Errc::io_error);
        std::snprintf(addr, sizeof addr, "0x%llx", static_cast<unsigned long long>(child.addr + n / 2));
        INFO(r.error().to_string());
        REQUIRE(r.error().message().find(addr) != std::string::npos);
        REQUIRE(matches(dst, n / 2));
    }
    SECTION("the process exited (and was reaped)") {
        child.tell('x');
        child.reap();
        auto r = cma::read(child.pid, child.addr, n, dst.data());
        REQUIRE(!r);
        REQUIRE(r.error().code() == Errc::connection_lost);
    }
    SECTION("unmapped while reads run: they fail, clearly and at once") {
        const auto t0 = std::chrono::steady_clock::now();
        ::write(child.cmd, "U", 1);  // no wait for the answer: the reads race the munmap
        Result<void> r = ok();
        int rounds = 0;
        while (r && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
            r = cma::read(child.pid, child.addr, n, dst.data(), std::size_t(256) << 10);
            ++rounds;
        }
        REQUIRE(!r);
        INFO(r.error().to_string() << " after " << rounds << " reads");
        REQUIRE(r.error().code() == Errc::io_error);
        REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    }
}

TEST_CASE("a process whose seccomp forbids process_vm_readv finds cma not viable by the probe", "[cma][fault]") {
    const auto target = cma::local_probe_target();  // this process's, read by the child
    REQUIRE(cma::probe(target));
    const pid_t pid = ::fork();
    if (pid == 0) {
        sock_filter filter[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
        if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) ::_exit(2);
        if (cma::probe(target)) ::_exit(3);  // must be false, silently
        std::uint8_t b[32];
        auto r = cma::read(target.pid, target.address, sizeof b, b);
        ::_exit(!r && r.error().code() == Errc::unauthorized ? 0 : 4);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    REQUIRE(WIFEXITED(st));
    REQUIRE(WEXITSTATUS(st) == 0);
}

TEST_CASE("the process at the other end of a socket is told apart from another one", "[cma][peer]") {
    // A child that connects to our listener over TCP and to our Unix socket, then waits.
    const int tcp_listener = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(tcp_listener >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(tcp_listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(tcp_listener, 4) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(tcp_listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    // (Not a socketpair: its credentials are those of whoever made it, for both ends.)
    const int unix_listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
    REQUIRE(unix_listener >= 0);
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    const std::string name = "tensorplay-cma-peer-test-" + std::to_string(::getpid());
    std::memcpy(un.sun_path + 1, name.data(), name.size());
    const auto un_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    REQUIRE(::bind(unix_listener, reinterpret_cast<sockaddr*>(&un), un_len) == 0);
    REQUIRE(::listen(unix_listener, 4) == 0);
    int hold[2];
    REQUIRE(::pipe(hold) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(hold[1]);
        const int c = ::socket(AF_INET, SOCK_STREAM, 0);
        if (::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ::_exit(1);
        const int u = ::socket(AF_UNIX, SOCK_STREAM, 0);
        if (::connect(u, reinterpret_cast<sockaddr*>(&un), un_len) != 0) ::_exit(1);
        char b;
        (void)::read(hold[0], &b, 1);  // until the parent is done
        ::_exit(0);
    }
    ::close(hold[0]);
    const int accepted = ::accept(tcp_listener, nullptr, nullptr);
    REQUIRE(accepted >= 0);
    const int unix_accepted = ::accept(unix_listener, nullptr, nullptr);
    REQUIRE(unix_accepted >= 0);
    CHECK(cma::peer_process_is(accepted, -1, child));           // TCP: the child holds the other end
    CHECK_FALSE(cma::peer_process_is(accepted, -1, ::getpid()));  // we hold only ours
    CHECK_FALSE(cma::peer_process_is(accepted, -1, 1));           // nor does init (or we may not look)
    CHECK(cma::peer_process_is(unix_accepted, -1, child));  // Unix: SO_PEERCRED
    CHECK_FALSE(cma::peer_process_is(unix_accepted, -1, ::getpid()));
    CHECK(cma::peer_process_is(-1, 42, 42));                      // a pid the kernel reported already
    CHECK_FALSE(cma::peer_process_is(-1, 42, 43));
    CHECK_FALSE(cma::peer_process_is(accepted, -1, 0));
    ::close(hold[1]);
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    ::close(accepted);
    ::close(unix_accepted);
    ::close(unix_listener);
    ::close(tcp_listener);
}

}  // namespace tp_cma_test
