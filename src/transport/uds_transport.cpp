// The `uds` transport: Unix stream sockets in the abstract namespace. Abstract sockets have no
// file permissions (anyone in the network namespace who knows the name can connect), so the
// accepting side checks the peer's credentials (SO_PEERCRED): only its own user is admitted.
#include "transport/transport.hpp"

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"

#include <asio/local/stream_protocol.hpp>

#include <openssl/rand.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

namespace tensorplay::detail {

namespace {

asio::local::stream_protocol::endpoint abstract_endpoint(const std::string& name) {
    std::string path(1, '\0');
    path += name;  // (Address::parse bounds the name's length)
    return asio::local::stream_protocol::endpoint(path);
}

/// A name nobody else picks: the pid and 8 random bytes.
Result<std::string> fresh_name() {
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

class UdsListener final : public Listener {
public:
    explicit UdsListener(Executor ex) : acceptor_(std::move(ex)) {}

    Result<void> open() {
        auto name = fresh_name();
        if (!name) return fail(name.error());
        std::error_code ec;
        const auto ep = abstract_endpoint(*name);
        acceptor_.open(ep.protocol(), ec);
        if (!ec) acceptor_.bind(ep, ec);
        if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
        if (ec) return fail(from_error_code(ec, "listening on uds://" + *name));
        address_ = Address::uds(std::move(*name));
        return ok();
    }

    const Address& address() const noexcept override { return address_; }

    Task<Result<Stream>> accept() override {
        for (;;) {
            asio::generic::stream_protocol::socket socket(acceptor_.get_executor());
            auto [ec] = co_await acceptor_.async_accept(socket, use_nothrow);
            if (!acceptor_.is_open()) co_return fail(Errc::cancelled, "the Unix socket listener " + address_.str() + " is closed");
            if (ec) co_return fail(from_error_code(ec, "accepting on " + address_.str()));
            ucred cred{};
            socklen_t len = sizeof cred;
            if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) {
                log(LogLevel::warn, "transport", "closing a connection on " + address_.str() + ": SO_PEERCRED failed");
                continue;  // (the socket closes with this scope)
            }
            if (cred.uid != ::geteuid()) {
                log(LogLevel::warn, "transport",
                    "closing a connection on " + address_.str() + " from pid " + std::to_string(cred.pid) + ": it runs as uid " +
                        std::to_string(cred.uid) + ", this worker as uid " + std::to_string(::geteuid()) +
                        " (the uds transport admits its own user only)");
                continue;
            }
            std::string endpoint = address_.str() + " (pid " + std::to_string(cred.pid) + ")";
            co_return Stream{std::move(socket), "uds", std::move(endpoint), false};
        }
    }

    void close() override {
        std::error_code ec;
        acceptor_.close(ec);
    }

private:
    asio::local::stream_protocol::acceptor acceptor_;
    Address address_;
};

class UdsTransport final : public Transport {
public:
    std::string_view name() const noexcept override { return "uds"; }
    int priority() const noexcept override { return 150; }
    const std::string& domain() const noexcept override { return domain_; }

    Result<std::unique_ptr<Listener>> listen(Executor ex, const ListenSpec&) const override {
        auto l = std::make_unique<UdsListener>(std::move(ex));
        if (auto r = l->open(); !r) return fail(r.error());
        return std::unique_ptr<Listener>(std::move(l));
    }

    Task<Result<Stream>> connect(Address address) const override {
        if (address.kind != Address::Kind::uds)
            co_return fail(Errc::invalid_argument, "the uds transport cannot connect to " + address.str());
        auto ex = co_await asio::this_coro::executor;
        asio::generic::stream_protocol::socket socket(ex);
        const asio::generic::stream_protocol::endpoint ep(abstract_endpoint(address.name));
        auto [ec] = co_await socket.async_connect(ep, use_nothrow);
        if (ec) co_return fail(from_error_code(ec, "connecting to " + address.str()));
        co_return Stream{std::move(socket), "uds", address.str(), false};
    }

private:
    std::string domain_ = "uds:" + same_host_domain();
};

}  // namespace

std::shared_ptr<const Transport> make_uds_transport() { return std::make_shared<UdsTransport>(); }

}  // namespace tensorplay::detail
