// The membership token: taking it (waiting on the holder, taking it from a dead one), its
// heartbeat, and giving it back.
#include "rpc/group_token.hpp"

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"
#include "core/task_group.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <cstdio>
#include <random>

namespace tensorplay::detail {

struct GroupToken::State {
    State(Executor ex, std::shared_ptr<Store> st, std::string v)
        : store(std::move(st)), value(std::move(v)), beat(value + "/beat"), tasks(std::move(ex)) {}
    std::shared_ptr<Store> store;
    std::string value;
    std::string beat;
    bool released = false;
    std::shared_ptr<bool> lost = std::make_shared<bool>(false);  ///< set by the heartbeat
    TaskGroup tasks;  ///< the heartbeat (declared last: destroyed first, it cancels it)
};

namespace {

std::string nonce() {
    std::random_device rd;
    const std::uint64_t n = (std::uint64_t{rd()} << 32) ^ rd();
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(n));
    return buf;
}

Bytes done_value() { return bytes("Done"); }

std::string purpose_name(TokenPurpose p) {
    switch (p) {
    case TokenPurpose::join: return "join";
    case TokenPurpose::leave: return "leave";
    case TokenPurpose::removal: return "removal";
    }
    return "?";
}

std::string purpose_what(TokenPurpose p, const std::string& name) {
    switch (p) {
    case TokenPurpose::join: return "joining as worker \"" + name + "\"";
    case TokenPurpose::leave: return "leaving as worker \"" + name + "\"";
    case TokenPurpose::removal: return "a removal by worker \"" + name + "\"";
    }
    return name;
}

std::string seconds(Duration d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
    return buf;
}

/// Moves `beat` every `interval` while the token is held (until cancelled), and checks that the
/// token key still holds `mine` (a compare_set of it with itself changes nothing), else sets
/// `lost`. A failed store call is logged and retried at the next beat.
Task<void> heartbeat(std::shared_ptr<Store> store, std::string mine, std::string beat, Duration interval,
                     std::shared_ptr<bool> lost) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (;;) {
        timer.expires_after(interval);
        auto [ec] = co_await timer.async_wait(use_nothrow);
        if (ec) co_return;
        if (auto r = co_await store->add(beat, 1); !r)
            log(LogLevel::warn, "rpc", "group token heartbeat failed: " + r.error().to_string());
        auto held = co_await store->compare_set(std::string(kGroupTokenKey), bytes(mine), bytes(mine));
        if (held && to_string(*held) != mine && !*lost) {
            *lost = true;
            log(LogLevel::warn, "rpc", "group token \"" + mine + "\" was taken by \"" + to_string(*held) + "\"");
        }
    }
}

}  // namespace

Task<Result<std::unique_ptr<GroupToken>>> GroupToken::acquire(std::shared_ptr<Store> store, std::string name, TokenPurpose purpose,
                                                             Clock::time_point deadline, GroupTokenTiming timing) {
    auto ex = co_await asio::this_coro::executor;
    // (No ?: on string literals in this coroutine: GCC 12 then fails with "array used as initializer".)
    const std::string kind = purpose_name(purpose);
    const std::string mine = "Token_for_" + name + "_" + kind + "_" + nonce();
    const std::string what = purpose_what(purpose, name);
    // The holder we wait for, its heartbeat as last read and when that value was first seen.
    const std::string key = kGroupTokenKey;
    std::string watched;
    std::int64_t last_beat = -1;
    Clock::time_point beat_seen{};
    // A holder whose key said "done" while the token still named it: a release writes that key
    // only after emptying the token, so this is a squatter naming a key that exists; waiting on
    // that key again would return at once, and spin the store.
    std::string done_holder;
    asio::steady_timer pause(ex);
    for (;;) {
        auto cas = co_await store->compare_set(key, Bytes{}, bytes(mine));
        if (!cas) co_return fail(std::move(cas).error().context("taking the group token for " + what));
        const std::string holder = to_string(*cas);
        if (holder == mine) break;
        const auto now = Clock::now();
        if (holder != watched) {
            watched = holder;
            last_beat = -1;
            beat_seen = now;
        }
        if (now >= deadline)
            co_return fail(Errc::timeout, "timed out taking the group token for " + what + ": it is held by \"" + holder + "\"");
        const Duration step = std::max<Duration>(std::min<Duration>(timing.beat_interval * 2, deadline - now),
                                                 std::chrono::milliseconds(1));
        if (holder != done_holder) {
            std::vector<std::string> holder_key{holder};
            auto done = co_await store->wait(std::move(holder_key), step);
            if (done) {  // the holder gave it back
                done_holder = holder;
                continue;
            }
            if (done.error().code() != Errc::timeout)
                co_return fail(std::move(done).error().context("waiting for the group token for " + what));
        } else {
            pause.expires_after(step);
            auto [ec] = co_await pause.async_wait(use_nothrow);
            if (ec) co_return fail(Errc::cancelled, "waiting for the group token for " + what + " was cancelled");
        }
        std::string holder_beat = holder + "/beat";
        auto beat = co_await store->add(std::move(holder_beat), 0);
        if (!beat) co_return fail(std::move(beat).error().context("reading the group token's heartbeat for " + what));
        if (*beat != last_beat) {
            last_beat = *beat;
            beat_seen = Clock::now();
            continue;
        }
        if (Clock::now() - beat_seen < timing.stale_after) continue;
        // The holder is silent: take its token away (only if it still holds it), and mark it done
        // so that everyone waiting on it looks again.
        auto taken = co_await store->compare_set(key, bytes(holder), Bytes{});
        if (!taken) co_return fail(std::move(taken).error().context("taking the group token from a dead holder"));
        if (taken->empty()) {
            log(LogLevel::warn, "rpc", "group token: \"" + holder + "\" sent no heartbeat for " +
                                           seconds(Clock::now() - beat_seen) + "; taking the token from it (" + what + ")");
            if (auto d = co_await store->set(holder, done_value()); !d)
                co_return fail(std::move(d).error().context("releasing a dead holder's group token"));
        }
    }
    auto state = std::make_shared<State>(ex, store, mine);
    state->tasks.spawn(heartbeat(store, mine, state->beat, timing.beat_interval, state->lost), "group token heartbeat");
    co_return std::unique_ptr<GroupToken>(new GroupToken(std::move(state)));
}

GroupToken::~GroupToken() = default;  // (unreleased: the heartbeat stops; a waiter takes it after stale_after)

const std::string& GroupToken::value() const noexcept { return s_->value; }

bool GroupToken::lost() const noexcept { return *s_->lost; }

Task<Result<void>> GroupToken::release() {
    auto s = s_;
    if (s->released) co_return ok();
    s->released = true;
    s->tasks.cancel();
    co_await s->tasks.join();
    // Emptied only if still ours (a waiter may have taken it while we were silent), then "Done".
    auto cas = co_await s->store->compare_set(std::string(kGroupTokenKey), bytes(s->value), Bytes{});
    if (!cas) co_return fail(std::move(cas).error().context("giving back the group token"));
    if (auto d = co_await s->store->set(s->value, done_value()); !d)
        co_return fail(std::move(d).error().context("giving back the group token"));
    if (auto k = co_await s->store->delete_key(s->beat); !k)
        co_return fail(std::move(k).error().context("giving back the group token"));
    co_return ok();
}

}  // namespace tensorplay::detail
