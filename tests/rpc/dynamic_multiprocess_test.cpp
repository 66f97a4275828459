// Dynamic groups across processes (issue 19): forked members of one group around an external
// store (its own process), as an elastic job runs them. Members that join at once, rank 0 leaving
// while the rest go on and a newcomer joins; a SIGKILLed member removed and its name joining
// again; a SIGSTOPped member (its connections open, only its heartbeat silent) removed after the
// member timeout. Every child has a deadline, and the parent reaps them with one.
#include "rpc/agent_test_util.hpp"
#include "rpc/forked.hpp"

#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/rpc/startup.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <asio/io_context.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_dynamic_multiprocess_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

enum class Scenario { rank0_leaves, killed, stopped };

struct Child {
    Scenario scenario;
    int rank;
    std::uint16_t port;
    int notify = -1;  ///< write end of a pipe to the parent
};

/// Waits until `a` lists exactly the workers of `ranks`; false at `limit`.
Task<bool> until_members(detail::NativeAgent& a, std::vector<int> ranks, std::chrono::milliseconds limit) {
    std::vector<std::string> expect;
    for (int r : ranks) expect.push_back(test::worker_name(r));
    co_return co_await a.until_members(std::move(expect), limit);
}

Task<bool> echoes(RpcAgent& a, int to) {
    const std::string name = test::worker_name(to);
    const std::string handler = "echo";
    Message m{bytes("from " + a.get_worker_info().name), {}};
    auto r = co_await a.rpc_async(name, handler, m, 10);
    if (!r) std::fprintf(stderr, "%s -> %s: %s\n", a.get_worker_info().name.c_str(), name.c_str(), r.error().to_string().c_str());
    co_return r && r->payload == m.payload;
}

/// The group is `ranks` in `a`'s view, and `a` echoes with each of them.
Task<bool> settled(detail::NativeAgent& a, std::vector<int> ranks, std::chrono::milliseconds limit) {
    if (!co_await until_members(a, ranks, limit)) co_return false;
    for (int r : ranks)
        if (!co_await echoes(a, r)) co_return false;
    co_return true;
}

/// A call to a departed member fails at once, naming it.
Task<bool> refused(RpcAgent& a, int to) {
    const std::string name = test::worker_name(to), handler = "echo";
    Message empty_message;
    auto r = co_await a.rpc_async(name, handler, std::move(empty_message), 10);
    co_return !r && r.error().code() == Errc::invalid_argument && r.error().message().find(name) != std::string::npos;
}

Task<bool> store_wait(Store& s, const char* key, std::chrono::seconds limit) {
    std::vector<std::string> keys(1, key);
    auto w = co_await s.wait(std::move(keys), limit);
    co_return w.has_value();
}

/// Counts this process in under `key`; the one that makes it `n` sets `key + "/all"`.
Task<bool> count_in(Store& s, const char* key, int n) {
    const std::string counter = key, all = counter + "/all";
    auto c = co_await s.add(counter, 1);
    if (!c) co_return false;
    if (*c == n) {
        const Bytes one = bytes("1");
        auto done = co_await s.set(all, one);
        if (!done) co_return false;
    }
    co_return true;
}

Task<int> member(Child c) {
    auto ex = co_await asio::this_coro::executor;
    auto store = co_await TcpStore::connect(ex, test::local_store(c.port, 20s));
    if (!store) co_return 10;
    std::shared_ptr<Store> st = *store;
    detail::NativeAgentTuning tuning;
    tuning.member_timeout = 1s;  // (the stopped scenario waits for it)
    auto args = test::init_args(st, c.rank, DYNAMIC_WORLD_SIZE, {});
    // The newcomers of rank0_leaves (rank 3) and killed (the second worker1) join later.
    const bool late = (c.scenario == Scenario::rank0_leaves && c.rank == 3) || (c.scenario == Scenario::killed && c.rank == 11);
    if (late && !co_await store_wait(*st, "test/late", 20s)) co_return 11;
    if (c.rank == 11) args.name = "worker1", args.rank = 1;
    // Installed before the join ends (a member may call it as soon as the update reached it).
    if (!register_startup_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; })) co_return 13;
    auto agent = co_await detail::NativeAgent::create(std::move(args), tuning);
    if (!agent) {
        std::fprintf(stderr, "rank %d: %s\n", c.rank, agent.error().to_string().c_str());
        co_return 12;
    }
    auto& a = **agent;
    const int me = a.get_worker_info().id;

    if (late) {
        // Everyone calls the newcomer, and it calls everyone.
        std::vector<int> group{1, 2, 3};
        if (c.scenario == Scenario::killed) group = {0, 1, 2};
        if (!co_await settled(a, group, 10s)) co_return 14;
        if (!co_await count_in(*st, "test/late_in", 1)) co_return 16;
        if (!co_await store_wait(*st, "test/finished/all", 20s)) co_return 17;
        auto s = co_await a.shutdown(true, 10);
        co_return s ? 0 : 18;
    }

    // The first three join at once (serialised by the token), then everyone calls everyone.
    const std::vector<int> first_three{0, 1, 2};
    if (!co_await settled(a, first_three, 15s)) co_return 20;
    if (!co_await count_in(*st, "test/called", 3)) co_return 22;
    if (!co_await store_wait(*st, "test/called/all", 15s)) co_return 23;

    // Who goes: rank 0 leaves gracefully, or rank 1 is killed or stopped by the parent.
    const int gone = c.scenario == Scenario::rank0_leaves ? 0 : 1;
    if (c.scenario == Scenario::rank0_leaves && me == 0) {
        auto s = co_await a.shutdown(true, 15);
        if (!s) {
            std::fprintf(stderr, "rank 0 leaving: %s\n", s.error().to_string().c_str());
            co_return 30;
        }
        co_return 0;
    }
    if (c.scenario != Scenario::rank0_leaves && me == 1) {
        // (killed or stopped by the parent: this only runs if it is not)
        (void)co_await store_wait(*st, "test/finished/all", 30s);
        co_return 32;
    }
    if (me == 0 && c.scenario != Scenario::rank0_leaves) {
        char k = 'k';
        if (::write(c.notify, &k, 1) != 1) co_return 33;  // the parent kills (or stops) worker1 now
    }
    std::vector<int> survivors;
    for (int r = 0; r < 3; ++r)
        if (r != gone) survivors.push_back(r);
    // A stopped member is noticed by its heartbeat alone: 1 s, plus a probe of 0.5 s and the update.
    if (!co_await until_members(a, survivors, 15s)) {
        std::fprintf(stderr, "rank %d: worker%d was not removed\n", me, gone);
        co_return 34;
    }
    if (!co_await refused(a, gone)) co_return 35;
    for (int r : survivors)
        if (!co_await echoes(a, r)) co_return 36;
    if (c.scenario == Scenario::stopped && me == 0) {
        char k = 'r';
        if (::write(c.notify, &k, 1) != 1) co_return 37;  // worker1 is out: the parent may kill it
    }
    if (c.scenario != Scenario::stopped) {
        // The newcomer: rank 3, or a new worker1 under the dead one's name.
        if (!co_await count_in(*st, "test/survived", 2)) co_return 38;
        if (me == survivors[0]) {
            if (!co_await store_wait(*st, "test/survived/all", 15s)) co_return 39;
            const std::string late_key = "test/late";
            const Bytes one = bytes("1");
            if (!co_await st->set(late_key, one)) co_return 40;
        }
        if (!co_await store_wait(*st, "test/late_in/all", 20s)) co_return 41;
        std::vector<int> now = survivors;
        now.push_back(c.scenario == Scenario::killed ? 1 : 3);
        std::sort(now.begin(), now.end());
        if (!co_await settled(a, now, 10s)) co_return 42;
    }
    if (!co_await count_in(*st, "test/finished", 2)) co_return 44;
    if (!co_await store_wait(*st, "test/finished/all", 20s)) co_return 45;
    auto s = co_await a.shutdown(true, 10);
    if (!s) std::fprintf(stderr, "rank %d shutdown: %s\n", me, s.error().to_string().c_str());
    co_return s ? 0 : 46;
}


struct Run {
    pid_t store = -1;
    std::vector<pid_t> members;  ///< by rank; a late newcomer last
    int notify_read = -1;
};

Run start(Scenario scenario, std::vector<int> ranks) {
    Run run;
    std::uint16_t port = 0;
    run.store = test::spawn_store(port);
    int n[2];
    REQUIRE(::pipe(n) == 0);
    run.notify_read = n[0];
    for (int r : ranks) {
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::close(n[0]);
            ::_exit(test::run_child(member(Child{scenario, r, port, n[1]}), 45s));
        }
        run.members.push_back(pid);
    }
    ::close(n[1]);
    return run;
}

/// The next byte a member writes to the parent (0 when none comes within 30 s).
char next_note(int fd) {
    pollfd p{fd, POLLIN, 0};
    char k = 0;
    if (::poll(&p, 1, 30000) == 1 && ::read(fd, &k, 1) != 1) k = 0;
    return k;
}

void finish(Run& run, std::vector<int>& codes) {
    codes = test::reap(run.members, std::chrono::seconds(60));
    ::kill(run.store, SIGKILL);
    (void)test::reap({run.store}, std::chrono::seconds(5));
    ::close(run.notify_read);
}

}  // namespace

TEST_CASE("member processes join at once around an external store; rank 0 leaves, the rest go on, and a newcomer joins",
          "[rpc][dynamic][multiprocess]") {
    auto run = start(Scenario::rank0_leaves, {0, 1, 2, 3});
    std::vector<int> codes;
    finish(run, codes);
    for (std::size_t i = 0; i < codes.size(); ++i) {
        INFO("member process " << i);
        CHECK(codes[i] == 0);
    }
}

TEST_CASE("a SIGKILLed member process is removed by the others, and a new process joins under its name",
          "[rpc][dynamic][multiprocess][fault]") {
    auto run = start(Scenario::killed, {0, 1, 2, 11});
    const char k = next_note(run.notify_read);
    if (k == 'k') ::kill(run.members[1], SIGKILL);
    std::vector<int> codes;
    finish(run, codes);
    CHECK(k == 'k');
    CHECK(codes[0] == 0);
    CHECK(codes[1] == -SIGKILL);
    CHECK(codes[2] == 0);
    CHECK(codes[3] == 0);
}

TEST_CASE("a SIGSTOPped member process, its connections still open, is removed once its heartbeat stood still",
          "[rpc][dynamic][multiprocess][fault]") {
    auto run = start(Scenario::stopped, {0, 1, 2});
    const char k = next_note(run.notify_read);
    if (k == 'k') ::kill(run.members[1], SIGSTOP);
    const char removed = k == 'k' ? next_note(run.notify_read) : 0;
    ::kill(run.members[1], SIGKILL);
    std::vector<int> codes;
    finish(run, codes);
    CHECK(k == 'k');
    CHECK(removed == 'r');
    CHECK(codes[0] == 0);
    CHECK(codes[1] == -SIGKILL);
    CHECK(codes[2] == 0);
}

}  // namespace tp_dynamic_multiprocess_test
