// CallTable: a worker's calls registered, answered, failed with their connection, timed out by
// the one deadline keeper, and drained by a graceful shutdown.
#include "rpc/call_table.hpp"

#include <tensorplay/core/timeout.hpp>

#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>

#include <memory>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_call_table_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::CallTable;
using detail::PendingCall;
using detail::PendingCallHandle;
using detail::TaskGroup;

namespace {

const auto never = Clock::time_point::max();

/// A caller as the agent's call() is one: registers, parks until signalled, ends with its frame.
Task<void> caller(CallTable& table, int rank, std::uint64_t id, Clock::time_point due, const Connection* conn,
                  std::optional<Result<Message>>& out, bool& timed_out) {
    PendingCallHandle pc(table, rank, id, nullptr);
    pc->conn = conn;
    pc.add(due);
    if (!pc->signalled) co_await pc->done.wait();
    timed_out = !pc->result;
    if (pc->result) out = std::move(*pc->result);
}

/// A table as the agent keeps one: on the test's executor, its deadline sweep in a task group.
struct Calls {
    explicit Calls(Executor ex) : tasks(ex), table(ex, tasks) {}
    /// Closes the table and waits until its sweep has ended.
    Task<void> close() {
        table.close();
        tasks.cancel();
        co_await tasks.join();
    }
    TaskGroup tasks;
    CallTable table;
};

/// The peer's rank in the cases with one peer.
constexpr int peer = 1;

Task<void> pause(Duration d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(detail::use_nothrow);
}

}  // namespace

TEST_CASE("a reply takes its call; a late reply finds nothing; the count follows the callers' frames", "[rpc][calls]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Calls calls(ex);
        auto& table = calls.table;
        const auto a = table.next_id(), b = table.next_id();
        CHECK(a != b);
        std::optional<Result<Message>> ra, rb;
        bool ta = false, tb = false;
        asio::co_spawn(ex, caller(table, peer, a, never, nullptr, ra, ta), asio::detached);
        asio::co_spawn(ex, caller(table, peer, b, never, nullptr, rb, tb), asio::detached);
        co_await pause(1ms);
        CHECK(table.outstanding() == 2);
        CHECK(table.in_flight(peer) == 2);
        PendingCall* pa = table.take(peer, a);
        REQUIRE(pa);
        CHECK(table.take(peer, a) == nullptr);  // a second reply with the same id: late
        pa->finish(Message{Bytes{'A'}, {}});  // resumes the caller in place
        REQUIRE(ra);
        REQUIRE(*ra);
        CHECK(to_string((*ra)->payload) == "A");
        CHECK(table.outstanding() == 1);
        CHECK(table.in_flight(peer) == 1);
        table.fail(peer, nullptr, Error(Errc::connection_lost, "gone"));
        REQUIRE(rb);
        CHECK(rb->error().code() == Errc::connection_lost);
        CHECK(table.outstanding() == 0);
        CHECK(table.in_flight(peer) == 0);
        co_await calls.close();
    });
}

TEST_CASE("a call past its deadline is signalled without a result and leaves the map; others wait on", "[rpc][calls]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Calls calls(ex);
        auto& table = calls.table;
        std::optional<Result<Message>> r1, r2;
        bool t1 = false, t2 = false;
        asio::co_spawn(ex, caller(table, peer, 1, Clock::now() + 20ms, nullptr, r1, t1), asio::detached);
        asio::co_spawn(ex, caller(table, peer, 2, Clock::now() + 10s, nullptr, r2, t2), asio::detached);
        for (int i = 0; i < 500 && !t1; ++i) co_await pause(2ms);
        CHECK(t1);
        CHECK_FALSE(r1);
        CHECK(table.in_flight(peer) == 1);  // the timed-out call left; the other stays
        CHECK(table.outstanding() == 1);
        CHECK_FALSE(t2);
        table.fail(peer, nullptr, Error(Errc::shutdown, "closing"));
        CHECK(r2);
        co_await calls.close();
    });
}

TEST_CASE("failing a connection's calls leaves the calls sent on another connection", "[rpc][calls]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Calls calls(ex);
        auto& table = calls.table;
        const auto* old_conn = reinterpret_cast<const Connection*>(0x1000);
        const auto* new_conn = reinterpret_cast<const Connection*>(0x2000);
        std::optional<Result<Message>> r[3];
        bool t[3] = {};
        asio::co_spawn(ex, caller(table, peer, 1, never, old_conn, r[0], t[0]), asio::detached);
        asio::co_spawn(ex, caller(table, peer, 2, never, new_conn, r[1], t[1]), asio::detached);
        asio::co_spawn(ex, caller(table, peer, 3, never, old_conn, r[2], t[2]), asio::detached);
        co_await pause(1ms);
        table.fail(peer, old_conn, Error(Errc::connection_lost, "old connection lost"));
        CHECK(r[0]);
        CHECK_FALSE(r[1]);
        CHECK(r[2]);
        CHECK(table.in_flight(peer) == 1);
        CHECK(table.outstanding() == 1);
        table.fail(peer, nullptr, Error(Errc::shutdown, "closing"));
        co_await calls.close();
    });
}

TEST_CASE("drained() waits for the last call, gives up at its deadline, and ends when the table closes", "[rpc][calls]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Calls calls(ex);
        auto& table = calls.table;
        const bool at_once = co_await table.drained(never);  // nothing outstanding: at once
        CHECK(at_once);

        std::optional<Result<Message>> r;
        bool t = false;
        asio::co_spawn(ex, caller(table, peer, 7, never, nullptr, r, t), asio::detached);
        co_await pause(1ms);
        const auto began = Clock::now();
        const bool in_time = co_await table.drained(Clock::now() + 30ms);  // the call stays: the deadline ends it
        CHECK_FALSE(in_time);
        CHECK(Clock::now() - began >= 25ms);

        // The reply comes while a shutdown drains: it resumes the drain.
        asio::co_spawn(
            ex,
            [](CallTable& tb) -> Task<void> {
                co_await pause(20ms);
                tb.fail(peer, nullptr, Error(Errc::connection_lost, "gone"));
            }(table),
            asio::detached);
        const bool after_reply = co_await table.drained(Clock::now() + 5s);
        CHECK(after_reply);
        CHECK(table.outstanding() == 0);

        // A local call stays outstanding: closing the table ends the drain (not drained).
        table.add_local();
        asio::co_spawn(
            ex,
            [](CallTable& tb) -> Task<void> {
                co_await pause(20ms);
                tb.close();
            }(table),
            asio::detached);
        const bool at_close = co_await table.drained(never);
        CHECK_FALSE(at_close);
        table.finished();
        co_await calls.close();
    });
}

TEST_CASE("the table owns each peer's calls: failing one peer's leaves another's, a reply names its peer", "[rpc][calls]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Calls calls(ex);
        auto& table = calls.table;
        CHECK(table.in_flight(0) == 0);  // ranks never called, negative ones included
        CHECK(table.in_flight(-1) == 0);
        CHECK(table.take(7, 1) == nullptr);
        std::optional<Result<Message>> r[4];
        bool t[4] = {};
        // Ranks 0 and 5 (grown past the first: the table keeps rank 0's calls when it grows).
        asio::co_spawn(ex, caller(table, 0, 1, never, nullptr, r[0], t[0]), asio::detached);
        asio::co_spawn(ex, caller(table, 0, 2, never, nullptr, r[1], t[1]), asio::detached);
        asio::co_spawn(ex, caller(table, 5, 3, never, nullptr, r[2], t[2]), asio::detached);
        asio::co_spawn(ex, caller(table, 5, 4, never, nullptr, r[3], t[3]), asio::detached);
        co_await pause(1ms);
        CHECK(table.outstanding() == 4);
        CHECK(table.in_flight(0) == 2);
        CHECK(table.in_flight(5) == 2);
        CHECK(table.in_flight(3) == 0);

        // A reply names its peer: rank 0 cannot take rank 5's call.
        CHECK(table.take(0, 3) == nullptr);
        CHECK(table.in_flight(5) == 2);

        table.fail(5, nullptr, Error(Errc::connection_lost, "rank 5 gone"));
        REQUIRE(r[2]);
        REQUIRE(r[3]);
        CHECK(r[2]->error().code() == Errc::connection_lost);
        CHECK_FALSE(r[0]);
        CHECK_FALSE(r[1]);
        CHECK(table.in_flight(5) == 0);
        CHECK(table.in_flight(0) == 2);
        CHECK(table.outstanding() == 2);

        // drained(rank) waits for that peer's calls only.
        const bool five_drained = co_await table.drained(5, Clock::now() + 5s);
        CHECK(five_drained);
        const bool zero_drained = co_await table.drained(0, Clock::now() + 20ms);
        CHECK_FALSE(zero_drained);

        PendingCall* p1 = table.take(0, 1);
        REQUIRE(p1);
        p1->finish(Message{Bytes{'1'}, {}});
        REQUIRE(r[0]);
        REQUIRE(*r[0]);
        CHECK(table.outstanding() == 1);
        table.fail(0, nullptr, Error(Errc::shutdown, "closing"));
        CHECK(r[1]);
        CHECK(table.outstanding() == 0);
        co_await calls.close();
    });
}

TEST_CASE("a reply after its call timed out finds nothing, and the count follows", "[rpc][calls]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Calls calls(ex);
        auto& table = calls.table;
        std::optional<Result<Message>> r[2];
        bool t[2] = {};
        asio::co_spawn(ex, caller(table, 2, 10, Clock::now() + 10ms, nullptr, r[0], t[0]), asio::detached);
        asio::co_spawn(ex, caller(table, 2, 11, never, nullptr, r[1], t[1]), asio::detached);
        co_await pause(1ms);
        CHECK(table.outstanding() == 2);
        for (int i = 0; i < 500 && !t[0]; ++i) co_await pause(2ms);
        REQUIRE(t[0]);
        CHECK(table.outstanding() == 1);  // the timed-out caller's frame ended: its count with it
        CHECK(table.take(2, 10) == nullptr);  // its late reply
        CHECK(table.in_flight(2) == 1);
        PendingCall* p = table.take(2, 11);
        REQUIRE(p);
        CHECK(table.in_flight(2) == 0);
        CHECK(table.outstanding() == 1);  // taken, but its caller has not resumed yet
        p->finish(Message{});
        CHECK(table.outstanding() == 0);
        CHECK(t[1] == false);
        co_await calls.close();
    });
}

}  // namespace tp_call_table_test
