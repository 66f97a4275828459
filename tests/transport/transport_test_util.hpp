// Test helpers for the transport layer: a connected pair of Connections and a raw-socket peer.
#pragma once

#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"
#include "core/asio_compat.hpp"
#include "support/deadline.hpp"
#include "transport/frame.hpp"

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
    co_return co_await Connection::accept(std::move(s), std::move(hello), limits);
}

struct ConnPair {
    std::shared_ptr<Connection> client, server;
};

/// A client and a server Connection joined over loopback.
inline Task<ConnPair> make_pair(ConnectionLimits limits = {}) {
    using namespace detail::awaitable_ops;
    auto ex = co_await asio::this_coro::executor;
    asio::ip::tcp::acceptor acc(ex, {asio::ip::make_address("127.0.0.1"), 0});
    auto port = acc.local_endpoint().port();
    auto [sv, cl] = co_await (accept_one(acc, hello("server", 1), limits) &&
                              Connection::connect("127.0.0.1", port, hello("client", 0), limits));
    REQUIRE(sv);
    REQUIRE(cl);
    co_return ConnPair{*cl, *sv};
}

/// A raw socket connected to a fresh acceptor, the other end handed to Connection::accept.
struct RawPair {
    asio::ip::tcp::socket raw;
    Task<Result<std::shared_ptr<Connection>>> accepted;
};

inline Task<void> write_raw(asio::ip::tcp::socket& s, Bytes b) {
    auto [ec, n] = co_await asio::async_write(s, asio::buffer(b), detail::use_nothrow);
    REQUIRE(!ec);
}

/// Reads the server's hello off a raw socket.
inline Task<void> read_hello(asio::ip::tcp::socket& s) {
    Bytes prefix(detail::kHelloPrefixSize);
    auto [ec, n] = co_await asio::async_read(s, asio::buffer(prefix), detail::use_nothrow);
    REQUIRE(!ec);
    auto p = detail::decode_hello_prefix(prefix);
    REQUIRE(p);
    Bytes body(p->body_len);
    auto [ec2, n2] = co_await asio::async_read(s, asio::buffer(body), detail::use_nothrow);
    REQUIRE(!ec2);
}

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
