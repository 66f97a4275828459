// Store: the asynchronous key-value store interface workers rendezvous through.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tensorplay {

/// A key-value store with c10d TCPStore semantics. Keys are strings, values bytes.
/// Every operation is a coroutine; implementations document their thread-safety.
/// A timeout of zero (or less) means "wait forever", as c10d's kNoTimeout.
class TP_API Store {
public:
    static constexpr Duration kDefaultTimeout = std::chrono::seconds(300);

    virtual ~Store() = default;

    /// Sets `key` to `value`, waking waiters of `key`.
    [[nodiscard]] virtual Task<Result<void>> set(std::string key, Bytes value) = 0;
    /// The value of `key`, waiting up to timeout() for it to be set (Errc::timeout otherwise).
    [[nodiscard]] virtual Task<Result<Bytes>> get(std::string key) = 0;
    /// Atomically adds `delta` to the integer at `key` (absent: 0) and returns the new value.
    /// The value is stored as ASCII decimal, as c10d does.
    [[nodiscard]] virtual Task<Result<std::int64_t>> add(std::string key, std::int64_t delta) = 0;
    /// c10d compare-and-set: key absent and `expected` empty: stores `desired`; key present and
    /// equal to `expected`: stores `desired`. Returns the value now stored, or `expected` when the
    /// key is absent and `expected` is not empty (nothing stored).
    [[nodiscard]] virtual Task<Result<Bytes>> compare_set(std::string key, Bytes expected, Bytes desired) = 0;
    /// Waits until every key exists, up to `timeout` (zero: forever). Errc::timeout names the keys.
    [[nodiscard]] virtual Task<Result<void>> wait(std::vector<std::string> keys, Duration timeout) = 0;
    /// Waits with the store's default timeout.
    [[nodiscard]] Task<Result<void>> wait(std::vector<std::string> keys) { return wait(std::move(keys), timeout()); }
    /// True when every key exists now (no waiting).
    [[nodiscard]] virtual Task<Result<bool>> check(std::vector<std::string> keys) = 0;
    /// Deletes `key`; true when it existed.
    [[nodiscard]] virtual Task<Result<bool>> delete_key(std::string key) = 0;
    /// Number of keys in the store (c10d counts every key, including internal ones).
    [[nodiscard]] virtual Task<Result<std::int64_t>> num_keys() = 0;
    /// Appends `value` to the value at `key` (absent: creates it), waking waiters.
    [[nodiscard]] virtual Task<Result<void>> append(std::string key, Bytes value) = 0;
    /// Values of all `keys`, waiting up to timeout() for them, in the order asked.
    [[nodiscard]] virtual Task<Result<std::vector<Bytes>>> multi_get(std::vector<std::string> keys) = 0;
    /// Sets every key to its value (sizes must match: Errc::invalid_argument otherwise).
    [[nodiscard]] virtual Task<Result<void>> multi_set(std::vector<std::string> keys, std::vector<Bytes> values) = 0;
    /// True when multi_get/multi_set cost one round trip (collectives use them then).
    [[nodiscard]] virtual bool has_extended_api() const noexcept { return true; }

    /// The default timeout of get, wait and multi_get.
    [[nodiscard]] Duration timeout() const noexcept { return timeout_; }
    void set_timeout(Duration t) noexcept { timeout_ = t; }

protected:
    Duration timeout_ = kDefaultTimeout;
};

}  // namespace tensorplay
