// Private: what the uds and shm transports share: abstract Unix socket names, one listener that
// admits its own user only (SO_PEERCRED), and connecting.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>

#include <asio/generic/stream_protocol.hpp>
#include <asio/local/stream_protocol.hpp>

#include "transport/transport.hpp"

#include <string>

namespace tensorplay::detail {

/// The endpoint of the abstract socket `name` (without its leading NUL).
[[nodiscard]] asio::local::stream_protocol::endpoint abstract_endpoint(const std::string& name);

/// A name nobody else picks: "tensorplay-<pid>-" and 8 random bytes in hex.
[[nodiscard]] Result<std::string> fresh_abstract_name();

/// A peer accepted on an AbstractUnixAcceptor.
struct UnixPeer {
    asio::generic::stream_protocol::socket socket;
    int pid = -1;  ///< as SO_PEERCRED tells it
};

/// A listening abstract Unix stream socket. Abstract sockets have no file permissions (anyone in
/// the network namespace who knows the name can connect), so accept() admits only peers of this
/// process's user. Strand-bound to its executor.
class AbstractUnixAcceptor {
public:
    explicit AbstractUnixAcceptor(Executor ex) : acceptor_(std::move(ex)) {}
    /// Binds `name` (empty: a fresh one) and listens. `url_scheme` ("uds", "shm") names it in messages.
    [[nodiscard]] Result<void> open(const std::string& url_scheme, const std::string& name);
    /// The bound name.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// The next peer of this user; others are closed and logged ("the `transport` transport admits
    /// its own user only"). cancelled once closed; io_error when accepting failed.
    [[nodiscard]] Task<Result<UnixPeer>> accept(std::string transport);
    void close();

private:
    asio::local::stream_protocol::acceptor acceptor_;
    std::string name_, url_;
};

/// The pid of the process at the other end of a connected Unix socket (SO_PEERCRED), or -1.
[[nodiscard]] int peer_pid_of(asio::generic::stream_protocol::socket& socket) noexcept;

/// Connects a Unix stream socket to the abstract socket `name` on the awaiting coroutine's
/// executor (`url` names it in errors).
[[nodiscard]] Task<Result<asio::generic::stream_protocol::socket>> connect_abstract(std::string name, std::string url);

/// The listener of a Unix-socket transport (uds, shm): an AbstractUnixAcceptor at `spec.name` (or
/// a fresh name), reached at an Address of `scheme`; its streams are of `transport` and carry the
/// peer's pid.
[[nodiscard]] Result<std::unique_ptr<Listener>> listen_abstract(Executor ex, std::string transport, std::string scheme,
                                                                const ListenSpec& spec);

/// Connects to `address` (an abstract socket served by `transport`) as a stream of `transport`,
/// with the peer's pid. invalid_argument for an address another transport serves.
[[nodiscard]] Task<Result<TransportStream>> connect_abstract_stream(Address address, std::string transport);

}  // namespace tensorplay::detail
