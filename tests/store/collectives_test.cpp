// Tests of all_gather and barrier: many ranks as coroutines, repeated rounds, bounded keys, costs, errors.
#include <tensorplay/store/collectives.hpp>
#include <tensorplay/store/hash_store.hpp>
#include <tensorplay/store/prefix_store.hpp>

#include "store/store_test_util.hpp"
#include "support/deadline.hpp"

#include <asio/io_context.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_collectives_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

const int kBigWorld = std::getenv("TP_BIG_WORLD") ? std::atoi(std::getenv("TP_BIG_WORLD")) : 256;

// Forwards to a HashStore and counts the operations each call makes (one op = one round trip
// on a network store); can pretend not to have the extended API.
class CountingStore final : public Store {
public:
    explicit CountingStore(bool extended) : extended_(extended) { timeout_ = 5s; }
    std::atomic<int> ops{0}, gets{0}, multi_gets{0};

    Task<Result<void>> set(std::string k, Bytes v) override { ++ops; return inner_.set(std::move(k), std::move(v)); }
    Task<Result<Bytes>> get(std::string k) override { ++ops; ++gets; return inner_.get(std::move(k)); }
    Task<Result<std::int64_t>> add(std::string k, std::int64_t d) override { ++ops; return inner_.add(std::move(k), d); }
    Task<Result<Bytes>> compare_set(std::string k, Bytes e, Bytes d) override {
        ++ops;
        return inner_.compare_set(std::move(k), std::move(e), std::move(d));
    }
    using Store::wait;
    Task<Result<void>> wait(std::vector<std::string> k, Duration t) override { ++ops; return inner_.wait(std::move(k), t); }
    Task<Result<bool>> check(std::vector<std::string> k) override { ++ops; return inner_.check(std::move(k)); }
    Task<Result<bool>> delete_key(std::string k) override { ++ops; return inner_.delete_key(std::move(k)); }
    Task<Result<std::int64_t>> num_keys() override { return inner_.num_keys(); }
    Task<Result<void>> append(std::string k, Bytes v) override { ++ops; return inner_.append(std::move(k), std::move(v)); }
    Task<Result<std::vector<Bytes>>> multi_get(std::vector<std::string> k) override {
        ++ops;
        ++multi_gets;
        return inner_.multi_get(std::move(k));
    }
    Task<Result<void>> multi_set(std::vector<std::string> k, std::vector<Bytes> v) override {
        ++ops;
        return inner_.multi_set(std::move(k), std::move(v));
    }
    bool has_extended_api() const noexcept override { return extended_; }

private:
    bool extended_;
    HashStore inner_{5s};
};

Bytes value_of(int rank, int round) { return bytes("r" + std::to_string(rank) + "/" + std::to_string(round)); }

// One rank: `rounds` all_gathers with a barrier between them, checking every result.
Task<Result<void>> rank_rounds(std::shared_ptr<Store> store, int rank, int world, int rounds) {
    for (int round = 0; round < rounds; ++round) {
        auto got = co_await all_gather(*store, rank, world, value_of(rank, round));
        if (!got) co_return fail(got.error());
        if (got->size() != std::size_t(world)) co_return fail(Errc::internal, "wrong size");
        for (int r = 0; r < world; ++r)
            if ((*got)[std::size_t(r)] != value_of(r, round))
                co_return fail(Errc::internal, "rank " + std::to_string(rank) + " saw a wrong value of rank " +
                                                   std::to_string(r) + " in round " + std::to_string(round));
        if (auto b = co_await barrier(*store, rank, world); !b) co_return fail(b.error());
    }
    co_return ok();
}

// A whole group: `world` ranks as coroutines, each doing `rounds` rounds.
Task<Result<void>> group_rounds(std::shared_ptr<Store> store, int world, int rounds) {
    auto ex = co_await asio::this_coro::executor;
    std::vector<std::unique_ptr<Spawned<void>>> ranks;
    for (int r = 0; r < world; ++r)
        ranks.push_back(std::make_unique<Spawned<void>>(ex, rank_rounds(store, r, world, rounds)));
    Result<void> out = ok();
    for (auto& r : ranks) {
        auto res = co_await r->join();
        if (!res && out) out = fail(res.error());
    }
    co_return out;
}

Task<void> run_group(std::shared_ptr<Store> store, int world, int rounds) {
    auto r = co_await group_rounds(std::move(store), world, rounds);
    if (!r) FAIL(r.error().to_string());
}

}  // namespace

TEST_CASE("collectives refuse a rank outside the world or an empty world", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        HashStore store;
        struct Case { int rank, world; std::string says; };
        std::vector<Case> cases{{-1, 4, "rank -1"}, {4, 4, "rank 4"}, {0, 0, "world_size"}, {0, -3, "world_size"}};
        for (const auto& c : cases) {
            auto g = co_await all_gather(store, c.rank, c.world, bytes("x"));
            REQUIRE_FALSE(g);
            REQUIRE(g.error().code() == Errc::invalid_argument);
            REQUIRE(g.error().message().find(c.says) != std::string::npos);
            auto b = co_await barrier(store, c.rank, c.world);
            REQUIRE_FALSE(b);
            REQUIRE(b.error().code() == Errc::invalid_argument);
        }
        auto n = co_await store.num_keys();
        REQUIRE((n && *n == 0));  // nothing written for a refused call
    });
}

TEST_CASE("all_gather over 64 coroutine ranks gives every rank every value, round after round", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto store = std::make_shared<HashStore>(5s);
        co_await run_group(store, 64, 6);
        // keys stay bounded: at most 4 * world + 4 whatever the number of rounds
        auto n = co_await store->num_keys();
        REQUIRE(n);
        CHECK(*n <= 4 * 64 + 4);
        co_await run_group(store, 64, 6);
        auto n2 = co_await store->num_keys();
        REQUIRE(n2);
        REQUIRE(*n2 == *n);
    });
}

TEST_CASE("all_gather over hundreds of coroutine ranks finishes (TP_BIG_WORLD sets how many)", "[store]") {
    run_with_deadline(20s, []() -> Task<void> {
        auto store = std::make_shared<HashStore>(10s);
        auto start = Clock::now();
        co_await run_group(store, kBigWorld, 1);
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
        WARN("all_gather + barrier over HashStore (" << kBigWorld << " ranks): " << ms << " ms");
    });
}

TEST_CASE("a world of one gathers its own value", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        HashStore store;
        for (int i = 0; i < 4; ++i) {
            auto g = co_await all_gather(store, 0, 1, bytes("solo"));
            REQUIRE(g);
            REQUIRE(*g == vals(bytes("solo")));
            auto b = co_await barrier(store, 0, 1);
            REQUIRE(b);
        }
    });
}

TEST_CASE("a barrier releases nobody until the last rank arrives", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(5s);
        for (int round = 0; round < 3; ++round) {
            std::vector<std::unique_ptr<Spawned<void>>> early;
            for (int r = 1; r < 8; ++r) early.push_back(std::make_unique<Spawned<void>>(ex, barrier(*store, r, 8)));
            co_await pause(20ms);
            for (auto& e : early) REQUIRE_FALSE(e->ready());
            auto last = co_await barrier(*store, 0, 8);
            REQUIRE(last);
            for (auto& e : early) {
                auto r = co_await e->join();
                REQUIRE(r);
            }
        }
    });
}

TEST_CASE("all_gather costs O(1) operations per rank with multi_get, O(world) without", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        for (bool extended : {true, false}) {
            for (int world : {4, 32}) {
                auto store = std::make_shared<CountingStore>(extended);
                auto ex = co_await asio::this_coro::executor;
                std::vector<std::unique_ptr<Spawned<std::vector<Bytes>>>> ranks;
                for (int r = 0; r < world; ++r)
                    ranks.push_back(std::make_unique<Spawned<std::vector<Bytes>>>(
                        ex, all_gather(*store, r, world, value_of(r, 0))));
                for (auto& r : ranks) {
                    auto v = co_await r->join();
                    REQUIRE(v);
                }
                int per_rank = store->ops / world;
                if (extended) {
                    REQUIRE(per_rank <= 4);
                    REQUIRE(store->gets == 0);
                    REQUIRE(store->multi_gets == world);
                } else {
                    REQUIRE(per_rank >= world);
                    REQUIRE(store->multi_gets == 0);
                }
            }
        }
    });
}

TEST_CASE("all_gather times out naming the keys of the ranks that never came", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(60ms);
        Spawned<std::vector<Bytes>> r0(ex, all_gather(*store, 0, 3, bytes("a")));
        auto r1 = co_await all_gather(*store, 1, 3, bytes("b"));
        REQUIRE_FALSE(r1);
        REQUIRE(r1.error().code() == Errc::timeout);
        INFO(r1.error().to_string());
        REQUIRE(r1.error().message().find("ranks 2 never arrived") != std::string::npos);
        REQUIRE(r1.error().message().find("all_gather round 1 (rank 1 of 3)") != std::string::npos);
        auto e0 = co_await r0.join();
        REQUIRE_FALSE(e0);
        REQUIRE(store->pending_waiters() == 0);
    });
}

TEST_CASE("two groups under different prefixes of one store do not mix", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto base = std::make_shared<HashStore>(5s);
        auto a = std::make_shared<PrefixStore>("group_a", base);
        auto b = std::make_shared<PrefixStore>("group_b", base);
        auto ex = co_await asio::this_coro::executor;
        Spawned<void> ga(ex, group_rounds(a, 5, 3));
        co_await run_group(b, 3, 4);
        auto r = co_await ga.join();
        REQUIRE(r);
    });
}

TEST_CASE("ranks on several threads gather through one store", "[store]") {
    constexpr int kThreads = 4, kPerThread = 8, kWorld = kThreads * kPerThread;
    auto store = std::make_shared<HashStore>(10s);
    std::atomic<int> good{0};
    std::mutex mu;
    std::vector<std::string> errors;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            asio::io_context ctx(1);
            for (int i = 0; i < kPerThread; ++i)
                asio::co_spawn(ctx, rank_rounds(store, t * kPerThread + i, kWorld, 4),
                               [&](std::exception_ptr e, Result<void> r) {
                                   if (!e && r) {
                                       ++good;
                                   } else {
                                       std::lock_guard lock(mu);
                                       errors.push_back(e ? "exception" : r.error().to_string());
                                   }
                               });
            ctx.run_for(std::chrono::seconds(20));
        });
    for (auto& t : threads) t.join();
    INFO((errors.empty() ? std::string() : errors.front()));
    REQUIRE(good == kWorld);
}

}  // namespace tp_collectives_test
