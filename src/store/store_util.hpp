// Private helpers shared by the in-process and file stores: counters, key lists, timeout errors.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/timeout.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace tensorplay::detail {

/// Parses a c10d counter value (ASCII decimal, optional sign, surrounding spaces allowed).
[[nodiscard]] inline Result<std::int64_t> parse_counter(std::string_view key, std::span<const std::uint8_t> value) {
    std::string_view s = as_string_view(value);
    auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    bool negative = false;
    if (!s.empty() && (s.front() == '-' || s.front() == '+')) {
        negative = s.front() == '-';
        s.remove_prefix(1);
    }
    auto bad = [&] {
        std::string shown = to_string(value.subspan(0, std::min<std::size_t>(value.size(), 32)));
        return fail(Errc::store_error, "add on key '" + std::string(key) + "': the value '" + shown +
                                           "' is not an ASCII decimal integer");
    };
    if (s.empty()) return bad();
    std::uint64_t magnitude = 0;
    const std::uint64_t limit = negative ? std::uint64_t(std::numeric_limits<std::int64_t>::max()) + 1
                                         : std::uint64_t(std::numeric_limits<std::int64_t>::max());
    for (char c : s) {
        if (c < '0' || c > '9') return bad();
        std::uint64_t digit = std::uint64_t(c - '0');
        if (magnitude > (limit - digit) / 10) return bad();
        magnitude = magnitude * 10 + digit;
    }
    if (negative) return magnitude == limit ? std::numeric_limits<std::int64_t>::min() : -std::int64_t(magnitude);
    return std::int64_t(magnitude);
}

/// current + delta, or a store_error naming the key on overflow.
[[nodiscard]] inline Result<std::int64_t> checked_add(std::string_view key, std::int64_t current, std::int64_t delta) {
    std::int64_t out = 0;
    if (__builtin_add_overflow(current, delta, &out))
        return fail(Errc::store_error, "add on key '" + std::string(key) + "' overflows a 64-bit integer");
    return out;
}

/// "'a', 'b', 'c'" (at most 8 keys shown, then "and N more").
[[nodiscard]] inline std::string describe_keys(const std::vector<std::string>& keys) {
    std::string out;
    std::size_t shown = std::min<std::size_t>(keys.size(), 8);
    for (std::size_t i = 0; i < shown; ++i) {
        if (i) out += ", ";
        out += "'" + keys[i] + "'";
    }
    if (keys.size() > shown) out += " and " + std::to_string(keys.size() - shown) + " more";
    return out;
}

/// The timeout error of a wait: names the keys still missing and the limit.
[[nodiscard]] inline Error wait_timeout_error(std::string_view what, const std::vector<std::string>& missing,
                                              Duration timeout) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
    return Error(Errc::timeout, std::string(what) + " timed out after " + std::to_string(ms) +
                                    " ms waiting for keys " + describe_keys(missing));
}

/// The keys without duplicates, first occurrence order kept.
[[nodiscard]] inline std::vector<std::string> unique_keys(const std::vector<std::string>& keys) {
    std::vector<std::string> out;
    out.reserve(keys.size());
    std::unordered_set<std::string_view> seen;
    seen.reserve(keys.size());
    for (const auto& k : keys)
        if (seen.insert(k).second) out.push_back(k);
    return out;
}

}  // namespace tensorplay::detail
