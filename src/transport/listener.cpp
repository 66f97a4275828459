// ConnectionListener: a transport's listener plus the server side of each handshake (listener.hpp).
#include <tensorplay/transport/listener.hpp>

#include "transport/connection_ext.hpp"
#include "transport/transport.hpp"

namespace tensorplay {

ConnectionListener::ConnectionListener(std::unique_ptr<detail::Listener> listener) : listener_(std::move(listener)) {}

ConnectionListener::~ConnectionListener() {
    if (listener_) listener_->close();
}

Result<std::unique_ptr<ConnectionListener>> ConnectionListener::listen(Executor ex, const Address& address) {
    auto transport = detail::transport_for(address);
    if (!transport) return fail(std::move(transport).error().context("listening on " + address.str()));
    detail::ListenSpec spec;
    if (address.transport() == "uv") {
        if (address.host.empty()) return fail(Errc::invalid_argument, "listening on " + address.str() + ": no host");
        spec.tcp_address = address.host;
        spec.tcp_port = address.port;
    } else {
        spec.name = address.name;
    }
    auto listener = (*transport)->listen(std::move(ex), spec);
    if (!listener) return fail(std::move(listener).error());
    return std::unique_ptr<ConnectionListener>(new ConnectionListener(std::move(*listener)));
}

const Address& ConnectionListener::address() const noexcept { return listener_->address(); }

Task<Result<std::shared_ptr<Connection>>> ConnectionListener::accept(HelloInfo local, ConnectionLimits limits,
                                                                    HandshakeAuth auth) {
    auto accepting = listener_->accept();
    auto stream = co_await std::move(accepting);
    if (!stream) co_return fail(std::move(stream).error());
    // (Named: GCC 12 mis-destroys by-value temporaries of a co_await expression.)
    auto handshake = detail::accept_stream(std::move(*stream), std::move(local), std::move(limits), std::move(auth));
    co_return co_await std::move(handshake);
}

Task<Result<std::shared_ptr<Connection>>> ConnectionListener::accept(HelloInfo local, ConnectionLimits limits) {
    return accept(std::move(local), std::move(limits), HandshakeAuth{});
}

void ConnectionListener::close() { listener_->close(); }

}  // namespace tensorplay
