// DeadlineQueue against a sorted reference under random adds and removals; DeadlineKeeper's one
// timer: entries fire in deadline order, a removed one never fires, an earlier one re-arms it, and
// closing (or destroying) the keeper stops it.
#include "core/deadline_queue.hpp"

#include "core/asio_compat.hpp"
#include "support/deadline.hpp"

#include <asio/steady_timer.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_deadline_queue_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::DeadlineHook;
using detail::DeadlineKeeper;
using detail::DeadlineQueue;

namespace {
struct Entry : DeadlineHook {
    int id = 0;
};
}  // namespace

TEST_CASE("a deadline queue gives its entries back earliest first, however they were added and removed", "[core][deadline]") {
    const auto t0 = Clock::now();
    std::vector<Entry> entries(500);
    for (int i = 0; i < 500; ++i) entries[static_cast<std::size_t>(i)].id = i;
    DeadlineQueue q;
    std::multiset<std::pair<Clock::time_point, int>> ref;
    std::mt19937 rng(7);
    for (int step = 0; step < 20000; ++step) {
        auto& e = entries[rng() % entries.size()];
        if (e.queued()) {
            ref.erase(ref.find({e.due(), e.id}));
            q.remove(e);
            CHECK_FALSE(e.queued());
        } else {
            // Mostly monotone (the list), sometimes earlier (the map).
            const auto at = rng() % 4 == 0 ? t0 + std::chrono::microseconds(rng() % 1000)
                                            : t0 + std::chrono::microseconds(1000 + step * 10 + rng() % 5);
            q.add(e, at);
            ref.insert({at, e.id});
        }
        REQUIRE(q.size() == ref.size());
        if (ref.empty()) {
            CHECK(q.earliest() == nullptr);
        } else {
            REQUIRE(q.earliest());
            CHECK(q.earliest()->due() == ref.begin()->first);
        }
    }
    // Expire the first half: in order, and exactly those due.
    const auto cut = t0 + std::chrono::microseconds(1000 + 10000 * 10);
    std::vector<Clock::time_point> popped;
    const auto next = q.expire(cut, [&](DeadlineHook& h) {
        CHECK_FALSE(h.queued());
        popped.push_back(h.due());
    });
    CHECK(std::is_sorted(popped.begin(), popped.end()));
    const auto due = static_cast<std::size_t>(std::distance(ref.begin(), ref.upper_bound({cut, 1 << 30})));
    CHECK(popped.size() == due);
    CHECK(q.size() == ref.size() - due);
    if (q.empty()) CHECK(next == Clock::time_point::max());
    else CHECK(next == q.earliest()->due());
    for (auto& e : entries) q.remove(e);
    CHECK(q.empty());
    q.remove(entries[0]);  // (not queued: nothing)
}

TEST_CASE("expire takes an entry that its callback adds when that entry is due too", "[core][deadline]") {
    const auto now = Clock::now();
    Entry a, b;
    DeadlineQueue q;
    q.add(a, now - 1ms);
    int calls = 0;
    const auto next = q.expire(now, [&](DeadlineHook& h) {
        ++calls;
        if (&h == &a) q.add(b, now - 2ms);  // (earlier than anything: the map)
    });
    CHECK(calls == 2);
    CHECK(q.empty());
    CHECK(next == Clock::time_point::max());
}

TEST_CASE("a deadline keeper fires its entries in deadline order with one timer; a removed entry never fires",
          "[core][deadline]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        detail::TaskGroup tasks(ex);
        std::vector<int> fired;
        DeadlineKeeper k(ex, tasks, [&fired](DeadlineHook& h) { fired.push_back(static_cast<Entry&>(h).id); });
        Entry e[5];
        for (int i = 0; i < 5; ++i) e[i].id = i;
        const auto now = Clock::now();
        k.add(e[0], now + 60ms);
        k.add(e[1], now + 20ms);  // earlier: re-arms the timer
        k.add(e[2], now + 40ms);
        k.add(e[3], now + 30ms);
        k.add(e[4], Clock::time_point::max());  // never: not queued
        CHECK_FALSE(e[4].queued());
        CHECK(k.size() == 4);
        k.remove(e[2]);
        asio::steady_timer t(ex, 150ms);
        co_await t.async_wait(asio::use_awaitable);
        CHECK(fired == std::vector<int>{1, 3, 0});
        CHECK(k.size() == 0);
        // Added again after the queue ran empty: the sweep goes on.
        k.add(e[2], Clock::now() + 10ms);
        t.expires_after(80ms);
        co_await t.async_wait(asio::use_awaitable);
        CHECK(fired == std::vector<int>{1, 3, 0, 2});
        // Closed: nothing fires any more, and the sweep ends.
        k.add(e[0], Clock::now() + 10ms);
        k.close();
        t.expires_after(50ms);
        co_await t.async_wait(asio::use_awaitable);
        CHECK(fired.size() == 4);
        k.remove(e[0]);
        co_await tasks.join();
        CHECK(tasks.running() == 0);
    });
}

TEST_CASE("a deadline keeper destroyed while its timer waits stops its sweep, which outlives it harmlessly", "[core][deadline]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        detail::TaskGroup tasks(ex);
        int fired = 0;
        Entry e;
        {
            DeadlineKeeper k(ex, tasks, [&fired](DeadlineHook&) { ++fired; });
            k.add(e, Clock::now() + 20ms);
            k.remove(e);  // (entries leave before the keeper goes)
            k.add(e, Clock::now() + 20ms);
            k.remove(e);
        }
        asio::steady_timer t(ex, 60ms);
        co_await t.async_wait(asio::use_awaitable);
        CHECK(fired == 0);
        co_await tasks.join();
        CHECK(tasks.running() == 0);
    });
}

}  // namespace tp_deadline_queue_test
