// Tests of HashStore: the c10d contract, waiters across threads, cancellation, timeouts, shutdown.
#include <tensorplay/store/hash_store.hpp>

#include "store/store_conformance.hpp"

#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <atomic>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_hash_store_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

Task<std::shared_ptr<Store>> make_hash_store() { co_return std::make_shared<HashStore>(); }

}  // namespace

STORE_CONFORMANCE_TESTS("HashStore", "[store]", make_hash_store)

TEST_CASE("a cancelled get returns cancelled and leaves no waiter behind", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>();
        Spawned<Bytes> g(ex, store->get("never"));
        Spawned<void> w(ex, store->wait(keys("never", "other"), 0ms));
        co_await pause(10ms);
        REQUIRE(store->pending_waiters() == 2);
        g.cancel();
        w.cancel();  // (a co_spawned coroutine lets only terminal cancellation through by default)
        auto r = co_await g.join();
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::cancelled);
        auto r2 = co_await w.join();
        REQUIRE_FALSE(r2);
        REQUIRE(r2.error().code() == Errc::cancelled);
        REQUIRE(store->pending_waiters() == 0);
        // the store still wakes later waiters normally
        Spawned<Bytes> g2(ex, store->get("never"));
        CO_REQUIRE(co_await store->set("never", bytes("now")));
        auto v = co_await g2.join();
        REQUIRE((v && *v == bytes("now")));
        REQUIRE(store->pending_waiters() == 0);
    });
}

TEST_CASE("a timed-out wait leaves no waiter behind", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        HashStore store(30ms);
        auto r = co_await store.get("k");
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::timeout);
        REQUIRE(r.error().message().find("'k'") != std::string::npos);
        auto w = co_await store.wait(keys("a", "b"), 20ms);
        REQUIRE_FALSE(w);
        REQUIRE(store.pending_waiters() == 0);
    });
}

TEST_CASE("a zero timeout waits until the key arrives", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(Duration::zero());
        Spawned<Bytes> g(ex, store->get("slow"));
        co_await pause(60ms);
        REQUIRE_FALSE(g.ready());
        CO_REQUIRE(co_await store->set("slow", bytes("v")));
        auto v = co_await g.join();
        REQUIRE((v && *v == bytes("v")));
    });
}

TEST_CASE("a key deleted after waking a getter makes it wait again", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(2s);
        Spawned<Bytes> g(ex, store->get("flip"));
        co_await pause(5ms);
        // set and delete before the getter runs again: it must not return a missing value
        CO_REQUIRE(co_await store->set("flip", bytes("1")));
        CO_REQUIRE(co_await store->delete_key("flip"));
        co_await pause(10ms);
        REQUIRE_FALSE(g.ready());
        CO_REQUIRE(co_await store->set("flip", bytes("2")));
        auto v = co_await g.join();
        REQUIRE((v && *v == bytes("2")));
    });
}

TEST_CASE("destroying the store ends pending waits with shutdown", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>();
        Spawned<void> w(ex, store->wait(keys("x"), 0ms));
        co_await pause(5ms);
        store.reset();
        auto r = co_await w.join();
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::shutdown);
    });
}

TEST_CASE("waiters on several threads are woken by a writer on another thread", "[store]") {
    constexpr int kThreads = 4;
    constexpr int kWaitersPerThread = 50;
    auto store = std::make_shared<HashStore>(5s);
    std::vector<std::unique_ptr<asio::io_context>> contexts;
    std::vector<std::thread> threads;
    std::atomic<int> woken{0};
    std::atomic<int> failures{0};
    for (int t = 0; t < kThreads; ++t) {
        contexts.push_back(std::make_unique<asio::io_context>(1));
        for (int i = 0; i < kWaitersPerThread; ++i) {
            std::string key = "k" + std::to_string((t * kWaitersPerThread + i) % 17);
            asio::co_spawn(*contexts.back(), store->get(key), [&, key](std::exception_ptr e, Result<Bytes> r) {
                if (e || !r || *r != bytes(key)) ++failures;
                ++woken;
            });
        }
    }
    for (auto& c : contexts) threads.emplace_back([&c] { c->run_for(std::chrono::seconds(10)); });
    // writers race the registration on purpose: both orders must work
    std::thread writer([&] {
        asio::io_context ctx(1);
        asio::co_spawn(ctx, [store]() -> Task<void> {
            for (int k = 0; k < 17; ++k) {
                std::string key = "k" + std::to_string(k);
                (void)co_await store->set(key, bytes(key));
            }
        }, [](std::exception_ptr) {});
        ctx.run();
    });
    writer.join();
    for (auto& t : threads) t.join();
    REQUIRE(failures == 0);
    REQUIRE(woken == kThreads * kWaitersPerThread);
    REQUIRE(store->pending_waiters() == 0);
}

TEST_CASE("concurrent adds from many threads lose no increment", "[store]") {
    auto store = std::make_shared<HashStore>();
    constexpr int kThreads = 4, kAdds = 500;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([store] {
            asio::io_context ctx(1);
            asio::co_spawn(ctx, [store]() -> Task<void> {
                for (int i = 0; i < kAdds; ++i) (void)co_await store->add("c", 1);
            }, [](std::exception_ptr) {});
            ctx.run();
        });
    for (auto& t : threads) t.join();
    run_with_deadline(5s, [store]() -> Task<void> {
        auto v = co_await store->add("c", 0);
        REQUIRE(v);
        REQUIRE(*v == kThreads * kAdds);
    });
}

TEST_CASE("a thousand waiters on one key are all woken by one set", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(5s);
        std::vector<std::unique_ptr<Spawned<Bytes>>> getters;
        for (int i = 0; i < 1000; ++i) getters.push_back(std::make_unique<Spawned<Bytes>>(ex, store->get("go")));
        co_await pause(5ms);
        REQUIRE(store->pending_waiters() == 1000);
        CO_REQUIRE(co_await store->set("go", bytes("!")));
        for (auto& g : getters) {
            auto v = co_await g->join();
            REQUIRE((v && *v == bytes("!")));
        }
        REQUIRE(store->pending_waiters() == 0);
    });
}

// Regression (ASan heap-use-after-free): a writer used to keep the last reference to a waiter's
// channel past the wake-up, so the channel died on the writer's thread after the waiter's thread
// had already destroyed its io_context (whose channel service the channel's destructor uses).
TEST_CASE("a waiter's io_context may end as soon as its wait is woken from another thread", "[store]") {
    auto store = std::make_shared<HashStore>(10s);
    asio::io_context writer_ctx(1);
    constexpr int kRounds = 300;
    int good = 0;
    for (int i = 0; i < kRounds; ++i) {
        const std::string key = "k" + std::to_string(i);
        std::atomic<bool> ok{false};
        std::thread waiter([&] {
            asio::io_context ctx(1);  // destroyed the moment its only wait completes
            asio::co_spawn(ctx, store->get(key), [&](std::exception_ptr e, Result<Bytes> r) {
                ok = !e && r && *r == bytes("v");
            });
            ctx.run();
        });
        while (store->pending_waiters() == 0) std::this_thread::yield();
        asio::co_spawn(writer_ctx, store->set(key, bytes("v")), [](std::exception_ptr, Result<void>) {});
        writer_ctx.restart();
        writer_ctx.run();
        waiter.join();
        good += ok ? 1 : 0;
    }
    REQUIRE(good == kRounds);
    REQUIRE(store->pending_waiters() == 0);
}

// A waiter cancelled on its own thread while a writer on another thread sets its key: either the
// value or cancelled, never a hang, and its event loop may go the moment its wait ends (ASan
// checks that no writer touches the waiter's signal or event loop after that).
TEST_CASE("a waiter cancelled while another thread sets its key ends cleanly, 2,000 times", "[store]") {
    auto store = std::make_shared<HashStore>(10s);
    constexpr int kRounds = 2000;
    std::atomic<int> turn{-1};
    std::atomic<bool> stop{false};
    std::thread writer([&] {
        asio::io_context ctx(1);
        for (int done = 0; !stop.load();) {
            const int t = turn.load(std::memory_order_acquire);
            if (t < done) {
                std::this_thread::yield();
                continue;
            }
            asio::co_spawn(ctx, store->set("k" + std::to_string(t), bytes("v")), [](std::exception_ptr, Result<void>) {});
            ctx.restart();
            ctx.run();
            done = t + 1;
        }
    });
    int values = 0, cancelled = 0, other = 0;
    for (int i = 0; i < kRounds; ++i) {
        const std::string key = "k" + std::to_string(i);
        std::optional<Result<Bytes>> result;
        {
            asio::io_context ctx(1);  // destroyed as soon as its only wait has ended
            asio::cancellation_signal cancel;
            asio::co_spawn(ctx, store->get(key),
                           asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, Result<Bytes> r) {
                               result = e ? Result<Bytes>(fail(Errc::internal, "threw")) : std::move(r);
                           }));
            ctx.poll();  // parks the waiter
            REQUIRE(store->pending_waiters() == 1);
            turn.store(i, std::memory_order_release);  // the writer sets the key now...
            for (int spin = 0; spin < i % 64; ++spin) std::this_thread::yield();
            cancel.emit(asio::cancellation_type::terminal);  // ...while the waiter is cancelled
            ctx.run();
        }
        REQUIRE(result);
        if (*result && **result == bytes("v")) ++values;
        else if (!*result && result->error().code() == Errc::cancelled) ++cancelled;
        else ++other;
    }
    stop = true;
    writer.join();
    INFO("values " << values << ", cancelled " << cancelled);
    CHECK(other == 0);
    CHECK(cancelled > 0);
    REQUIRE(store->pending_waiters() == 0);
}

}  // namespace tp_hash_store_test
