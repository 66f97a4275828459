// The `uds` transport: Unix stream sockets in the abstract namespace. Abstract sockets have no
// file permissions (anyone in the network namespace who knows the name can connect), so the
// accepting side checks the peer's credentials (SO_PEERCRED): only its own user is admitted.
#include "transport/transport.hpp"

#include "transport/unix_socket.hpp"

namespace tensorplay::detail {

namespace {

class UdsTransport final : public Transport {
public:
    std::string_view name() const noexcept override { return "uds"; }
    int priority() const noexcept override { return 150; }
    const std::string& domain() const noexcept override { return domain_; }

    Result<std::unique_ptr<Listener>> listen(Executor ex, const ListenSpec& spec) const override {
        return listen_abstract(std::move(ex), "uds", "uds", spec);
    }

    Task<Result<TransportStream>> connect(Address address) const override {
        return connect_abstract_stream(std::move(address), "uds");
    }

private:
    std::string domain_ = "uds:" + same_host_domain();
};

}  // namespace

std::shared_ptr<const Transport> make_uds_transport() { return std::make_shared<UdsTransport>(); }

}  // namespace tensorplay::detail
