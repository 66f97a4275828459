// cma::peer_process_is: whether a claimed pid is the process at the other end of a socket.
#include "transport/channels/cma/cma.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace tensorplay::detail::cma {

namespace {

/// An endpoint as /proc/net/tcp{,6} prints it: each 32-bit word of the address as it lies in
/// memory, read as a native integer, in %08X; then the port in %04X.
std::string proc_net_form(const sockaddr_storage& ss) {
    char buf[64] = {};
    auto word = [](const std::uint8_t* p) {
        std::uint32_t w;
        std::memcpy(&w, p, sizeof w);
        return w;
    };
    if (ss.ss_family == AF_INET) {
        const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
        std::snprintf(buf, sizeof buf, "%08X:%04X", word(reinterpret_cast<const std::uint8_t*>(&a.sin_addr)), ntohs(a.sin_port));
    } else {
        const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
        const auto* b = reinterpret_cast<const std::uint8_t*>(&a.sin6_addr);
        std::snprintf(buf, sizeof buf, "%08X%08X%08X%08X:%04X", word(b), word(b + 4), word(b + 8), word(b + 12), ntohs(a.sin6_port));
    }
    return buf;
}

/// The inode of the socket whose local endpoint is `local` and remote `remote`, from `table`
/// (/proc/net/tcp or tcp6); 0 when not listed.
unsigned long long inode_of(const char* table, const std::string& local, const std::string& remote) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // the header
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string sl, l, r, st, queues, timer, retr, uid, timeout;
        unsigned long long inode = 0;
        if (!(in >> sl >> l >> r >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
        if (l == local && r == remote) return inode;
    }
    return 0;
}

/// Whether one of `pid`'s descriptors is the socket with `inode`.
bool holds_socket(int pid, unsigned long long inode) {
    const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* d = ::opendir(dir.c_str());
    if (!d) return false;  // gone, or not ours to look at
    const std::string want = "socket:[" + std::to_string(inode) + "]";
    bool found = false;
    while (const dirent* e = ::readdir(d)) {
        if (e->d_name[0] == '.') continue;
        char target[64];
        const std::string path = dir + "/" + e->d_name;
        const auto n = ::readlink(path.c_str(), target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (want == target) {
            found = true;
            break;
        }
    }
    ::closedir(d);
    return found;
}

}  // namespace

bool peer_process_is(int fd, int known_pid, int pid) noexcept {
    if (pid <= 0) return false;
    if (known_pid >= 0) return known_pid == pid;
    try {
        sockaddr_storage mine{}, theirs{};
        socklen_t ml = sizeof mine, tl = sizeof theirs;
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &ml) != 0) return false;
        if (mine.ss_family == AF_UNIX) {
            ucred cred{};
            socklen_t len = sizeof cred;
            return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof cred && cred.pid == pid;
        }
        if (::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &tl) != 0) return false;
        if (mine.ss_family != theirs.ss_family || (mine.ss_family != AF_INET && mine.ss_family != AF_INET6)) return false;
        // The peer's socket has our remote endpoint as its local one, and ours as its remote.
        const char* table = mine.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6";
        const auto inode = inode_of(table, proc_net_form(theirs), proc_net_form(mine));
        return inode != 0 && holds_socket(pid, inode);
    } catch (...) {
        return false;  // (out of memory reading /proc: cannot be told)
    }
}

}  // namespace tensorplay::detail::cma
