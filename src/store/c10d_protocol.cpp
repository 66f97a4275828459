// The c10d TCPStore wire protocol: type numbering of both dialects and the incremental request parser.
#include "store/c10d_protocol.hpp"

#include <tensorplay/core/wire.hpp>

#include <array>
#include <cstring>

namespace tensorplay::detail::c10d {

namespace {

// Index = type byte. Legacy: PyTorch 1.13 (SET..DELETE_KEY, WATCH_KEY = 7). Modern: the enum after
// VALIDATE was inserted at 0 and WATCH_KEY removed (PyTorch >= 2.3), plus PING and LIST.
constexpr std::array<Op, 9> kLegacy = {Op::set, Op::compare_set, Op::get, Op::add, Op::check,
                                       Op::wait, Op::num_keys, Op::watch_key, Op::delete_key};
constexpr std::uint8_t kModernList = 17;
constexpr std::array<Op, 14> kModern = {Op::validate, Op::set, Op::compare_set, Op::get, Op::add,
                                        Op::check, Op::wait, Op::num_keys, Op::delete_key, Op::append,
                                        Op::multi_get, Op::multi_set, Op::cancel_wait, Op::ping};

// A read position over the buffered bytes; `need` says how many bytes must be buffered before a
// retry can get further, so that a large request is not re-parsed for every small read.
struct Cursor {
    std::span<const std::uint8_t> buf;
    const Limits& limits;
    std::size_t pos = 0;
    std::size_t need = 0;
    std::string error;

    bool have(std::size_t n) {
        if (pos + n > limits.max_request_size) {
            error = "request longer than the limit of " + std::to_string(limits.max_request_size) + " bytes";
            return false;
        }
        if (buf.size() - pos < n) {
            need = pos + n;
            return false;
        }
        return true;
    }
    bool u32(std::uint32_t& v) {
        if (!have(4)) return false;
        v = get_u32(buf.data() + pos);
        pos += 4;
        return true;
    }
    bool u64(std::uint64_t& v) {
        if (!have(8)) return false;
        v = get_u64(buf.data() + pos);
        pos += 8;
        return true;
    }
    bool blob(std::size_t max, std::string_view what, std::span<const std::uint8_t>& out) {
        std::uint64_t len = 0;
        if (!u64(len)) return false;
        if (len > max) {
            error = std::string(what) + " of " + std::to_string(len) + " bytes is over the limit of " +
                    std::to_string(max) + " bytes";
            return false;
        }
        if (!have(static_cast<std::size_t>(len))) return false;
        out = buf.subspan(pos, static_cast<std::size_t>(len));
        pos += static_cast<std::size_t>(len);
        return true;
    }
    bool key(std::vector<std::string_view>& keys) {
        std::span<const std::uint8_t> b;
        if (!blob(limits.max_key_size, "key", b)) return false;
        keys.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
        return true;
    }
    bool value(std::vector<std::span<const std::uint8_t>>& values) {
        std::span<const std::uint8_t> b;
        if (!blob(limits.max_value_size, "value", b)) return false;
        values.push_back(b);
        return true;
    }
    bool count(std::uint64_t& n) {
        if (!u64(n)) return false;
        if (n > limits.max_keys_per_request) {
            error = std::to_string(n) + " keys in one request is over the limit of " +
                    std::to_string(limits.max_keys_per_request);
            return false;
        }
        return true;
    }
};

bool parse_body(Cursor& c, Request& r) {
    switch (r.op) {
        case Op::validate:
        case Op::ping: return c.u32(r.nonce);
        case Op::set:
        case Op::append: return c.key(r.keys) && c.value(r.values);
        case Op::compare_set: return c.key(r.keys) && c.value(r.values) && c.value(r.values);
        case Op::get:
        case Op::watch_key:
        case Op::delete_key: return c.key(r.keys);
        case Op::add: {
            std::uint64_t d = 0;
            if (!c.key(r.keys) || !c.u64(d)) return false;
            r.integer = static_cast<std::int64_t>(d);
            return true;
        }
        case Op::check:
        case Op::wait:
        case Op::multi_get: {
            std::uint64_t n = 0;
            if (!c.count(n)) return false;
            for (std::uint64_t i = 0; i < n; ++i)
                if (!c.key(r.keys)) return false;
            return true;
        }
        case Op::multi_set: {
            std::uint64_t n = 0;
            if (!c.count(n)) return false;
            for (std::uint64_t i = 0; i < n; ++i)
                if (!c.key(r.keys) || !c.value(r.values)) return false;
            return true;
        }
        case Op::num_keys:
        case Op::cancel_wait:
        case Op::list: return true;
    }
    return true;
}

}  // namespace

std::string_view op_name(Op op) noexcept {
    switch (op) {
        case Op::validate: return "VALIDATE";
        case Op::set: return "SET";
        case Op::compare_set: return "COMPARE_SET";
        case Op::get: return "GET";
        case Op::add: return "ADD";
        case Op::check: return "CHECK";
        case Op::wait: return "WAIT";
        case Op::num_keys: return "GETNUMKEYS";
        case Op::watch_key: return "WATCH_KEY";
        case Op::delete_key: return "DELETE_KEY";
        case Op::append: return "APPEND";
        case Op::multi_get: return "MULTI_GET";
        case Op::multi_set: return "MULTI_SET";
        case Op::cancel_wait: return "CANCEL_WAIT";
        case Op::ping: return "PING";
        case Op::list: return "LIST";
    }
    return "?";
}

std::optional<Op> decode_type(Dialect d, std::uint8_t type) noexcept {
    if (d == Dialect::legacy) {
        if (type < kLegacy.size()) return kLegacy[type];
        return std::nullopt;
    }
    if (type < kModern.size()) return kModern[type];
    if (type == kModernList) return Op::list;
    return std::nullopt;
}

std::optional<std::uint8_t> encode_type(Dialect d, Op op) noexcept {
    if (d == Dialect::legacy) {
        for (std::size_t i = 0; i < kLegacy.size(); ++i)
            if (kLegacy[i] == op) return static_cast<std::uint8_t>(i);
        return std::nullopt;
    }
    if (op == Op::list) return kModernList;
    for (std::size_t i = 0; i < kModern.size(); ++i)
        if (kModern[i] == op) return static_cast<std::uint8_t>(i);
    return std::nullopt;
}

ParseResult parse_request(Dialect d, std::span<const std::uint8_t> buf, const Limits& limits, Request& out) {
    if (buf.empty()) return {ParseStatus::incomplete, 1, {}};
    auto op = decode_type(d, buf[0]);
    if (!op) return {ParseStatus::error, 0, "unknown query type " + std::to_string(buf[0])};
    out.op = *op;
    out.keys.clear();
    out.values.clear();
    out.integer = 0;
    out.nonce = 0;
    Cursor c{buf, limits, 0, 0, {}};
    c.pos = 1;
    if (parse_body(c, out)) return {ParseStatus::complete, c.pos, {}};
    if (!c.error.empty()) return {ParseStatus::error, 0, std::string(op_name(*op)) + ": " + c.error};
    return {ParseStatus::incomplete, c.need, {}};
}

void put_u32(Bytes& b, std::uint32_t v) {
    std::uint8_t tmp[4];
    for (int i = 0; i < 4; ++i) tmp[i] = static_cast<std::uint8_t>(v >> (8 * i));
    b.insert(b.end(), tmp, tmp + 4);
}

void put_u64(Bytes& b, std::uint64_t v) {
    std::uint8_t tmp[8];
    for (int i = 0; i < 8; ++i) tmp[i] = static_cast<std::uint8_t>(v >> (8 * i));
    b.insert(b.end(), tmp, tmp + 8);
}

void put_str(Bytes& b, std::string_view s) {
    put_u64(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
}

void put_bytes(Bytes& b, std::span<const std::uint8_t> v) {
    put_u64(b, v.size());
    b.insert(b.end(), v.begin(), v.end());
}

std::uint64_t get_u64(const std::uint8_t* p) noexcept { return load_le<std::uint64_t>(p); }

std::uint32_t get_u32(const std::uint8_t* p) noexcept { return load_le<std::uint32_t>(p); }

std::optional<std::int64_t> parse_counter(std::span<const std::uint8_t> v) noexcept {
    std::size_t i = 0;
    while (i < v.size() && (v[i] == ' ' || (v[i] >= '\t' && v[i] <= '\r'))) ++i;
    bool neg = false;
    if (i < v.size() && (v[i] == '+' || v[i] == '-')) neg = v[i++] == '-';
    std::size_t digits = 0;
    std::uint64_t mag = 0;
    constexpr std::uint64_t kMaxMag = static_cast<std::uint64_t>(INT64_MAX) + 1;
    for (; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i, ++digits) {
        const std::uint64_t digit = v[i] - '0';
        if (mag > (kMaxMag - digit) / 10) return std::nullopt;
        mag = mag * 10 + digit;
    }
    if (digits == 0) return std::nullopt;
    if (!neg && mag == kMaxMag) return std::nullopt;
    return neg ? static_cast<std::int64_t>(0 - mag) : static_cast<std::int64_t>(mag);
}

std::string printable(std::string_view key) {
    std::string out;
    for (char ch : key.substr(0, 80)) {
        auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += ch;
        } else {
            static constexpr char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    if (key.size() > 80) out += "...";
    return out;
}

}  // namespace tensorplay::detail::c10d
