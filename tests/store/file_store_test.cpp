// Tests of FileStore: the Store contract, forked processes sharing a file, torn tails, locks of dead writers.
#include <tensorplay/store/file_store.hpp>

#include "store/store_conformance.hpp"

#include <asio/io_context.hpp>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_file_store_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

// A fresh path in a per-process temporary directory, removed at exit.
std::string temp_path(const std::string& name) {
    static const auto dir = [] {
        auto d = std::filesystem::temp_directory_path() / ("tp_file_store_test." + std::to_string(::getpid()));
        std::filesystem::create_directories(d);
        static struct Cleanup {
            std::filesystem::path p;
            ~Cleanup() {
                std::error_code ec;
                std::filesystem::remove_all(p, ec);
            }
        } cleanup{d};
        return d;
    }();
    static std::atomic<int> n{0};
    return (dir / (name + "." + std::to_string(n++))).string();
}

Task<std::shared_ptr<Store>> make_file_store() {
    auto s = FileStore::open(temp_path("conformance"));
    REQUIRE(s);
    co_return *s;
}

// Runs `body` in a forked child on its own io_context; the child exits 0 on success, 1 on error.
template <class F>
pid_t fork_child(F body) {
    pid_t pid = ::fork();
    if (pid != 0) return pid;
    int code = 1;
    try {
        asio::io_context ctx(1);
        asio::co_spawn(ctx, std::move(body), [&code](std::exception_ptr e, Result<void> r) {
            code = (!e && r) ? 0 : 1;
            if (!e && !r) std::fprintf(stderr, "child %d: %s\n", int(::getpid()), r.error().to_string().c_str());
        });
        ctx.run_for(std::chrono::seconds(20));
    } catch (...) {
    }
    ::_exit(code);
}

int wait_child(pid_t pid) {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Task<Result<void>> child_counts(std::string path, int id, int adds, int children, std::size_t compact_min = 1 << 20) {
    auto s = FileStore::open(path, {.timeout = 15s, .compact_min_bytes = compact_min});
    if (!s) co_return fail(s.error());
    for (int i = 0; i < adds; ++i)
        if (auto r = co_await (*s)->add("counter", 1); !r) co_return fail(r.error());
    if (auto r = co_await (*s)->set("done/" + std::to_string(id), bytes(std::to_string(id))); !r) co_return r;
    std::vector<std::string> all;
    for (int c = 0; c < children; ++c) all.push_back("done/" + std::to_string(c));
    co_return co_await (*s)->wait(std::move(all));  // everyone sees everyone's key
}

/// Forks `children` processes that each add to "counter" `adds` times; every one must exit 0.
void run_counting_children(const std::string& path, int children, int adds, std::size_t compact_min = 1 << 20) {
    std::vector<pid_t> pids;
    for (int c = 0; c < children; ++c)
        pids.push_back(fork_child([path, c, adds, children, compact_min] {
            return child_counts(path, c, adds, children, compact_min);
        }));
    for (auto pid : pids) REQUIRE(wait_child(pid) == 0);
}

/// A fresh opener of `path` reads `expected` under "counter".
void expect_counter(const std::string& path, int expected) {
    run_with_deadline(5s, [path, expected]() -> Task<void> {
        auto s = FileStore::open(path);
        REQUIRE(s);
        auto v = co_await (*s)->get("counter");
        REQUIRE(v);
        REQUIRE(to_string(*v) == std::to_string(expected));
    });
}

}  // namespace

STORE_CONFORMANCE_TESTS("FileStore", "[store]", make_file_store)

TEST_CASE("forked processes sharing one FileStore lose no add and see each other's keys", "[store]") {
    auto path = temp_path("forked");
    constexpr int kChildren = 4, kAdds = 50;
    run_counting_children(path, kChildren, kAdds);
    expect_counter(path, kChildren * kAdds);
}

TEST_CASE("a wait in one process is woken by a set in another", "[store]") {
    auto path = temp_path("cross");
    pid_t child = fork_child([path]() -> Task<Result<void>> {
        auto s = FileStore::open(path, {.timeout = 10s});
        if (!s) co_return fail(s.error());
        auto v = co_await (*s)->get("from-parent");
        if (!v) co_return fail(v.error());
        co_return co_await (*s)->set("from-child", *v);
    });
    run_with_deadline(10s, [path]() -> Task<void> {
        auto s = FileStore::open(path, {.timeout = 8s});
        REQUIRE(s);
        co_await pause(30ms);  // let the child start waiting first
        CO_REQUIRE(co_await (*s)->set("from-parent", bytes("ping")));
        auto v = co_await (*s)->get("from-child");
        REQUIRE((v && *v == bytes("ping")));
    });
    REQUIRE(wait_child(child) == 0);
}

TEST_CASE("a torn tail record is ignored by readers and cut off by the next writer", "[store]") {
    auto path = temp_path("torn");
    run_with_deadline(5s, [path]() -> Task<void> {
        {
            auto s = FileStore::open(path);
            REQUIRE(s);
            CO_REQUIRE(co_await (*s)->set("good", bytes("1")));
        }
        const auto good_size = std::filesystem::file_size(path);
        {
            // A writer that died mid-record: a valid-looking header promising more bytes than exist.
            std::ofstream f(path, std::ios::binary | std::ios::app);
            const unsigned char torn[] = {'T', 'P', 'R', 'C', 1, 0, 0, 0, 4, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 'l', 'o'};
            f.write(reinterpret_cast<const char*>(torn), sizeof torn);
        }
        REQUIRE(std::filesystem::file_size(path) > good_size);
        auto reader = FileStore::open(path, {.timeout = 50ms});
        REQUIRE(reader);
        auto v = co_await (*reader)->get("good");
        REQUIRE((v && *v == bytes("1")));
        auto n = co_await (*reader)->num_keys();
        REQUIRE((n && *n == 1));
        auto writer = FileStore::open(path);
        REQUIRE(writer);
        CO_REQUIRE(co_await (*writer)->set("after", bytes("2")));
        // the reader, which stopped before the torn record, now reads on into the new one
        auto a = co_await (*reader)->get("after");
        REQUIRE((a && *a == bytes("2")));
        auto fresh = FileStore::open(path);
        REQUIRE(fresh);
        auto both = co_await (*fresh)->multi_get(keys("good", "after"));
        REQUIRE(both);
        REQUIRE(*both == vals(bytes("1"), bytes("2")));
    });
}

TEST_CASE("a record with a bad checksum is treated as torn", "[store]") {
    auto path = temp_path("crc");
    run_with_deadline(5s, [path]() -> Task<void> {
        auto s = FileStore::open(path);
        REQUIRE(s);
        CO_REQUIRE(co_await (*s)->set("a", bytes("1")));
        const auto size_before = std::filesystem::file_size(path);
        CO_REQUIRE(co_await (*s)->set("b", bytes("2")));
        {
            // flip the last value byte of the second record
            std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
            f.seekp(std::streamoff(std::filesystem::file_size(path) - 5));
            f.put('X');
        }
        auto other = FileStore::open(path, {.timeout = 30ms});
        REQUIRE(other);
        auto b = co_await (*other)->get("b");
        REQUIRE_FALSE(b);
        REQUIRE(b.error().code() == Errc::timeout);
        CO_REQUIRE(co_await (*other)->set("c", bytes("3")));
        REQUIRE(std::filesystem::file_size(path) > size_before);
        auto fresh = FileStore::open(path, {.timeout = 30ms});
        REQUIRE(fresh);
        auto c = co_await (*fresh)->check(keys("a", "c"));
        REQUIRE((c && *c));
        auto no_b = co_await (*fresh)->check(keys("b"));
        REQUIRE((no_b && !*no_b));
    });
}

TEST_CASE("a writer killed while holding the lock does not block the others", "[store]") {
    auto path = temp_path("killed");
    run_with_deadline(5s, [path]() -> Task<void> {
        auto s = FileStore::open(path);
        REQUIRE(s);
        CO_REQUIRE(co_await (*s)->set("before", bytes("1")));
    });
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid_t child = ::fork();
    if (child == 0) {
        int fd = ::open(path.c_str(), O_RDWR | O_APPEND);
        ::flock(fd, LOCK_EX);
        const char partial[] = "TPRC\x01\0\0\0";
        (void)::write(fd, partial, 8);  // the start of a record, never finished
        (void)::write(ready[1], "x", 1);
        ::pause();  // killed while holding the lock
        ::_exit(0);
    }
    char c;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::kill(child, SIGKILL);
    REQUIRE(wait_child(child) == 128 + SIGKILL);
    ::close(ready[0]);
    ::close(ready[1]);
    run_with_deadline(5s, [path]() -> Task<void> {
        auto s = FileStore::open(path, {.timeout = 2s});
        REQUIRE(s);
        CO_REQUIRE(co_await (*s)->set("after", bytes("2")));
        auto v = co_await (*s)->get("after");
        REQUIRE((v && *v == bytes("2")));
    });
}

TEST_CASE("a file that is not a FileStore is refused, not overwritten", "[store]") {
    auto path = temp_path("foreign");
    {
        std::ofstream f(path);
        f << "this is somebody's notes file, not a store\n";
    }
    run_with_deadline(5s, [path]() -> Task<void> {
        auto s = FileStore::open(path);
        REQUIRE(s);
        auto r = co_await (*s)->set("k", bytes("v"));
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::store_error);
        REQUIRE(r.error().message().find(path) != std::string::npos);
    });
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    REQUIRE(line == "this is somebody's notes file, not a store");
}

TEST_CASE("a FileStore wait can be cancelled", "[store]") {
    auto path = temp_path("cancel");
    run_with_deadline(5s, [path]() -> Task<void> {
        auto s = FileStore::open(path);
        REQUIRE(s);
        auto ex = co_await asio::this_coro::executor;
        Spawned<Bytes> g(ex, (*s)->get("never"));
        co_await pause(20ms);
        REQUIRE_FALSE(g.ready());
        g.cancel();
        auto r = co_await g.join();
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::cancelled);
    });
}

TEST_CASE("an unopenable path is an io_error naming it", "[store]") {
    auto s = FileStore::open("/nonexistent-dir-for-tp-test/store");
    REQUIRE_FALSE(s);
    REQUIRE(s.error().code() == Errc::io_error);
    REQUIRE(s.error().message().find("/nonexistent-dir-for-tp-test/store") != std::string::npos);
}

TEST_CASE("forked processes keep every add while the log is compacted under them", "[store]") {
    auto path = temp_path("compacting");
    constexpr int kChildren = 4, kAdds = 150;
    constexpr std::size_t kCompactMin = 512;  // a few dozen records: compacts again and again
    run_counting_children(path, kChildren, kAdds, kCompactMin);
    // Each add appended a record; compaction kept the file near the size of its few live keys.
    CHECK(std::filesystem::file_size(path) < 8 * kCompactMin);
    expect_counter(path, kChildren * kAdds);
}

TEST_CASE("compaction keeps the last value of every key and forgets deleted ones, for every opener", "[store]") {
    auto path = temp_path("compact");
    run_with_deadline(10s, [path]() -> Task<void> {
        FileStoreOptions o;
        o.timeout = 100ms;
        o.compact_min_bytes = 4096;
        auto a = FileStore::open(path, o);  // two opens: two lock holders, as two processes would be
        auto b = FileStore::open(path, o);
        REQUIRE((a && b));
        const Bytes pad(100, 'p');
        for (int i = 0; i < 1000; ++i) {
            Bytes v = bytes(std::to_string(i));
            v.insert(v.end(), pad.begin(), pad.end());
            CO_REQUIRE(co_await (*a)->set("k" + std::to_string(i % 10), std::move(v)));
            if (i % 100 == 0) {
                CO_REQUIRE(co_await (*b)->set("b", bytes(std::to_string(i))));
                auto seen = co_await (*b)->get("k" + std::to_string(i % 10));
                REQUIRE(seen);
                REQUIRE(to_string(Bytes(seen->begin(), seen->begin() + std::ptrdiff_t(std::to_string(i).size()))) ==
                        std::to_string(i));
            }
        }
        CO_REQUIRE(co_await (*a)->set("gone", bytes("x")));
        auto del = co_await (*b)->delete_key("gone");
        REQUIRE((del && *del));
        for (int i = 0; i < 200; ++i) CO_REQUIRE(co_await (*b)->set("k0", bytes(std::to_string(i))));
        CHECK(std::filesystem::file_size(path) < 4 * 4096);  // about 128 KB were appended
        auto fresh = FileStore::open(path, o);
        REQUIRE(fresh);
        for (auto* s : {&*a, &*b, &*fresh}) {
            auto n = co_await (*s)->num_keys();
            REQUIRE((n && *n == 11));  // k0..k9 and b
            auto k9 = co_await (*s)->get("k9");
            REQUIRE(k9);
            REQUIRE(to_string(Bytes(k9->begin(), k9->begin() + 3)) == "999");
            auto k0 = co_await (*s)->get("k0");
            REQUIRE((k0 && to_string(*k0) == "199"));
            auto g = co_await (*s)->check(keys("gone"));
            REQUIRE((g && !*g));
        }
    });
}

}  // namespace tp_file_store_test
