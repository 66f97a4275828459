// Abstract Unix sockets for the uds and shm transports: names, the same-user listener, connect.
#include "transport/unix_socket.hpp"

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"

#include <asio/this_coro.hpp>

#include <openssl/rand.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

namespace tensorplay::detail {

asio::local::stream_protocol::endpoint abstract_endpoint(const std::string& name) {
    std::string path(1, '\0');
    path += name;  // (Address::parse bounds the name's length)
    return asio::local::stream_protocol::endpoint(path);
}

Result<std::string> fresh_abstract_name() {
    unsigned char r[8];
    if (RAND_bytes(r, sizeof r) != 1) return fail(Errc::io_error, "RAND_bytes failed while naming a Unix socket");
    std::string s = "tensorplay-" + std::to_string(::getpid()) + "-";
    char hex[3];
    for (unsigned char b : r) {
        std::snprintf(hex, sizeof hex, "%02x", b);
        s += hex;
    }
    return s;
}

Result<void> AbstractUnixAcceptor::open(const std::string& url_scheme, const std::string& wanted) {
    Result<std::string> name = wanted;
    if (wanted.empty()) name = fresh_abstract_name();
    if (!name) return fail(name.error());
    // (Address::parse checks a parsed name; one set by hand is checked here, before it is bound.)
    if (name->size() > 106 || name->find('\0') != std::string::npos)
        return fail(Errc::invalid_argument, "cannot listen on " + url_scheme + "://" + *name +
                                                ": a socket name has at most 106 bytes and no NUL");
    std::error_code ec;
    const auto ep = abstract_endpoint(*name);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    url_ = url_scheme + "://" + *name;
    if (ec) return fail(from_error_code(ec, "listening on " + url_));
    name_ = std::move(*name);
    return ok();
}

Task<Result<UnixPeer>> AbstractUnixAcceptor::accept(std::string transport) {  // (by value: a coroutine)
    for (;;) {
        asio::generic::stream_protocol::socket socket(acceptor_.get_executor());
        auto [ec] = co_await acceptor_.async_accept(socket, use_nothrow);
        if (!acceptor_.is_open()) co_return fail(Errc::cancelled, "the Unix socket listener " + url_ + " is closed");
        if (ec) co_return fail(from_error_code(ec, "accepting on " + url_));
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) {
            log(LogLevel::warn, "transport", "closing a connection on " + url_ + ": SO_PEERCRED failed");
            continue;  // (the socket closes with this scope)
        }
        if (cred.uid != ::geteuid()) {
            log(LogLevel::warn, "transport",
                "closing a connection on " + url_ + " from pid " + std::to_string(cred.pid) + ": it runs as uid " +
                    std::to_string(cred.uid) + ", this worker as uid " + std::to_string(::geteuid()) + " (the " + transport +
                    " transport admits its own user only)");
            continue;
        }
        co_return UnixPeer{std::move(socket), static_cast<int>(cred.pid)};
    }
}

void AbstractUnixAcceptor::close() {
    std::error_code ec;
    acceptor_.close(ec);
}

int peer_pid_of(asio::generic::stream_protocol::socket& socket) noexcept {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) return -1;
    return cred.pid > 0 ? static_cast<int>(cred.pid) : -1;
}

Task<Result<asio::generic::stream_protocol::socket>> connect_abstract(std::string name, std::string url) {
    auto ex = co_await asio::this_coro::executor;
    asio::generic::stream_protocol::socket socket(ex);
    const asio::generic::stream_protocol::endpoint ep(abstract_endpoint(name));
    auto [ec] = co_await socket.async_connect(ep, use_nothrow);
    if (ec) co_return fail(from_error_code(ec, "connecting to " + url));
    co_return std::move(socket);
}

namespace {

class AbstractListener final : public Listener {
public:
    AbstractListener(Executor ex, std::string transport) : acceptor_(std::move(ex)), transport_(std::move(transport)) {}

    Result<void> open(std::string scheme, const std::string& name) {
        if (auto r = acceptor_.open(scheme, name); !r) return r;
        address_.scheme = std::move(scheme);
        address_.name = acceptor_.name();
        return ok();
    }

    const Address& address() const noexcept override { return address_; }

    Task<Result<TransportStream>> accept() override {
        auto accepting = acceptor_.accept(transport_);
        auto peer = co_await std::move(accepting);
        if (!peer) co_return fail(std::move(peer).error());
        std::string endpoint = address_.str() + " (pid " + std::to_string(peer->pid) + ")";
        co_return TransportStream{std::move(peer->socket), transport_, std::move(endpoint), false, nullptr, peer->pid};
    }

    void close() override { acceptor_.close(); }

private:
    AbstractUnixAcceptor acceptor_;
    std::string transport_;
    Address address_;
};

}  // namespace

Result<std::unique_ptr<Listener>> listen_abstract(Executor ex, std::string transport, std::string scheme,
                                                 const ListenSpec& spec) {
    auto l = std::make_unique<AbstractListener>(std::move(ex), std::move(transport));
    if (auto r = l->open(std::move(scheme), spec.name); !r) return fail(r.error());
    return std::unique_ptr<Listener>(std::move(l));
}

Task<Result<TransportStream>> connect_abstract_stream(Address address, std::string transport) {
    if (address.transport() != transport)
        co_return fail(Errc::invalid_argument, "the " + transport + " transport cannot connect to " + address.str());
    auto connecting = connect_abstract(address.name, address.str());
    auto socket = co_await std::move(connecting);
    if (!socket) co_return fail(std::move(socket).error());
    const int pid = peer_pid_of(*socket);
    co_return TransportStream{std::move(*socket), std::move(transport), address.str(), false, nullptr, pid};
}

}  // namespace tensorplay::detail
