// Large cma reads off the event loop: a 64 MiB process_vm_readv takes some 20 ms here, during
// which an event loop that ran it would serve none of its other connections. Reads of at least
// kCmaOffloadBytes run on a small process-wide pool instead, while the reading coroutine waits.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/tensor.hpp>

#include <cstddef>
#include <cstdint>

namespace tensorplay::detail::cma {

/// Reads of at least this many bytes leave the event loop (smaller ones cost less than the hand-off).
inline constexpr std::size_t kCmaOffloadBytes = std::size_t(4) << 20;

/// As cma::read of `dst.nbytes()` bytes at `remote` in process `pid` into `dst`, on the offload
/// pool; the caller's coroutine resumes on its executor when the read is done. The pool's task
/// holds `dst` until the copy ends, even when the wait is cancelled (operation_aborted, as
/// Errc::shutdown naming the read) and the caller has gone. In a forked child of a process that
/// ran such reads, it reads in place (see cma_offload.cpp).
[[nodiscard]] Task<Result<void>> read_off_loop(int pid, std::uint64_t remote, Tensor dst);

/// Reads run by read_off_loop so far in this process (tests).
[[nodiscard]] std::uint64_t reads_off_loop() noexcept;

}  // namespace tensorplay::detail::cma
