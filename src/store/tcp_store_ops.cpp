// TcpStore operations: encoding each Store call as c10d requests in the client's dialect.
#include <tensorplay/store/tcp_store.hpp>

#include "core/asio_compat.hpp"
#include "store/tcp_store_client_impl.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>

#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <random>

namespace tensorplay {

using detail::ClientState;
using detail::PendingOp;
using detail::ReplyKind;
namespace c10d = detail::c10d;
using c10d::Op;

struct TcpStore::Impl : ClientState {
    using ClientState::ClientState;
};

namespace {

using StatePtr = std::shared_ptr<ClientState>;

// Appends one request; user keys get c10d's "/" prefix, internal ones ("init/") do not.
struct Encoder {
    c10d::Dialect dialect;
    Bytes& b;

    Encoder& op(Op o) {
        c10d::put_u8(b, *c10d::encode_type(dialect, o));
        return *this;
    }
    Encoder& key(std::string_view k, bool prefixed = true) {
        c10d::put_u64(b, k.size() + (prefixed ? 1 : 0));
        if (prefixed) b.push_back('/');
        b.insert(b.end(), k.begin(), k.end());
        return *this;
    }
    Encoder& keys(const std::vector<std::string>& ks) {
        c10d::put_u64(b, ks.size());
        for (const auto& k : ks) key(k);
        return *this;
    }
    Encoder& value(std::span<const std::uint8_t> v) {
        c10d::put_bytes(b, v);
        return *this;
    }
    Encoder& i64(std::int64_t v) {
        c10d::put_i64(b, v);
        return *this;
    }
};

std::string join_keys(const std::vector<std::string>& keys) {
    std::string out;
    for (std::size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", " : "") + c10d::printable(keys[i]);
    if (keys.size() > 8) out += ", ... (" + std::to_string(keys.size()) + " keys)";
    return out;
}

std::shared_ptr<PendingOp> new_op(const StatePtr&) { return std::make_shared<PendingOp>(); }

Encoder enc(const StatePtr& s, Bytes& b) { return Encoder{s->dialect, b}; }

// Runs `op` on the client's strand and waits for it from the caller's executor. `limit` bounds
// the caller's wait (kept by the client's deadline keeper). The operation bodies below run on the
// caller's executor: they only build requests and read an op's results after it completed, and the
// client state they read (dialect, options, where) never changes after connect.
//
// The caller may be on any thread, so the strand's finish() reaches it through a RemoteSignal
// (posted to the caller's executor). A cancelled caller stops waiting at once and never reads the
// op again; the op is abandoned on the strand, which still holds it (see PendingOp).
Task<Result<void>> exec(StatePtr s, std::shared_ptr<PendingOp> op, Duration limit) {
    detail::RemoteSignal done(co_await asio::this_coro::executor);
    op->limit = limit;
    op->notifier = done.notifier();
    asio::dispatch(s->strand, [s, op] { s->start_op(op); });
    const std::error_code ec = co_await done.wait();
    if (ec) {
        asio::dispatch(s->strand, [s, op] { s->abandon(*op, Error(Errc::cancelled, "store operation cancelled")); });
        co_return fail(Errc::cancelled, "store operation cancelled");
    }
    if (op->error) co_return fail(*op->error);
    co_return ok();
}

void add_wait(const StatePtr& s, PendingOp& op, const std::vector<std::string>& keys, Duration timeout) {
    enc(s, op.wait_request).op(Op::wait).keys(keys);
    op.wait_keys = join_keys(keys);
    if (timeout > Duration::zero()) op.deadline = Clock::now() + timeout;
}

// The caller waits a little longer than a WAIT's own deadline so that the actor's verdict (which
// may be "ready" when the keys raced the cancel) is the one reported: on a live link that verdict
// comes within a round trip; a stalled link must not hold the caller much past its timeout.
constexpr Duration kWaitVerdictGrace = std::chrono::milliseconds(250);

Duration wait_limit(Duration timeout) { return timeout > Duration::zero() ? timeout + kWaitVerdictGrace : Duration::zero(); }

// A timed-out wait names the keys still missing ('a', 'b'), found with one CHECK per key
// (pipelined) within what is left of the caller's limit (`start` + wait_limit); when nothing is
// left (the link did not even deliver the WAIT's verdict) it names the keys asked.
Task<Error> explain_wait_timeout(StatePtr s, std::vector<std::string> keys, Error e, Clock::time_point start,
                                 Duration timeout) {
    if (e.code() != Errc::timeout) co_return e;
    constexpr std::size_t kNamed = 16;
    std::string missing;
    const auto left = start + wait_limit(timeout) - Clock::now();
    bool named = false;
    if (left > std::chrono::milliseconds(1)) {
        auto op = new_op(s);
        std::vector<std::string> asked;
        for (std::size_t i = 0; i < keys.size() && i < kNamed; ++i) {
            std::vector<std::string> one(1, keys[i]);
            enc(s, op->request).op(Op::check).keys(one);
            asked.push_back(keys[i]);
        }
        op->expect.assign(asked.size(), ReplyKind::u8);
        if (auto r = co_await exec(s, op, left); r) {
            for (std::size_t i = 0; i < asked.size(); ++i)
                if (op->ints.at(i) != c10d::kCheckReady)
                    missing += (missing.empty() ? "'" : ", '") + c10d::printable(asked[i]) + "'";
            if (keys.size() > kNamed) missing += ", ... (" + std::to_string(keys.size()) + " keys asked)";
            named = true;
        }
    }
    if (!named) missing = join_keys(keys) + " (the store did not answer in time)";
    co_return Error(Errc::timeout, "timed out after " +
                                       std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()) +
                                       " ms waiting for keys " + missing + " in the store at " + s->where);
}

// Runs `body` on the client's strand and returns its result to the caller's executor.
template <class T>
Task<Result<T>> on_strand(StatePtr s, Task<Result<T>> body, std::string what) {
    auto [e, r] = co_await asio::co_spawn(s->strand, std::move(body), detail::use_nothrow);
    if (e) co_return fail(error_from_exception_ptr(e, what));
    if (!r) co_return fail(std::move(r).error().context(what));
    co_return std::move(r);
}

// Runs an operation body on the caller's executor; an error gets `what "key"` as context, built
// only then. An exception (allocation failure) becomes an Error as well.
template <class T>
Task<Result<T>> named(Task<Result<T>> body, const char* what, std::string key = {}) {
    std::optional<Result<T>> r;
    try {
        r.emplace(co_await std::move(body));
    } catch (...) {
        r.emplace(fail(error_from_current_exception(what)));
    }
    if (!*r) {
        std::string ctx = what;
        if (!key.empty()) ctx += " \"" + c10d::printable(key) + "\"";
        co_return fail(std::move(*r).error().context(ctx));
    }
    co_return std::move(*r);
}

Task<Result<void>> do_set(StatePtr s, std::string key, Bytes value) {
    auto op = new_op(s);
    enc(s, op->request).op(Op::set).key(key).value(value);
    co_return co_await exec(s, op, s->options.timeout);
}

Task<Result<Bytes>> do_get(StatePtr s, std::string key, Duration timeout) {
    auto op = new_op(s);
    const auto start = Clock::now();
    std::vector<std::string> keys(1, key);
    add_wait(s, *op, keys, timeout);
    enc(s, op->request).op(Op::get).key(key);
    op->expect.assign(1, ReplyKind::bytes);
    if (auto r = co_await exec(s, op, wait_limit(timeout)); !r)
        co_return fail(co_await explain_wait_timeout(s, std::move(keys), r.error(), start, timeout));
    co_return std::move(op->blobs.at(0));
}

Task<Result<std::int64_t>> do_add(StatePtr s, std::string key, std::int64_t delta, bool prefixed) {
    auto op = new_op(s);
    enc(s, op->request).op(Op::add).key(key, prefixed).i64(delta);
    op->expect = {ReplyKind::i64};
    if (auto r = co_await exec(s, op, s->options.timeout); !r) co_return fail(r.error());
    co_return op->ints.at(0);
}

Task<Result<Bytes>> do_compare_set(StatePtr s, std::string key, Bytes expected, Bytes desired) {
    auto op = new_op(s);
    enc(s, op->request).op(Op::compare_set).key(key).value(expected).value(desired);
    op->expect = {ReplyKind::bytes};
    if (auto r = co_await exec(s, op, s->options.timeout); !r) co_return fail(r.error());
    co_return std::move(op->blobs.at(0));
}

Task<Result<void>> do_wait(StatePtr s, std::vector<std::string> keys, Duration timeout) {
    if (keys.empty()) co_return ok();
    auto op = new_op(s);
    const auto start = Clock::now();
    add_wait(s, *op, keys, timeout);
    if (auto r = co_await exec(s, op, wait_limit(timeout)); !r)
        co_return fail(co_await explain_wait_timeout(s, std::move(keys), r.error(), start, timeout));
    co_return ok();
}

Task<Result<bool>> do_check(StatePtr s, std::vector<std::string> keys) {
    auto op = new_op(s);
    enc(s, op->request).op(Op::check).keys(keys);
    op->expect = {ReplyKind::u8};
    if (auto r = co_await exec(s, op, s->options.timeout); !r) co_return fail(r.error());
    co_return op->ints.at(0) == c10d::kCheckReady;
}

Task<Result<bool>> do_delete(StatePtr s, std::string key) {
    auto op = new_op(s);
    enc(s, op->request).op(Op::delete_key).key(key);
    op->expect = {ReplyKind::i64};
    if (auto r = co_await exec(s, op, s->options.timeout); !r) co_return fail(r.error());
    co_return op->ints.at(0) > 0;
}

Task<Result<std::int64_t>> do_num_keys(StatePtr s) {
    auto op = new_op(s);
    enc(s, op->request).op(Op::num_keys);
    op->expect = {ReplyKind::i64};
    if (auto r = co_await exec(s, op, s->options.timeout); !r) co_return fail(r.error());
    co_return op->ints.at(0);
}

// torch113 has no APPEND: read the value with a compare_set that cannot match (a random
// sentinel), then compare_set(current, current + value) until no other writer intervened.
Task<Result<void>> do_append_emulated(StatePtr s, std::string key, Bytes value) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    Bytes sentinel(24);
    for (auto& b : sentinel) b = static_cast<std::uint8_t>(rng());
    const auto deadline = Clock::now() + s->options.timeout;
    while (s->options.timeout <= Duration::zero() || Clock::now() < deadline) {
        auto current = co_await do_compare_set(s, key, sentinel, sentinel);
        if (!current) co_return fail(current.error());
        Bytes expected = *current == sentinel ? Bytes{} : std::move(*current);
        Bytes desired = expected;
        desired.insert(desired.end(), value.begin(), value.end());
        auto stored = co_await do_compare_set(s, key, expected, desired);
        if (!stored) co_return fail(stored.error());
        if (*stored == desired) co_return ok();
    }
    co_return fail(Errc::timeout, "append kept racing other writers until the timeout");
}

Task<Result<void>> do_append(StatePtr s, std::string key, Bytes value) {
    if (s->dialect == c10d::Dialect::legacy) co_return co_await do_append_emulated(s, std::move(key), std::move(value));
    auto op = new_op(s);
    enc(s, op->request).op(Op::append).key(key).value(value);
    co_return co_await exec(s, op, s->options.timeout);
}

Task<Result<std::vector<Bytes>>> do_multi_get(StatePtr s, std::vector<std::string> keys, Duration timeout) {
    if (keys.empty()) co_return std::vector<Bytes>{};
    auto op = new_op(s);
    add_wait(s, *op, keys, timeout);
    if (s->dialect == c10d::Dialect::modern) {
        enc(s, op->request).op(Op::multi_get).keys(keys);
    } else {
        for (const auto& k : keys) enc(s, op->request).op(Op::get).key(k);
    }
    op->expect.assign(keys.size(), ReplyKind::bytes);
    const auto start = Clock::now();
    if (auto r = co_await exec(s, op, wait_limit(timeout)); !r)
        co_return fail(co_await explain_wait_timeout(s, std::move(keys), r.error(), start, timeout));
    co_return std::move(op->blobs);
}

Task<Result<void>> do_multi_set(StatePtr s, std::vector<std::string> keys, std::vector<Bytes> values) {
    if (keys.size() != values.size())
        co_return fail(Errc::invalid_argument, "multi_set got " + std::to_string(keys.size()) + " keys and " +
                                                   std::to_string(values.size()) + " values");
    if (keys.empty()) co_return ok();
    auto op = new_op(s);
    if (s->dialect == c10d::Dialect::modern) {
        auto e = enc(s, op->request).op(Op::multi_set);
        c10d::put_u64(op->request, keys.size());
        for (std::size_t i = 0; i < keys.size(); ++i) e.key(keys[i]).value(values[i]);
    } else {
        for (std::size_t i = 0; i < keys.size(); ++i) enc(s, op->request).op(Op::set).key(keys[i]).value(values[i]);
    }
    co_return co_await exec(s, op, s->options.timeout);
}

Task<Result<Duration>> do_ping(StatePtr s) {
    const auto start = Clock::now();
    auto op = new_op(s);
    if (s->dialect == c10d::Dialect::modern) {
        enc(s, op->request).op(Op::ping);
        c10d::put_u32(op->request, 0x7470u);
        op->expect = {ReplyKind::u32};
    } else {
        enc(s, op->request).op(Op::num_keys);
        op->expect = {ReplyKind::i64};
    }
    if (auto r = co_await exec(s, op, s->options.timeout); !r) co_return fail(r.error());
    if (s->dialect == c10d::Dialect::modern && op->ints.at(0) != 0x7470)
        co_return fail(Errc::protocol_error, "the store at " + s->where + " answered PING with a wrong value");
    co_return Clock::now() - start;
}

// c10d worker counting: ADD "init/" 1, then (optionally) wait until every worker has done so.
Task<Result<void>> count_workers(StatePtr s) {
    auto joined = co_await do_add(s, "init/", 1, false);
    if (!joined) co_return fail(joined.error());
    if (!s->options.wait_for_workers) co_return ok();
    const auto start = Clock::now();
    asio::steady_timer sleep(s->strand);
    Duration backoff = std::chrono::milliseconds(5);
    std::int64_t n = *joined;
    while (n < s->options.world_size) {
        if (s->options.timeout > Duration::zero() && Clock::now() - start > s->options.timeout)
            co_return fail(Errc::timeout, "timed out after " + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(s->options.timeout).count()) +
                                              " s waiting for workers: " + std::to_string(n) + "/" +
                                              std::to_string(s->options.world_size) + " joined");
        sleep.expires_after(backoff);
        co_await sleep.async_wait(detail::use_nothrow);
        backoff = std::min<Duration>(backoff * 2, std::chrono::milliseconds(100));
        auto now = co_await do_add(s, "init/", 0, false);
        if (!now) co_return fail(now.error());
        n = *now;
    }
    co_return ok();
}

Task<Result<std::shared_ptr<TcpStore>>> do_connect(std::shared_ptr<TcpStore::Impl> impl) {
    const auto deadline = impl->options.timeout > Duration::zero() ? Clock::now() + impl->options.timeout
                                                                   : Clock::time_point::max();
    auto lane = std::make_shared<detail::Lane>(*impl);
    if (auto r = co_await impl->open(*lane, deadline, true); !r) co_return fail(r.error());
    // The store first: whatever fails from here on, its destructor closes the client (and so
    // ends the lane's actor, which holds the client state).
    auto store = std::make_shared<TcpStore>(impl);
    impl->add_lane(std::move(lane), true);
    if (impl->options.world_size >= 0) {
        if (auto r = co_await count_workers(impl); !r) {
            impl->shut(Error(Errc::shutdown, "connect failed"));
            co_return fail(r.error());
        }
    }
    co_return store;
}

}  // namespace

TcpStore::TcpStore(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStore::~TcpStore() { close(); }

Task<Result<std::shared_ptr<TcpStore>>> TcpStore::connect(Executor executor, TcpStoreOptions options) {
    if (options.port == 0)
        co_return fail(Errc::invalid_argument, "TcpStore needs the server's port (got 0 for " + options.host + ")");
    std::shared_ptr<Impl> impl;
    try {
        impl = std::make_shared<Impl>(std::move(executor), std::move(options));
    } catch (...) {
        co_return fail(error_from_current_exception("creating the store client"));
    }
    const std::string what = "connecting to the store at " + impl->where;
    auto s = impl;
    auto r = co_await on_strand(s, do_connect(std::move(impl)), what);
    if (r) (*r)->set_timeout(s->options.timeout);
    co_return r;
}

void TcpStore::close() {
    if (!impl_) return;
    asio::dispatch(impl_->strand, [s = impl_] { s->shut(Error(Errc::shutdown, "the store client was closed")); });
}

const TcpStoreOptions& TcpStore::options() const noexcept { return impl_->options; }

bool TcpStore::has_extended_api() const noexcept { return impl_->dialect == c10d::Dialect::modern; }

Task<Result<void>> TcpStore::set(std::string key, Bytes value) {
    return named(do_set(impl_, key, std::move(value)), "set", key);
}

Task<Result<Bytes>> TcpStore::get(std::string key) { return named(do_get(impl_, key, timeout()), "get", key); }

Task<Result<std::int64_t>> TcpStore::add(std::string key, std::int64_t delta) {
    return named(do_add(impl_, key, delta, true), "add", key);
}

Task<Result<Bytes>> TcpStore::compare_set(std::string key, Bytes expected, Bytes desired) {
    return named(do_compare_set(impl_, key, std::move(expected), std::move(desired)), "compare_set", key);
}

Task<Result<void>> TcpStore::wait(std::vector<std::string> keys, Duration timeout) {
    return named(do_wait(impl_, std::move(keys), timeout), "wait");
}

Task<Result<bool>> TcpStore::check(std::vector<std::string> keys) { return named(do_check(impl_, std::move(keys)), "check"); }

Task<Result<bool>> TcpStore::delete_key(std::string key) { return named(do_delete(impl_, key), "delete_key", key); }

Task<Result<std::int64_t>> TcpStore::num_keys() { return named(do_num_keys(impl_), "num_keys"); }

Task<Result<void>> TcpStore::append(std::string key, Bytes value) {
    return named(do_append(impl_, key, std::move(value)), "append", key);
}

Task<Result<std::vector<Bytes>>> TcpStore::multi_get(std::vector<std::string> keys) {
    return named(do_multi_get(impl_, std::move(keys), timeout()), "multi_get");
}

Task<Result<void>> TcpStore::multi_set(std::vector<std::string> keys, std::vector<Bytes> values) {
    return named(do_multi_set(impl_, std::move(keys), std::move(values)), "multi_set");
}

Task<Result<Duration>> TcpStore::ping() { return named(do_ping(impl_), "ping"); }

}  // namespace tensorplay
