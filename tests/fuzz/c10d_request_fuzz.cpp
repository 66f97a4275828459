// Fuzzes the incremental c10d request parser in both dialects: a complete request re-encodes to
// the bytes it was parsed from, every shorter prefix of it is "incomplete" with an honest `size`,
// nothing exceeds the limits, and parse_counter agrees with strtoll.
#include "store/c10d_protocol.hpp"

#include "fuzz_util.hpp"

#include <tensorplay/store/tcp_store.hpp>

#include <cerrno>
#include <cstdlib>
#include <string>

using namespace tensorplay;
using namespace tensorplay::detail::c10d;

namespace {

void put_value(Bytes& b, std::span<const std::uint8_t> v) { put_bytes(b, v); }

// The request as a client would send it (the layouts of docs/protocol.md).
Bytes encode(Dialect d, const Request& r) {
    Bytes b;
    auto type = encode_type(d, r.op);
    TP_FUZZ_CHECK(type.has_value());
    put_u8(b, *type);
    switch (r.op) {
        case Op::validate:
        case Op::ping: put_u32(b, r.nonce); break;
        case Op::set:
        case Op::append: put_str(b, r.keys[0]); put_value(b, r.values[0]); break;
        case Op::compare_set: put_str(b, r.keys[0]); put_value(b, r.values[0]); put_value(b, r.values[1]); break;
        case Op::get:
        case Op::watch_key:
        case Op::delete_key: put_str(b, r.keys[0]); break;
        case Op::add: put_str(b, r.keys[0]); put_i64(b, r.integer); break;
        case Op::check:
        case Op::wait:
        case Op::multi_get:
            put_u64(b, r.keys.size());
            for (auto k : r.keys) put_str(b, k);
            break;
        case Op::multi_set:
            put_u64(b, r.keys.size());
            for (std::size_t i = 0; i < r.keys.size(); ++i) {
                put_str(b, r.keys[i]);
                put_value(b, r.values[i]);
            }
            break;
        case Op::num_keys:
        case Op::cancel_wait:
        case Op::list: break;
    }
    return b;
}

void check_shape(const Request& r) {
    switch (r.op) {
        case Op::set:
        case Op::append: TP_FUZZ_CHECK(r.keys.size() == 1 && r.values.size() == 1); break;
        case Op::compare_set: TP_FUZZ_CHECK(r.keys.size() == 1 && r.values.size() == 2); break;
        case Op::get:
        case Op::watch_key:
        case Op::delete_key:
        case Op::add: TP_FUZZ_CHECK(r.keys.size() == 1 && r.values.empty()); break;
        case Op::multi_set: TP_FUZZ_CHECK(r.keys.size() == r.values.size()); break;
        default: TP_FUZZ_CHECK(r.values.empty()); break;
    }
}

void check(Dialect d, std::span<const std::uint8_t> in, const Limits& limits) {
    Request r;
    ParseResult p{ParseStatus::error, 0, {}};
    {
        fuzz::AllocationBound bound;
        p = parse_request(d, in, limits, r);
        TP_FUZZ_CHECK(bound.within(in.size()));
    }
    switch (p.status) {
        case ParseStatus::error: TP_FUZZ_CHECK(!p.error.empty()); return;
        case ParseStatus::incomplete:
            // Retrying with fewer bytes than `size` cannot help, and `size` never asks for more
            // than a request may have.
            TP_FUZZ_CHECK(p.size > in.size() && p.size <= limits.max_request_size);
            return;
        case ParseStatus::complete: break;
    }
    TP_FUZZ_CHECK(p.size >= 1 && p.size <= in.size() && p.size <= limits.max_request_size);
    check_shape(r);
    TP_FUZZ_CHECK(r.keys.size() <= limits.max_keys_per_request || r.keys.size() == 1);
    for (auto k : r.keys) {
        TP_FUZZ_CHECK(k.size() <= limits.max_key_size);
        const auto* kp = reinterpret_cast<const std::uint8_t*>(k.data());
        TP_FUZZ_CHECK(k.empty() || (kp >= in.data() && kp + k.size() <= in.data() + p.size));
    }
    for (auto v : r.values) {
        TP_FUZZ_CHECK(v.size() <= limits.max_value_size);
        TP_FUZZ_CHECK(v.empty() || (v.data() >= in.data() && v.data() + v.size() <= in.data() + p.size));
    }
    const Bytes again = encode(d, r);
    TP_FUZZ_CHECK(again.size() == p.size && std::equal(again.begin(), again.end(), in.begin()));
    // The parser is incremental: any prefix is incomplete and asks for no more than the request.
    for (std::size_t cut : {std::size_t{0}, p.size / 2, p.size - 1}) {
        Request part;
        auto q = parse_request(d, in.first(cut), limits, part);
        TP_FUZZ_CHECK(q.status == ParseStatus::incomplete && q.size > cut && q.size <= p.size);
    }
}

void check_counter(std::span<const std::uint8_t> in) {
    const auto got = parse_counter(in);
    std::string s(in.begin(), in.end());
    s = s.substr(0, s.find('\0'));  // strtoll stops at the first NUL, as parse_counter stops at a non-digit
    errno = 0;
    char* end = nullptr;
    const long long want = std::strtoll(s.c_str(), &end, 10);
    const bool converted = end != s.c_str() && errno != ERANGE;
    TP_FUZZ_CHECK(got.has_value() == converted);
    if (got) TP_FUZZ_CHECK(*got == want);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::uint8_t> in(data, size);
    const TcpStoreServerOptions defaults;
    const Limits wide{defaults.max_key_size, defaults.max_value_size, defaults.max_keys_per_request,
                      defaults.max_request_size};
    const Limits tight{16, 64, 4, 256};
    for (Dialect d : {Dialect::legacy, Dialect::modern}) {
        check(d, in, wide);
        check(d, in, tight);
    }
    check_counter(in.first(std::min<std::size_t>(in.size(), 64)));
    return 0;
}
