// ShmConnection: a byte stream between two processes on one host over a pair of shared-memory
// rings (one per direction), set up over a Unix stream socket whose EOF says the peer is gone.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>

#include "transport/byte_stream.hpp"

#include <asio/local/stream_protocol.hpp>

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace tensorplay::detail::shm {

/// How long a waiter spins before it sleeps on its doorbell: TP_SHM_SPIN_US (microseconds, 0 =
/// never spin, at most 10 s), else 30 us. A bad value is ignored (the default holds).
[[nodiscard]] std::chrono::microseconds spin_from_env();

/// Settings of one shm connection.
struct ShmOptions {
    /// Data bytes of this side's inbox (the ring the peer writes): a power of two, >= 4096.
    std::size_t ring_bytes = std::size_t(2) << 20;
    /// The largest inbox a peer may claim (its ring is mapped here too): a claim over it is
    /// refused (protocol_error). 16 MiB, eight times the default ring.
    std::size_t max_peer_ring_bytes = std::size_t(16) << 20;
    /// Spin this long for bytes or space before sleeping on a doorbell.
    std::chrono::microseconds spin = spin_from_env();
    /// What poll_spin() tells a reader that polls the stream itself (a Connection does, letting
    /// its event loop run between looks, with `spin` 0).
    std::chrono::microseconds reader_spin = spin_from_env();
    /// Bound on establish() (the peer must send its setup within it).
    Duration setup_timeout = std::chrono::seconds(10);
    /// Wait for the peer's setup before sending ours (the accepting side, when the setup follows
    /// a handshake on the same socket: neither side then reads the other's setup as handshake
    /// bytes). False: send first. The two sides may not both wait.
    bool receive_first = false;
};

/// What one connection did (for tests and benchmarks).
struct ShmStats {
    std::uint64_t sleeps = 0;       ///< waits that slept on a doorbell (spinning did not suffice)
    std::uint64_t bells_rung = 0;   ///< doorbells this side rang for the peer
    std::uint64_t idle_bells = 0;   ///< doorbells that woke us to nothing (a peer ringing idly)
    std::uint64_t backoffs = 0;     ///< times too many idle bells made a wait pause (kIdleBells)
};

/// A wait woken by more than this many doorbells with nothing behind them within kIdleWindow, with
/// no bytes or space in between, pauses until the window ends: a peer ringing in a loop costs us a
/// few percent of a core, not one. (An honest peer rings only for bytes or space: at most one of its
/// bells finds nothing, one rung for bytes that the look before our sleep had already found.)
inline constexpr unsigned kIdleBells = 64;
inline constexpr std::chrono::milliseconds kIdleWindow{10};

/// One side of an shm connection. Strand-bound: every call, and the completions of its waits, on
/// the executor of the socket it was established on. Reads and writes never block; the waits
/// spin for `spin`, then sleep on a doorbell the event loop watches, so an idle connection costs
/// no CPU. The peer is gone when the Unix socket ends (EOF, reset: a process that dies closes
/// it): waits then fail with connection_lost, after the bytes it wrote before are read.
class ShmConnection final : public ByteStream {
public:
    /// Both sides call this on their ends of a connected Unix stream socket: each sends its inbox
    /// and doorbells, checks the peer's (protocol_error saying what was wrong: descriptor count,
    /// kinds, sizes, seals, magic), and acknowledges. connection_lost when the peer closes
    /// first (it refused us); timeout after options.setup_timeout.
    [[nodiscard]] static Task<Result<std::unique_ptr<ShmConnection>>> establish(asio::local::stream_protocol::socket socket,
                                                                              ShmOptions options = {});
    ~ShmConnection() override;
    ShmConnection(const ShmConnection&) = delete;
    ShmConnection& operator=(const ShmConnection&) = delete;

    /// Copies as much of `iov` as the peer's inbox has room for (in order, stopping at the first
    /// byte that does not fit); 0 when it is full. connection_lost once the peer is gone or this
    /// side closed; protocol_error when the peer corrupted the ring.
    [[nodiscard]] Result<std::size_t> write_some(std::span<const iovec> iov) override;
    /// Copies up to dst.size() bytes that arrived; 0 when none wait. connection_lost once none
    /// are left and the peer is gone (or this side closed).
    [[nodiscard]] Result<std::size_t> read_some(std::span<std::uint8_t> dst) override;

    /// Completes when read_some will return bytes (or an error). One reader at a time.
    /// Cancellation (terminal, partial): the wait ends with Errc::cancelled.
    [[nodiscard]] Task<Result<void>> wait_readable() override;
    /// Completes when write_some will take at least one byte (or fail). One writer at a time.
    /// Cancellation as wait_readable.
    [[nodiscard]] Task<Result<void>> wait_writable() override;

    /// Ends this side: the peer sees EOF; pending waits end with connection_lost. Idempotent.
    void close() override;
    /// False once closed or the peer is gone.
    [[nodiscard]] bool is_open() const noexcept;
    /// The peer's process id as SO_PEERCRED tells it (for a socketpair: the process that made it).
    [[nodiscard]] int peer_pid() const noexcept;
    [[nodiscard]] ShmStats stats() const noexcept;
    /// Whether the peer is asleep on its doorbell waiting for our bytes (its flag in our outbox:
    /// the event a test of the doorbell waits for).
    [[nodiscard]] bool peer_reader_asleep() const noexcept;
    /// ShmOptions::reader_spin.
    [[nodiscard]] std::chrono::microseconds poll_spin() const noexcept override;
    [[nodiscard]] Executor get_executor() const;

    struct State;

private:
    explicit ShmConnection(std::shared_ptr<State> s) noexcept : s_(std::move(s)) {}
    std::shared_ptr<State> s_;
};

}  // namespace tensorplay::detail::shm
