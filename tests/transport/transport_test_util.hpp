// Test helpers for the transport layer: a connected pair of Connections and a raw-socket peer.
#pragma once

#include <tensorplay/transport/connection.hpp>
#include <tensorplay/transport/listener.hpp>

#include "transport/connection_ext.hpp"
#include "core/asio_compat.hpp"
#include "support/deadline.hpp"
#include "transport/frame.hpp"
#include "transport/transport.hpp"
#include "support/raw_wire.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

namespace tensorplay::test {

/// A HelloInfo built outside any coroutine (GCC 12 miscompiles initializer lists in coroutine frames).
inline HelloInfo hello(std::string name, int rank) {
    HelloInfo h;
    h.name = std::move(name);
    h.rank = rank;
    return h;
}

inline Task<Result<std::shared_ptr<Connection>>> accept_one(asio::ip::tcp::acceptor& acc, HelloInfo hello,
                                                            ConnectionLimits limits) {
    auto [ec, s] = co_await acc.async_accept(detail::use_nothrow);
    if (ec) co_return fail(from_error_code(ec, "accept"));
    auto accepting = accept_socket(std::move(s), std::move(hello), std::move(limits));
    co_return co_await std::move(accepting);
}

struct ConnPair {
    std::shared_ptr<Connection> client, server;
};

/// A client and a server Connection joined over loopback, as a user joins them: a
/// ConnectionListener and Connection::connect.
inline Task<ConnPair> make_pair(ConnectionLimits limits = {}) {
    using namespace detail::awaitable_ops;
    auto ex = co_await asio::this_coro::executor;
    auto listener = ConnectionListener::listen(ex, Address::tcp("127.0.0.1", 0));
    REQUIRE(listener);
    auto port = (*listener)->address().port;
    auto [sv, cl] = co_await ((*listener)->accept(hello("server", 1), limits) &&
                              Connection::connect("127.0.0.1", port, hello("client", 0), limits));
    REQUIRE(sv);
    REQUIRE(cl);
    co_return ConnPair{*cl, *sv};
}

/// A uint8 tensor of `n` bytes with a pattern that depends on `seed`.
inline Tensor iota_tensor(std::size_t n, std::uint8_t seed) {
    Tensor t = Tensor::cpu(DType::uint8, {static_cast<std::int64_t>(n)});
    for (std::size_t i = 0; i < n; ++i) t.data()[i] = static_cast<std::uint8_t>(i * 7 + seed);
    return t;
}

/// A request frame.
inline Frame request(std::uint64_t id, std::string name, Bytes payload, std::vector<Tensor> tensors = {}) {
    Frame f;
    f.kind = FrameKind::request;
    f.id = id;
    f.name = std::move(name);
    f.payload = std::move(payload);
    f.tensors = std::move(tensors);
    return f;
}

// ---- Over any transport: "uv" (TCP), "uds" or "shm" (the stream_conformance body). ----

/// A HelloInfo that offers `transport` only (with this host's domain for it).
inline HelloInfo hello_over(std::string name, int rank, const std::string& transport) {
    HelloInfo h = hello(std::move(name), rank);
    auto t = detail::transport_named(transport);
    REQUIRE(t);
    h.transports.clear();
    h.transports.push_back(TransportOffer{transport, (*t)->domain(), ""});
    return h;
}

/// A listener of `transport` on the awaiting coroutine's executor (TCP: on 127.0.0.1).
inline Task<std::unique_ptr<detail::Listener>> listen_over(std::string transport) {
    auto t = detail::transport_named(transport);
    REQUIRE(t);
    detail::ListenSpec spec;
    spec.tcp_address = "127.0.0.1";
    auto l = (*t)->listen(co_await asio::this_coro::executor, spec);
    REQUIRE(l);
    co_return std::move(*l);
}

/// The server's side on the next stream `l` accepts: the handshake, then the transport's setup.
inline Task<Result<std::shared_ptr<Connection>>> accept_over(detail::Listener& l, HelloInfo hello, ConnectionLimits limits) {
    auto accepting = l.accept();
    auto stream = co_await std::move(accepting);
    if (!stream) co_return fail(stream.error());
    // (A named task: by-value arguments that are temporaries of a co_await expression are
    // mis-destroyed by GCC 12.)
    auto handshake = detail::accept_stream(std::move(*stream), std::move(hello), std::move(limits), HandshakeAuth{});
    co_return co_await std::move(handshake);
}

/// A client and a server Connection joined over `transport`; `limits` on both sides.
inline Task<ConnPair> make_pair_over(std::string transport, ConnectionLimits limits = {}) {
    using namespace detail::awaitable_ops;
    auto l = co_await listen_over(transport);
    auto accepting = accept_over(*l, hello_over("server", 1, transport), limits);
    auto connecting = Connection::connect(l->address(), hello_over("client", 0, transport), limits, HandshakeAuth{});
    auto [sv, cl] = co_await (std::move(accepting) && std::move(connecting));
    REQUIRE(sv);
    REQUIRE(cl);
    co_return ConnPair{*cl, *sv};
}

/// A raw client of some transport that said a valid hello and did the transport's setup, so that
/// what it writes next is read as frames by the server's Connection.
struct RawPeer {
    std::unique_ptr<detail::Listener> listener;
    detail::TransportStream raw;
    std::shared_ptr<Connection> conn;  ///< the server's side
};

inline Task<void> raw_hello_and_setup(detail::TransportStream& raw, std::string transport) {
    co_await raw_write(raw, detail::encode_hello(hello_over("raw", 7, transport)));
    co_await raw_read_hello(raw);
    co_await finish_raw(raw);
}

inline Task<RawPeer> raw_handshaken_over(std::string transport, ConnectionLimits limits = {}) {
    using namespace detail::awaitable_ops;
    auto listener = co_await listen_over(transport);
    auto accepting = accept_over(*listener, hello_over("server", 0, transport), limits);
    auto raw = co_await raw_connect(listener->address());
    auto conn = co_await (std::move(accepting) && raw_hello_and_setup(raw, transport));
    REQUIRE(conn);
    co_return RawPeer{std::move(listener), std::move(raw), std::move(*conn)};
}

/// A raw socket connected to a fresh acceptor, the other end handed to test::accept_socket.
struct RawPair {
    asio::ip::tcp::socket raw;
    Task<Result<std::shared_ptr<Connection>>> accepted;
};

/// Lets a test await what a FrameSink is told: the sink calls notify() from each of its calls, and
/// until() waits for those calls (not by polling) until its condition holds. One thread: a sink is
/// called only while the awaiting test is suspended, so no notification falls between the check
/// and the wait.
class SinkEvents {
public:
    explicit SinkEvents(asio::any_io_executor ex) : timer_(std::move(ex)) {}
    void notify() { timer_.cancel(); }
    template <class F>
    Task<void> until(F done) {
        while (!done()) {
            timer_.expires_at(asio::steady_timer::time_point::max());
            co_await timer_.async_wait(detail::use_nothrow);
        }
    }

private:
    asio::steady_timer timer_;
};

}  // namespace tensorplay::test
