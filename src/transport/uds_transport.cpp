// The `uds` transport: Unix stream sockets in the abstract namespace. Abstract sockets have no
// file permissions (anyone in the network namespace who knows the name can connect), so the
// accepting side checks the peer's credentials (SO_PEERCRED): only its own user is admitted.
#include "transport/transport.hpp"

#include "transport/unix_socket.hpp"

namespace tensorplay::detail {

namespace {

class UdsListener final : public Listener {
public:
    explicit UdsListener(Executor ex) : acceptor_(std::move(ex)) {}

    Result<void> open() {
        if (auto r = acceptor_.open("uds"); !r) return r;
        address_ = Address::uds(acceptor_.name());
        return ok();
    }

    const Address& address() const noexcept override { return address_; }

    Task<Result<Stream>> accept() override {
        auto accepting = acceptor_.accept("uds");
        auto peer = co_await std::move(accepting);
        if (!peer) co_return fail(std::move(peer).error());
        std::string endpoint = address_.str() + " (pid " + std::to_string(peer->pid) + ")";
        co_return Stream{std::move(peer->socket), "uds", std::move(endpoint), false, nullptr, peer->pid};
    }

    void close() override { acceptor_.close(); }

private:
    AbstractUnixAcceptor acceptor_;
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
        auto connecting = connect_abstract(address.name, address.str());
        auto socket = co_await std::move(connecting);
        if (!socket) co_return fail(std::move(socket).error());
        const int pid = peer_pid_of(*socket);
        co_return Stream{std::move(*socket), "uds", address.str(), false, nullptr, pid};
    }

private:
    std::string domain_ = "uds:" + same_host_domain();
};

}  // namespace

std::shared_ptr<const Transport> make_uds_transport() { return std::make_shared<UdsTransport>(); }

}  // namespace tensorplay::detail
