// The `shm` transport: per-connection rings in shared memory (ShmConnection), set up over an
// abstract Unix socket whose end is the liveness signal. The listener and its same-user check are
// shared with the uds transport (unix_socket.hpp). The handshake runs on that socket first; the rings are
// set up after it (Transport::finish), so that nothing is mapped for a peer not yet admitted.
#include "transport/transport.hpp"

#include "core/asio_compat.hpp"
#include "transport/shm/shm_connection.hpp"
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

Task<Result<std::unique_ptr<ByteStream>>> establish(TransportStream& stream, Duration timeout, bool receive_first) {
    auto local = as_local(stream.socket);
    if (!local) co_return fail(std::move(local).error());
    auto setting_up = shm::ShmConnection::establish(std::move(*local), transport_options(timeout, receive_first));
    auto c = co_await std::move(setting_up);
    if (!c) co_return fail(std::move(c).error().context("shm connection with " + stream.endpoint));
    co_return std::unique_ptr<ByteStream>(std::move(*c));
}

class ShmTransport final : public Transport {
public:
    std::string_view name() const noexcept override { return "shm"; }
    int priority() const noexcept override { return 200; }
    const std::string& domain() const noexcept override { return domain_; }

    Result<std::unique_ptr<Listener>> listen(Executor ex, const ListenSpec& spec) const override {
        return listen_abstract(std::move(ex), "shm", "shm", spec);
    }

    /// (Bounded by the caller's handshake timeout; the rings come after the handshake.)
    Task<Result<TransportStream>> connect(Address address) const override {
        return connect_abstract_stream(std::move(address), "shm");
    }

    Task<Result<std::unique_ptr<ByteStream>>> finish(TransportStream& stream, Duration timeout, bool receive_first,
                                                     std::size_t buffered) const override {
        if (buffered > 0)
            co_return fail(Errc::protocol_error, "peer at " + stream.endpoint + " sent " + std::to_string(buffered) +
                                                     " bytes after the handshake, before its shm setup");
        auto setting_up = establish(stream, timeout, receive_first);
        co_return co_await std::move(setting_up);
    }

private:
    std::string domain_ = "shm:" + same_host_domain();
};

}  // namespace

std::shared_ptr<const Transport> make_shm_transport() { return std::make_shared<ShmTransport>(); }

}  // namespace tensorplay::detail
