// Private: the transport seam. A Transport (uv = TCP, uds = Unix sockets, shm = shared-memory
// rings; ibv named but not built) listens on an Address and connects to one, giving a byte stream
// that a Connection runs on.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/secret.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/transport/address.hpp>

#include <asio/generic/stream_protocol.hpp>

#include "transport/byte_stream.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

/// A connected stream of some transport, before any handshake.
struct TransportStream {
    asio::generic::stream_protocol::socket socket;
    std::string transport;  ///< the transport's name ("uv", "uds", "shm")
    std::string endpoint;   ///< the peer, for messages ("10.0.0.2:4242", "uds://name (pid 42)")
    /// TCP: TCP_NODELAY is set, and reads may ask TCP_INQ; other streams always read short.
    bool tcp = false;
    /// Set by finish_stream() when the transport's bytes run over something else than `socket`
    /// (shm: rings; `socket` is then closed, the stream holding it). Until then the bytes run over
    /// `socket`: the handshake does, so that a peer is authenticated before anything is set up for it.
    std::unique_ptr<ByteStream> polled = nullptr;
    /// The peer's process as the kernel tells it (SO_PEERCRED: the Unix-socket transports, uds and
    /// shm); -1 when it cannot be known (TCP). cma reads only a peer whose pid is known this way.
    int peer_pid = -1;
};

/// Finishes a stream whose handshake ran on its socket (its transport's Transport::finish),
/// bounded by `timeout`; `buffered`: bytes the reader already took past the handshake. Run per
/// connection, so that a peer slow to finish delays only itself. Nothing when it is done.
[[nodiscard]] Task<Result<void>> finish_stream(TransportStream& stream, Duration timeout, bool receive_first,
                                               std::size_t buffered = 0);

/// A bound, listening socket of one transport. Strand-bound to the executor it was made on.
class Listener {
public:
    virtual ~Listener() = default;
    /// Where peers reach it (the bound port filled in).
    [[nodiscard]] virtual const Address& address() const noexcept = 0;
    /// The next peer that passed this transport's own check (uds: same user, SO_PEERCRED); a peer
    /// that fails it is closed and logged, and accept waits for the next. Errors: the listener was
    /// closed (cancelled), or accepting failed (io_error, after which accepting may go on).
    [[nodiscard]] virtual Task<Result<TransportStream>> accept() = 0;
    /// Stops listening; a pending accept ends with Errc::cancelled.
    virtual void close() = 0;
};

/// How a worker chooses where it listens (the agent's options; environment as TensorPipe's).
struct ListenSpec {
    /// TCP: "host" or "host:port" (TensorPipeRpcBackendOptions::listen_address); empty: the
    /// interface named by TP_SOCKET_IFNAME, else this host name's address, else 127.0.0.1.
    std::string tcp_address;
    /// TCP: the port when tcp_address names none (0: any free one).
    std::uint16_t tcp_port = 0;
    /// A Unix-socket transport (uds, shm): the abstract name to bind; empty: a fresh one.
    std::string name;
};

/// One way of moving bytes between two workers. Thread-safe (immutable).
class Transport {
public:
    virtual ~Transport() = default;
    /// Its name in `_transports` and on the wire.
    [[nodiscard]] virtual std::string_view name() const noexcept = 0;
    /// Default priority (higher wins): shm 200 > uds 150 > uv 0, as torch's agent ranks shm over
    /// uv; uds sits between (a same-host stream without TCP's stack, below shared memory).
    [[nodiscard]] virtual int priority() const noexcept = 0;
    /// Whom it reaches: two sides may use it when their descriptors are equal. uv: "uv" (any
    /// peer with an address); uds and shm: boot id, network namespace and user (an abstract socket
    /// is visible only inside one network namespace, and the accepting side admits its own user
    /// only; shm sets its rings up over such a socket).
    [[nodiscard]] virtual const std::string& domain() const noexcept = 0;
    /// Its streams are TCP: TCP_NODELAY is set and reads may ask TCP_INQ (other streams read short).
    [[nodiscard]] virtual bool tcp() const noexcept { return false; }
    /// Binds and listens on the executor `ex`.
    [[nodiscard]] virtual Result<std::unique_ptr<Listener>> listen(Executor ex, const ListenSpec& spec) const = 0;
    /// Connects to `address` (of this transport's kind) on the awaiting coroutine's executor.
    [[nodiscard]] virtual Task<Result<TransportStream>> connect(Address address) const = 0;
    /// Once the handshake on a stream's socket admitted the peer: a transport whose bytes run over
    /// something else sets it up here, over that socket, and returns it; null (the default): the
    /// socket carries them. `receive_first`: wait for the peer's setup before sending ours (exactly
    /// one side does: the one that wrote the handshake's last message, since the other may have
    /// read ahead). `buffered`: bytes already read past the handshake (none may precede a setup).
    [[nodiscard]] virtual Task<Result<std::unique_ptr<ByteStream>>> finish(TransportStream& stream, Duration timeout,
                                                                          bool receive_first, std::size_t buffered) const;
};

/// Every transport name this library recognises, built or not, in default priority order.
[[nodiscard]] std::span<const std::string_view> known_transports() noexcept;
/// Every channel name recognised (TensorPipe's), in default priority order.
[[nodiscard]] std::span<const std::string_view> known_channels() noexcept;
/// Channels built in (today: basic).
[[nodiscard]] bool channel_available(std::string_view name) noexcept;

/// The transport named `name` ("tcp" is taken as "uv"). invalid_argument for a name nobody
/// knows; not_supported for a recognised one that is not built (shm, ibv).
[[nodiscard]] Result<std::shared_ptr<const Transport>> transport_named(std::string_view name);
/// The transport for an address's kind.
[[nodiscard]] Result<std::shared_ptr<const Transport>> transport_for(const Address& address);

/// The transports to use for `wanted` (`_transports`; nullopt: every one built in), highest
/// priority first. Named but unbuilt ones are left out (logged once); none left is not_supported;
/// an unknown name is invalid_argument.
[[nodiscard]] Result<std::vector<std::shared_ptr<const Transport>>> select_transports(
    const std::optional<std::vector<std::string>>& wanted);
/// The channels to use for `wanted` (`_channels`), highest priority first, as select_transports.
[[nodiscard]] Result<std::vector<std::string>> select_channels(const std::optional<std::vector<std::string>>& wanted);

/// Checks that every name is a recognised transport (resp. channel): invalid_argument naming the
/// first that is not, and the ones that are.
[[nodiscard]] Result<void> check_transport_names(std::span<const std::string> names);
[[nodiscard]] Result<void> check_channel_names(std::span<const std::string> names);

/// "boot id/network namespace inode/uid" of this process: the same-host domain.
[[nodiscard]] std::string same_host_domain();

/// The longest shared key accepted (an option, a variable or a file): a larger "key file" is
/// more likely the wrong file than a key.
inline constexpr std::size_t kMaxAuthKeyBytes = 64 * 1024;

/// Reads a shared key from `path`: the whole file, less trailing newlines (as `$(cat file)` gives
/// it). Errc::invalid_argument naming the file (never its bytes) when it cannot be read, is empty
/// or is larger than kMaxAuthKeyBytes. What it read is wiped from its own buffers.
[[nodiscard]] Result<Secret> read_auth_key_file(const std::string& path);

}  // namespace tensorplay::detail
