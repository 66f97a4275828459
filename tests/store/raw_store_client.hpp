// Raw-socket helpers for hostile-client store tests: c10d requests built by hand, bounded reads.
#pragma once

#include <tensorplay/store/tcp_store.hpp>

#include "store/store_test_util.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include <catch2/catch.hpp>

#include <string_view>

namespace tensorplay::test {

using asio::ip::tcp;

/// Little-endian u64 and u64-length-prefixed strings, as c10d puts them on the wire.
inline void put64(Bytes& b, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
inline void put_str(Bytes& b, std::string_view s) {
    put64(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
}
inline void put_blob(Bytes& b, const Bytes& v) {
    put64(b, v.size());
    b.insert(b.end(), v.begin(), v.end());
}
inline std::uint64_t get64(const std::uint8_t* p) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

/// The modern (PyTorch 2.x) VALIDATE handshake; the server then speaks the modern numbering.
inline Bytes validate_bytes() { return Bytes{0x00, 0xCE, 0xF7, 0x85, 0x3C}; }

/// `n` bytes of a pattern that differs per `seed`.
inline Bytes pattern(std::size_t n, std::uint32_t seed) {
    Bytes b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(seed * 131 + i * 7 + (i >> 12));
    return b;
}

/// Connects in place (GCC 12 mishandles a socket returned by value from a coroutine).
inline Task<void> raw_connect(tcp::socket* s, std::uint16_t port) {
    auto [ec] = co_await s->async_connect({asio::ip::make_address("127.0.0.1"), port}, detail::use_nothrow);
    REQUIRE_FALSE(ec);
}

inline Task<void> send_all(tcp::socket& s, const Bytes& b) {
    auto [ec, n] = co_await asio::async_write(s, asio::buffer(b), detail::use_nothrow);
    REQUIRE_FALSE(ec);
    (void)n;
}

/// What a bounded read saw.
struct ReadOutcome {
    Bytes bytes;             ///< the bytes read (all `n` when complete)
    bool complete = false;   ///< all `n` bytes arrived
    bool closed = false;     ///< the peer closed (EOF or reset) first
    bool timed_out = false;  ///< `limit` passed first
};

/// Reads exactly `n` bytes, giving up after `limit`.
inline Task<ReadOutcome> read_within(tcp::socket& s, std::size_t n, Duration limit) {
    ReadOutcome out;
    out.bytes.resize(n);
    asio::steady_timer timer(co_await asio::this_coro::executor, limit);
    using namespace detail::awaitable_ops;
    auto r = co_await (asio::async_read(s, asio::buffer(out.bytes), detail::use_nothrow) ||
                       timer.async_wait(detail::use_nothrow));
    if (r.index() == 1) {
        out.timed_out = true;
        co_return out;
    }
    auto [ec, got] = std::get<0>(r);
    out.bytes.resize(got);
    out.complete = !ec && got == n;
    out.closed = static_cast<bool>(ec);
    co_return out;
}

/// True when the server closes the connection (EOF or reset) within `limit` without sending anything.
inline Task<bool> closed_within(tcp::socket& s, Duration limit) {
    auto r = co_await read_within(s, 1, limit);
    co_return r.closed && r.bytes.empty();
}

/// Polls until the server has `n` connections or `limit` passes; returns the last count seen.
inline Task<std::size_t> wait_for_connections(TcpStoreServer& server, std::size_t n, Duration limit) {
    const auto deadline = Clock::now() + limit;
    std::size_t now = co_await server.num_connections();
    while (now != n && Clock::now() < deadline) {
        co_await pause(std::chrono::milliseconds(20));
        now = co_await server.num_connections();
    }
    co_return now;
}

inline TcpStoreOptions client_options(std::uint16_t port) {
    TcpStoreOptions o;
    o.port = port;
    o.timeout = std::chrono::seconds(10);
    return o;
}

/// Another client still gets served: a fault affected only its own connection.
inline Task<void> require_server_healthy(std::uint16_t port, const char* key_text) {
    const std::string key(key_text);
    auto ex = co_await asio::this_coro::executor;
    auto c = co_await TcpStore::connect(ex, client_options(port));
    CO_REQUIRE(c);
    CO_REQUIRE(co_await (*c)->set(key, bytes("ok")));
    auto v = co_await (*c)->get(key);
    REQUIRE((v && *v == bytes("ok")));
    (*c)->close();
}

constexpr std::size_t kMiB = 1024 * 1024;

}  // namespace tensorplay::test
