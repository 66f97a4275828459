// Tests of Tensor and DType: sizes, wrapping storage, sharing, host allocation.
#include <tensorplay/device/tensor.hpp>

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/device/backend.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_tensor_test {

using namespace tensorplay;

TEST_CASE("element sizes and names of every dtype", "[device][tensor]") {
    CHECK(element_size(DType::uint8) == 1);
    CHECK(element_size(DType::boolean) == 1);
    CHECK(element_size(DType::float16) == 2);
    CHECK(element_size(DType::bfloat16) == 2);
    CHECK(element_size(DType::int32) == 4);
    CHECK(element_size(DType::float32) == 4);
    CHECK(element_size(DType::int64) == 8);
    CHECK(element_size(DType::float64) == 8);
    CHECK(to_string(DType::float32) == "float32");
    CHECK(to_string(DType::boolean) == "bool");
}

TEST_CASE("dtype codes round trip and unknown codes are protocol errors", "[device][tensor]") {
    for (std::uint8_t c = 0; c <= static_cast<std::uint8_t>(DType::boolean); ++c) {
        auto d = dtype_from_code(c);
        REQUIRE(d);
        CHECK(static_cast<std::uint8_t>(*d) == c);
    }
    auto bad = dtype_from_code(200);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code() == Errc::protocol_error);
    CHECK_THAT(bad.error().message(), Catch::Contains("200"));
}

TEST_CASE("a cpu tensor has the shape, size and device asked for", "[device][tensor]") {
    auto t = Tensor::cpu(DType::float32, {3, 4});
    REQUIRE(t.defined());
    CHECK(t.device() == Device::cpu());
    CHECK(t.numel() == 12);
    CHECK(t.nbytes() == 48);
    CHECK(t.bytes().size() == 48);
    CHECK(t.storage()->size() >= 48);
    CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
}

TEST_CASE("a scalar tensor has one element and an empty dimension has none", "[device][tensor]") {
    CHECK(Tensor::cpu(DType::int64, {}).numel() == 1);
    CHECK(Tensor::cpu(DType::int64, {}).nbytes() == 8);
    auto empty_t = Tensor::cpu(DType::int64, {0, 5});
    REQUIRE(empty_t.defined());
    CHECK(empty_t.nbytes() == 0);
}

TEST_CASE("an undefined tensor has no bytes", "[device][tensor]") {
    Tensor t;
    CHECK_FALSE(t.defined());
    CHECK(t.numel() == 0);
    CHECK(t.nbytes() == 0);
    CHECK(t.data() == nullptr);
}

TEST_CASE("copies of a tensor share storage", "[device][tensor]") {
    auto a = Tensor::from_bytes(bytes("hello"));
    auto b = a;
    b.data()[0] = 'j';
    CHECK(to_string(a.bytes()) == "jello");
    CHECK(a.storage() == b.storage());
}

TEST_CASE("from_bytes copies the data into a 1-D uint8 tensor", "[device][tensor]") {
    Bytes src = bytes("abc");
    auto t = Tensor::from_bytes(src);
    src[0] = 'z';
    CHECK(t.dtype() == DType::uint8);
    CHECK(t.shape() == std::vector<std::int64_t>{3});
    CHECK(to_string(t.bytes()) == "abc");
    CHECK(Tensor::from_bytes({}).nbytes() == 0);
}

TEST_CASE("wrap refuses a null storage, a shape larger than the storage and negative dims", "[device][tensor]") {
    auto storage = Tensor::cpu(DType::uint8, {16}).storage();
    auto ok4 = Tensor::wrap(storage, DType::float32, {4});
    REQUIRE(ok4);
    CHECK(ok4->data() == storage->data());

    auto big = Tensor::wrap(storage, DType::float32, {5});
    REQUIRE_FALSE(big);
    CHECK(big.error().code() == Errc::invalid_argument);
    CHECK_THAT(big.error().message(), Catch::Contains("20") && Catch::Contains("16"));

    auto neg = Tensor::wrap(storage, DType::uint8, {-1});
    REQUIRE_FALSE(neg);
    CHECK(neg.error().code() == Errc::invalid_argument);

    auto null = Tensor::wrap(nullptr, DType::uint8, {0});
    REQUIRE_FALSE(null);
    CHECK(null.error().code() == Errc::invalid_argument);
}

TEST_CASE("sizes that overflow are refused, not wrapped around", "[device][tensor]") {
    const std::int64_t huge = std::numeric_limits<std::int64_t>::max();
    auto n = checked_nbytes(DType::float64, std::vector<std::int64_t>{huge, 4});
    REQUIRE_FALSE(n);
    CHECK(n.error().code() == Errc::invalid_argument);
    CHECK_FALSE(Tensor::cpu(DType::float64, {huge, 4}).defined());
    auto e = empty(Device::cpu(), DType::uint8, {huge, huge});
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == Errc::invalid_argument);
}

// A zero dimension after huge ones gives 0 bytes, but the partial product [2^32, 2^31] is past
// int64: numel() of such a tensor overflowed signed arithmetic (UBSan in a live agent). Such a
// shape is refused wherever a tensor is made, so numel() is exact for every tensor.
TEST_CASE("a shape whose partial product passes int64 is refused even when a later dimension is 0", "[device][tensor]") {
    const std::vector<std::int64_t> wide{std::int64_t(1) << 32, std::int64_t(1) << 31, 0};
    auto n = checked_nbytes(DType::uint8, wide);
    REQUIRE_FALSE(n);
    CHECK(n.error().code() == Errc::invalid_argument);
    auto storage = Tensor::cpu(DType::uint8, {16}).storage();
    CHECK_FALSE(Tensor::wrap(storage, DType::uint8, wide));
    CHECK_FALSE(empty(Device::cpu(), DType::uint8, wide));
    const std::vector<std::int64_t> past{(std::int64_t(1) << 62) + 1, 0};  // 8 * (2^62 + 1) bytes
    CHECK_FALSE(checked_nbytes(DType::int64, past));

    // Large dimensions whose products stay in range still work, and numel is exact.
    const std::vector<std::int64_t> fine{std::int64_t(1) << 40, 0, std::int64_t(1) << 20};
    auto z = Tensor::wrap(storage, DType::uint8, fine);
    REQUIRE(z);
    CHECK(z->numel() == 0);
    CHECK(z->nbytes() == 0);
    auto m = Tensor::wrap(storage, DType::int16, {2, 4});
    REQUIRE(m);
    CHECK(m->numel() == 8);
}

TEST_CASE("large cpu tensors are 2 MiB aligned and writable end to end", "[device][tensor]") {
    auto t = Tensor::cpu(DType::uint8, {3 << 20});
    REQUIRE(t.defined());
    CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % (2u << 20) == 0);
    auto span = t.bytes();
    span.front() = 1;
    span.back() = 2;
    CHECK(span.front() == 1);
    CHECK(span.back() == 2);
}

TEST_CASE("a freed large buffer is reused by the next allocation of that size", "[device][tensor]") {
    std::uint8_t* first = nullptr;
    {
        auto t = Tensor::cpu(DType::uint8, {5 << 20});
        REQUIRE(t.defined());
        first = t.data();
        t.data()[0] = 42;
    }
    auto again = Tensor::cpu(DType::uint8, {5 << 20});
    REQUIRE(again.defined());
    CHECK(again.data() == first);
    auto other = Tensor::cpu(DType::uint8, {9 << 20});
    CHECK(other.data() != first);
}

}  // namespace tp_tensor_test
