// The c10d TCPStore wire protocol: query types of both dialects and an incremental request parser.
#pragma once

#include <tensorplay/core/bytes.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail::c10d {

/// 0x3C85F7CE, sent little-endian (CE F7 85 3C) after a VALIDATE type byte.
inline constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;

/// Wire dialects: legacy = PyTorch 1.13/2.0 (with WATCH_KEY, no handshake); modern = PyTorch >= 2.3.
enum class Dialect : std::uint8_t { legacy, modern };

/// Operations, independent of their number in either dialect.
enum class Op : std::uint8_t {
    validate, set, compare_set, get, add, check, wait, num_keys, watch_key, delete_key,
    append, multi_get, multi_set, cancel_wait, ping, list,
};

[[nodiscard]] std::string_view op_name(Op op) noexcept;
/// The operation a type byte means in `d`, or nothing for an unknown type.
[[nodiscard]] std::optional<Op> decode_type(Dialect d, std::uint8_t type) noexcept;
/// The type byte of `op` in `d`, or nothing when `d` lacks it.
[[nodiscard]] std::optional<std::uint8_t> encode_type(Dialect d, Op op) noexcept;

inline constexpr std::uint8_t kCheckReady = 0;
inline constexpr std::uint8_t kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0;
inline constexpr std::uint8_t kWaitCanceled = 1;
inline constexpr std::uint8_t kWatchUpdated = 0;
inline constexpr std::uint8_t kWatchCreated = 1;
inline constexpr std::uint8_t kWatchDeleted = 2;
inline constexpr std::uint8_t kWatchRegistered = 3;

struct Limits {
    std::size_t max_key_size;
    std::size_t max_value_size;
    std::size_t max_keys_per_request;
    std::size_t max_request_size;
};

/// One parsed request; views point into the connection's read buffer (valid until it is consumed).
/// Reused between requests so that steady-state parsing allocates nothing.
struct Request {
    Op op = Op::set;
    std::vector<std::string_view> keys;               // set/get/add/...: keys[0]
    std::vector<std::span<const std::uint8_t>> values;  // set: [v]; compare_set: [expected, desired]
    std::int64_t integer = 0;                          // add delta
    std::uint32_t nonce = 0;                           // ping nonce, validate magic
};

enum class ParseStatus { complete, incomplete, error };

struct ParseResult {
    ParseStatus status;
    std::size_t size = 0;  ///< complete: bytes consumed; incomplete: total bytes needed before a retry helps
    std::string error;     ///< error: what was wrong (for the log line)
};

/// Parses one request of dialect `d` from the front of `buf`. Every length and count is checked
/// against `limits` as soon as it is read, before the bytes it announces are awaited.
[[nodiscard]] ParseResult parse_request(Dialect d, std::span<const std::uint8_t> buf, const Limits& limits,
                                        Request& out);

/// Appends little-endian integers and length-prefixed strings to a reply buffer.
inline void put_u8(Bytes& b, std::uint8_t v) { b.push_back(v); }
void put_u32(Bytes& b, std::uint32_t v);
void put_u64(Bytes& b, std::uint64_t v);
inline void put_i64(Bytes& b, std::int64_t v) { put_u64(b, static_cast<std::uint64_t>(v)); }
void put_str(Bytes& b, std::string_view s);
void put_bytes(Bytes& b, std::span<const std::uint8_t> v);
[[nodiscard]] std::uint64_t get_u64(const std::uint8_t* p) noexcept;
[[nodiscard]] std::uint32_t get_u32(const std::uint8_t* p) noexcept;

/// c10d stores counters as ASCII decimal; nothing when `v` is not a decimal integer (stoll rules:
/// optional leading spaces and sign, digits, trailing bytes ignored).
[[nodiscard]] std::optional<std::int64_t> parse_counter(std::span<const std::uint8_t> v) noexcept;
/// Printable form of a key for log lines (escaped, cut at 80 characters).
[[nodiscard]] std::string printable(std::string_view key);

}  // namespace tensorplay::detail::c10d
