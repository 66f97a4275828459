// The `shm` transport: per-connection rings in shared memory (ShmConnection), set up over an
// abstract Unix socket whose end is the liveness signal. The listener and its same-user check are
// the uds transport's (unix_socket.hpp). The handshake runs on that socket first; the rings are
// set up after it (finish_stream), so that nothing is mapped for a peer not yet admitted.
#include "transport/transport.hpp"

#include "core/asio_compat.hpp"
#include "transport/unix_socket.hpp"

namespace tensorplay::detail {

namespace {

/// The ShmConnection's settings as a Connection uses them: its reader spins itself, letting the
/// event loop run in between (connection_read.cpp), so the rings' own waits sleep at once.
shm::ShmOptions transport_options(Duration setup_timeout, bool receive_first) {
    shm::ShmOptions o;
    o.spin = std::chrono::microseconds(0);
    o.setup_timeout = setup_timeout;
    o.receive_first = receive_first;
    return o;
}

/// The setup socket as ShmConnection takes it (the same descriptor, as a local socket).
Result<asio::local::stream_protocol::socket> as_local(asio::generic::stream_protocol::socket& s) {
    asio::local::stream_protocol::socket local(s.get_executor());
    std::error_code ec;
    const int fd = s.release(ec);
    if (!ec) local.assign(asio::local::stream_protocol(), fd, ec);
    if (ec) return fail(from_error_code(ec, "taking the shm setup socket"));
    return local;
}

Task<Result<void>> establish(Stream& stream, Duration timeout, bool receive_first) {
    auto local = as_local(stream.socket);
    if (!local) co_return fail(std::move(local).error());
    auto setting_up = shm::ShmConnection::establish(std::move(*local), transport_options(timeout, receive_first));
    auto c = co_await std::move(setting_up);
    if (!c) co_return fail(std::move(c).error().context("shm connection with " + stream.endpoint));
    stream.shm = std::move(*c);
    co_return ok();
}

class ShmListener final : public Listener {
public:
    explicit ShmListener(Executor ex) : acceptor_(std::move(ex)) {}

    Result<void> open() {
        if (auto r = acceptor_.open("shm"); !r) return r;
        address_.kind = Address::Kind::shm;
        address_.name = acceptor_.name();
        return ok();
    }

    const Address& address() const noexcept override { return address_; }

    Task<Result<Stream>> accept() override {
        auto accepting = acceptor_.accept("shm");
        auto peer = co_await std::move(accepting);
        if (!peer) co_return fail(std::move(peer).error());
        std::string endpoint = address_.str() + " (pid " + std::to_string(peer->pid) + ")";
        co_return Stream{std::move(peer->socket), "shm", std::move(endpoint), false, nullptr, peer->pid};
    }

    void close() override { acceptor_.close(); }

private:
    AbstractUnixAcceptor acceptor_;
    Address address_;
};

class ShmTransport final : public Transport {
public:
    std::string_view name() const noexcept override { return "shm"; }
    int priority() const noexcept override { return 200; }
    const std::string& domain() const noexcept override { return domain_; }

    Result<std::unique_ptr<Listener>> listen(Executor ex, const ListenSpec&) const override {
        auto l = std::make_unique<ShmListener>(std::move(ex));
        if (auto r = l->open(); !r) return fail(r.error());
        return std::unique_ptr<Listener>(std::move(l));
    }

    /// (Bounded by the caller's handshake timeout; the rings come after the handshake.)
    Task<Result<Stream>> connect(Address address) const override {
        if (address.kind != Address::Kind::shm)
            co_return fail(Errc::invalid_argument, "the shm transport cannot connect to " + address.str());
        auto connecting = connect_abstract(address.name, address.str());
        auto socket = co_await std::move(connecting);
        if (!socket) co_return fail(std::move(socket).error());
        const int pid = peer_pid_of(*socket);
        co_return Stream{std::move(*socket), "shm", address.str(), false, nullptr, pid};
    }

private:
    std::string domain_ = "shm:" + same_host_domain();
};

}  // namespace

std::shared_ptr<const Transport> make_shm_transport() { return std::make_shared<ShmTransport>(); }

Task<Result<void>> finish_stream(Stream& stream, Duration timeout, bool receive_first) {
    if (stream.transport != "shm" || stream.shm) co_return ok();
    co_return co_await establish(stream, timeout, receive_first);
}

}  // namespace tensorplay::detail
