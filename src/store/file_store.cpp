// FileStore: a checksummed append-only log shared by processes through flock; waits poll on a timer.
#include <tensorplay/store/file_store.hpp>

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"
#include "store/store_util.hpp"

#include <asio/error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <system_error>
#include <type_traits>
#include <unordered_map>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tensorplay {

// The file format (all integers little-endian):
//
//   header  "TPFSTORE" u32 version=1 u32 0                               16 bytes, written once
//   record  u32 magic "TPRC" | u8 op (1 set, 2 delete) | 3 zero bytes | u32 key_len | u64 value_len
//           | key | value | u32 crc32 (of everything from op to the end of value)
//
// Every process keeps a replayed copy of the log and the offset it has read up to. Writers hold an
// exclusive flock, readers a shared one, so a reader never sees a record being written. A record
// that is incomplete, over the limits or fails its checksum can only be the tail left by a writer
// that died mid-write (flock is released when a process dies): readers stop before it, and the next
// writer (exclusive, so nobody else is writing) truncates the file back to the last good record
// before appending. Records are written with one pwrite per operation, so a batch (multi_set) is
// either visible whole or cut off whole. Deletes are records too.
//
// Compaction: the writer holding the exclusive flock, once the log is long enough and mostly dead
// records, writes the live keys to "<path>.compact.<pid>" and renames it over the path. Its own
// records are in the new file, and nobody else wrote meanwhile (they were locked out). flock
// belongs to the inode, so after taking the lock every process checks that its descriptor is still
// the file at the path; if not it drops the lock, reopens and replays the new file from the start.
// A crash before the rename leaves the old log intact (and a stray temporary file).
// flock locks belong to the open file description: a forked child would share its parent's, so the
// file is reopened when the process id changes. Threads of one process serialise on a mutex.

namespace {

constexpr char kHeaderMagic[8] = {'T', 'P', 'F', 'S', 'T', 'O', 'R', 'E'};
constexpr std::size_t kHeaderSize = 16;
constexpr std::uint32_t kRecordMagic = 0x43525054;  // "TPRC"
constexpr std::size_t kRecordHead = 20;
constexpr std::size_t kRecordTail = 4;
constexpr std::size_t kMaxKey = 64 * 1024;
constexpr std::uint8_t kOpSet = 1;
constexpr std::uint8_t kOpDelete = 2;

std::uint32_t crc32(const std::uint8_t* p, std::size_t n) {
    static const auto table = [] {
        std::array<std::uint32_t, 256> t{};
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

void put_le(Bytes& out, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(std::uint8_t(v >> (8 * i)));
}

std::uint64_t get_le(const std::uint8_t* p, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t(p[i]) << (8 * i);
    return v;
}

void encode_record(Bytes& out, std::uint8_t op, const std::string& key, const Bytes& value) {
    const auto start = out.size();
    put_le(out, kRecordMagic, 4);
    out.push_back(op);
    out.insert(out.end(), 3, 0);
    put_le(out, key.size(), 4);
    put_le(out, value.size(), 8);
    out.insert(out.end(), key.begin(), key.end());
    out.insert(out.end(), value.begin(), value.end());
    put_le(out, crc32(out.data() + start + 4, out.size() - start - 4), 4);
}

Error os_error(const std::string& what, const std::string& path) {
    int e = errno;
    return Error(Errc::io_error, what + " " + path + ": " + std::strerror(e), {},
                 std::error_code(e, std::generic_category()));
}

}  // namespace

struct FileStore::State {
    std::string path;
    FileStoreOptions options;
    std::mutex mu;  // the fd, the replayed data and the offset; never held across a suspension
    int fd = -1;
    pid_t pid = 0;
    std::uint64_t offset = 0;  // end of the last good record read
    std::unordered_map<std::string, Bytes> data;
    dev_t dev = 0;  // the inode `fd` is open on
    ino_t ino = 0;
    std::uint64_t compact_at = 0;  // log length at which compaction is next considered

    ~State() {
        if (fd >= 0) ::close(fd);
    }

    // Under mu: (re)opens the file for this process, checking or writing the header.
    Result<void> ensure_open() {
        if (fd >= 0 && pid == ::getpid()) return ok();
        if (fd >= 0) ::close(fd);  // inherited through fork(): its flock would be the parent's
        fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return fail(os_error("FileStore: cannot open", path));
        pid = ::getpid();
        offset = 0;
        data.clear();
        struct stat st {};
        if (::fstat(fd, &st) == 0) {
            dev = st.st_dev;
            ino = st.st_ino;
        }
        return ok();
    }

    // Under mu: true when the path now names another file than `fd` (compacted by someone).
    bool replaced() const {
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) return false;  // removed: keep using what we have
        return st.st_dev != dev || st.st_ino != ino;
    }

    static std::uint64_t record_size(const std::string& key, const Bytes& value) {
        return kRecordHead + key.size() + value.size() + kRecordTail;
    }

    // Under mu and the exclusive flock, with `data` replayed up to the end of the file: rewrites
    // the log with only the live keys when it is long enough and at least half dead.
    void maybe_compact() {
        const std::uint64_t min = options.compact_min_bytes;
        if (min == 0 || offset < std::max(min, compact_at)) return;
        std::uint64_t live = kHeaderSize;
        for (const auto& [k, v] : data) live += record_size(k, v);
        if (offset < 2 * live) {
            compact_at = 2 * live;
            return;
        }
        Bytes out(kHeaderMagic, kHeaderMagic + 8);
        put_le(out, 1, 4);
        put_le(out, 0, 4);
        out.reserve(live);
        for (const auto& [k, v] : data) encode_record(out, kOpSet, k, v);
        const std::string tmp = path + ".compact." + std::to_string(::getpid());
        struct stat st {};
        const mode_t mode = ::fstat(fd, &st) == 0 ? (st.st_mode & 0777) : 0644;
        int t = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        if (t < 0) {
            log(LogLevel::warn, "store", os_error("FileStore: cannot compact, cannot create", tmp).message());
            compact_at = 2 * offset;  // try again much later
            return;
        }
        std::size_t done = 0;
        bool good = true;
        while (done < out.size()) {
            auto n = ::pwrite(t, out.data() + done, out.size() - done, off_t(done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                good = false;
                break;
            }
            done += std::size_t(n);
        }
        good = good && ::fsync(t) == 0;
        ::close(t);
        if (!good || ::rename(tmp.c_str(), path.c_str()) != 0) {
            log(LogLevel::warn, "store", os_error("FileStore: cannot compact into", tmp).message());
            ::unlink(tmp.c_str());
            compact_at = 2 * offset;
            return;
        }
        log(LogLevel::debug, "store", "FileStore " + path + ": compacted " + std::to_string(offset) + " bytes to " +
                                          std::to_string(out.size()));
        compact_at = std::max<std::uint64_t>(min, 2 * out.size());
        // Our descriptor is now the old file: the next operation notices and replays the new one.
    }

    // Under mu and a flock: checks the header; with `exclusive`, writes it when the file is new or
    // a creator died before finishing it.
    Result<void> ensure_header(std::uint64_t& size, bool exclusive) {
        if (offset >= kHeaderSize) return ok();
        if (size >= kHeaderSize) {
            std::uint8_t h[kHeaderSize];
            if (::pread(fd, h, kHeaderSize, 0) != ssize_t(kHeaderSize))
                return fail(os_error("FileStore: cannot read the header of", path));
            if (std::memcmp(h, kHeaderMagic, 8) != 0 || get_le(h + 8, 4) != 1)
                return fail(Errc::store_error, "FileStore: " + path + " is not a tensorplay FileStore file (bad header)");
            offset = kHeaderSize;
            return ok();
        }
        if (!exclusive) return ok();  // nothing to read yet
        Bytes h(kHeaderMagic, kHeaderMagic + 8);
        put_le(h, 1, 4);
        put_le(h, 0, 4);
        if (::ftruncate(fd, 0) != 0) return fail(os_error("FileStore: cannot reset", path));
        if (::pwrite(fd, h.data(), h.size(), 0) != ssize_t(h.size()))
            return fail(os_error("FileStore: cannot write the header of", path));
        offset = kHeaderSize;
        size = kHeaderSize;
        return ok();
    }

    // Under mu and a flock: replays the records appended since `offset`. Returns the file size;
    // offset < size afterwards means a torn tail.
    Result<std::uint64_t> refresh(bool exclusive) {
        struct stat st {};
        if (::fstat(fd, &st) != 0) return fail(os_error("FileStore: cannot stat", path));
        auto size = std::uint64_t(st.st_size);
        if (auto h = ensure_header(size, exclusive); !h) return fail(h.error());
        if (offset < kHeaderSize) return size;
        if (size < offset)
            return fail(Errc::store_error, "FileStore: " + path + " shrank below what was already read (replaced by someone?)");
        if (size == offset) return size;
        Bytes buf(size - offset);
        std::size_t got = 0;
        while (got < buf.size()) {
            auto n = ::pread(fd, buf.data() + got, buf.size() - got, off_t(offset + got));
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return fail(os_error("FileStore: cannot read", path));
            if (n == 0) break;
            got += std::size_t(n);
        }
        std::size_t pos = 0;
        while (got - pos >= kRecordHead) {
            const auto* p = buf.data() + pos;
            if (get_le(p, 4) != kRecordMagic) break;
            const auto op = p[4];
            const auto klen = get_le(p + 8, 4);
            const auto vlen = get_le(p + 12, 8);
            if ((op != kOpSet && op != kOpDelete) || klen > kMaxKey || vlen > options.max_value_size) break;
            const auto total = kRecordHead + klen + vlen + kRecordTail;
            if (got - pos < total) break;
            if (crc32(p + 4, total - 4 - kRecordTail) != get_le(p + total - kRecordTail, 4)) break;
            std::string key(reinterpret_cast<const char*>(p + kRecordHead), klen);
            if (op == kOpSet)
                data[std::move(key)] = Bytes(p + kRecordHead + klen, p + kRecordHead + klen + vlen);
            else
                data.erase(key);
            pos += total;
        }
        offset += pos;
        return size;
    }

    // Under mu and the exclusive flock: cuts a torn tail, then appends `records` in one write.
    Result<void> append_records(std::uint64_t size, const Bytes& records) {
        if (size > offset) {
            log(LogLevel::warn, "store",
                "FileStore " + path + ": dropping a torn record of " + std::to_string(size - offset) +
                    " bytes at offset " + std::to_string(offset) + " (a writer died mid-write)");
            if (::ftruncate(fd, off_t(offset)) != 0) return fail(os_error("FileStore: cannot truncate", path));
        }
        std::size_t done = 0;
        while (done < records.size()) {
            auto n = ::pwrite(fd, records.data() + done, records.size() - done, off_t(offset + done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                auto e = os_error("FileStore: cannot write to", path);
                (void)::ftruncate(fd, off_t(offset));  // leave no partial record behind
                return fail(e);
            }
            done += std::size_t(n);
        }
        return ok();
    }
};

namespace {

using State = FileStore::State;

/// Waits `d` on the awaiting coroutine's executor; false when the wait was cancelled.
Task<bool> pause_for(Duration d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    auto [ec] = co_await t.async_wait(detail::use_nothrow);
    co_return !ec;
}

/// A cancellation that comes while a coroutine is between two awaits makes Asio throw
/// operation_aborted from its next co_await of an awaitable: the waits below catch it around each
/// such co_await, so that the operation ends with Errc::cancelled, never an exception.
bool aborted(const std::system_error& e) noexcept { return e.code() == asio::error::operation_aborted; }

// Runs `fn(state, file_size)` under the in-process mutex and a flock of the file (exclusive for
// writers), after replaying the log. The flock is tried without blocking; while another process
// holds it the coroutine sleeps on a timer, up to the store's timeout.
template <class F>
auto locked(std::shared_ptr<State> s, bool exclusive, Duration limit, F fn)
    -> Task<std::invoke_result_t<F&, State&, std::uint64_t>> {
    const auto deadline = limit > Duration::zero() ? Clock::now() + limit : Clock::time_point::max();
    auto backoff = std::chrono::duration_cast<Duration>(std::chrono::microseconds(200));
    for (;;) {
        {
            std::lock_guard guard(s->mu);
            if (auto o = s->ensure_open(); !o) co_return fail(o.error());
            if (::flock(s->fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) {
                if (s->replaced()) {  // compacted by a writer since we opened it: start over on the new file
                    ::flock(s->fd, LOCK_UN);
                    ::close(s->fd);
                    s->fd = -1;
                    continue;
                }
                struct Unlock {
                    int fd;
                    ~Unlock() { ::flock(fd, LOCK_UN); }
                } unlock{s->fd};
                auto size = s->refresh(exclusive);
                if (!size) co_return fail(size.error());
                co_return fn(*s, *size);
            }
            if (errno != EWOULDBLOCK && errno != EINTR) co_return fail(os_error("FileStore: cannot lock", s->path));
        }
        if (Clock::now() >= deadline)
            co_return fail(Errc::timeout, "FileStore: " + s->path + " stayed locked by another process");
        bool waited = false;
        try {
            waited = co_await pause_for(backoff);
        } catch (const std::system_error& e) {
            if (!aborted(e)) throw;
        }
        if (!waited) co_return fail(Errc::cancelled, "FileStore: waiting for the lock on " + s->path + " was cancelled");
        backoff = std::min<Duration>(backoff * 2, std::chrono::milliseconds(20));
    }
}

// Appends records built by `build(state)` (which may also compute the result) under the exclusive lock.
template <class T, class F>
Task<Result<T>> write_op(std::shared_ptr<State> s, Duration limit, F build) {
    co_return co_await locked(s, true, limit, [&build](State& st, std::uint64_t size) -> Result<T> {
        Bytes records;
        auto r = build(st, records);
        if (!r || records.empty()) return r;
        if (auto w = st.append_records(size, records); !w) return fail(w.error());
        // Replay what we wrote, so that our copy and offset follow the file exactly.
        if (auto again = st.refresh(true); !again) return fail(again.error());
        st.maybe_compact();
        return r;
    });
}

// Polls until every key is present (time_point::max(): forever), then returns `read(state)`.
template <class T, class F>
Task<Result<T>> poll_until(std::shared_ptr<State> s, std::vector<std::string> keys, Duration timeout,
                           std::string what, F read) {
    const auto deadline = timeout > Duration::zero() ? Clock::now() + timeout : Clock::time_point::max();
    auto interval = s->options.poll_min;
    for (;;) {
        std::vector<std::string> missing;
        Result<T> r = fail(Errc::cancelled, what + " of keys " + detail::describe_keys(keys) + " was cancelled");
        try {
            r = co_await locked(s, false, timeout, [&](State& st, std::uint64_t) -> Result<T> {
                for (const auto& k : keys)
                    if (!st.data.count(k)) missing.push_back(k);
                if (!missing.empty()) return fail(Errc::not_found, "");
                return read(st);
            });
        } catch (const std::system_error& e) {
            if (!aborted(e)) throw;
        }
        if (r || r.error().code() != Errc::not_found) co_return r;
        const auto now = Clock::now();
        if (now >= deadline) co_return fail(detail::wait_timeout_error(what, missing, timeout));
        auto sleep = interval;
        if (deadline != Clock::time_point::max()) sleep = std::min<Duration>(sleep, deadline - now);
        bool waited = false;
        try {
            waited = co_await pause_for(sleep);
        } catch (const std::system_error& e) {
            if (!aborted(e)) throw;
        }
        if (!waited) co_return fail(Errc::cancelled, what + " of keys " + detail::describe_keys(missing) + " was cancelled");
        interval = std::min(interval * 2, s->options.poll_max);
    }
}

Result<void> check_sizes(const State& s, const std::string& key, std::size_t value_size) {
    if (key.size() > kMaxKey)
        return fail(Errc::invalid_argument, "FileStore: key of " + std::to_string(key.size()) +
                                                " bytes is over the limit of " + std::to_string(kMaxKey));
    if (value_size > s.options.max_value_size)
        return fail(Errc::invalid_argument, "FileStore: value of " + std::to_string(value_size) + " bytes for key '" +
                                                key + "' is over the limit of " + std::to_string(s.options.max_value_size));
    return ok();
}

}  // namespace

Result<std::shared_ptr<FileStore>> FileStore::open(std::string path, FileStoreOptions options) {
    if (path.empty()) return fail(Errc::invalid_argument, "FileStore: empty path");
    auto state = std::make_shared<State>();
    state->path = std::move(path);
    state->options = options;
    if (state->options.poll_min <= Duration::zero()) state->options.poll_min = std::chrono::milliseconds(1);
    if (state->options.poll_max < state->options.poll_min) state->options.poll_max = state->options.poll_min;
    {
        std::lock_guard guard(state->mu);
        if (auto o = state->ensure_open(); !o) return fail(o.error());
    }
    auto store = std::make_shared<FileStore>(state);
    store->timeout_ = options.timeout;
    return store;
}

FileStore::FileStore(std::shared_ptr<State> state) : state_(std::move(state)) {}
FileStore::~FileStore() = default;

const std::string& FileStore::path() const noexcept { return state_->path; }

Task<Result<void>> FileStore::set(std::string key, Bytes value) {
    if (auto c = check_sizes(*state_, key, value.size()); !c) co_return c;
    co_return co_await write_op<void>(state_, timeout(), [&](State&, Bytes& out) -> Result<void> {
        encode_record(out, kOpSet, key, value);
        return ok();
    });
}

Task<Result<Bytes>> FileStore::get(std::string key) {
    std::vector<std::string> keys{key};
    co_return co_await poll_until<Bytes>(state_, std::move(keys), timeout(), "get",
                                         [&key](State& st) -> Result<Bytes> { return st.data.at(key); });
}

Task<Result<std::int64_t>> FileStore::add(std::string key, std::int64_t delta) {
    if (auto c = check_sizes(*state_, key, 0); !c) co_return fail(c.error());
    co_return co_await write_op<std::int64_t>(state_, timeout(), [&](State& st, Bytes& out) -> Result<std::int64_t> {
        std::int64_t current = 0;
        if (auto it = st.data.find(key); it != st.data.end()) {
            auto parsed = detail::parse_counter(key, it->second);
            if (!parsed) return parsed;
            current = *parsed;
        }
        auto sum = detail::checked_add(key, current, delta);
        if (!sum) return sum;
        encode_record(out, kOpSet, key, bytes(std::to_string(*sum)));
        return sum;
    });
}

Task<Result<Bytes>> FileStore::compare_set(std::string key, Bytes expected, Bytes desired) {
    if (auto c = check_sizes(*state_, key, desired.size()); !c) co_return fail(c.error());
    co_return co_await write_op<Bytes>(state_, timeout(), [&](State& st, Bytes& out) -> Result<Bytes> {
        auto it = st.data.find(key);
        if (it == st.data.end()) {
            if (!expected.empty()) return expected;  // c10d: absent key, non-empty expected: nothing stored
        } else if (it->second != expected) {
            return it->second;
        }
        encode_record(out, kOpSet, key, desired);
        return desired;
    });
}

Task<Result<void>> FileStore::wait(std::vector<std::string> keys, Duration timeout) {
    co_return co_await poll_until<void>(state_, std::move(keys), timeout, "wait", [](State&) { return ok(); });
}

Task<Result<bool>> FileStore::check(std::vector<std::string> keys) {
    co_return co_await locked(state_, false, timeout(), [&](State& st, std::uint64_t) -> Result<bool> {
        for (const auto& k : keys)
            if (!st.data.count(k)) return false;
        return true;
    });
}

Task<Result<bool>> FileStore::delete_key(std::string key) {
    co_return co_await write_op<bool>(state_, timeout(), [&](State& st, Bytes& out) -> Result<bool> {
        if (!st.data.count(key)) return false;
        encode_record(out, kOpDelete, key, {});
        return true;
    });
}

Task<Result<std::int64_t>> FileStore::num_keys() {
    co_return co_await locked(state_, false, timeout(), [](State& st, std::uint64_t) -> Result<std::int64_t> {
        return std::int64_t(st.data.size());
    });
}

Task<Result<void>> FileStore::append(std::string key, Bytes value) {
    if (auto c = check_sizes(*state_, key, value.size()); !c) co_return c;
    co_return co_await write_op<void>(state_, timeout(), [&](State& st, Bytes& out) -> Result<void> {
        Bytes joined;
        if (auto it = st.data.find(key); it != st.data.end()) joined = it->second;
        joined.insert(joined.end(), value.begin(), value.end());
        if (auto c = check_sizes(st, key, joined.size()); !c) return c;
        encode_record(out, kOpSet, key, joined);
        return ok();
    });
}

Task<Result<std::vector<Bytes>>> FileStore::multi_get(std::vector<std::string> keys) {
    auto wanted = keys;
    co_return co_await poll_until<std::vector<Bytes>>(
        state_, std::move(wanted), timeout(), "multi_get", [&keys](State& st) -> Result<std::vector<Bytes>> {
            std::vector<Bytes> out;
            out.reserve(keys.size());
            for (const auto& k : keys) out.push_back(st.data.at(k));
            return out;
        });
}

Task<Result<void>> FileStore::multi_set(std::vector<std::string> keys, std::vector<Bytes> values) {
    if (keys.size() != values.size())
        co_return fail(Errc::invalid_argument, "multi_set got " + std::to_string(keys.size()) + " keys but " +
                                                   std::to_string(values.size()) + " values");
    for (std::size_t i = 0; i < keys.size(); ++i)
        if (auto c = check_sizes(*state_, keys[i], values[i].size()); !c) co_return c;
    co_return co_await write_op<void>(state_, timeout(), [&](State&, Bytes& out) -> Result<void> {
        for (std::size_t i = 0; i < keys.size(); ++i) encode_record(out, kOpSet, keys[i], values[i]);
        return ok();
    });
}

}  // namespace tensorplay
