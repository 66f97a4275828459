// TcpStoreServer and TcpStore: a key-value store over TCP, wire-compatible with PyTorch's c10d TCPStore.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/store/store.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tensorplay {

/// Settings of a TcpStoreServer. Every limit is checked before anything is allocated; a request
/// over a limit (or of an unknown type) closes only the connection that sent it, with a log line
/// (the c10d protocol has no error reply). docs/protocol.md "Store server limits" has the details.
struct TcpStoreServerOptions {
    /// Address to bind; "" = all interfaces (IPv6 [::] dual-stack, falling back to 0.0.0.0).
    std::string host = "";
    /// Port to bind; 0 = an ephemeral port (see TcpStoreServer::port()).
    std::uint16_t port = 0;
    std::size_t max_key_size = 64 * 1024;                 ///< bytes in one key
    std::size_t max_value_size = 64 * 1024 * 1024;        ///< bytes in one value
    std::size_t max_keys_per_request = 131072;            ///< keys in one CHECK/WAIT/MULTI_GET/MULTI_SET
    std::size_t max_request_size = 256 * 1024 * 1024;     ///< bytes of one whole request (MULTI_SET)
    int backlog = 4096;                                   ///< listen backlog (the OS caps it at somaxconn)
    std::size_t max_reply_size = 256 * 1024 * 1024;       ///< bytes of one reply (MULTI_GET, LIST, GET)
    /// Unsent output one connection may have queued before the server stops reading its requests
    /// (until the client has read enough of its replies).
    std::size_t max_queued_output = 4 * 1024 * 1024;
    /// Unsent output past which a connection that is sent watch events or wake-ups without reading
    /// them is closed. One reply or event that starts under max_queued_output may exceed it.
    std::size_t max_queued_output_hard = 16 * 1024 * 1024;
    /// A connection over max_queued_output whose socket takes no byte for this long is closed; 0 = never.
    Duration queued_output_timeout = std::chrono::seconds(60);
    /// Bytes the whole key space may hold (keys, values, and 64 bytes per key); a request that
    /// would pass it closes its connection, as any request over a limit does. 0 = no limit.
    std::size_t max_stored_bytes = std::size_t(4) << 30;
    /// Client connections open at once. One more ends the oldest connection that has not sent a
    /// byte yet, or when every one has, is accepted and closed at once (logged). 0 = no limit.
    std::size_t max_connections = 16384;
    /// Client connections open at once from one IP address (one host cannot take the whole
    /// store); one more is accepted and closed at once. 0 = no limit.
    std::size_t max_connections_per_host = 4096;
};

/// A c10d-compatible TCP store server. It tells each connection's dialect from its first bytes
/// (PyTorch 2.x VALIDATE handshake, or PyTorch 1.13 without one) and serves both on one key space.
/// Thread-safe: all state lives on one strand of the executor it was started on; a blocked WAIT
/// never holds up another connection.
class TP_API TcpStoreServer {
public:
    /// Binds and starts accepting on `executor`. Errors: io_error (bind/listen failed, e.g. the
    /// port is taken), invalid_argument (host does not resolve).
    [[nodiscard]] static Result<std::shared_ptr<TcpStoreServer>> start(Executor executor,
                                                                       TcpStoreServerOptions options = {});
    ~TcpStoreServer();
    TcpStoreServer(const TcpStoreServer&) = delete;
    TcpStoreServer& operator=(const TcpStoreServer&) = delete;

    /// The bound port (the ephemeral one when options.port was 0).
    [[nodiscard]] std::uint16_t port() const noexcept;
    /// The bound address, e.g. "[::]:29500" or "127.0.0.1:41234".
    [[nodiscard]] std::string address() const;
    /// Stops accepting and closes every connection (clients blocked in a wait see the connection
    /// close). Idempotent; callable from any thread; also done by the destructor.
    void stop();
    /// Number of keys stored now (for tests and tools; takes effect on the strand, so it is a snapshot).
    [[nodiscard]] Task<std::size_t> num_keys() const;
    /// Number of open client connections (a snapshot, for tests and tools).
    [[nodiscard]] Task<std::size_t> num_connections() const;

    struct Impl;
    explicit TcpStoreServer(std::shared_ptr<Impl> impl);

private:
    std::shared_ptr<Impl> impl_;
};

/// Which c10d wire dialect a TcpStore client speaks.
enum class TcpStoreDialect {
    /// Detect: TP_STORE_DIALECT (auto|torch2|torch113) when set, else try the torch2 handshake and,
    /// if the server closes the connection on VALIDATE (as PyTorch 1.13/2.0 stores do), reconnect
    /// in torch113 after checking that the server answers a torch113 request.
    automatic,
    torch2,    ///< PyTorch >= 2.3: VALIDATE + PING handshake, APPEND/MULTI_*/CANCEL_WAIT (our server speaks it)
    torch113,  ///< PyTorch 1.13 / 2.0: no handshake; append and multi_* emulated with basic operations
};

/// Settings of a TcpStore client.
struct TcpStoreOptions {
    std::string host = "127.0.0.1";
    std::uint16_t port = 0;
    /// Connect deadline (the server may start later: a refused connect is retried with backoff until
    /// then, with an info log line every few seconds; a host name that does not resolve fails at
    /// once), and the default timeout of get/wait/multi_get and of every other operation.
    Duration timeout = std::chrono::seconds(300);
    /// The wire dialect; an explicit torch2 or torch113 is used as given (TP_STORE_DIALECT is then ignored).
    TcpStoreDialect dialect = TcpStoreDialect::automatic;
    /// >= 0: c10d worker counting: after connecting, ADD "init/" 1 (un-prefixed key, as c10d does).
    int world_size = -1;
    /// With world_size >= 0: wait (up to timeout) until "init/" reaches world_size. Unlike c10d,
    /// where only the master waits, every client that asks for it waits; set it on rank 0 only to
    /// get c10d's behaviour. A timeout is an error (Errc::timeout naming n/world_size), as in 2.x.
    bool wait_for_workers = true;
    std::size_t max_value_size = 64 * 1024 * 1024;  ///< longest value accepted in a reply
};

/// A c10d TCPStore client. User keys go on the wire as "/" + key, like PyTorch's Python TCPStore,
/// so keys interoperate with PyTorch processes. Thread-safe: operations may be awaited from any
/// coroutine on any thread; they run on an internal strand and share one connection (requests
/// without a reply wait are pipelined). A timed-out wait is cancelled on the server (torch2) or the
/// connection is replaced (torch113). When the server goes away every pending and later operation
/// fails with Errc::connection_lost. Cancelling an awaiting caller abandons only its reply.
class TP_API TcpStore final : public Store {
public:
    /// Connects (retrying with backoff until options.timeout), settles the dialect, handshakes
    /// (torch2) and counts workers. Errors: invalid_argument (a host that does not resolve, a bad
    /// TP_STORE_DIALECT), timeout (nothing accepted the connection in time), protocol_error (the
    /// listener is not a tensorplay/c10d store), connection_lost.
    [[nodiscard]] static Task<Result<std::shared_ptr<TcpStore>>> connect(Executor executor, TcpStoreOptions options);
    ~TcpStore() override;
    TcpStore(const TcpStore&) = delete;
    TcpStore& operator=(const TcpStore&) = delete;

    [[nodiscard]] Task<Result<void>> set(std::string key, Bytes value) override;
    [[nodiscard]] Task<Result<Bytes>> get(std::string key) override;
    [[nodiscard]] Task<Result<std::int64_t>> add(std::string key, std::int64_t delta) override;
    [[nodiscard]] Task<Result<Bytes>> compare_set(std::string key, Bytes expected, Bytes desired) override;
    using Store::wait;
    [[nodiscard]] Task<Result<void>> wait(std::vector<std::string> keys, Duration timeout) override;
    [[nodiscard]] Task<Result<bool>> check(std::vector<std::string> keys) override;
    [[nodiscard]] Task<Result<bool>> delete_key(std::string key) override;
    [[nodiscard]] Task<Result<std::int64_t>> num_keys() override;
    /// torch113: emulated with compare_set (atomic; on a real 1.13 server it wakes no waiter of a key it creates).
    [[nodiscard]] Task<Result<void>> append(std::string key, Bytes value) override;
    /// torch113: one WAIT, then the GETs pipelined.
    [[nodiscard]] Task<Result<std::vector<Bytes>>> multi_get(std::vector<std::string> keys) override;
    /// torch113: the SETs pipelined in one write.
    [[nodiscard]] Task<Result<void>> multi_set(std::vector<std::string> keys, std::vector<Bytes> values) override;
    /// True for torch2 (one round trip); false for torch113, where multi_* are emulated (after
    /// connect(), this also tells which dialect automatic detection settled on).
    [[nodiscard]] bool has_extended_api() const noexcept override;
    /// Round trip to the server (torch2 PING; torch113 GETNUMKEYS). Returns the time it took.
    [[nodiscard]] Task<Result<Duration>> ping();

    /// Closes the connection; pending operations fail with Errc::shutdown. Idempotent.
    void close();
    [[nodiscard]] const TcpStoreOptions& options() const noexcept;

    struct Impl;
    explicit TcpStore(std::shared_ptr<Impl> impl);

private:
    std::shared_ptr<Impl> impl_;
};

}  // namespace tensorplay
