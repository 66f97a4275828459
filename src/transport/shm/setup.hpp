// Setting up an shm connection: each side's inbox (a sealed memfd ring) and doorbells (eventfds),
// the setup message that passes them over a Unix socket with SCM_RIGHTS, and the checks of what
// the peer sent (fd count, fd kinds, sizes by fstat, seals, header magic) before anything is used.
#pragma once

#include <tensorplay/core/result.hpp>

#include "transport/shm/ring.hpp"

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace tensorplay::detail::shm {

/// An owned file descriptor (closed on destruction).
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) noexcept : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    Fd& operator=(Fd&& o) noexcept;
    ~Fd() { reset(); }
    [[nodiscard]] int get() const noexcept { return fd_; }
    [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
    [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
    void reset() noexcept;

private:
    int fd_ = -1;
};

/// An owned shared mapping (unmapped on destruction).
class Mapping {
public:
    Mapping() = default;
    Mapping(void* base, std::size_t bytes) noexcept : base_(base), bytes_(bytes) {}
    Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    Mapping& operator=(Mapping&& o) noexcept;
    ~Mapping() { reset(); }
    [[nodiscard]] void* base() const noexcept { return base_; }
    [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
    void reset() noexcept;

private:
    void* base_ = nullptr;
    std::size_t bytes_ = 0;
};

/// Descriptors in a setup message, in this order.
inline constexpr std::size_t kSetupFds = 3;  // ring memfd, data doorbell, space doorbell
inline constexpr std::uint64_t kSetupMagic = 0x3150555445534d53ull;  // "SMSETUP1" little-endian
inline constexpr std::uint32_t kSetupVersion = 1;
/// The byte each side sends once it has accepted the peer's setup.
inline constexpr std::uint8_t kSetupAck = 0x4b;

/// The bytes of a setup message (host byte order: both ends are on one host).
struct SetupMessage {
    std::uint64_t magic = kSetupMagic;
    std::uint32_t version = kSetupVersion;
    std::uint32_t fd_count = kSetupFds;
    std::uint64_t capacity = 0;  ///< data bytes of the sender's inbox ring
    std::uint64_t reserved = 0;
};
static_assert(sizeof(SetupMessage) == 32);

/// This side's half: the ring it reads (its inbox, which the peer writes) and its doorbells.
/// `data_bell` wakes this side when bytes arrive in its inbox; `space_bell` when space frees up
/// in the peer's inbox (this side's outbox).
struct LocalEnd {
    Fd memfd;
    Mapping inbox;
    std::size_t capacity = 0;
    Fd data_bell;
    Fd space_bell;
};

/// Creates a local end with an inbox of `capacity` data bytes (a sealed memfd, mapped and
/// pre-faulted) and two non-blocking eventfds. io_error naming the call that failed.
[[nodiscard]] Result<LocalEnd> create_local_end(std::size_t capacity);

/// The peer's half as this side uses it: the ring this side writes and the doorbells it rings.
struct PeerEnd {
    Mapping outbox;
    std::size_t capacity = 0;
    Fd data_bell;   ///< rung when this side wrote bytes and the peer sleeps on them
    Fd space_bell;  ///< rung when this side freed space in its inbox and the peer waits for it
};

/// The most descriptors one send_with_fds passes.
inline constexpr std::size_t kMaxSentFds = 8;
/// One non-blocking sendmsg of `bytes` with `fds` (SCM_RIGHTS; none: plain bytes): sendmsg's
/// result (-1 with errno, EINVAL for more than kMaxSentFds descriptors).
[[nodiscard]] ssize_t send_with_fds(int sock, std::span<const std::uint8_t> bytes, std::span<const int> fds) noexcept;
/// Sends `msg` with `fds` in one sendmsg on a non-blocking socket. true: sent; false: the
/// socket would block (wait until writable and call again); an error otherwise.
[[nodiscard]] Result<bool> send_setup(int sock, const SetupMessage& msg, std::span<const int> fds);

/// Receives a setup message in as many reads as it takes, keeping every descriptor that came
/// with it (all are closed if it is refused).
class SetupReceiver {
public:
    /// Reads what the socket holds (never past the message). true: the message is whole; false:
    /// wait until readable and call again. connection_lost at EOF; protocol_error for more
    /// descriptors than a setup carries, or for anything but SCM_RIGHTS.
    [[nodiscard]] Result<bool> poll(int sock);
    /// Checks the whole message and its descriptors and maps the peer's ring; at most
    /// `max_capacity` data bytes are accepted. protocol_error saying what was wrong.
    [[nodiscard]] Result<PeerEnd> finish(std::size_t max_capacity);

private:
    SetupMessage msg_{};
    std::size_t got_ = 0;
    std::vector<Fd> fds_;
};

/// Checks a peer's setup message and its descriptors (what SetupReceiver::finish does).
[[nodiscard]] Result<PeerEnd> accept_peer_end(const SetupMessage& msg, std::vector<Fd> fds, std::size_t max_capacity);

/// Rings an eventfd doorbell (adds 1; a full counter already means "wake").
void ring_bell(int fd) noexcept;
/// Empties an eventfd doorbell's counter.
void drain_bell(int fd) noexcept;

}  // namespace tensorplay::detail::shm
