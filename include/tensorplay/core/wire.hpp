// Bounds-checked little-endian encoding for the wire protocols.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace tensorplay {

/// Reads a little-endian fixed-width integer at `p` (the caller checked the bounds): one load on a
/// little-endian host (GCC 12 keeps a byte loop as a loop of loads and shifts).
template <class U>
[[nodiscard]] constexpr U load_le(const std::uint8_t* p) noexcept {
    if constexpr (std::endian::native == std::endian::little) {
        if (!std::is_constant_evaluated()) {
            U v;
            std::memcpy(&v, p, sizeof(U));
            return v;
        }
    }
    U v = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(p[i]) << (8 * i));
    return v;
}

/// Writes `v` little-endian at `p` (the caller sized the buffer).
template <class U>
constexpr void store_le(std::uint8_t* p, U v) noexcept {
    if constexpr (std::endian::native == std::endian::little) {
        if (!std::is_constant_evaluated()) {
            std::memcpy(p, &v, sizeof(U));
            return;
        }
    }
    for (std::size_t i = 0; i < sizeof(U); ++i) p[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(v) >> (8 * i));
}

/// Appends little-endian fixed-width integers and length-prefixed strings to a Bytes buffer.
class TP_API WireWriter {
public:
    WireWriter() = default;
    explicit WireWriter(Bytes initial) : buf_(std::move(initial)) {}

    WireWriter& u8(std::uint8_t v) { buf_.push_back(v); return *this; }
    WireWriter& u16(std::uint16_t v) { return put_le(v); }
    WireWriter& u32(std::uint32_t v) { return put_le(v); }
    WireWriter& u64(std::uint64_t v) { return put_le(v); }
    WireWriter& i32(std::int32_t v) { return put_le(static_cast<std::uint32_t>(v)); }
    WireWriter& i64(std::int64_t v) { return put_le(static_cast<std::uint64_t>(v)); }
    WireWriter& f64(double v) { return put_le(std::bit_cast<std::uint64_t>(v)); }
    /// Raw bytes, no length.
    WireWriter& raw(std::span<const std::uint8_t> b) { buf_.insert(buf_.end(), b.begin(), b.end()); return *this; }
    WireWriter& raw(std::string_view s) { return raw({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()}); }
    /// u64 length then the bytes (the c10d string encoding).
    WireWriter& str64(std::string_view s) { u64(s.size()); return raw(s); }
    WireWriter& bytes64(std::span<const std::uint8_t> b) { u64(b.size()); return raw(b); }
    /// u32 length then the bytes.
    WireWriter& str32(std::string_view s) { u32(static_cast<std::uint32_t>(s.size())); return raw(s); }
    WireWriter& bytes32(std::span<const std::uint8_t> b) { u32(static_cast<std::uint32_t>(b.size())); return raw(b); }

    [[nodiscard]] std::size_t size() const noexcept { return buf_.size(); }
    [[nodiscard]] const Bytes& data() const& noexcept { return buf_; }
    [[nodiscard]] Bytes take() && noexcept { return std::move(buf_); }
    /// Overwrites a u32 written earlier at `offset` (for lengths known only at the end).
    void patch_u32(std::size_t offset, std::uint32_t v);

private:
    template <class U>
    WireWriter& put_le(U v) {
        const std::size_t at = buf_.size();
        buf_.resize(at + sizeof(U));
        store_le(buf_.data() + at, v);
        return *this;
    }
    Bytes buf_;
};

/// Reads what WireWriter wrote. Errors are sticky: after the first failed read every read
/// returns zero/empty and error() says what failed. A read past the end is Errc::protocol_error,
/// and a length prefix is checked against the remaining bytes and `max_len` before any copy.
class TP_API WireReader {
public:
    explicit WireReader(std::span<const std::uint8_t> data) noexcept : data_(data) {}

    std::uint8_t u8() { return get_le<std::uint8_t>("u8"); }
    std::uint16_t u16() { return get_le<std::uint16_t>("u16"); }
    std::uint32_t u32() { return get_le<std::uint32_t>("u32"); }
    std::uint64_t u64() { return get_le<std::uint64_t>("u64"); }
    std::int32_t i32() { return static_cast<std::int32_t>(get_le<std::uint32_t>("i32")); }
    std::int64_t i64() { return static_cast<std::int64_t>(get_le<std::uint64_t>("i64")); }
    double f64() { return std::bit_cast<double>(get_le<std::uint64_t>("f64")); }
    /// `n` raw bytes as a view into the input.
    std::span<const std::uint8_t> raw(std::size_t n, std::string_view what = "bytes");
    /// A u64-length-prefixed string/bytes, refused when longer than `max_len`.
    std::string_view str64(std::size_t max_len = std::numeric_limits<std::size_t>::max(), std::string_view what = "string");
    std::span<const std::uint8_t> bytes64(std::size_t max_len = std::numeric_limits<std::size_t>::max(), std::string_view what = "bytes");
    /// A u32-length-prefixed string/bytes, refused when longer than `max_len`.
    std::string_view str32(std::size_t max_len = std::numeric_limits<std::uint32_t>::max(), std::string_view what = "string");
    std::span<const std::uint8_t> bytes32(std::size_t max_len = std::numeric_limits<std::uint32_t>::max(), std::string_view what = "bytes");

    [[nodiscard]] std::size_t remaining() const noexcept { return failed() ? 0 : data_.size() - pos_; }
    [[nodiscard]] std::size_t position() const noexcept { return pos_; }
    [[nodiscard]] bool failed() const noexcept { return error_.has_value(); }
    /// The first failure, if any.
    [[nodiscard]] const std::optional<Error>& error() const noexcept { return error_; }
    /// Ok if nothing failed; otherwise the first error.
    [[nodiscard]] Result<void> status() const;
    /// Ok if nothing failed and every byte was consumed (trailing bytes are a protocol_error).
    [[nodiscard]] Result<void> finish() const;
    /// Records a failure (for checks the caller makes on decoded values).
    void set_error(Errc code, std::string message);

private:
    bool need(std::size_t n, std::string_view what);
    template <class U>
    U get_le(std::string_view what) {
        if (!need(sizeof(U), what)) return 0;
        const U v = load_le<U>(data_.data() + pos_);
        pos_ += sizeof(U);
        return v;
    }
    std::span<const std::uint8_t> data_;
    std::size_t pos_ = 0;
    std::optional<Error> error_;
};

}  // namespace tensorplay
