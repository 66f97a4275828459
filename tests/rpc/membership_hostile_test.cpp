// Dynamic groups against crashes and hostile peers (issue 32), in processes as they were found:
// forked members around an external store (its own process), an attacker in its own process.
// - a member SIGKILLed while every member calls every other: the survivors remove it and go on
//   (a survivor used to spin at 100% CPU when a waiter on a connect to the dead member woke to
//   the removal's event left set); run several times, each with a deadline;
// - forged membership updates (a non-member's join listing a phantom, an impostor's removal, a
//   non-member's leave) and a non-member's call of a user handler are refused, with and without
//   a group key, and the members' view does not change;
// - a member stopped (SIGSTOP) until the others removed it learns, once it runs again, that it is
//   no longer a member: its calls fail saying so, and its graceful shutdown tells nobody.
#include "rpc/agent_test_util.hpp"
#include "rpc/forked.hpp"

#include <tensorplay/core/timeout.hpp>
#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/rpc/startup.hpp>
#include <tensorplay/store/tcp_store.hpp>
#include <tensorplay/transport/address.hpp>

#include "rpc/membership.hpp"

#include <asio/io_context.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_membership_hostile_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

struct Child {
    int rank;
    std::uint16_t port;
    int notify = -1;  ///< write end of a pipe to the parent
    std::string key;  ///< the group's key ("" none)
};

Task<bool> store_wait(Store& s, std::string key, Duration limit) {
    std::vector<std::string> keys(1, std::move(key));
    auto w = co_await s.wait(std::move(keys), limit);
    co_return w.has_value();
}

Task<bool> store_flag(Store& s, std::string key) {
    const Bytes one = bytes("1");
    auto r = co_await s.set(std::move(key), one);
    co_return r.has_value();
}

/// Counts this process in under `key`; the one that makes it `n` sets `key + "/all"`.
Task<bool> count_in(Store& s, std::string key, int n) {
    auto c = co_await s.add(key, 1);
    if (!c) co_return false;
    if (*c == n) co_return co_await store_flag(s, key + "/all");
    co_return true;
}

Task<bool> echoes(RpcAgent& a, int to) {
    const std::string name = test::worker_name(to), handler = "echo";
    Message m{bytes("from " + a.get_worker_info().name), {}};
    auto r = co_await a.rpc_async(name, handler, m, 10);
    if (!r) std::fprintf(stderr, "%s -> %s: %s\n", a.get_worker_info().name.c_str(), name.c_str(), r.error().to_string().c_str());
    co_return r && r->payload == m.payload;
}

/// The ranks first..last. (GCC 12 fails on a braced list in a coroutine: "array used as initializer".)
std::vector<int> ranks_upto(int last) {
    std::vector<int> r;
    for (int i = 0; i <= last; ++i) r.push_back(i);
    return r;
}

/// `a` lists exactly the workers of `ranks` (within `limit`), and echoes with each of them.
Task<bool> settled(detail::NativeAgent& a, std::vector<int> ranks, Duration limit) {
    std::vector<std::string> expect;
    for (int r : ranks) expect.push_back(test::worker_name(r));
    if (!co_await a.until_members(expect, limit)) {
        std::string now;
        for (const auto& w : a.get_worker_infos()) now += " " + w.name;
        std::fprintf(stderr, "%s: the group is%s\n", a.get_worker_info().name.c_str(), now.c_str());
        co_return false;
    }
    for (int r : ranks)
        if (!co_await echoes(a, r)) co_return false;
    co_return true;
}

/// A dynamic member of rank `c.rank` with an "echo" handler (installed before it joins).
Task<Result<test::AgentPtr>> join(std::shared_ptr<Store> st, const Child& c, Duration member_timeout) {
    detail::NativeAgentTuning tuning;
    tuning.member_timeout = member_timeout;
    const std::string key = c.key;
    auto args = test::init_args(st, c.rank, DYNAMIC_WORLD_SIZE, [key](int, TensorPipeRpcBackendOptions& o) { o.auth_key = key; });
    if (auto r = register_startup_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; }); !r)
        co_return fail(r.error());
    co_return co_await detail::NativeAgent::create(std::move(args), tuning);
}

void note(int fd, char k) {
    if (::write(fd, &k, 1) != 1) std::perror("note");
}

/// The next byte a child writes to the parent (0 when none comes within `ms`).
char next_note(int fd, int ms = 30000) {
    pollfd p{fd, POLLIN, 0};
    char k = 0;
    if (::poll(&p, 1, ms) == 1 && ::read(fd, &k, 1) != 1) k = 0;
    return k;
}

struct Run {
    pid_t store = -1;
    std::vector<pid_t> children;
    int notify_read = -1;
};

Run start(const std::vector<std::function<Task<int>(Child)>>& bodies, const std::string& key = {}) {
    Run run;
    std::uint16_t port = 0;
    run.store = test::spawn_store(port);
    int n[2];
    REQUIRE(::pipe(n) == 0);
    run.notify_read = n[0];
    for (std::size_t i = 0; i < bodies.size(); ++i) {
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::close(n[0]);
            ::_exit(test::run_child(bodies[i](Child{static_cast<int>(i), port, n[1], key}), 45s));  // (not a coroutine)
        }
        run.children.push_back(pid);
    }
    ::close(n[1]);
    return run;
}

std::vector<int> finish(Run& run) {
    auto codes = test::reap(run.children, std::chrono::seconds(60));
    ::kill(run.store, SIGKILL);
    (void)test::reap({run.store}, std::chrono::seconds(5));
    ::close(run.notify_read);
    return codes;
}

// ---- a member killed under load ----

/// Calls `to` with echo until `stop`, pausing briefly after a failure (a dead member fails fast).
Task<void> load_loop(test::AgentPtr a, int to, const bool* stop, std::size_t* ok) {
    asio::steady_timer pause(co_await asio::this_coro::executor);
    const std::string name = test::worker_name(to), handler = "echo";
    while (!*stop) {
        auto r = co_await a->rpc_async(name, handler, test::text_message("load"), 5);
        if (r) {
            ++*ok;
            continue;
        }
        pause.expires_after(5ms);
        (void)co_await pause.async_wait(detail::use_nothrow);
    }
}

Task<int> loaded_member(Child c) {
    auto ex = co_await asio::this_coro::executor;
    auto store = co_await TcpStore::connect(ex, test::local_store(c.port, 20s));
    if (!store) co_return 10;
    std::shared_ptr<Store> st = *store;
    auto agent = co_await join(st, c, 1s);
    if (!agent) {
        std::fprintf(stderr, "rank %d: %s\n", c.rank, agent.error().to_string().c_str());
        co_return 12;
    }
    auto a = *agent;
    if (!co_await count_in(*st, "test/in", 4)) co_return 13;
    if (!co_await store_wait(*st, "test/in/all", 20s)) co_return 14;
    // Every member calls every other, 4 calls at a time each.
    bool stop = false;
    std::size_t ok = 0;
    test::Signal ended(ex, 64);
    int loops = 0;
    for (int to = 0; to < 4; ++to) {
        if (to == c.rank) continue;
        for (int k = 0; k < 4; ++k, ++loops)
            asio::co_spawn(ex, load_loop(a, to, &stop, &ok), [&ended](std::exception_ptr) { ended.try_send(std::error_code{}, 0); });
    }
    asio::steady_timer t(ex);
    t.expires_after(300ms);
    (void)co_await t.async_wait(detail::use_nothrow);
    if (c.rank == 3) {
        (void)co_await store_wait(*st, "test/done/all", 40s);  // (killed by the parent before)
        co_return 20;
    }
    if (c.rank == 0) note(c.notify, 'k');  // the parent kills worker3 now, in the middle of the load
    const bool out = co_await settled(*a, ranks_upto(2), 15s);
    stop = true;
    for (int i = 0; i < loops; ++i) co_await ended.async_receive(asio::use_awaitable);
    if (!out) co_return 21;
    if (ok == 0) co_return 22;
    if (!co_await count_in(*st, "test/done", 3)) co_return 23;
    if (!co_await store_wait(*st, "test/done/all", 20s)) co_return 24;
    auto s = co_await a->shutdown(true, 10);
    if (!s) std::fprintf(stderr, "rank %d shutdown: %s\n", c.rank, s.error().to_string().c_str());
    co_return s ? 0 : 25;
}

// ---- forged updates ----

Task<int> attacked_member(Child c) {
    auto ex = co_await asio::this_coro::executor;
    auto store = co_await TcpStore::connect(ex, test::local_store(c.port, 20s));
    if (!store) co_return 10;
    std::shared_ptr<Store> st = *store;
    auto agent = co_await join(st, c, 5s);
    if (!agent) {
        std::fprintf(stderr, "rank %d: %s\n", c.rank, agent.error().to_string().c_str());
        co_return 12;
    }
    auto a = *agent;
    if (!co_await count_in(*st, "test/in", 3)) co_return 13;
    if (!co_await store_wait(*st, "test/attacked", 30s)) co_return 14;
    // Whatever was sent, the group is what it was, and everyone is reachable.
    if (!co_await settled(*a, ranks_upto(2), 3s)) co_return 15;
    if (!co_await count_in(*st, "test/done", 3)) co_return 16;
    if (!co_await store_wait(*st, "test/done/all", 20s)) co_return 17;
    auto s = co_await a->shutdown(true, 10);
    co_return s ? 0 : 18;
}

/// Connects to the member of rank `to` as worker `name` of rank `rank` and makes one call; the
/// reply frame.
Task<Result<Frame>> call_as(Store& st, int to, std::string name, int rank, std::string key, std::string handler, Bytes payload) {
    auto rec_bytes = co_await st.get(detail::member_info_key(to));
    if (!rec_bytes) co_return fail(rec_bytes.error());
    auto rec = detail::decode_record(*rec_bytes);
    if (!rec) co_return fail(rec.error());
    const TransportOffer* uv = nullptr;
    for (const auto& o : rec->addresses)
        if (o.name == "uv") uv = &o;
    if (!uv) co_return fail(Errc::not_found, "no uv address");
    auto address = Address::parse(uv->address);
    if (!address) co_return fail(address.error());
    HelloInfo hello;
    hello.name = std::move(name);
    hello.rank = rank;
    HandshakeAuth auth;
    auth.key = std::move(key);
    auto connecting = Connection::connect(std::move(*address), hello, ConnectionLimits{}, std::move(auth));
    auto conn = co_await std::move(connecting);
    if (!conn) co_return fail(conn.error());
    Frame f;
    f.id = 1;
    f.name = std::move(handler);
    f.payload = std::move(payload);
    if (auto s = (*conn)->send(std::move(f), true); !s) co_return fail(s.error());
    auto reply = co_await with_timeout((*conn)->receive(), 10s);
    (*conn)->close();
    co_return reply;
}

/// 0 when `reply` is an error reply of code unauthorized; else `code` (and what came, on stderr).
int refused_with(const Result<Frame>& reply, int code, const char* what) {
    if (!reply) {
        std::fprintf(stderr, "%s: %s\n", what, reply.error().to_string().c_str());
        return code;
    }
    if (reply->kind != FrameKind::error) {
        std::fprintf(stderr, "%s: accepted\n", what);
        return code;
    }
    const Error e = detail::decode_error(reply->payload, "worker0");
    // (A built-in handler's refusal reaches the caller as the handler's failure: remote_error
    // carrying the unauthorized error; a gate's refusal, before any handler, as unauthorized.)
    const bool unauthorized = e.code() == Errc::unauthorized ||
                              (e.code() == Errc::remote_error && e.message().find("unauthorized") != std::string::npos);
    if (!unauthorized) {
        std::fprintf(stderr, "%s: refused with %s\n", what, e.to_string().c_str());
        return code + 1;
    }
    return 0;
}

Task<int> attacker(Child c) {
    auto ex = co_await asio::this_coro::executor;
    auto store = co_await TcpStore::connect(ex, test::local_store(c.port, 20s));
    if (!store) co_return 10;
    auto& st = **store;
    if (!co_await store_wait(st, "test/in/all", 30s)) co_return 11;
    // What any process may ask of a member: its record (the store) and its device info (joining needs it).
    auto rec0_bytes = co_await st.get(detail::member_info_key(0));
    auto rec1_bytes = co_await st.get(detail::member_info_key(1));
    if (!rec0_bytes || !rec1_bytes) co_return 12;
    auto rec0 = detail::decode_record(*rec0_bytes);
    auto rec1 = detail::decode_record(*rec1_bytes);
    if (!rec0 || !rec1) co_return 13;
    auto dev0_reply = co_await call_as(st, 0, "intruder", 7, c.key, detail::kDeviceInfosHandler, {});
    if (!dev0_reply || dev0_reply->kind != FrameKind::response) co_return 14;
    auto dev0 = decode_worker_device_info(dev0_reply->payload);
    if (!dev0) co_return 15;
    auto member = [](detail::PeerRecord rec) {
        detail::GroupMember m;
        m.devices.name = rec.name;
        m.record = std::move(rec);
        return m;
    };
    detail::GroupMember worker0;
    worker0.record = *rec0;
    worker0.devices = *dev0;
    detail::GroupMember worker1 = member(*rec1);
    worker1.devices.name = rec1->name;
    auto named = [&rec0](std::string name, int rank) {
        detail::PeerRecord r;
        r.name = std::move(name);
        r.rank = rank;
        r.addresses = rec0->addresses;
        return r;
    };
    detail::GroupMember intruder = member(named("intruder", 7));
    detail::GroupMember phantom = member(named("phantom", 8));

    // A non-member calls a user handler.
    auto echo = co_await call_as(st, 0, "intruder", 7, c.key, "echo", bytes("hi"));
    if (int r = refused_with(echo, 20, "a non-member's call of echo")) co_return r;
    // A non-member's join that lists worker0 and a phantom (no token, no claim).
    detail::MembershipUpdate join;
    join.change = detail::MembershipChange::join;
    join.subject = "intruder";
    join.members.push_back(worker0);
    join.members.push_back(intruder);
    join.members.push_back(phantom);
    auto joined = co_await call_as(st, 0, "intruder", 7, c.key, detail::kMembershipHandler, detail::encode_membership_update(join));
    if (int r = refused_with(joined, 30, "a forged join")) co_return r;
    // An impostor under worker1's name removes worker2 (it does not hold the token).
    detail::MembershipUpdate removal;
    removal.change = detail::MembershipChange::removal;
    removal.subject = "worker2";
    removal.members.push_back(worker0);
    removal.members.push_back(worker1);
    auto removed = co_await call_as(st, 0, "worker1", 1, c.key, detail::kMembershipHandler, detail::encode_membership_update(removal));
    if (int r = refused_with(removed, 40, "an impostor's removal")) co_return r;
    // A non-member "leaves", telling worker0 that the group is worker0 alone.
    detail::MembershipUpdate leave;
    leave.change = detail::MembershipChange::leave;
    leave.subject = "intruder";
    leave.members.push_back(worker0);
    auto left = co_await call_as(st, 0, "intruder", 9, c.key, detail::kMembershipHandler, detail::encode_membership_update(leave));
    if (int r = refused_with(left, 50, "a non-member's leave")) co_return r;
    if (!co_await store_flag(st, "test/attacked")) co_return 60;
    co_return 0;
}

void run_forged(const std::string& key) {
    auto run = start({attacked_member, attacked_member, attacked_member, attacker}, key);
    auto codes = finish(run);
    for (std::size_t i = 0; i < codes.size(); ++i) {
        INFO((i < 3 ? "member process " : "attacker process ") << i);
        CHECK(codes[i] == 0);
    }
}

// ---- a live member removed ----

Task<int> removed_or_not(Child c) {
    auto ex = co_await asio::this_coro::executor;
    auto store = co_await TcpStore::connect(ex, test::local_store(c.port, 20s));
    if (!store) co_return 10;
    std::shared_ptr<Store> st = *store;
    auto agent = co_await join(st, c, 1s);
    if (!agent) {
        std::fprintf(stderr, "rank %d: %s\n", c.rank, agent.error().to_string().c_str());
        co_return 12;
    }
    auto a = *agent;
    if (!co_await count_in(*st, "test/in", 3)) co_return 13;
    if (!co_await store_wait(*st, "test/in/all", 20s)) co_return 14;
    if (c.rank == 2) {
        // Stopped by the parent (after 's') until the others removed it, then resumed: it keeps
        // calling until a call says that it is no longer a member.
        note(c.notify, 's');
        asio::steady_timer pause(ex);
        const auto deadline = Clock::now() + 30s;
        std::optional<Error> last;
        const std::string to0 = "worker0", to1 = "worker1", handler = "echo";
        while (Clock::now() < deadline) {
            auto r = co_await a->rpc_async(to0, handler, test::text_message("still here?"), 2);
            if (!r && r.error().code() == Errc::shutdown && r.error().message().find("removed from the dynamic group") != std::string::npos) {
                last = r.error();
                break;
            }
            pause.expires_after(20ms);
            (void)co_await pause.async_wait(detail::use_nothrow);
        }
        if (!last) co_return 30;
        // Evicted: every call fails so, and leaving tells nobody (it is no member).
        auto again = co_await a->rpc_async(to1, handler, test::text_message("again"), 2);
        if (again || again.error().code() != Errc::shutdown) co_return 31;
        if (!co_await store_flag(*st, "test/evicted")) co_return 32;
        auto s = co_await a->shutdown(true, 10);
        if (!s) std::fprintf(stderr, "rank 2 shutdown: %s\n", s.error().to_string().c_str());
        co_return s ? 0 : 33;
    }
    if (!co_await settled(*a, ranks_upto(1), 15s)) co_return 40;  // worker2 removed by its silent heartbeat
    if (c.rank == 0) note(c.notify, 'r');                  // the parent resumes it
    if (!co_await store_wait(*st, "test/evicted", 40s)) co_return 41;
    if (!co_await settled(*a, ranks_upto(1), 2s)) co_return 42;  // and it did not come back by itself
    if (!co_await count_in(*st, "test/done", 2)) co_return 43;
    if (!co_await store_wait(*st, "test/done/all", 20s)) co_return 44;
    auto s = co_await a->shutdown(true, 10);
    co_return s ? 0 : 45;
}

}  // namespace

TEST_CASE("a member SIGKILLed while every member calls every other is removed, and the survivors go on (3 runs)",
          "[rpc][dynamic][multiprocess][fault]") {
    for (int i = 0; i < 3; ++i) {
        INFO("run " << i);
        auto run = start({loaded_member, loaded_member, loaded_member, loaded_member});
        const char k = next_note(run.notify_read);
        if (k == 'k') ::kill(run.children[3], SIGKILL);
        auto codes = finish(run);
        CHECK(k == 'k');
        CHECK(codes[0] == 0);
        CHECK(codes[1] == 0);
        CHECK(codes[2] == 0);
        CHECK(codes[3] == -SIGKILL);
    }
}

TEST_CASE("forged membership updates and a non-member's calls are refused, and the group stays as it is",
          "[rpc][dynamic][multiprocess][hostile]") {
    SECTION("without a key") { run_forged(""); }
    SECTION("with a key the forger holds too") { run_forged("group key of issue 32"); }
}

// (It used to fail about one run in three: a call made while the member was evicted connected
// anew, and later calls took that connection past the eviction check, refused by the others.)
TEST_CASE("a member stopped until the others removed it learns, when it runs again, that it is no member",
          "[rpc][dynamic][multiprocess][fault]") {
    auto run = start({removed_or_not, removed_or_not, removed_or_not});
    const char s = next_note(run.notify_read);
    if (s == 's') ::kill(run.children[2], SIGSTOP);
    const char r = s == 's' ? next_note(run.notify_read) : 0;
    ::kill(run.children[2], SIGCONT);
    auto codes = finish(run);
    CHECK(s == 's');
    CHECK(r == 'r');
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
    CHECK(codes[2] == 0);
}

}  // namespace tp_membership_hostile_test
