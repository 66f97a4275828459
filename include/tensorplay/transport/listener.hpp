// ConnectionListener: listens at an Address of any transport and runs the server side of each
// peer's handshake (the accepting counterpart of Connection::connect).
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/transport/address.hpp>
#include <tensorplay/transport/connection.hpp>

#include <memory>

namespace tensorplay {

namespace detail {
class Listener;
}

/// A listening socket of one transport. Strand-bound: every member must be called on the
/// executor it was made on.
class TP_API ConnectionListener {
public:
    /// Binds and listens at `address` on `ex`: `tcp://host:port` (a numeric host; port 0: a free
    /// one), `uds://name` or `shm://name` (an abstract Unix socket; an empty name: a fresh one,
    /// which address() tells). Errors: invalid_argument (a host that is no IP address), io_error
    /// (the port or name is taken), not_supported (a transport this build lacks).
    [[nodiscard]] static Result<std::unique_ptr<ConnectionListener>> listen(Executor ex, const Address& address);
    ~ConnectionListener();
    ConnectionListener(const ConnectionListener&) = delete;
    ConnectionListener& operator=(const ConnectionListener&) = delete;

    /// Where peers reach it (the port or name it was given filled in).
    [[nodiscard]] const Address& address() const noexcept;
    /// The next peer's connection: accepts it, then runs the handshake (bounded by
    /// limits.handshake_timeout), one peer at a time. A Unix-socket transport admits only peers
    /// of this process's user (others are closed and logged, and the next one is awaited). Errors:
    /// cancelled once close() was called, else the handshake's (as Connection::connect's); the
    /// listener stays usable. When the negotiation chose another transport (`local` offers
    /// several), the connection comes back closed and redirected(): the client reconnects there.
    [[nodiscard]] Task<Result<std::shared_ptr<Connection>>> accept(HelloInfo local, ConnectionLimits limits,
                                                                  HandshakeAuth auth);
    /// As accept() without a key, admitting everyone. (An overload: GCC 12 copies a coroutine's
    /// defaulted class-type argument bitwise.)
    [[nodiscard]] Task<Result<std::shared_ptr<Connection>>> accept(HelloInfo local, ConnectionLimits limits = {});
    /// Stops listening; a pending accept ends with Errc::cancelled.
    void close();

private:
    explicit ConnectionListener(std::unique_ptr<detail::Listener> listener);
    std::unique_ptr<detail::Listener> listener_;
};

}  // namespace tensorplay
