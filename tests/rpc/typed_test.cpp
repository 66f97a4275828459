// Tests of the typed RPC layer: codec round trips, malformed payloads, define/call over a fake agent.
#include <tensorplay/rpc/typed.hpp>

#include "rpc/fake_agent.hpp"
#include "support/deadline.hpp"

#include <catch2/catch.hpp>

#include <limits>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_typed_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

template <class T>
T round_trip(const T& v, std::vector<Tensor>* tensors_out = nullptr) {
    WireWriter w;
    std::vector<Tensor> tensors;
    Codec<T>::encode(w, v, tensors);
    auto bytes = std::move(w).take();
    WireReader r(bytes);
    auto back = Codec<T>::decode(r, tensors);
    REQUIRE(back);
    REQUIRE(r.finish());
    if (tensors_out) *tensors_out = tensors;
    return *back;
}

template <class T>
Error decode_error(const Bytes& payload, std::vector<Tensor> tensors = {}) {
    WireReader r(payload);
    auto v = Codec<T>::decode(r, tensors);
    REQUIRE_FALSE(v);
    return v.error();
}

}  // namespace

TEST_CASE("arithmetic values round trip at their extremes", "[rpc][typed]") {
    CHECK(round_trip<bool>(true) == true);
    CHECK(round_trip<bool>(false) == false);
    CHECK(round_trip<std::int8_t>(-128) == -128);
    CHECK(round_trip<std::uint16_t>(65535) == 65535);
    CHECK(round_trip<std::int32_t>(std::numeric_limits<std::int32_t>::min()) == std::numeric_limits<std::int32_t>::min());
    CHECK(round_trip<std::int64_t>(std::numeric_limits<std::int64_t>::max()) == std::numeric_limits<std::int64_t>::max());
    CHECK(round_trip<std::uint64_t>(~0ull) == ~0ull);
    CHECK(round_trip<float>(1.5f) == 1.5f);
    CHECK(round_trip<double>(-0.1) == -0.1);
    CHECK(Codec<std::int64_t>::name() == "i64");
    CHECK(Codec<std::uint8_t>::name() == "u8");
    CHECK(Codec<double>::name() == "f64");
}

TEST_CASE("strings, vectors, maps and pairs round trip", "[rpc][typed]") {
    CHECK(round_trip<std::string>("") == "");
    CHECK(round_trip<std::string>(std::string("a\0b", 3)) == std::string("a\0b", 3));
    CHECK(round_trip(std::vector<int>{1, -2, 3}) == std::vector<int>{1, -2, 3});
    CHECK(round_trip(std::vector<double>{}).empty());
    CHECK(round_trip(std::vector<bool>{true, false, true}) == std::vector<bool>{true, false, true});
    CHECK(round_trip(std::vector<std::string>{"x", "", "yz"}) == std::vector<std::string>{"x", "", "yz"});
    std::map<std::string, std::vector<float>> m{{"a", {1.f}}, {"b", {}}, {"c", {2.f, 3.f}}};
    CHECK(round_trip(m) == m);
    CHECK(round_trip(std::pair<int, std::string>{7, "s"}) == std::pair<int, std::string>{7, "s"});
    CHECK(Codec<decltype(m)>::name() == "map<str,vec<f32>>");
}

TEST_CASE("tensors travel beside the payload, not inside it", "[rpc][typed]") {
    auto t = Tensor::from_bytes(bytes("tensor bytes"));
    std::vector<Tensor> tensors;
    auto v = round_trip(std::vector<Tensor>{t, t}, &tensors);
    REQUIRE(tensors.size() == 2);
    REQUIRE(v.size() == 2);
    CHECK(v[1].storage() == t.storage());
    WireWriter w;
    std::vector<Tensor> ts;
    Codec<Tensor>::encode(w, t, ts);
    CHECK(w.size() == 4);  // only the index
}

TEST_CASE("truncated values are protocol errors", "[rpc][typed][fault]") {
    CHECK(decode_error<std::int64_t>(Bytes{1, 2, 3}).code() == Errc::protocol_error);
    WireWriter w;
    w.u64(10).raw(std::string_view("abc"));
    CHECK(decode_error<std::string>(w.data()).code() == Errc::protocol_error);
    CHECK(decode_error<std::vector<std::string>>(Bytes{}).code() == Errc::protocol_error);
}

TEST_CASE("a hostile element count is refused before anything is allocated", "[rpc][typed][fault]") {
    WireWriter w;
    w.u64(std::numeric_limits<std::uint64_t>::max()).u32(0);
    auto e = decode_error<std::vector<std::int64_t>>(w.data());
    CHECK(e.code() == Errc::protocol_error);
    CHECK_THAT(e.message(), Catch::Contains("elements"));
    auto m = decode_error<std::map<int, int>>(w.data());
    CHECK(m.code() == Errc::protocol_error);
    auto s = decode_error<std::vector<std::string>>(w.data());
    CHECK(s.code() == Errc::protocol_error);
}

TEST_CASE("a tensor index past the message's tensors is a protocol error", "[rpc][typed][fault]") {
    WireWriter w;
    w.u32(1);
    auto e = decode_error<Tensor>(w.data(), {Tensor::from_bytes(bytes("x"))});
    CHECK(e.code() == Errc::protocol_error);
    CHECK_THAT(e.message(), Catch::Contains("1 tensor"));
}

TEST_CASE("a bool byte other than 0 or 1 and a repeated map key are refused", "[rpc][typed][fault]") {
    CHECK(decode_error<bool>(Bytes{2}).code() == Errc::type_error);
    WireWriter w;
    w.u64(2).u32(5).u32(1).u32(5).u32(2);
    CHECK(decode_error<std::map<std::int32_t, std::int32_t>>(w.data()).code() == Errc::protocol_error);
}

TEST_CASE("arguments with a wrong signature, trailing bytes or a bad version are refused", "[rpc][typed][fault]") {
    auto m = detail::encode_args(std::int64_t{1}, std::string("s"));
    CHECK(detail::decode_args<std::int64_t, std::string>(m, "h"));
    auto wrong = detail::decode_args<std::int64_t, std::int64_t>(m, "h");
    REQUIRE_FALSE(wrong);
    CHECK(wrong.error().code() == Errc::type_error);
    CHECK_THAT(wrong.error().message(), Catch::Contains("(i64,i64)") && Catch::Contains("(i64,str)"));

    auto extra = m;
    extra.payload.push_back(0);
    auto e = detail::decode_args<std::int64_t, std::string>(extra, "h");
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == Errc::protocol_error);

    auto bad_version = m;
    bad_version.payload[0] = 99;
    auto v = detail::decode_args<std::int64_t, std::string>(bad_version, "h");
    REQUIRE_FALSE(v);
    CHECK(v.error().code() == Errc::protocol_error);

    for (std::size_t cut = 0; cut < m.payload.size(); ++cut) {
        Message t{Bytes(m.payload.begin(), m.payload.begin() + static_cast<std::ptrdiff_t>(cut)), {}};
        auto r = detail::decode_args<std::int64_t, std::string>(t, "h");
        REQUIRE_FALSE(r);
    }
}

TEST_CASE("a typed call reaches a typed handler and returns its value", "[rpc][typed]") {
    test::FakeAgent agent;
    REQUIRE(define<std::int64_t(std::int64_t, std::int64_t)>(agent, "add", [](std::int64_t a, std::int64_t b) {
        return a + b;
    }));
    REQUIRE(define<std::string(const std::string&)>(agent, "who", [](const WorkerInfo& caller, std::string s) {
        return s + " from " + caller.name;
    }));
    REQUIRE(define_inline<std::vector<int>(std::vector<int>)>(agent, "rev", [](std::vector<int> v) {
        std::reverse(v.begin(), v.end());
        return v;
    }));
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto sum = co_await call<std::int64_t>(agent, "peer", "add", std::int64_t{2}, std::int64_t{40});
        REQUIRE(sum);
        CHECK(*sum == 42);
        auto who = co_await call<std::string>(agent, "peer", "who", "hi");
        REQUIRE(who);
        CHECK(*who == std::string("hi from self"));
        // (built first: GCC 12 rejects an initializer list inside a co_await expression)
        std::vector<int> fwd{1, 2, 3};
        auto rev = co_await call_with_timeout<std::vector<int>>(agent, 1.0, "peer", "rev", fwd);
        REQUIRE(rev);
        std::vector<int> expected{3, 2, 1};
        CHECK(*rev == expected);
    });
}

TEST_CASE("coroutine handlers, void results and tensors work through typed calls", "[rpc][typed]") {
    test::FakeAgent agent;
    int touched = 0;
    REQUIRE(define<Tensor(Tensor, std::int32_t)>(agent, "fill", [](Tensor t, std::int32_t v) -> Task<Tensor> {
        for (auto& b : t.bytes()) b = static_cast<std::uint8_t>(v);
        co_return t;
    }));
    REQUIRE(define<void(std::int32_t)>(agent, "touch", [&](std::int32_t v) { touched = v; }));
    REQUIRE(define<std::map<std::string, std::int32_t>()>(agent, "table", []() -> Result<std::map<std::string, std::int32_t>> {
        return std::map<std::string, std::int32_t>{{"a", 1}};
    }));
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto t = Tensor::from_bytes(bytes("abcd"));
        auto filled = co_await call<Tensor>(agent, "peer", "fill", t, std::int32_t{7});
        REQUIRE(filled);
        CHECK(filled->bytes()[3] == 7);
        auto v = co_await call<void>(agent, "peer", "touch", std::int32_t{5});
        REQUIRE(v);
        auto table = co_await call<std::map<std::string, std::int32_t>>(agent, "peer", "table");
        REQUIRE(table);
        CHECK(table->at("a") == 1);
    });
    CHECK(touched == 5);
}

TEST_CASE("handler errors, throws and argument mismatches reach the caller as remote errors", "[rpc][typed][fault]") {
    test::FakeAgent agent;
    REQUIRE(define<std::int32_t(std::int32_t)>(agent, "fails", [](std::int32_t) -> Result<std::int32_t> {
        return fail(Errc::invalid_argument, "no thanks");
    }));
    REQUIRE(define<std::int32_t(std::int32_t)>(agent, "throws", [](std::int32_t) -> std::int32_t {
        throw std::runtime_error("boom");
    }));
    REQUIRE(define<std::int32_t(std::int32_t)>(agent, "coro_throws", [](std::int32_t) -> Task<std::int32_t> {
        throw std::runtime_error("coroutine boom");
        co_return 0;
    }));
    auto again = define<void()>(agent, "fails", [] {});
    REQUIRE_FALSE(again);
    CHECK(again.error().code() == Errc::already_registered);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto a = co_await call<std::int32_t>(agent, "peer", "fails", std::int32_t{1});
        REQUIRE_FALSE(a);
        CHECK(a.error().code() == Errc::remote_error);
        CHECK_THAT(a.error().message(), Catch::Contains("no thanks"));
        auto b = co_await call<std::int32_t>(agent, "peer", "throws", std::int32_t{1});
        REQUIRE_FALSE(b);
        CHECK_THAT(b.error().message(), Catch::Contains("boom"));
        auto c = co_await call<std::int32_t>(agent, "peer", "coro_throws", std::int32_t{1});
        REQUIRE_FALSE(c);
        CHECK_THAT(c.error().message(), Catch::Contains("coroutine boom"));
        auto d = co_await call<std::int32_t>(agent, "peer", "fails", std::int64_t{1});
        REQUIRE_FALSE(d);
        CHECK(d.error().code() == Errc::remote_error);
        CHECK_THAT(d.error().message(), Catch::Contains("(i32)") && Catch::Contains("(i64)"));
    });
}

TEST_CASE("a reply of another type than the call expects is a local type error", "[rpc][typed][fault]") {
    test::FakeAgent agent;
    REQUIRE(define<std::int32_t()>(agent, "one", [] { return 1; }));
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto r = co_await call<double>(agent, "peer", "one");
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::type_error);
        CHECK_THAT(r.error().message(), Catch::Contains("f64") && Catch::Contains("i32") && Catch::Contains("peer"));
        auto unknown = co_await call<double>(agent, "nobody", "one");
        REQUIRE_FALSE(unknown);
        CHECK(unknown.error().code() == Errc::invalid_argument);
    });
}

}  // namespace tp_typed_test
