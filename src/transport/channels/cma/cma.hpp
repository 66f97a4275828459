// The cma primitive: whether this process may read a same-host peer's memory with
// process_vm_readv (identity checks and a live probe), and the chunked read itself.
#pragma once

#include <tensorplay/core/result.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace tensorplay::detail::cma {

/// What decides whether one process may read another's memory. Exchanged between peers at
/// connection setup (each side sends its own).
struct Identity {
    std::string boot_id;  ///< /proc/sys/kernel/random/boot_id: same boot of the same kernel
    std::string pid_ns;   ///< /proc/self/ns/pid link ("pid:[4026531836]"): pids mean the same
    std::string user_ns;  ///< /proc/self/ns/user link: uids and capabilities mean the same
    std::uint32_t uid = 0, euid = 0, gid = 0, egid = 0;
    int pid = -1;
    /// /proc/sys/kernel/yama/ptrace_scope; -1 when Yama is not there (no restriction beyond uid).
    int ptrace_scope = -1;
    bool dumpable = true;        ///< prctl(PR_GET_DUMPABLE): a non-dumpable process refuses readers
    bool cap_sys_ptrace = false; ///< CAP_SYS_PTRACE in the effective set (overrides uid, dumpable, Yama 1-2)
    bool readers_allowed = false; ///< this process called allow_same_user_readers() (Yama scope 1)
};

/// This process's identity. io_error when /proc cannot be read.
[[nodiscard]] Result<Identity> local_identity();

/// Whether `reader` may read `target`'s memory, as far as identities tell (the probe has the last
/// word): same boot id, pid and user namespaces; then CAP_SYS_PTRACE in the reader, or the same
/// real and effective uid and gid on both sides with a dumpable target; and Yama's ptrace_scope:
/// none or 0 allows; 1 allows when the target called allow_same_user_readers() (a parent reading
/// its own child would pass too, but peers are not each other's parents) or the reader has
/// CAP_SYS_PTRACE; 2 only with CAP_SYS_PTRACE; 3 never. not_supported naming the first reason.
[[nodiscard]] Result<void> check_viable(const Identity& reader, const Identity& target);

/// Under Yama ptrace_scope 1, lets any process of the same user read this one's memory
/// (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY); the peers' uid check still applies). Opt-in: it
/// widens who may attach to this process. io_error when the kernel refuses.
[[nodiscard]] Result<void> allow_same_user_readers();

/// A known buffer of this process that a peer reads to prove that process_vm_readv works
/// between them (seccomp, LSMs and containers can forbid it whatever the identities say).
struct ProbeTarget {
    int pid = -1;
    std::uint64_t address = 0;
    std::array<std::uint8_t, 32> expected{};  ///< the buffer's contents (random, fixed per process)
};

/// This process's probe target (the buffer lives as long as the process; a forked child shares
/// its contents and address, with its own pid).
[[nodiscard]] ProbeTarget local_probe_target();

/// Reads `peer`'s probe buffer; true when the bytes match. Any failure (EPERM or ENOSYS from
/// seccomp, EACCES, ESRCH, a mismatch) is false, silently: cma is then not used.
[[nodiscard]] bool probe(const ProbeTarget& peer) noexcept;

/// Whether process `pid` is the one at the other end of the connected socket `fd`, as far as this
/// host's kernel tells: `known_pid` (>= 0) is the peer's pid as the kernel reported it already
/// (SO_PEERCRED of a Unix socket, taken when it connected), which must equal `pid`; otherwise,
/// for a Unix socket its SO_PEERCRED pid must, and for TCP `pid` must hold the socket at the other end (found by the two endpoints in
/// /proc/net/tcp or tcp6, then among /proc/<pid>/fd, which only a process allowed to read
/// `pid`'s memory may list). False whenever it cannot be told. A cma reader checks the pid a
/// peer's offer names with it: without the check a peer could name another process of the same
/// user and have us read that process's memory into its tensors.
[[nodiscard]] bool peer_process_is(int fd, int known_pid, int pid) noexcept;

/// One syscall reads at most this much (a huge read is several calls, each bounded).
inline constexpr std::size_t kDefaultChunk = std::size_t(16) << 20;

/// Reads `len` bytes at `remote_addr` in process `pid` into `dst`, in calls of at most `chunk`
/// bytes, carrying on after partial reads. Errors name pid, address and errno: connection_lost
/// when the process is gone (ESRCH), io_error when the range is not (or no longer) mapped there
/// (EFAULT, also after a partial read), unauthorized for EPERM/EACCES, not_supported for ENOSYS.
/// Never blocks on the peer (the kernel copies, or fails).
[[nodiscard]] Result<void> read(int pid, std::uint64_t remote_addr, std::size_t len, void* dst,
                                std::size_t chunk = kDefaultChunk);

/// A range of the peer's memory.
struct RemoteRange {
    std::uint64_t address = 0;
    std::size_t length = 0;
};

/// Reads the peer's `ranges`, one after another, into `dst` (their lengths summed), in calls of
/// at most IOV_MAX ranges; errors as read().
[[nodiscard]] Result<void> read_ranges(int pid, std::span<const RemoteRange> ranges, void* dst);

}  // namespace tensorplay::detail::cma
