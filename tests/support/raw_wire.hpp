// Raw peers for hostile tests: a stream of any transport (uv, uds, shm) opened without a
// Connection, on which a test writes whatever bytes it likes (a hello, a frame header that lies,
// half a frame) and sees when the other side closes it.
#pragma once

#include <tensorplay/core/wire.hpp>

#include "core/asio_compat.hpp"
#include "transport/connection_ext.hpp"
#include "transport/frame.hpp"
#include "transport/transport.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <catch2/catch.hpp>

#include <sys/socket.h>
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

/// A frame head announcing `payload_len` bytes of payload (none of them): header and metadata
/// (`name`, no tensors).
inline Bytes frame_head(std::uint8_t kind, std::uint64_t id, std::string_view name, std::uint64_t payload_len) {
    WireWriter meta;
    meta.str32(name).u32(0);
    Bytes f = frame_header(kind, static_cast<std::uint32_t>(meta.size()), id, payload_len);
    f.insert(f.end(), meta.data().begin(), meta.data().end());
    return f;
}

/// One blocking send() of all of `b`: the test's event loop (and the peer's, if it shares it)
/// does not run meanwhile.
template <class Socket>
void send_now(Socket& s, const Bytes& b) {
    std::size_t off = 0;
    while (off < b.size()) {
        const ssize_t n = ::send(s.native_handle(), b.data() + off, b.size() - off, MSG_NOSIGNAL);
        REQUIRE(n > 0);
        off += static_cast<std::size_t>(n);
    }
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

/// The server's side of a handshake on a TCP socket that a test accepted itself (the other end of
/// its raw peer): what ConnectionListener::accept runs after its own accept. (Not a coroutine:
/// it may have defaulted arguments.)
inline Task<Result<std::shared_ptr<Connection>>> accept_socket(asio::ip::tcp::socket socket, HelloInfo local,
                                                               ConnectionLimits limits = {}, HandshakeAuth auth = {}) {
    std::error_code ec;
    socket.set_option(asio::ip::tcp::no_delay(true), ec);
    std::string endpoint = "a TCP peer";
    const auto ep = socket.remote_endpoint(ec);
    if (!ec) endpoint = ep.address().to_string() + ":" + std::to_string(ep.port());
    asio::generic::stream_protocol::socket generic(socket.get_executor());
    if (socket.is_open()) {
        const asio::generic::stream_protocol protocol(ep.protocol().family(), IPPROTO_TCP);
        const int fd = socket.release(ec);
        if (!ec) generic.assign(protocol, fd, ec);
    }
    detail::TransportStream stream{std::move(generic), "uv", std::move(endpoint), true, nullptr};
    return detail::accept_stream(std::move(stream), std::move(local), std::move(limits), std::move(auth));
}

/// Writes `b` whole on a socket.
template <class Socket>
Task<void> raw_write(Socket& s, Bytes b) {
    auto [ec, n] = co_await asio::async_write(s, asio::buffer(b), detail::use_nothrow);
    REQUIRE(!ec);
}

/// Writes `b` whole on a raw stream: on its socket, or on the stream the transport set up after the
/// handshake (finish_raw), where the peer expects frames.
inline Task<void> raw_write(detail::TransportStream& s, Bytes b) {
    if (!s.polled) co_return co_await raw_write(s.socket, std::move(b));
    std::size_t off = 0;
    while (off < b.size()) {
        const iovec v{b.data() + off, b.size() - off};
        auto n = s.polled->write_some(std::span<const iovec>(&v, 1));
        REQUIRE(n);
        off += *n;
        if (*n == 0) REQUIRE(co_await s.polled->wait_writable());
    }
}

/// Reads a hello (prefix and body) off a socket.
template <class Socket>
Task<void> raw_read_hello(Socket& s) {
    Bytes prefix(detail::kHelloPrefixSize);
    auto [ec, n] = co_await asio::async_read(s, asio::buffer(prefix), detail::use_nothrow);
    REQUIRE(!ec);
    auto p = detail::decode_hello_prefix(prefix);
    REQUIRE(p);
    Bytes body(p->body_len);
    std::tie(ec, n) = co_await asio::async_read(s, asio::buffer(body), detail::use_nothrow);
    REQUIRE(!ec);
}

/// Reads a hello off a raw stream's socket (the handshake runs there for every transport).
inline Task<void> raw_read_hello(detail::TransportStream& s) { return raw_read_hello(s.socket); }

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

/// Reads (and drops) until the peer closes the socket (a read fails or reaches EOF); true then.
/// (Await it outside Catch's assertion macros: under GCC 12 a co_await inside one hangs.)
template <class Socket>
Task<bool> raw_closed_by_peer(Socket& s) {
    Bytes sink(1 << 16);
    for (;;) {
        auto [ec, n] = co_await s.async_read_some(asio::buffer(sink), detail::use_nothrow);
        if (ec) co_return true;
    }
}

/// raw_closed_by_peer on a raw stream: its socket, or the stream set up after the handshake.
inline Task<bool> raw_closed_by_peer(detail::TransportStream& s) {
    if (!s.polled) co_return co_await raw_closed_by_peer(s.socket);
    Bytes sink(1 << 16);
    for (;;) {
        auto n = s.polled->read_some(sink);
        if (!n) co_return true;
        if (*n == 0)
            if (auto w = co_await s.polled->wait_readable(); !w) co_return true;
    }
}

}  // namespace tensorplay::test
