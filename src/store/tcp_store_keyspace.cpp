// TcpStoreServer key space: what each c10d request does to the keys, waiters and watchers.
#include "store/tcp_store_server_impl.hpp"
#include "store/owned_tasks.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>

#include <asio/co_spawn.hpp>

#include <algorithm>
#include <atomic>

namespace tensorplay::detail {

using c10d::Op;

namespace {
std::span<const std::uint8_t> as_span(std::string_view s) {
    return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

LifetimeCounters g_server_counts;
}  // namespace

StoreServerState::StoreServerState(Executor ex, TcpStoreServerOptions opts)
    : strand(asio::make_strand(std::move(ex))),
      options(std::move(opts)),
      limits{options.max_key_size, options.max_value_size, options.max_keys_per_request,
             options.max_request_size},
      sweep(strand),
      tasks(strand) {
    slots = &SlotRegistry::of(strand);
    g_server_counts.states.fetch_add(1, std::memory_order_relaxed);
}

StoreServerState::~StoreServerState() { g_server_counts.states.fetch_sub(1, std::memory_order_relaxed); }

std::size_t server_states_alive() noexcept { return g_server_counts.states.load(std::memory_order_relaxed); }
std::size_t server_tasks_running() noexcept { return g_server_counts.tasks.load(std::memory_order_relaxed); }

bool StoreServerState::spawn(Task<void> task, const char* what) { return tasks.spawn(counted(g_server_counts, std::move(task)), what); }

bool StoreServerState::reply_fits(Op op, std::size_t size, std::string& why) const {
    if (size <= options.max_reply_size) return true;
    why = std::string(c10d::op_name(op)) + " reply of " + std::to_string(size) + " bytes is over the limit of " +
          std::to_string(options.max_reply_size) + " bytes (max_reply_size)";
    return false;
}

std::size_t StoreServerState::charge(std::string_view key, std::size_t value_size) noexcept {
    constexpr std::size_t kPerKey = 64;  // the map's node and the key's string, roughly
    return kPerKey + key.size() + value_size;
}

bool StoreServerState::space_for(Op op, std::size_t grow, std::string& why) const {
    const std::size_t limit = options.max_stored_bytes;
    if (limit == 0 || grow <= limit - std::min(limit, stored_bytes)) return true;
    why = std::string(c10d::op_name(op)) + " would store " + std::to_string(grow) + " more bytes; the store holds " +
          std::to_string(stored_bytes) + " of its limit of " + std::to_string(limit) + " bytes (max_stored_bytes)";
    return false;
}

bool StoreServerState::handle(StoreConn& c, const c10d::Request& r, std::string& why) {
    Bytes& out = c.out;
    // What the key space may grow by, charged before anything is stored (a MULTI_SET as if every
    // key were new: a refusal near the limit, never a request stored in part).
    std::size_t grow = 0;
    switch (r.op) {
        case Op::set:
        case Op::compare_set:
        case Op::add:
            grow = charge(r.keys[0], r.op == Op::add ? 24 : r.values.back().size());
            break;
        case Op::append: grow = charge(r.keys[0], r.values[0].size()); break;
        case Op::multi_set:
            for (std::size_t i = 0; i < r.keys.size(); ++i) grow += charge(r.keys[i], r.values[i].size());
            break;
        default: break;
    }
    if (grow && !space_for(r.op, grow, why)) return false;
    switch (r.op) {
        case Op::validate:
            // Only valid as the first request (consumed by the dialect sniffer); a repeat with the
            // right magic is harmless, anything else is a confused client.
            if (r.nonce != c10d::kValidationMagic) {
                why = "VALIDATE with a wrong magic number";
                return false;
            }
            return true;
        case Op::set:
            store(r.keys[0], r.values[0], false);
            return true;
        case Op::append: {
            // A value grows only up to max_value_size, so that every GET reply is bounded too.
            auto it = data.find(r.keys[0]);
            const std::size_t now = it == data.end() ? 0 : it->second.size();
            if (now + r.values[0].size() > options.max_value_size) {
                why = "APPEND to key \"" + c10d::printable(r.keys[0]) + "\" would make its value " +
                      std::to_string(now + r.values[0].size()) + " bytes, over the limit of " +
                      std::to_string(options.max_value_size) + " bytes";
                return false;
            }
            store(r.keys[0], r.values[0], true);
            return true;
        }
        case Op::multi_set:
            for (std::size_t i = 0; i < r.keys.size(); ++i) store(r.keys[i], r.values[i], false);
            return true;
        case Op::compare_set:
            compare_set(c, r.keys[0], r.values[0], r.values[1]);
            return true;
        case Op::get: {
            // c10d 1.13 drops the connection for a missing key; clients always WAIT first, so
            // answering empty bytes (as PyTorch's libuv server does) is compatible and kinder.
            auto it = data.find(r.keys[0]);
            if (it == data.end()) {
                c10d::put_u64(out, 0);
                return true;
            }
            if (!reply_fits(r.op, 8 + it->second.size(), why)) return false;
            c10d::put_bytes(out, it->second);
            return true;
        }
        case Op::multi_get: {
            // One lookup per key; the reply is sized first (a key may be named many times: the size
            // is bounded before anything is reserved) so that the values are copied once.
            std::vector<const Bytes*>& found = multi_get_scratch;
            found.clear();
            std::size_t total = 0;
            for (auto key : r.keys) {
                auto it = data.find(key);
                found.push_back(it == data.end() ? nullptr : &it->second);
                total += 8 + (found.back() ? found.back()->size() : 0);  // <= 2^17 * (2^26 + 8): no overflow
            }
            if (!reply_fits(r.op, total, why)) return false;
            if (out.capacity() - out.size() < total) out.reserve(std::max(out.size() + total, 2 * out.capacity()));
            for (const Bytes* v : found) {
                if (v) c10d::put_bytes(out, *v);
                else c10d::put_u64(out, 0);
            }
            return true;
        }
        case Op::add: return add(c, r.keys[0], r.integer, why);
        case Op::check: {
            bool all = std::all_of(r.keys.begin(), r.keys.end(), [&](auto k) { return data.contains(k); });
            c10d::put_u8(out, all ? c10d::kCheckReady : c10d::kCheckNotReady);
            return true;
        }
        case Op::wait:
            start_wait(c, r.keys);
            return true;
        case Op::cancel_wait:
            cancel_waits(c);
            c10d::put_u8(out, c10d::kWaitCanceled);
            return true;
        case Op::num_keys:
            c10d::put_i64(out, static_cast<std::int64_t>(data.size()));
            return true;
        case Op::delete_key: {
            auto it = data.find(r.keys[0]);
            if (it == data.end()) {
                c10d::put_i64(out, 0);
                return true;
            }
            // (erase uncharges the value's size before it is moved out: a watched key's DELETE
            // must not leave its bytes counted.)
            Bytes old = erase(it);
            if (watchers.contains(r.keys[0])) notify_watchers(r.keys[0], c10d::kWatchDeleted, old, {});
            c10d::put_i64(out, 1);
            return true;
        }
        case Op::watch_key: {
            std::string key(r.keys[0]);
            watchers[key].push_back(&c);
            c.watch_keys.push_back(std::move(key));
            c10d::put_u8(out, c10d::kWatchRegistered);
            return true;
        }
        case Op::ping:
            c10d::put_u32(out, r.nonce);
            return true;
        case Op::list: {
            std::size_t total = 8;
            for (const auto& kv : data) total += 8 + kv.first.size();
            if (!reply_fits(r.op, total, why)) return false;
            c10d::put_i64(out, static_cast<std::int64_t>(data.size()));
            for (const auto& kv : data) c10d::put_str(out, kv.first);
            return true;
        }
    }
    why = "unhandled query";
    return false;
}

Bytes StoreServerState::erase(StringMap<Bytes>::iterator it) {
    stored_bytes -= charge(it->first, it->second.size());
    Bytes value = std::move(it->second);
    data.erase(it);
    return value;
}

void StoreServerState::store(std::string_view key, std::span<const std::uint8_t> value, bool append) {
    auto it = data.find(key);
    const bool watched = !watchers.empty() && watchers.contains(key);
    const bool created = it == data.end();
    Bytes old;  // for the watchers
    if (created) {
        it = data.emplace(std::string(key), Bytes(value.begin(), value.end())).first;
        stored_bytes += charge(key, it->second.size());
    } else {
        if (watched) old = it->second;
        const std::size_t before = charge(key, it->second.size());
        if (append) it->second.insert(it->second.end(), value.begin(), value.end());
        else it->second.assign(value.begin(), value.end());
        stored_bytes = stored_bytes - before + charge(key, it->second.size());  // (counted as soon as changed)
    }
    if (watched) notify_watchers(key, created ? c10d::kWatchCreated : c10d::kWatchUpdated, old, it->second);
    key_changed(key);
}

bool StoreServerState::add(StoreConn& c, std::string_view key, std::int64_t delta, std::string& why) {
    auto it = data.find(key);
    std::int64_t value = 0;
    if (it != data.end()) {
        auto current = c10d::parse_counter(it->second);
        if (!current) {
            why = "ADD on key \"" + c10d::printable(key) + "\" whose value is not an integer";
            return false;
        }
        value = *current;
    }
    value = static_cast<std::int64_t>(static_cast<std::uint64_t>(value) + static_cast<std::uint64_t>(delta));
    store(key, as_span(std::to_string(value)), false);
    c10d::put_i64(c.out, value);
    return true;
}

void StoreServerState::compare_set(StoreConn& c, std::string_view key, std::span<const std::uint8_t> expected,
                                   std::span<const std::uint8_t> desired) {
    auto it = data.find(key);
    if (it == data.end()) {
        if (expected.empty()) {
            store(key, desired, false);
            c10d::put_bytes(c.out, desired);
        } else {
            c10d::put_bytes(c.out, expected);  // c10d: absent key and non-empty expected => reply expected
        }
        return;
    }
    if (std::equal(it->second.begin(), it->second.end(), expected.begin(), expected.end())) {
        store(key, desired, false);
        it = data.find(key);
    }
    c10d::put_bytes(c.out, it->second);
}

void StoreServerState::key_changed(std::string_view key) {
    if (waiters.empty()) return;
    auto it = waiters.find(key);
    if (it == waiters.end()) return;
    auto refs = std::move(it->second);
    waiters.erase(it);
    for (const auto& ref : refs) {
        StoreConn& c = *ref.conn;
        auto w = std::find_if(c.waits.begin(), c.waits.end(), [&](const auto& x) { return x.id == ref.wait_id; });
        if (w == c.waits.end() || --w->missing > 0) continue;
        c.waits.erase(w);
        if (c.waits.empty()) c.wait_keys.clear();
        const std::size_t before = c.queued();
        c10d::put_u8(c.out, c10d::kStopWaiting);
        pushed(c, before);
    }
}

void StoreServerState::notify_watchers(std::string_view key, std::uint8_t event, std::span<const std::uint8_t> old_value,
                                       std::span<const std::uint8_t> new_value) {
    auto it = watchers.find(key);
    if (it == watchers.end()) return;
    for (StoreConn* w : it->second) {
        if (!w->overflow.empty()) continue;  // closed at the end of this batch
        const std::size_t before = w->queued();
        c10d::put_u8(w->out, event);
        c10d::put_str(w->out, key);
        c10d::put_bytes(w->out, old_value);
        c10d::put_bytes(w->out, new_value);
        pushed(*w, before);
    }
}

void StoreServerState::pushed(StoreConn& w, std::size_t before) {
    // A connection under max_queued_output takes one more reply or event, however large (else a
    // watched 64 MiB value could never be delivered); one already over it may grow to the hard limit.
    if (w.overflow.empty() && before > options.max_queued_output && w.queued() > options.max_queued_output_hard) {
        w.overflow = std::to_string(w.queued()) + " bytes of output are queued for it (watch events or wake-ups "
                     "it does not read), over max_queued_output_hard = " +
                     std::to_string(options.max_queued_output_hard);
        Bytes().swap(w.out);
    }
    w.flush();
}

void StoreServerState::start_wait(StoreConn& c, const std::vector<std::string_view>& keys) {
    std::size_t missing = 0;
    for (auto k : keys) missing += data.contains(k) ? 0 : 1;
    if (missing == 0) {
        c10d::put_u8(c.out, c10d::kStopWaiting);
        return;
    }
    const std::uint64_t id = c.next_wait_id++;
    c.waits.push_back({id, missing});
    for (auto k : keys) {
        if (data.contains(k)) continue;
        auto it = waiters.find(k);
        if (it == waiters.end()) it = waiters.emplace(std::string(k), std::vector<WaitRef>{}).first;
        it->second.push_back({&c, id});
        c.wait_keys.emplace_back(k);
    }
}

void StoreServerState::cancel_waits(StoreConn& c) {
    for (const auto& key : c.wait_keys) {
        auto it = waiters.find(key);
        if (it == waiters.end()) continue;
        std::erase_if(it->second, [&](const WaitRef& r) { return r.conn == &c; });
        if (it->second.empty()) waiters.erase(it);
    }
    c.wait_keys.clear();
    c.waits.clear();
}

void StoreServerState::close(StoreConn& c) noexcept {
    if (c.closed) return;
    c.closed = true;
    if (c.dirty) {
        std::erase_if(dirty, [&](const std::shared_ptr<StoreConn>& p) { return p.get() == &c; });
        c.dirty = false;
    }
    Bytes().swap(c.out);
    cancel_waits(c);
    for (const auto& key : c.watch_keys) {
        auto it = watchers.find(key);
        if (it == watchers.end()) continue;
        std::erase(it->second, &c);
        if (it->second.empty()) watchers.erase(it);
    }
    c.watch_keys.clear();
    conns.erase(&c);
    silent.erase(c.id);
    if (auto it = per_host.find(c.host); it != per_host.end() && --it->second == 0) per_host.erase(it);
    std::error_code ignored;
    c.socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    c.socket.close(ignored);
    // Last: each may resume its coroutine here, which ends (it sees `closed`).
    c.wake.complete();
    c.drained.complete();
}

void StoreServerState::warn(const std::string& line) {
    std::string note;
    if (warnings.allow(note)) log(LogLevel::warn, "store", line + note);
}

void StoreServerState::close_stalled(Clock::time_point now) {
    std::vector<StoreConn*> stalled;
    for (StoreConn* c : conns)
        if (c->writer_busy && c->queued() > options.max_queued_output &&
            now - c->progress_at >= options.queued_output_timeout)
            stalled.push_back(c);
    for (StoreConn* c : stalled) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - c->progress_at).count();
        warn("closing connection from " + c->peer + ": " + std::to_string(c->queued()) +
                " bytes of output are queued for it (over max_queued_output) and it has taken none for " +
                std::to_string(ms) + " ms (queued_output_timeout); the client does not read its replies");
        close(*c);
    }
}

void StoreServerState::stop_all() {
    if (stopped) return;
    stopped = true;
    sweep.cancel();
    for (auto& a : acceptors) {
        std::error_code ignored;
        a.close(ignored);
    }
    std::vector<StoreConn*> all(conns.begin(), conns.end());
    for (StoreConn* c : all) close(*c);
    if (!all.empty())
        log(LogLevel::info, "store", "server on " + address + " stopped; closed " + std::to_string(all.size()) +
                                         " connection(s)");
    tasks.close();
    tasks.cancel();  // (what is left: acceptors and the sweeper, whose waits end now)
    release_after_join(strand, shared_from_this(), joining, "the store server");
}

}  // namespace tensorplay::detail
