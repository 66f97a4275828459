// shm connection setup: sealed memfd rings, eventfd doorbells, SCM_RIGHTS, and the peer's checks.
#include "transport/shm/setup.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

namespace tensorplay::detail::shm {

namespace {

Error os_error(std::string what, int err) {
    return Error(Errc::io_error, what + ": " + std::strerror(err), {}, std::error_code(err, std::system_category()));
}

/// Whether `fd` is an eventfd (the kernel names its anonymous inode so).
bool is_eventfd(int fd) {
    char link[64];
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    auto n = ::readlink(path, link, sizeof link - 1);
    if (n < 0) return false;
    link[n] = '\0';
    return std::strcmp(link, "anon_inode:[eventfd]") == 0;
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
    if (this != &o) {
        reset();
        fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
}

void Fd::reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
    if (this != &o) {
        reset();
        base_ = std::exchange(o.base_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

void Mapping::reset() noexcept {
    if (base_) ::munmap(base_, bytes_);
    base_ = nullptr;
    bytes_ = 0;
}

Result<LocalEnd> create_local_end(std::size_t capacity) {
    if (!valid_capacity(capacity))
        return fail(Errc::invalid_argument, "shm ring size " + std::to_string(capacity) +
                                                " is not a power of two between " + std::to_string(kMinRingBytes) +
                                                " and " + std::to_string(kMaxRingBytes));
    LocalEnd end;
    end.capacity = capacity;
    end.memfd = Fd(::memfd_create("tensorplay-shm-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!end.memfd) return fail(os_error("memfd_create", errno));
    const std::size_t bytes = mapping_bytes(capacity);
    if (::ftruncate(end.memfd.get(), static_cast<off_t>(bytes)) != 0) return fail(os_error("ftruncate of the shm ring", errno));
    // Sealed before the peer sees it: the ring's size can never change under a mapping (a shrunk
    // file would turn the peer's next access into SIGBUS).
    if (::fcntl(end.memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        return fail(os_error("sealing the shm ring", errno));
    // Faulted in at once (MAP_POPULATE): a ring faulted as bytes reach it instead cost the rpc
    // benchmark over shm 40% of its calls/s at 16 and 128 calls in flight. A ring is set up only for
    // a peer the handshake admitted, and a peer's is at most max_peer_ring_bytes.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, end.memfd.get(), 0);
    if (p == MAP_FAILED) return fail(os_error("mmap of the shm ring", errno));
    end.inbox = Mapping(p, bytes);
    init_ring(p, capacity);
    end.data_bell = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    end.space_bell = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!end.data_bell || !end.space_bell) return fail(os_error("eventfd", errno));
    return end;
}

ssize_t send_with_fds(int sock, std::span<const std::uint8_t> bytes, std::span<const int> fds) noexcept {
    if (fds.size() > kMaxSentFds) {
        errno = EINVAL;
        return -1;
    }
    iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxSentFds)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (!fds.empty()) {
        std::memset(control, 0, sizeof control);
        mh.msg_control = control;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr* c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    for (;;) {
        const auto n = ::sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0 || errno != EINTR) return n;
    }
}

Result<bool> send_setup(int sock, const SetupMessage& msg, std::span<const int> fds) {
    if (fds.size() > kMaxSentFds) return fail(Errc::invalid_argument, "too many descriptors for one setup message");
    const auto n = send_with_fds(sock, {reinterpret_cast<const std::uint8_t*>(&msg), sizeof msg}, fds);
    if (n == static_cast<ssize_t>(sizeof msg)) return true;
    if (n >= 0) return fail(Errc::io_error, "shm setup message was sent only in part");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    if (errno == EPIPE || errno == ECONNRESET)
        return fail(Errc::connection_lost, std::string("peer closed the socket during shm setup: ") + std::strerror(errno));
    return fail(os_error("sendmsg of the shm setup", errno));
}

Result<bool> SetupReceiver::poll(int sock) {
    while (got_ < sizeof msg_) {
        iovec iov{reinterpret_cast<std::uint8_t*>(&msg_) + got_, sizeof msg_ - got_};
        // Room for more descriptors than a setup carries, so that too many are seen (and closed).
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control;
        mh.msg_controllen = sizeof control;
        auto n = ::recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
            if (errno == ECONNRESET)
                return fail(Errc::connection_lost, "peer reset the socket during shm setup");
            return fail(os_error("recvmsg of the shm setup", errno));
        }
        bool foreign = false;
        for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (std::size_t i = 0; i < k; ++i) {
                    int fd;
                    std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                    fds_.emplace_back(fd);
                }
            } else {
                foreign = true;
            }
        }
        if (mh.msg_flags & MSG_CTRUNC)
            return fail(Errc::protocol_error, "shm setup carried more descriptors than the " + std::to_string(kSetupFds) +
                                                  " a setup has (the rest were dropped)");
        if (foreign) return fail(Errc::protocol_error, "shm setup carried ancillary data other than descriptors");
        if (fds_.size() > kSetupFds)
            return fail(Errc::protocol_error, "shm setup carried " + std::to_string(fds_.size()) + " descriptors, expected " +
                                                  std::to_string(kSetupFds));
        if (n == 0)
            return fail(Errc::connection_lost, "peer closed the socket during shm setup (after " + std::to_string(got_) +
                                                   " of " + std::to_string(sizeof msg_) + " bytes)");
        // (A setup's descriptors come with its first byte: bytes without them are something else.)
        if (got_ == 0 && fds_.empty())
            return fail(Errc::protocol_error, "peer sent " + std::to_string(n) + " bytes without descriptors where its shm setup belongs");
        got_ += static_cast<std::size_t>(n);
    }
    return true;
}

Result<PeerEnd> SetupReceiver::finish(std::size_t max_capacity) {
    return accept_peer_end(msg_, std::move(fds_), max_capacity);
}

Result<PeerEnd> accept_peer_end(const SetupMessage& msg, std::vector<Fd> fds, std::size_t max_capacity) {
    if (msg.magic != kSetupMagic) return fail(Errc::protocol_error, "shm setup message has a bad magic (not a tensorplay peer)");
    if (msg.version != kSetupVersion)
        return fail(Errc::protocol_error, "shm setup version " + std::to_string(msg.version) + " is not supported (this side speaks " +
                                              std::to_string(kSetupVersion) + ")");
    if (msg.fd_count != kSetupFds || fds.size() != kSetupFds)
        return fail(Errc::protocol_error, "shm setup carried " + std::to_string(fds.size()) + " descriptors (it says " +
                                              std::to_string(msg.fd_count) + "), expected " + std::to_string(kSetupFds));
    if (!valid_capacity(msg.capacity, max_capacity))
        return fail(Errc::protocol_error, "shm setup claims a ring of " + std::to_string(msg.capacity) +
                                              " bytes: not a power of two between " + std::to_string(kMinRingBytes) + " and " +
                                              std::to_string(max_capacity));
    const int memfd = fds[0].get();
    struct stat st{};
    if (::fstat(memfd, &st) != 0) return fail(os_error("fstat of the peer's shm ring", errno));
    if (!S_ISREG(st.st_mode)) return fail(Errc::protocol_error, "the peer's shm ring descriptor is not a memory file");
    const std::size_t bytes = mapping_bytes(msg.capacity);
    if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) != bytes)
        return fail(Errc::protocol_error, "the peer's shm ring file is " + std::to_string(st.st_size) + " bytes, but a ring of " +
                                              std::to_string(msg.capacity) + " bytes needs " + std::to_string(bytes));
    const int seals = ::fcntl(memfd, F_GET_SEALS);
    if (seals < 0) return fail(Errc::protocol_error, "the peer's shm ring descriptor is not a sealable memfd");
    if ((seals & F_SEAL_SHRINK) == 0)
        return fail(Errc::protocol_error, "the peer's shm ring is not sealed against shrinking (it could fault our writes)");
    for (std::size_t i = 1; i < kSetupFds; ++i)
        if (!is_eventfd(fds[i].get()))
            return fail(Errc::protocol_error, "descriptor " + std::to_string(i) + " of the shm setup is not an eventfd");
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd, 0);  // (as ours)
    if (p == MAP_FAILED) return fail(os_error("mmap of the peer's shm ring", errno));
    PeerEnd end;
    end.outbox = Mapping(p, bytes);
    end.capacity = msg.capacity;
    if (auto r = check_ring(p, bytes, msg.capacity); !r) return fail(std::move(r).error().context("the peer's shm ring"));
    // Our rings of the peer's doorbells must never block us, whatever flags it made them with.
    for (std::size_t i = 1; i < kSetupFds; ++i) {
        const int fl = ::fcntl(fds[i].get(), F_GETFL);
        if (fl < 0 || ::fcntl(fds[i].get(), F_SETFL, fl | O_NONBLOCK) != 0) return fail(os_error("fcntl of a doorbell", errno));
    }
    end.data_bell = std::move(fds[1]);
    end.space_bell = std::move(fds[2]);
    return end;
}

void ring_bell(int fd) noexcept {
    const std::uint64_t one = 1;
    // EAGAIN: the counter is full, so the sleeper will wake anyway.
    while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

void drain_bell(int fd) noexcept {
    std::uint64_t v;
    while (::read(fd, &v, sizeof v) < 0 && errno == EINTR) {
    }
}

}  // namespace tensorplay::detail::shm
