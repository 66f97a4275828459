// The `uv` transport: TCP (TensorPipe's name, kept for `_transports`). Listening address as
// TensorPipe chooses it: listen_address, else TP_SOCKET_IFNAME's address, else the host name's,
// else 127.0.0.1.
#include "transport/transport.hpp"

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"
#include "core/resolve.hpp"

#include <asio/ip/tcp.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace tensorplay::detail {

namespace {

/// The address of interface `ifname` (IPv4 first), as TensorPipe's TP_SOCKET_IFNAME does.
Result<std::string> interface_address(const std::string& ifname) {
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) != 0) return fail(Errc::io_error, "getifaddrs failed: " + std::string(std::strerror(errno)));
    std::string found;
    for (ifaddrs* a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr || ifname != a->ifa_name) continue;
        char buf[INET6_ADDRSTRLEN] = {};
        if (a->ifa_addr->sa_family == AF_INET) {
            inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
            found = buf;
            break;
        }
        if (a->ifa_addr->sa_family == AF_INET6 && found.empty()) {
            inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf, sizeof buf);
            found = buf;
        }
    }
    freeifaddrs(list);
    if (found.empty())
        return fail(Errc::invalid_argument, "TP_SOCKET_IFNAME=" + ifname + ": no such interface with an IP address");
    return found;
}

/// The address of this host's name, or 127.0.0.1 with a warning.
std::string hostname_address() {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) == 0) {
        addrinfo hints{};
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* res = nullptr;
        if (getaddrinfo(name, nullptr, &hints, &res) == 0 && res) {
            char buf[INET_ADDRSTRLEN] = {};
            inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
            freeaddrinfo(res);
            return buf;
        }
    }
    log(LogLevel::warn, "transport",
        std::string("failed to look up the IP address for the hostname \"") + name + "\", defaulting to 127.0.0.1");
    return "127.0.0.1";
}

class TcpListener final : public Listener {
public:
    explicit TcpListener(Executor ex) : acceptor_(std::move(ex)) {}

    Result<void> open(const ListenSpec& spec) {
        std::string want;
        std::uint16_t want_port = spec.tcp_port;
        const bool explicit_address = !spec.tcp_address.empty();
        if (explicit_address) {
            want = spec.tcp_address;
            if (want.rfind("unix:", 0) == 0)
                return fail(Errc::not_supported, "listen_address \"" + want + "\": Unix socket paths are not supported (the "
                                                                              "uds transport listens in the abstract namespace)");
            if (auto colon = want.rfind(':'); colon != std::string::npos && want.find(':') == colon) {
                auto port_text = want.substr(colon + 1);
                want = want.substr(0, colon);
                char* end = nullptr;
                long p = std::strtol(port_text.c_str(), &end, 10);
                if (port_text.empty() || *end != '\0' || p < 0 || p > 65535)
                    return fail(Errc::invalid_argument, "listen_address has a bad port \"" + port_text + "\"");
                want_port = static_cast<std::uint16_t>(p);
            }
        } else if (const char* ifname = std::getenv("TP_SOCKET_IFNAME"); ifname && *ifname) {
            auto a = interface_address(ifname);
            if (!a) return fail(a.error());
            want = *a;
        } else {
            want = hostname_address();
        }
        std::error_code ec;
        auto addr = asio::ip::make_address(want, ec);
        if (ec) return fail(Errc::invalid_argument, "cannot listen on \"" + want + "\": not an IP address");
        asio::ip::tcp::endpoint ep(addr, want_port);
        acceptor_.open(ep.protocol(), ec);
        if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
        if (!ec) acceptor_.bind(ep, ec);
        if (ec && addr != asio::ip::make_address("127.0.0.1") && !explicit_address) {
            log(LogLevel::warn, "transport", "cannot listen on " + want + " (" + ec.message() + "), defaulting to 127.0.0.1");
            std::error_code ignored;
            acceptor_.close(ignored);
            ep = asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0);
            acceptor_.open(ep.protocol(), ec);
            if (!ec) acceptor_.bind(ep, ec);
        }
        if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
        if (ec) return fail(from_error_code(ec, "listening on " + want));
        auto local = acceptor_.local_endpoint(ec);
        if (ec) return fail(from_error_code(ec, "listening on " + want));
        address_ = Address::tcp(local.address().to_string(), local.port());
        return ok();
    }

    const Address& address() const noexcept override { return address_; }

    Task<Result<TransportStream>> accept() override {
        asio::generic::stream_protocol::socket socket(acceptor_.get_executor());
        auto [ec] = co_await acceptor_.async_accept(socket, use_nothrow);
        if (!acceptor_.is_open()) co_return fail(Errc::cancelled, "the TCP listener at " + address_.where() + " is closed");
        if (ec) co_return fail(from_error_code(ec, "accepting on " + address_.where()));
        std::error_code ignored;
        socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        std::string endpoint = "a TCP peer";
        asio::ip::tcp::socket::endpoint_type ep;
        socklen_t len = static_cast<socklen_t>(ep.capacity());
        if (::getpeername(socket.native_handle(), ep.data(), &len) == 0) {
            ep.resize(len);
            endpoint = ep.address().to_string() + ":" + std::to_string(ep.port());
        }
        co_return TransportStream{std::move(socket), "uv", std::move(endpoint), true};
    }

    void close() override {
        std::error_code ec;
        acceptor_.close(ec);
    }

private:
    asio::ip::tcp::acceptor acceptor_;
    Address address_;
};

class UvTransport final : public Transport {
public:
    std::string_view name() const noexcept override { return "uv"; }
    int priority() const noexcept override { return 0; }
    const std::string& domain() const noexcept override { return domain_; }
    bool tcp() const noexcept override { return true; }

    Result<std::unique_ptr<Listener>> listen(Executor ex, const ListenSpec& spec) const override {
        auto l = std::make_unique<TcpListener>(std::move(ex));
        if (auto r = l->open(spec); !r) return fail(r.error());
        return std::unique_ptr<Listener>(std::move(l));
    }

    Task<Result<TransportStream>> connect(Address address) const override {
        if (address.transport() != name())
            co_return fail(Errc::invalid_argument, "the uv transport cannot connect to " + address.str());
        auto ex = co_await asio::this_coro::executor;
        auto eps = co_await resolve_host(address.host, address.port);  // (a numeric host: at once)
        if (!eps) co_return fail(eps.error());
        std::error_code last = asio::error::host_not_found;
        for (const auto& ep : *eps) {
            asio::generic::stream_protocol::socket socket(ex);
            const asio::generic::stream_protocol::endpoint gep(ep);
            auto [ec] = co_await socket.async_connect(gep, use_nothrow);
            if (ec) {
                last = ec;
                continue;
            }
            std::error_code ignored;
            socket.set_option(asio::ip::tcp::no_delay(true), ignored);
            co_return TransportStream{std::move(socket), "uv", address.where(), true};
        }
        co_return fail(from_error_code(last, "connecting to " + address.where()));
    }

private:
    std::string domain_ = "uv";
};

}  // namespace

std::shared_ptr<const Transport> make_uv_transport() { return std::make_shared<UvTransport>(); }

}  // namespace tensorplay::detail
