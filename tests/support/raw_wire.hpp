// Raw peers for hostile tests: a stream of any transport (uv, uds, shm) opened without a
// Connection, on which a test writes whatever bytes it likes (a hello, a frame header that lies,
// half a frame) and sees when the other side closes it.
#pragma once

#include <tensorplay/core/wire.hpp>

#include "core/asio_compat.hpp"
#include "transport/frame.hpp"
#include "transport/transport.hpp"

#include <asio/read.hpp>
#include <asio/write.hpp>

#include <catch2/catch.hpp>

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace tensorplay::test {

/// A frame header as the wire has it (frame.hpp): marker, kind, flags, metadata length, id,
/// payload length. Tests lie in it.
inline Bytes frame_header(std::uint8_t kind, std::uint32_t meta_len, std::uint64_t id, std::uint64_t payload_len,
                          std::uint16_t marker = detail::kFrameMarker) {
    WireWriter w;
    w.u16(marker).u8(kind).u8(0).u32(meta_len).u64(id).u64(payload_len);
    return std::move(w).take();
}

/// Opens a raw stream to `address` with its transport (no handshake).
inline Task<detail::TransportStream> raw_connect(Address address) {
    auto t = detail::transport_for(address);
    REQUIRE(t);
    auto connecting = (*t)->connect(std::move(address));
    auto s = co_await std::move(connecting);
    REQUIRE(s);
    co_return std::move(*s);
}

/// Writes `b` whole: on the socket, or on the stream the transport set up after the handshake
/// (finish_raw), where the peer expects frames.
inline Task<void> raw_write(detail::TransportStream& s, Bytes b) {
    if (s.polled) {
        std::size_t off = 0;
        while (off < b.size()) {
            const iovec v{b.data() + off, b.size() - off};
            auto n = s.polled->write_some(std::span<const iovec>(&v, 1));
            REQUIRE(n);
            off += *n;
            if (*n == 0) REQUIRE(co_await s.polled->wait_writable());
        }
        co_return;
    }
    auto [ec, n] = co_await asio::async_write(s.socket, asio::buffer(b), detail::use_nothrow);
    REQUIRE(!ec);
}

/// Reads a hello (prefix and body) off the raw stream's socket.
inline Task<void> raw_read_hello(detail::TransportStream& s) {
    Bytes prefix(detail::kHelloPrefixSize);
    auto [ec, n] = co_await asio::async_read(s.socket, asio::buffer(prefix), detail::use_nothrow);
    REQUIRE(!ec);
    auto p = detail::decode_hello_prefix(prefix);
    REQUIRE(p);
    Bytes body(p->body_len);
    std::tie(ec, n) = co_await asio::async_read(s.socket, asio::buffer(body), detail::use_nothrow);
    REQUIRE(!ec);
}

/// After the hellos (the other side wrote last): the transport's own setup, as a real client
/// would do it (shm: the rings; we send our setup first). Nothing for other transports.
inline Task<void> finish_raw(detail::TransportStream& s) {
    auto finishing = detail::finish_stream(s, std::chrono::seconds(5), false);
    auto r = co_await std::move(finishing);
    REQUIRE(r);
}

/// Closes our end (the peer sees an orderly end: a FIN, or the rings' socket closing).
inline void raw_close(detail::TransportStream& s) {
    if (s.polled) s.polled->close();
    std::error_code ec;
    s.socket.close(ec);
}

/// Reads (and drops) until the peer closes the raw stream; true then.
inline Task<bool> raw_closed_by_peer(detail::TransportStream& s) {
    Bytes sink(1 << 16);
    if (s.polled) {
        for (;;) {
            auto n = s.polled->read_some(sink);
            if (!n) co_return true;
            if (*n == 0)
                if (auto w = co_await s.polled->wait_readable(); !w) co_return true;
        }
    }
    for (;;) {
        auto [ec, n] = co_await s.socket.async_read_some(asio::buffer(sink), detail::use_nothrow);
        if (ec) co_return true;
    }
}

}  // namespace tensorplay::test
