// Tests of the bounds-checked little-endian wire reader and writer.
#include <tensorplay/core/wire.hpp>

#include <catch2/catch.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_wire_test {

using namespace tensorplay;

TEST_CASE("integers are written little-endian and read back", "[core]") {
    WireWriter w;
    w.u8(0xAB).u16(0x1234).u32(0xDEADBEEF).u64(0x0102030405060708ULL).i64(-5).f64(2.5);
    const Bytes& b = w.data();
    REQUIRE(b[1] == 0x34);
    REQUIRE(b[2] == 0x12);
    REQUIRE(b[3] == 0xEF);
    WireReader r(b);
    REQUIRE(r.u8() == 0xAB);
    REQUIRE(r.u16() == 0x1234);
    REQUIRE(r.u32() == 0xDEADBEEF);
    REQUIRE(r.u64() == 0x0102030405060708ULL);
    REQUIRE(r.i64() == -5);
    REQUIRE(r.f64() == 2.5);
    REQUIRE(r.finish().has_value());
}

TEST_CASE("length-prefixed strings round trip", "[core]") {
    WireWriter w;
    w.str64("/key").str32("value").bytes64(bytes("xyz"));
    WireReader r(w.data());
    REQUIRE(r.str64() == "/key");
    REQUIRE(r.str32() == "value");
    REQUIRE(to_string(r.bytes64()) == "xyz");
    REQUIRE(r.finish());
}

TEST_CASE("a read past the end is a protocol_error, and errors are sticky", "[core]") {
    Bytes b{1, 2, 3};
    WireReader r(b);
    REQUIRE(r.u32() == 0);
    REQUIRE(r.failed());
    REQUIRE(r.error()->code() == Errc::protocol_error);
    REQUIRE(r.u8() == 0);  // sticky: no read succeeds after a failure
    REQUIRE_FALSE(r.status());
}

TEST_CASE("a length larger than the input or the limit is refused before copying", "[core]") {
    WireWriter w;
    w.u64(1ULL << 60);  // claims an exabyte follows
    WireReader r(w.data());
    REQUIRE(r.bytes64().empty());
    REQUIRE(r.error()->code() == Errc::protocol_error);

    WireWriter w2;
    w2.str64("0123456789");
    WireReader r2(w2.data());
    REQUIRE(r2.str64(4, "key").empty());
    REQUIRE(r2.error()->message().find("key length 10 exceeds the limit of 4") != std::string::npos);
}

TEST_CASE("finish reports trailing bytes", "[core]") {
    Bytes b{1, 2};
    WireReader r(b);
    (void)r.u8();
    auto s = r.finish();
    REQUIRE_FALSE(s);
    REQUIRE(s.error().code() == Errc::protocol_error);
}

TEST_CASE("patch_u32 rewrites a length written earlier", "[core]") {
    WireWriter w;
    w.u32(0).u8(9);
    w.patch_u32(0, 77);
    WireReader r(w.data());
    REQUIRE(r.u32() == 77);
}

}  // namespace tp_wire_test
