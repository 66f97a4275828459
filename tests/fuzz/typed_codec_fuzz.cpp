// Fuzzes the typed codecs (Codec<T>::decode for integers, floats, bool, strings, vectors, maps,
// pairs and nestings of them) and the typed payload reader (decode_args / decode_reply): a value
// that decodes re-encodes to exactly the bytes it consumed, and decoding allocates in proportion
// to the input, whatever counts it claims.
#include <tensorplay/rpc/typed.hpp>

#include "fuzz_util.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

using namespace tensorplay;

namespace {

// Whether T holds a std::map: a map's entries may arrive in any order and are re-encoded sorted,
// so its encoding is canonical only after one round.
template <class T>
struct has_map : std::false_type {};
template <class K, class V, class C, class A>
struct has_map<std::map<K, V, C, A>> : std::true_type {};
template <class T, class A>
struct has_map<std::vector<T, A>> : has_map<T> {};
template <class A, class B>
struct has_map<std::pair<A, B>> : std::bool_constant<has_map<A>::value || has_map<B>::value> {};

template <class T>
Bytes encode(const T& v) {
    WireWriter w;
    std::vector<Tensor> tensors;
    Codec<T>::encode(w, v, tensors);
    TP_FUZZ_CHECK(tensors.empty());
    return std::move(w).take();
}

template <class T>
void round_trip(std::span<const std::uint8_t> in) {
    WireReader r(in);
    Result<T> v = fail(Errc::internal, "not decoded");
    {
        fuzz::AllocationBound bound;
        v = Codec<T>::decode(r, {});
        TP_FUZZ_CHECK(bound.within(in.size()));
    }
    if (!v) {
        const Errc c = v.error().code();
        TP_FUZZ_CHECK((c == Errc::protocol_error || c == Errc::type_error) && !v.error().message().empty());
        return;
    }
    TP_FUZZ_CHECK(!r.failed() && r.position() <= in.size());
    const Bytes out = encode(*v);
    TP_FUZZ_CHECK(out.size() == r.position());
    if constexpr (!has_map<T>::value) {
        TP_FUZZ_CHECK(std::equal(out.begin(), out.end(), in.begin()));
    } else {
        // Bytes, not values, are compared: a float NaN is not equal to itself.
        WireReader again(out);
        auto v2 = Codec<T>::decode(again, {});
        TP_FUZZ_CHECK(v2 && again.remaining() == 0 && encode(*v2) == out);
    }
}

// A whole typed request or reply, as a handler or caller reads it: header, values, nothing after.
template <class... Args>
void payload(std::span<const std::uint8_t> in) {
    Message m;
    m.payload.assign(in.begin(), in.end());
    {
        fuzz::AllocationBound bound;
        auto args = detail::decode_args<Args...>(m, "fuzz");
        TP_FUZZ_CHECK(bound.within(in.size()));
        if (args) {
            Message again = std::apply([](const auto&... a) { return detail::encode_args<Args...>(a...); }, *args);
            TP_FUZZ_CHECK(again.payload.size() == m.payload.size());
            if constexpr (!(has_map<Args>::value || ...)) TP_FUZZ_CHECK(again.payload == m.payload);
        }
    }
    using R = std::tuple_element_t<0, std::tuple<Args...>>;
    fuzz::AllocationBound bound;
    auto reply = detail::decode_reply<R>(m, "fuzz", "peer");
    TP_FUZZ_CHECK(bound.within(in.size()));
    if (reply) {
        const Bytes again = detail::encode_reply<R>(&*reply).payload;
        TP_FUZZ_CHECK(again.size() == m.payload.size());
        if constexpr (!has_map<R>::value) TP_FUZZ_CHECK(again == m.payload);
    }
}

using Str = std::string;
template <class T>
using Vec = std::vector<T>;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input input(data, size);
    const std::uint8_t which = input.byte();
    const auto in = input.rest();
    switch (which % 20) {
        case 0: round_trip<bool>(in); break;
        case 1: round_trip<std::int8_t>(in); break;
        case 2: round_trip<std::uint16_t>(in); break;
        case 3: round_trip<std::int32_t>(in); break;
        case 4: round_trip<std::uint64_t>(in); break;
        case 5: round_trip<double>(in); break;
        case 6: round_trip<float>(in); break;
        case 7: round_trip<Str>(in); break;
        case 8: round_trip<Vec<std::int64_t>>(in); break;
        case 9: round_trip<Vec<bool>>(in); break;
        case 10: round_trip<Vec<Str>>(in); break;
        case 11: round_trip<Vec<Vec<std::uint8_t>>>(in); break;
        case 12: round_trip<std::map<Str, std::int64_t>>(in); break;
        case 13: round_trip<std::map<std::int32_t, Vec<Str>>>(in); break;
        case 14: round_trip<std::pair<Str, double>>(in); break;
        case 15: round_trip<Vec<std::pair<Str, Vec<float>>>>(in); break;
        case 16: round_trip<std::map<Str, std::map<Str, Vec<std::pair<bool, Str>>>>>(in); break;
        case 17: payload<std::int64_t, Str>(in); break;
        case 18: payload<Vec<Str>, std::map<Str, double>>(in); break;
        case 19: payload<std::pair<Vec<std::int32_t>, Str>>(in); break;
    }
    return 0;
}
