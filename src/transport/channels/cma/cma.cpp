// cma: identities, the live probe and chunked process_vm_readv.
#include "transport/channels/cma/cma.hpp"

#include <limits.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

namespace tensorplay::detail::cma {

namespace {

std::atomic<bool> g_readers_allowed{false};

Result<std::string> read_line(const char* path) {
    std::ifstream f(path);
    std::string line;
    if (!f || !std::getline(f, line)) return fail(Errc::io_error, std::string("cannot read ") + path);
    return line;
}

Result<std::string> read_link(const char* path) {
    char buf[256];
    auto n = ::readlink(path, buf, sizeof buf - 1);
    if (n < 0) return fail(Errc::io_error, std::string("cannot read link ") + path + ": " + std::strerror(errno));
    return std::string(buf, static_cast<std::size_t>(n));
}

bool has_cap_sys_ptrace() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("CapEff:", 0) != 0) continue;
        unsigned long long caps = 0;
        std::istringstream(line.substr(7)) >> std::hex >> caps;
        return (caps >> 19) & 1;  // CAP_SYS_PTRACE
    }
    return false;
}

std::string hex(std::uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return b;
}

Error read_error(int err, int pid, std::uint64_t addr, std::size_t len) {
    const std::string where = std::to_string(len) + " bytes at " + hex(addr) + " of process " + std::to_string(pid);
    const std::error_code cause(err, std::system_category());
    const std::string why = std::string(" (") + std::strerror(err) + ")";
    switch (err) {
    case ESRCH:
        return Error(Errc::connection_lost, "cma read of " + where + " failed: the process is gone" + why, {}, cause);
    case EFAULT:
        return Error(Errc::io_error, "cma read of " + where + " failed: the range is not mapped there (its memory went away)" + why,
                     {}, cause);
    case EPERM:
    case EACCES:
        return Error(Errc::unauthorized, "cma read of " + where + " is not permitted" + why, {}, cause);
    case ENOSYS:
        return Error(Errc::not_supported, "cma read of " + where + ": process_vm_readv is not available" + why, {}, cause);
    default:
        return Error(Errc::io_error, "cma read of " + where + " failed" + why, {}, cause);
    }
}

/// Reads `remote` (in order) into dst: per call at most IOV_MAX ranges and about `chunk` bytes
/// (ranges longer than that were split by the caller), resuming where a partial read stopped.
Result<void> read_iov(int pid, std::vector<iovec>& remote, std::uint8_t* dst, std::size_t chunk) {
    std::size_t i = 0;          // first range not wholly read
    std::size_t in_first = 0;   // bytes of remote[i] already read
    while (i < remote.size()) {
        // This call's batch: remote[i] from in_first, then whole ranges while they fit.
        std::vector<iovec> batch;
        std::size_t bytes = 0;
        for (std::size_t k = i; k < remote.size() && batch.size() < static_cast<std::size_t>(IOV_MAX); ++k) {
            iovec v = remote[k];
            if (k == i) {
                v.iov_base = static_cast<std::uint8_t*>(v.iov_base) + in_first;
                v.iov_len -= in_first;
            }
            if (!batch.empty() && bytes + v.iov_len > chunk) break;
            batch.push_back(v);
            bytes += v.iov_len;
        }
        if (bytes == 0) {  // empty ranges only
            i += batch.size();
            in_first = 0;
            continue;
        }
        iovec local{dst, bytes};
        const auto n = ::process_vm_readv(pid, &local, 1, batch.data(), batch.size(), 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return fail(read_error(errno, pid, reinterpret_cast<std::uint64_t>(batch[0].iov_base), bytes));
        }
        if (n == 0)  // nothing read and no error: the first page is not there
            return fail(read_error(EFAULT, pid, reinterpret_cast<std::uint64_t>(batch[0].iov_base), bytes));
        // Advance past what was read (a partial read stops at the first fault; the next call
        // starts there and reports it).
        std::size_t adv = static_cast<std::size_t>(n);
        dst += adv;
        while (adv > 0) {
            const std::size_t rest = remote[i].iov_len - in_first;
            if (adv >= rest) {
                adv -= rest;
                ++i;
                in_first = 0;
            } else {
                in_first += adv;
                adv = 0;
            }
        }
        while (i < remote.size() && remote[i].iov_len == in_first) {
            ++i;
            in_first = 0;
        }
    }
    return ok();
}

}  // namespace

Result<Identity> local_identity() {
    Identity id;
    auto boot = read_line("/proc/sys/kernel/random/boot_id");
    if (!boot) return fail(std::move(boot).error());
    id.boot_id = *boot;
    auto pidns = read_link("/proc/self/ns/pid");
    if (!pidns) return fail(std::move(pidns).error());
    id.pid_ns = *pidns;
    auto userns = read_link("/proc/self/ns/user");
    if (!userns) return fail(std::move(userns).error());
    id.user_ns = *userns;
    id.uid = ::getuid();
    id.euid = ::geteuid();
    id.gid = ::getgid();
    id.egid = ::getegid();
    id.pid = ::getpid();
    if (auto scope = read_line("/proc/sys/kernel/yama/ptrace_scope")) {
        id.ptrace_scope = std::atoi(scope->c_str());
    }
    id.dumpable = ::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1;
    id.cap_sys_ptrace = has_cap_sys_ptrace();
    id.readers_allowed = g_readers_allowed.load();
    return id;
}

Result<void> check_viable(const Identity& reader, const Identity& target) {
    auto no = [](std::string why) { return fail(Errc::not_supported, "cma is not viable: " + why); };
    if (reader.boot_id != target.boot_id) return no("the peer runs on another host or boot (boot ids differ)");
    if (reader.pid_ns != target.pid_ns) return no("the peer is in another pid namespace");
    if (reader.user_ns != target.user_ns) return no("the peer is in another user namespace");
    if (!reader.cap_sys_ptrace) {
        if (reader.uid != target.uid || reader.uid != target.euid || reader.gid != target.gid || reader.gid != target.egid)
            return no("the peer runs as another user or group (uid " + std::to_string(target.uid) + "/" +
                      std::to_string(target.euid) + ", ours " + std::to_string(reader.uid) + ")");
        if (!target.dumpable) return no("the peer is not dumpable (it changed credentials or asked so)");
    }
    switch (reader.ptrace_scope) {
    case -1:
    case 0:
        break;
    case 1:
        if (!reader.cap_sys_ptrace && !target.readers_allowed)
            return no("Yama ptrace_scope is 1 and the peer did not allow same-user readers");
        break;
    case 2:
        if (!reader.cap_sys_ptrace) return no("Yama ptrace_scope is 2 (only CAP_SYS_PTRACE may read other processes)");
        break;
    default:
        return no("Yama ptrace_scope is " + std::to_string(reader.ptrace_scope) + " (reading other processes is disabled)");
    }
    return ok();
}

Result<void> allow_same_user_readers() {
    if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0 && errno != EINVAL)
        return fail(Errc::io_error, std::string("prctl(PR_SET_PTRACER) failed: ") + std::strerror(errno));
    // EINVAL: no Yama in this kernel, nothing to allow.
    g_readers_allowed.store(true);
    return ok();
}

ProbeTarget local_probe_target() {
    static const ProbeTarget contents = [] {
        static std::array<std::uint8_t, 32> buffer{};
        if (::getrandom(buffer.data(), buffer.size(), 0) != static_cast<ssize_t>(buffer.size())) {
            for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<std::uint8_t>(i * 37 + 11);
        }
        ProbeTarget t;
        t.address = reinterpret_cast<std::uint64_t>(buffer.data());
        t.expected = buffer;
        return t;
    }();
    ProbeTarget t = contents;
    t.pid = ::getpid();
    return t;
}

bool probe(const ProbeTarget& peer) noexcept {
    std::array<std::uint8_t, 32> got{};
    iovec local{got.data(), got.size()};
    iovec remote{reinterpret_cast<void*>(peer.address), got.size()};
    ssize_t n;
    do {
        n = ::process_vm_readv(peer.pid, &local, 1, &remote, 1, 0);
    } while (n < 0 && errno == EINTR);
    return n == static_cast<ssize_t>(got.size()) && got == peer.expected;
}

Result<void> read(int pid, std::uint64_t remote_addr, std::size_t len, void* dst, std::size_t chunk) {
    if (len == 0) return ok();
    if (chunk == 0) chunk = kDefaultChunk;
    std::vector<iovec> remote;
    remote.reserve(len / chunk + 1);
    for (std::size_t off = 0; off < len; off += chunk)
        remote.push_back(iovec{reinterpret_cast<void*>(remote_addr + off), std::min(chunk, len - off)});
    return read_iov(pid, remote, static_cast<std::uint8_t*>(dst), chunk);
}

Result<void> read_ranges(int pid, std::span<const RemoteRange> ranges, void* dst) {
    std::vector<iovec> remote;
    remote.reserve(ranges.size());
    for (const auto& r : ranges) {
        // Ranges longer than a chunk are split, so each call stays bounded.
        for (std::size_t off = 0; off < r.length; off += kDefaultChunk)
            remote.push_back(iovec{reinterpret_cast<void*>(r.address + off), std::min(kDefaultChunk, r.length - off)});
    }
    return read_iov(pid, remote, static_cast<std::uint8_t*>(dst), kDefaultChunk);
}

}  // namespace tensorplay::detail::cma
