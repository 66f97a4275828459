// HashStore: in-process key-value store; waiters park on one-shot RemoteSignals woken by writers.
#include <tensorplay/store/hash_store.hpp>

#include "core/flag.hpp"
#include "store/store_util.hpp"

#include <asio/error.hpp>
#include <asio/this_coro.hpp>

#include <mutex>
#include <unordered_map>

namespace tensorplay {

namespace {
// How a waiter's signal ends when the store is destroyed (a plain wake-up carries no error).
const std::error_code kClosed = asio::error::shut_down;
}  // namespace

// Why RemoteSignal: a waiter must be resumed on its own executor by a writer on any thread, and
// must be cancellable per operation. The signal provides both (notify() posts the completion to
// the waiter's executor; its wait honours the cancellation slot), so the store only keeps, under
// one mutex, which waiters still miss which keys.
//
// Lifetimes: a signal's state holds a slot of its waiter's event loop (listed with that loop's
// SlotRegistry while the waiter is parked) and posts to that loop. So writers notify it under `mu`,
// through the registration (a notifier) that the waiter removes (under `mu`) before its signal
// dies; the waiter's frame holds the signal all that time. A writer never keeps a notifier beyond
// `mu`; were it to take one out from under the lock, the waiter could wake, finish, and its thread
// destroy its io_context before the writer's post: a post into a freed event loop. Nor does a
// writer ever hold the last reference to the signal's state (erasing the registration under `mu`
// leaves the waiter's own). notify() never runs the waiter inline (it posts), so notifying under
// `mu` cannot re-enter the store.
struct HashStore::State {
    struct Waiter {
        std::size_t missing = 0;        // distinct keys not yet set since the wait began
        std::vector<std::string> keys;  // distinct keys waited for
        detail::RemoteSignal::Notifier wake;  // the waiting coroutine's signal; notified under mu
    };

    mutable std::mutex mu;
    std::unordered_map<std::string, Bytes> data;
    std::unordered_map<std::uint64_t, Waiter> waiters;
    std::unordered_map<std::string, std::vector<std::uint64_t>> waiting_on;  // key -> waiter ids
    std::uint64_t next_id = 1;
    bool closed = false;

    // Under mu: `key` was written; counts it for every waiter of it, waking those now complete.
    // As in c10d, a write counts once per waiter even if the key is deleted again later; readers
    // (get, multi_get) re-check the data after waking.
    void notify(const std::string& key) {
        if (waiting_on.empty()) return;
        auto it = waiting_on.find(key);
        if (it == waiting_on.end()) return;
        auto ids = std::move(it->second);
        waiting_on.erase(it);
        for (auto id : ids) {
            auto w = waiters.find(id);
            if (w == waiters.end()) continue;
            if (--w->second.missing == 0) {
                w->second.wake.notify();
                erase_waiter(w);
            }
        }
    }

    // Under mu: forgets a waiter and its index entries.
    void erase_waiter(std::unordered_map<std::uint64_t, Waiter>::iterator w) {
        const auto id = w->first;
        for (const auto& k : w->second.keys) {
            auto it = waiting_on.find(k);
            if (it == waiting_on.end()) continue;
            auto& ids = it->second;
            ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
            if (ids.empty()) waiting_on.erase(it);
        }
        waiters.erase(w);
    }

    std::vector<std::string> missing_of(const std::vector<std::string>& keys) const {
        std::lock_guard lock(mu);
        std::vector<std::string> out;
        for (const auto& k : keys)
            if (!data.count(k)) out.push_back(k);
        return out;
    }
};

namespace {

using HashState = HashStore::State;  // (not State: file_store.cpp may share its unity chunk)

// Removes a waiter on every way out of the waiting coroutine (woken, cancelled, destroyed). Declared
// after the signal, so that no writer can reach the signal once it is being destroyed.
struct WaiterGuard {
    std::shared_ptr<HashState> s;
    std::uint64_t id;
    ~WaiterGuard() {
        std::lock_guard lock(s->mu);
        auto w = s->waiters.find(id);
        if (w != s->waiters.end()) s->erase_waiter(w);
    }
};

// Waits (no deadline) until each of `keys` has been written or exists; cancellable.
// `keys` is a reference: the only caller, wait_until, awaits this coroutine to its end.
Task<Result<void>> wait_keys(std::shared_ptr<HashState> s, const std::vector<std::string>& keys) {
    detail::RemoteSignal signal(co_await asio::this_coro::executor);
    std::uint64_t id = 0;
    {
        std::lock_guard lock(s->mu);
        if (s->closed) co_return fail(Errc::shutdown, "the HashStore was destroyed");
        id = s->next_id++;
        std::vector<std::string> missing;
        for (const auto& k : keys) {
            if (s->data.count(k)) continue;
            auto& ids = s->waiting_on[k];
            if (!ids.empty() && ids.back() == id) continue;  // a duplicate key in this wait
            ids.push_back(id);
            missing.push_back(k);
        }
        if (missing.empty()) co_return ok();
        auto n = missing.size();
        s->waiters.emplace(id, HashState::Waiter{n, std::move(missing), signal.notifier()});
    }
    WaiterGuard guard{s, id};
    const std::error_code ec = co_await signal.wait();
    if (ec == kClosed) co_return fail(Errc::shutdown, "the HashStore was destroyed while waiting for keys");
    if (ec) co_return fail(Errc::cancelled, "wait for keys " + detail::describe_keys(keys) + " was cancelled");
    co_return ok();
}

// Waits for `keys` until `deadline` (time_point::max(): forever); a timeout names the keys missing.
Task<Result<void>> wait_until(std::shared_ptr<HashState> s, std::vector<std::string> keys, Clock::time_point deadline,
                              Duration total, std::string_view what) {
    Duration left = Duration::zero();  // zero: no limit
    if (deadline != Clock::time_point::max()) {
        left = deadline - Clock::now();
        if (left <= Duration::zero()) left = Duration(1);  // already due: check once, then time out
    }
    auto r = co_await with_timeout(wait_keys(s, keys), left);
    if (!r && r.error().code() == Errc::timeout) {
        auto missing = s->missing_of(keys);
        if (missing.empty()) co_return ok();  // written just as the deadline passed
        co_return fail(detail::wait_timeout_error(what, missing, total));
    }
    co_return r;
}

Clock::time_point deadline_of(Duration timeout) {
    return timeout > Duration::zero() ? Clock::now() + timeout : Clock::time_point::max();
}

}  // namespace

HashStore::HashStore(Duration timeout) : state_(std::make_shared<HashState>()) { timeout_ = timeout; }

HashStore::~HashStore() {
    std::lock_guard lock(state_->mu);
    state_->closed = true;
    for (auto& [id, w] : state_->waiters) w.wake.notify(kClosed);
    state_->waiters.clear();
    state_->waiting_on.clear();
}

std::size_t HashStore::pending_waiters() const {
    std::lock_guard lock(state_->mu);
    return state_->waiters.size();
}

Task<Result<void>> HashStore::set(std::string key, Bytes value) {
    {
        std::lock_guard lock(state_->mu);
        state_->data[key] = std::move(value);
        state_->notify(key);
    }
    co_return ok();
}

Task<Result<Bytes>> HashStore::get(std::string key) {
    auto s = state_;
    const auto total = timeout();
    const auto deadline = deadline_of(total);
    for (;;) {
        {
            std::lock_guard lock(s->mu);
            auto it = s->data.find(key);
            if (it != s->data.end()) co_return it->second;
        }
        std::vector<std::string> keys{key};  // a named vector: GCC 12 miscompiles a braced list here
        auto r = co_await wait_until(s, std::move(keys), deadline, total, "get");
        if (!r) co_return fail(std::move(r).error());
    }
}

Task<Result<std::int64_t>> HashStore::add(std::string key, std::int64_t delta) {
    std::int64_t out = 0;
    {
        std::lock_guard lock(state_->mu);
        std::int64_t current = 0;
        auto it = state_->data.find(key);
        if (it != state_->data.end()) {
            auto parsed = detail::parse_counter(key, it->second);
            if (!parsed) co_return fail(std::move(parsed).error());
            current = *parsed;
        }
        auto sum = detail::checked_add(key, current, delta);
        if (!sum) co_return fail(std::move(sum).error());
        out = *sum;
        state_->data[key] = bytes(std::to_string(out));
        state_->notify(key);
    }
    co_return out;
}

Task<Result<Bytes>> HashStore::compare_set(std::string key, Bytes expected, Bytes desired) {
    Bytes out;
    {
        std::lock_guard lock(state_->mu);
        auto it = state_->data.find(key);
        if (it == state_->data.end()) {
            if (!expected.empty()) co_return expected;  // c10d: absent key, non-empty expected: nothing stored
            out = desired;
            state_->data.emplace(key, std::move(desired));
            state_->notify(key);
        } else if (it->second == expected) {
            it->second = std::move(desired);
            out = it->second;
            state_->notify(key);
        } else {
            out = it->second;
        }
    }
    co_return out;
}

Task<Result<void>> HashStore::wait(std::vector<std::string> keys, Duration timeout) {
    auto s = state_;
    co_return co_await wait_until(s, std::move(keys), deadline_of(timeout), timeout, "wait");
}

Task<Result<bool>> HashStore::check(std::vector<std::string> keys) {
    std::lock_guard lock(state_->mu);
    for (const auto& k : keys)
        if (!state_->data.count(k)) co_return false;
    co_return true;
}

Task<Result<bool>> HashStore::delete_key(std::string key) {
    std::lock_guard lock(state_->mu);
    co_return state_->data.erase(key) > 0;
}

Task<Result<std::int64_t>> HashStore::num_keys() {
    std::lock_guard lock(state_->mu);
    co_return static_cast<std::int64_t>(state_->data.size());
}

Task<Result<void>> HashStore::append(std::string key, Bytes value) {
    {
        std::lock_guard lock(state_->mu);
        auto& v = state_->data[key];
        v.insert(v.end(), value.begin(), value.end());
        state_->notify(key);
    }
    co_return ok();
}

Task<Result<std::vector<Bytes>>> HashStore::multi_get(std::vector<std::string> keys) {
    auto s = state_;
    const auto total = timeout();
    const auto deadline = deadline_of(total);
    for (;;) {
        std::vector<std::string> missing;
        {
            std::lock_guard lock(s->mu);
            for (const auto& k : keys)
                if (!s->data.count(k)) missing.push_back(k);
            if (missing.empty()) {
                std::vector<Bytes> out;
                out.reserve(keys.size());
                for (const auto& k : keys) out.push_back(s->data.find(k)->second);
                co_return out;
            }
        }
        auto r = co_await wait_until(s, std::move(missing), deadline, total, "multi_get");
        if (!r) co_return fail(std::move(r).error());
    }
}

Task<Result<void>> HashStore::multi_set(std::vector<std::string> keys, std::vector<Bytes> values) {
    if (keys.size() != values.size())
        co_return fail(Errc::invalid_argument, "multi_set got " + std::to_string(keys.size()) + " keys but " +
                                                   std::to_string(values.size()) + " values");
    {
        std::lock_guard lock(state_->mu);
        for (std::size_t i = 0; i < keys.size(); ++i) {
            state_->data[keys[i]] = std::move(values[i]);
            state_->notify(keys[i]);
        }
    }
    co_return ok();
}

}  // namespace tensorplay
