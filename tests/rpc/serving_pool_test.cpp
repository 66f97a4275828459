// ServingPool: serving workers parked between requests (bounded), woken with a request or to
// exit, a parked worker destroyed unwoken or abandoned, and the blocking handlers' threads.
#include "rpc/serving_pool.hpp"

#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>

#include <catch2/catch.hpp>

#include <future>
#include <thread>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_serving_pool_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::ResumeSlot;
using detail::ServeWorker;
using detail::ServingPool;

namespace {

struct Served {
    std::vector<std::uint64_t> ids;
    int exited = 0;
    int frames_gone = 0;
};

/// Counts its frame's end, however it ends (returned or destroyed parked).
struct FrameEnd {
    int& n;
    ~FrameEnd() { ++n; }
};

/// A serving worker as the agent's is one: parks, serves each request it is handed, and exits when
/// it is refused a place or woken without a request.
Task<void> serve(ServingPool& pool, Served& s) {
    FrameEnd end{s.frames_gone};
    ServeWorker w;
    for (;;) {
        if (!pool.park(w)) break;
        co_await w.wake.wait(ResumeSlot::OnCancel::ignore);
        if (w.wake.error() || !w.has_request) break;
        s.ids.push_back(w.req.id);
        w.has_request = false;
    }
    ++s.exited;
}

/// Hands request `id` to a parked worker, as the agent's reader does; false when none is parked.
bool hand(ServingPool& pool, std::uint64_t id) {
    ServeWorker* w = pool.take();
    if (!w) return false;
    w->req.id = id;
    w->has_request = true;
    w->wake.complete();
    return true;
}

}  // namespace

TEST_CASE("a serving pool parks workers up to its bound, hands them requests, and wakes them to exit when closed",
          "[rpc][serving]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        ServingPool pool(2);
        Served s;
        for (int i = 0; i < 3; ++i) asio::co_spawn(ex, serve(pool, s), asio::detached);
        co_await asio::post(ex, asio::use_awaitable);  // (one turn: the three have started)
        CHECK(pool.idle() == 2);
        CHECK(s.exited == 1);  // the third found the pool full

        REQUIRE(hand(pool, 7));
        CHECK(s.ids == std::vector<std::uint64_t>{7});
        CHECK(pool.idle() == 2);  // it served and parked again
        // A parked worker is resumed in place: it has served, and parked again, when hand() returns.
        REQUIRE(hand(pool, 8));
        CHECK(s.ids.back() == 8);
        REQUIRE(hand(pool, 9));
        CHECK(s.ids.back() == 9);
        CHECK(pool.idle() == 2);

        pool.close();
        co_await asio::post(ex, asio::use_awaitable);  // (one turn: the woken workers have exited)
        CHECK(s.exited == 3);
        CHECK(pool.idle() == 0);
        CHECK_FALSE(hand(pool, 10));
        ServeWorker late;
        CHECK_FALSE(pool.park(late));  // closed: parks no more
        CHECK(s.frames_gone == 3);
    });
}

TEST_CASE("a parked worker destroyed unwoken leaves the idle list; abandon destroys the parked frames", "[rpc][serving]") {
    ServingPool pool;
    {
        ServeWorker w;
        REQUIRE(pool.park(w));
        CHECK(w.parked_in == &pool);
        CHECK(pool.idle() == 1);
    }
    CHECK(pool.idle() == 0);
    CHECK(pool.take() == nullptr);

    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        Served s;
        asio::co_spawn(ex, serve(pool, s), asio::detached);
        asio::co_spawn(ex, serve(pool, s), asio::detached);
        co_await asio::post(ex, asio::use_awaitable);  // (one turn: both have parked)
        CHECK(pool.idle() == 2);
        pool.abandon();  // (the owner goes: no request can come, and nobody resumes them)
        CHECK(pool.idle() == 0);
        co_await asio::post(ex, asio::use_awaitable);  // (Asio unwinds an abandoned coroutine through its executor)
        CHECK(s.frames_gone == 2);
        CHECK(s.exited == 0);
        ServeWorker again;  // abandoning does not close: a new worker may park
        CHECK(pool.park(again));
        pool.unpark(again);
    });
}

TEST_CASE("the blocking handlers' threads are made once, from any thread, and run work off the caller's thread",
          "[rpc][serving]") {
    ServingPool pool;
    std::promise<asio::thread_pool*> other;
    std::thread t([&] { other.set_value(&pool.blocking_threads(2)); });
    asio::thread_pool& mine = pool.blocking_threads(3);  // (the count of whichever call came first)
    t.join();
    CHECK(other.get_future().get() == &mine);
    std::promise<std::thread::id> ran;
    asio::post(mine, [&ran] { ran.set_value(std::this_thread::get_id()); });
    auto f = ran.get_future();
    REQUIRE(f.wait_for(5s) == std::future_status::ready);
    CHECK(f.get() != std::this_thread::get_id());
}

}  // namespace tp_serving_pool_test
