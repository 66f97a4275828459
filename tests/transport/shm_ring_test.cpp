// The shared-memory byte ring alone: wrap-around, partial writes, checks of a corrupted or bad
// header, and ordering under a real producer thread and consumer thread.
#include "transport/shm/ring.hpp"

#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <cstring>
#include <thread>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_shm_ring_test {

using namespace tensorplay;
using namespace tensorplay::detail::shm;

namespace {

/// A zeroed anonymous mapping standing in for the memfd one.
struct TestMapping {
    explicit TestMapping(std::size_t capacity) : bytes(mapping_bytes(capacity)) {
        base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        REQUIRE(base != MAP_FAILED);
        init_ring(base, capacity);
    }
    ~TestMapping() { ::munmap(base, bytes); }
    std::size_t bytes;
    void* base;
};

std::size_t write_all(RingView& w, const std::uint8_t* p, std::size_t n) {
    iovec v{const_cast<std::uint8_t*>(p), n};
    auto r = w.write(std::span<const iovec>(&v, 1));
    REQUIRE(r);
    return *r;
}

std::uint8_t pattern(std::uint64_t i) { return static_cast<std::uint8_t>((i * 2654435761u) >> 13); }

}  // namespace

TEST_CASE("a ring carries bytes in order across many wrap-arounds", "[shm]") {
    TestMapping m(4096);
    RingView w(m.base, 4096), r(m.base, 4096);
    std::uint64_t sent = 0, got = 0;
    std::vector<std::uint8_t> src(5000), dst(5000);
    // Odd sizes so that writes and reads straddle the end of the ring at every offset.
    for (int round = 0; round < 2000; ++round) {
        const std::size_t n = 1 + (static_cast<std::size_t>(round) * 977) % 3001;
        for (std::size_t i = 0; i < n; ++i) src[i] = pattern(sent + i);
        const std::size_t took = write_all(w, src.data(), n);
        REQUIRE(took == std::min<std::size_t>(n, 4096 - (sent - got)));
        sent += took;
        const std::size_t want = 1 + (static_cast<std::size_t>(round) * 389) % 4096;
        auto k = r.read(std::span<std::uint8_t>(dst.data(), want));
        REQUIRE(k);
        for (std::size_t i = 0; i < *k; ++i) REQUIRE(dst[i] == pattern(got + i));
        got += *k;
    }
    REQUIRE(sent > 1'000'000);  // the ring of 4 KiB wrapped hundreds of times
}

TEST_CASE("a write into a full ring takes what fits, in order, across several iovecs", "[shm]") {
    TestMapping m(4096);
    RingView w(m.base, 4096), r(m.base, 4096);
    std::vector<std::uint8_t> a(3000, 1), b(3000, 2);
    iovec iov[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
    auto n = w.write(iov);
    REQUIRE(n);
    REQUIRE(*n == 4096);
    auto again = w.write(iov);
    REQUIRE(again);
    REQUIRE(*again == 0);
    REQUIRE(*w.free_bytes() == 0);
    std::vector<std::uint8_t> out(8192);
    auto k = r.read(out);
    REQUIRE(k);
    REQUIRE(*k == 4096);
    REQUIRE(out[2999] == 1);
    REQUIRE(out[3000] == 2);
    REQUIRE(out[4095] == 2);
    REQUIRE(*r.readable_bytes() == 0);
    REQUIRE(*w.free_bytes() == 4096);
}

TEST_CASE("positions the peer corrupted are refused with protocol_error", "[shm][fault]") {
    TestMapping m(4096);
    RingView w(m.base, 4096), r(m.base, 4096);
    auto* h = static_cast<RingHeader*>(m.base);
    SECTION("a tail more than a ring ahead of the head") {
        h->tail.store(4097);
        auto k = r.readable_bytes();
        REQUIRE(!k);
        REQUIRE(k.error().code() == Errc::protocol_error);
        std::uint8_t b[8];
        REQUIRE(!r.read(b));
    }
    SECTION("a head past the tail") {
        h->head.store(10);
        auto f = w.free_bytes();
        REQUIRE(!f);
        REQUIRE(f.error().code() == Errc::protocol_error);
        REQUIRE(f.error().message().find("corrupted") != std::string::npos);
    }
}

TEST_CASE("a ring header that does not match its claim is refused, saying which field", "[shm][fault]") {
    TestMapping m(4096);
    auto* h = static_cast<RingHeader*>(m.base);
    REQUIRE(check_ring(m.base, m.bytes, 4096));
    auto refused = [&](std::size_t bytes, std::size_t claim, const char* phrase) {
        auto r = check_ring(m.base, bytes, claim);
        REQUIRE(!r);
        REQUIRE(r.error().code() == Errc::protocol_error);
        INFO(r.error().message());
        REQUIRE(r.error().message().find(phrase) != std::string::npos);
    };
    refused(m.bytes - 4096, 4096, "needs");
    refused(mapping_bytes(8192), 8192, "claimed");
    h->magic = 0;
    refused(m.bytes, 4096, "magic");
    h->magic = kRingMagic;
    h->version = 7;
    refused(m.bytes, 4096, "version");
    h->version = kRingVersion;
    h->tail.store(1);
    refused(m.bytes, 4096, "fresh");
}

TEST_CASE("ring sizes must be powers of two within bounds", "[shm]") {
    REQUIRE(valid_capacity(4096));
    REQUIRE(valid_capacity(std::size_t(2) << 20));
    REQUIRE(!valid_capacity(4095));
    REQUIRE(!valid_capacity(6144));
    REQUIRE(!valid_capacity(2048));
    REQUIRE(!valid_capacity(std::size_t(1) << 31));
    REQUIRE(!valid_capacity(std::size_t(1) << 21, std::size_t(1) << 20));
}

TEST_CASE("a waiting flag is taken once by the side that must ring", "[shm]") {
    std::atomic<std::uint32_t> flag{0};
    REQUIRE(!take_waiter(flag));
    announce_wait(flag);
    REQUIRE(take_waiter(flag));
    REQUIRE(!take_waiter(flag));
}

TEST_CASE("a producer thread and a consumer thread keep every byte in order through a small ring", "[shm]") {
    TestMapping m(4096);
    constexpr std::uint64_t total = 32u << 20;
    std::thread producer([&] {
        RingView w(m.base, 4096);
        std::vector<std::uint8_t> buf(1500);
        std::uint64_t sent = 0;
        while (sent < total) {
            const std::size_t n = std::min<std::uint64_t>(buf.size(), total - sent);
            for (std::size_t i = 0; i < n; ++i) buf[i] = pattern(sent + i);
            std::size_t off = 0;
            while (off < n) {
                iovec v{buf.data() + off, n - off};
                auto k = w.write(std::span<const iovec>(&v, 1));
                if (!k) return;
                off += *k;
            }
            sent += n;
        }
    });
    RingView r(m.base, 4096);
    std::vector<std::uint8_t> out(1000);
    std::uint64_t got = 0, bad = 0;
    while (got < total) {
        auto k = r.read(out);
        REQUIRE(k);
        for (std::size_t i = 0; i < *k; ++i) bad += out[i] != pattern(got + i);
        got += *k;
    }
    producer.join();
    REQUIRE(bad == 0);
    REQUIRE(got == total);
}

}  // namespace tp_shm_ring_test
