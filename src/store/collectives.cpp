// all_gather and barrier over any Store, with per-rank round counters and bounded keys.
#include <tensorplay/store/collectives.hpp>

#include <string>

namespace tensorplay {

namespace {

// Short keys: most stay within std::string's small-string buffer (no allocation per key).
const std::string kGather = "tp/ag/";
const std::string kBarrier = "tp/bar/";

Result<void> check_group(const char* what, int rank, int world_size) {
    if (world_size < 1)
        return fail(Errc::invalid_argument,
                    std::string(what) + ": world_size must be at least 1, got " + std::to_string(world_size));
    if (rank < 0 || rank >= world_size)
        return fail(Errc::invalid_argument, std::string(what) + ": rank " + std::to_string(rank) +
                                                " is outside the world [0, " + std::to_string(world_size) + ")");
    return ok();
}

std::string gather_key(std::int64_t round, int rank) {
    return kGather + std::to_string(round) + "/" + std::to_string(rank);
}

std::string round_context(const char* what, std::int64_t round, int rank, int world_size) {
    return std::string(what) + " round " + std::to_string(round) + " (rank " + std::to_string(rank) + " of " +
           std::to_string(world_size) + ")";
}

}  // namespace

Task<Result<std::vector<Bytes>>> all_gather(Store& store, int rank, int world_size, Bytes value) {
    if (auto valid = check_group("all_gather", rank, world_size); !valid) co_return fail(valid.error());
    auto round = co_await store.add(kGather + "seq/" + std::to_string(rank), 1);
    if (!round) co_return fail(std::move(round).error().context("all_gather: counting rounds"));
    const auto k = *round;
    auto ctx = [&] { return round_context("all_gather", k, rank, world_size); };

    if (auto r = co_await store.set(gather_key(k, rank), std::move(value)); !r)
        co_return fail(std::move(r).error().context(ctx()));
    // Every rank has read round k-2 before any rank could finish round k-1, so ours can go.
    if (k > 2) {
        if (auto r = co_await store.delete_key(gather_key(k - 2, rank)); !r)
            co_return fail(std::move(r).error().context(ctx()));
    }

    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(world_size));
    for (int r = 0; r < world_size; ++r) keys.push_back(gather_key(k, r));

    if (store.has_extended_api()) {
        auto values = co_await store.multi_get(std::move(keys));
        if (!values) co_return fail(std::move(values).error().context(ctx()));
        co_return std::move(*values);
    }
    if (auto r = co_await store.wait(keys); !r) co_return fail(std::move(r).error().context(ctx()));
    std::vector<Bytes> out;
    out.reserve(keys.size());
    for (auto& key : keys) {
        auto v = co_await store.get(std::move(key));
        if (!v) co_return fail(std::move(v).error().context(ctx()));
        out.push_back(std::move(*v));
    }
    co_return out;
}

Task<Result<void>> barrier(Store& store, int rank, int world_size) {
    if (auto valid = check_group("barrier", rank, world_size); !valid) co_return fail(valid.error());
    auto round = co_await store.add(kBarrier + "seq/" + std::to_string(rank), 1);
    if (!round) co_return fail(std::move(round).error().context("barrier: counting rounds"));
    const auto k = *round;
    auto ctx = [&] { return round_context("barrier", k, rank, world_size); };
    const auto base = kBarrier + std::to_string(k) + "/";

    auto arrived = co_await store.add(base + "arrived", 1);
    if (!arrived) co_return fail(std::move(arrived).error().context(ctx()));
    if (*arrived == world_size) {
        if (auto r = co_await store.set(base + "done", bytes("1")); !r)
            co_return fail(std::move(r).error().context(ctx()));
        // Every rank has arrived at round k, so every rank is past round k-1's wait.
        if (k > 1) {
            const auto prev = kBarrier + std::to_string(k - 1) + "/";
            for (const char* name : {"arrived", "done"}) {
                if (auto r = co_await store.delete_key(prev + name); !r)
                    co_return fail(std::move(r).error().context(ctx()));
            }
        }
        co_return ok();
    }
    if (*arrived > world_size)
        co_return fail(Errc::store_error, ctx() + ": " + std::to_string(*arrived) + " ranks arrived in a world of " +
                                              std::to_string(world_size) + " (two groups share one prefix?)");
    std::vector<std::string> done{base + "done"};
    if (auto r = co_await store.wait(std::move(done)); !r) co_return fail(std::move(r).error().context(ctx()));
    co_return ok();
}

}  // namespace tensorplay
