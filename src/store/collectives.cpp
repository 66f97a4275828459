// all_gather and barrier over any Store, with per-rank round counters and bounded keys.
#include <tensorplay/store/collectives.hpp>

#include "core/asio_compat.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
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

// Extended stores: rank's value is one frame (u32 rank, u64 length, bytes; little-endian) appended
// to the round's single key, so that a rank sends O(1) bytes of request instead of world_size keys.
void put_frame(Bytes& out, int rank, const Bytes& value) {
    const auto r = static_cast<std::uint32_t>(rank);
    const auto n = static_cast<std::uint64_t>(value.size());
    out.reserve(out.size() + 12 + value.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(r >> (8 * i)));
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
    out.insert(out.end(), value.begin(), value.end());
}

// Splits a round's frames by rank. False when the data is malformed or names a rank twice or out of
// range; `missing` gets the ranks without a frame (appended on another connection and not yet seen).
bool split_frames(const Bytes& all, int world_size, std::vector<Bytes>& out, std::vector<int>& missing) {
    out.assign(static_cast<std::size_t>(world_size), Bytes{});
    std::vector<bool> seen(static_cast<std::size_t>(world_size), false);
    std::size_t pos = 0;
    while (pos < all.size()) {
        if (all.size() - pos < 12) return false;
        std::uint32_t r = 0;
        std::uint64_t n = 0;
        for (int i = 3; i >= 0; --i) r = (r << 8) | all[pos + static_cast<std::size_t>(i)];
        for (int i = 7; i >= 0; --i) n = (n << 8) | all[pos + 4 + static_cast<std::size_t>(i)];
        pos += 12;
        if (r >= static_cast<std::uint32_t>(world_size) || seen[r] || n > all.size() - pos) return false;
        seen[r] = true;
        out[r].assign(all.begin() + static_cast<std::ptrdiff_t>(pos), all.begin() + static_cast<std::ptrdiff_t>(pos + n));
        pos += static_cast<std::size_t>(n);
    }
    missing.clear();
    for (int r = 0; r < world_size; ++r)
        if (!seen[static_cast<std::size_t>(r)]) missing.push_back(r);
    return true;
}

std::string rank_list(const std::vector<int>& ranks) {
    std::string out;
    for (std::size_t i = 0; i < ranks.size() && i < 16; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    if (ranks.size() > 16) out += ", ... (" + std::to_string(ranks.size()) + " ranks)";
    return out;
}

std::string round_context(const char* what, std::int64_t round, int rank, int world_size) {
    return std::string(what) + " round " + std::to_string(round) + " (rank " + std::to_string(rank) + " of " +
           std::to_string(world_size) + ")";
}

}  // namespace

namespace {

// The extended-store all_gather: 4 operations per rank (the last to arrive adds one set and the
// previous round's cleanup), each O(1) bytes of request whatever the world size.
//   tp/ag/<k>/v     frames of every rank's value, appended
//   tp/ag/<k>/n     arrival counter
//   tp/ag/<k>/done  set by the last rank to arrive; everyone multi_gets {done, v}
// The last arrival in round k deletes round k-1's keys: every rank finished reading round k-1
// before it could arrive at round k.
Task<Result<std::vector<Bytes>>> all_gather_appending(Store& store, int rank, int world_size, Bytes value,
                                                      std::int64_t k) {
    auto ctx = [&] { return round_context("all_gather", k, rank, world_size); };
    const std::string base = kGather + std::to_string(k) + "/";
    Bytes frame;
    put_frame(frame, rank, value);
    if (auto r = co_await store.append(base + "v", std::move(frame)); !r)
        co_return fail(std::move(r).error().context(ctx()));
    auto arrived = co_await store.add(base + "n", 1);
    if (!arrived) co_return fail(std::move(arrived).error().context(ctx()));
    if (*arrived > world_size)
        co_return fail(Errc::store_error, ctx() + ": " + std::to_string(*arrived) + " ranks arrived in a world of " +
                                              std::to_string(world_size) + " (two groups share one prefix?)");
    if (*arrived == world_size) {
        if (auto r = co_await store.set(base + "done", bytes("1")); !r)
            co_return fail(std::move(r).error().context(ctx()));
        if (k > 1) {
            const std::string prev = kGather + std::to_string(k - 1) + "/";
            for (const char* name : {"v", "n", "done"}) {
                if (auto r = co_await store.delete_key(prev + name); !r)
                    co_return fail(std::move(r).error().context(ctx()));
            }
        }
    }
    const auto deadline = store.timeout() > Duration::zero() ? Clock::now() + store.timeout() : Clock::time_point::max();
    std::vector<Bytes> out;
    std::vector<int> missing;
    for (Duration pause = std::chrono::milliseconds(1);; pause = std::min<Duration>(pause * 2, std::chrono::milliseconds(50))) {
        std::vector<std::string> keys{base + "done", base + "v"};
        auto got = co_await store.multi_get(std::move(keys));
        if (!got) {
            auto e = std::move(got).error();
            if (e.code() == Errc::timeout) {
                // Name the ranks that never came, from what did arrive.
                std::vector<std::string> v{base + "v"};
                auto have = co_await store.check(std::move(v));
                std::vector<Bytes> partial;
                if (have && *have) {
                    std::vector<std::string> only_v{base + "v"};
                    auto all = co_await store.multi_get(std::move(only_v));
                    if (all && split_frames(all->at(0), world_size, partial, missing))
                        e = Error(Errc::timeout, "ranks " + rank_list(missing) + " never arrived: " + e.message());
                } else {
                    std::vector<int> everyone;
                    for (int r = 0; r < world_size; ++r) everyone.push_back(r);
                    e = Error(Errc::timeout, "ranks " + rank_list(everyone) + " never arrived: " + e.message());
                }
            }
            co_return fail(std::move(e).context(ctx()));
        }
        if (!split_frames((*got)[1], world_size, out, missing))
            co_return fail(Errc::store_error, ctx() + ": the gathered data under '" + base + "v' is malformed "
                                              "(two groups share one prefix?)");
        if (missing.empty()) co_return out;
        // Counted but not yet appended: that rank's append went over another connection of its
        // client and is still on its way. It lands shortly; poll for it.
        if (Clock::now() + pause >= deadline)
            co_return fail(Errc::timeout, ctx() + ": ranks " + rank_list(missing) + " counted but their values never "
                                              "arrived under '" + base + "v'");
        asio::steady_timer sleep(co_await asio::this_coro::executor, pause);
        co_await sleep.async_wait(detail::use_nothrow);
    }
}

}  // namespace

Task<Result<std::vector<Bytes>>> all_gather(Store& store, int rank, int world_size, Bytes value) {
    if (auto valid = check_group("all_gather", rank, world_size); !valid) co_return fail(valid.error());
    auto round = co_await store.add(kGather + "seq/" + std::to_string(rank), 1);
    if (!round) co_return fail(std::move(round).error().context("all_gather: counting rounds"));
    const auto k = *round;
    if (store.has_extended_api()) co_return co_await all_gather_appending(store, rank, world_size, std::move(value), k);
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
