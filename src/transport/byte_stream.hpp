// Private: a byte stream that a Connection drives by polling (non-blocking reads and writes, and
// waits for readiness), for transports whose bytes do not run over the socket's reactor path:
// shm's rings today. A Connection on a plain socket (uv, uds) reads and writes that socket
// directly (edge reads, one sendmsg per batch); one on a ByteStream goes through this interface
// only, and never learns which transport made it.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace tensorplay::detail {

class ByteStream {
public:
    virtual ~ByteStream() = default;

    /// Copies up to dst.size() bytes that arrived; 0 when none wait. connection_lost once none
    /// are left and the peer is gone (or this side closed); protocol_error for a corrupt stream.
    [[nodiscard]] virtual Result<std::size_t> read_some(std::span<std::uint8_t> dst) = 0;
    /// Takes as much of `iov` as there is room for, in order; 0 when there is none. Errors as
    /// read_some.
    [[nodiscard]] virtual Result<std::size_t> write_some(std::span<const iovec> iov) = 0;
    /// Completes when read_some will return bytes (or an error). One reader at a time;
    /// cancellation (terminal, partial) ends it with Errc::cancelled.
    [[nodiscard]] virtual Task<Result<void>> wait_readable() = 0;
    /// Completes when write_some will take at least one byte (or fail). One writer at a time.
    [[nodiscard]] virtual Task<Result<void>> wait_writable() = 0;
    /// Ends this side: the peer sees the end; pending waits fail. Idempotent.
    virtual void close() = 0;
    /// How long a reader that finds nothing keeps looking (letting its event loop run between
    /// looks) before it waits: bytes that come within it skip a sleep and a wake-up. 0: wait at once.
    [[nodiscard]] virtual std::chrono::microseconds poll_spin() const noexcept { return {}; }
};

}  // namespace tensorplay::detail
