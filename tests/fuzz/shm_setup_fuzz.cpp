// Fuzzes the receiving side of an shm connection's setup as a hostile same-host peer could drive
// it: a setup message (valid, or with the input's bytes mixed in) sent over a Unix socket in one
// or two pieces, with descriptors of the input's choice on either piece (a ring memfd of some
// size, seals and header, an eventfd, a pipe, /dev/null, an unsealed memfd, a socket; none, or
// more than a setup has), the socket then half-closed or not. SetupReceiver::poll and finish
// either accept a peer end that is what the message claims, or refuse with a clear error; either
// way every descriptor that came in is closed and nothing much is allocated.
#include "fuzz_util.hpp"

#include "transport/shm/ring.hpp"
#include "transport/shm/setup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

using namespace tensorplay;
using namespace tensorplay::detail::shm;

namespace {

/// Open descriptors of this process (a leak shows as a count that grows).
int open_fds() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d)) ++n;
        ::closedir(d);
    }
    return n;
}

bool is_eventfd_nonblocking(int fd) {
    const int fl = ::fcntl(fd, F_GETFL);
    return fl >= 0 && (fl & O_NONBLOCK) != 0;
}

/// A ring memfd as a peer might make it: `capacity` data bytes, the file `delta` pages off the
/// right size, seals from `seal_bits`, its header written properly and then `scribble`d on.
Fd ring_memfd(std::size_t capacity, int delta, std::uint8_t seal_bits, std::span<const std::uint8_t> scribble) {
    Fd fd(::memfd_create("fuzz-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return fd;
    const std::size_t bytes = mapping_bytes(capacity);
    const auto size = static_cast<off_t>(bytes) + off_t{delta} * 4096;
    if (size < 0 || ::ftruncate(fd.get(), size) != 0) return fd;
    if (static_cast<std::size_t>(size) >= kDataOffset) {
        void* p = ::mmap(nullptr, kDataOffset, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
        if (p != MAP_FAILED) {
            init_ring(p, capacity);
            // Pairs of (offset into the header's first 256 bytes, byte).
            for (std::size_t i = 0; i + 1 < scribble.size(); i += 2) static_cast<std::uint8_t*>(p)[scribble[i]] = scribble[i + 1];
            ::munmap(p, kDataOffset);
        }
    }
    int seals = 0;
    if (seal_bits & 1) seals |= F_SEAL_SHRINK;
    if (seal_bits & 2) seals |= F_SEAL_GROW;
    if (seal_bits & 4) seals |= F_SEAL_WRITE;  // (a shared writable mapping of it then fails)
    if (seal_bits & 8) seals |= F_SEAL_SEAL;
    if (seals) (void)::fcntl(fd.get(), F_ADD_SEALS, seals);
    return fd;
}

/// One descriptor of kind `kind` (0: a ring memfd, 1 and 2: eventfds, 3: a pipe, 4: /dev/null,
/// 5: an unsealed memfd of one page, 6: a socket).
Fd make_fd(fuzz::Input& in, std::size_t& ring_capacity) {
    switch (in.byte() % 7) {
        case 0: {
            ring_capacity = std::size_t{4096} << (in.byte() % 4);
            const std::uint8_t shape = in.byte();
            const int delta = (shape & 0x30) == 0x30 ? (shape & 0x40 ? -1 : 1) : 0;  // mostly the right size
            const std::uint8_t seals = (shape & 0x80) ? (shape & 0x0f) : 0x0b;        // mostly as ours: shrink, grow, seal
            return ring_memfd(ring_capacity, delta, seals, in.take(in.byte() % 9 * 2));
        }
        case 1:
        case 2:
            return Fd(::eventfd(0, EFD_CLOEXEC | ((in.byte() & 1) ? EFD_NONBLOCK : 0)));
        case 3: {
            int p[2];
            if (::pipe2(p, O_CLOEXEC) != 0) return Fd();
            ::close(p[1]);
            return Fd(p[0]);
        }
        case 4:
            return Fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
        case 5: {
            Fd fd(::memfd_create("fuzz-plain", MFD_CLOEXEC));
            if (fd) (void)::ftruncate(fd.get(), 4096);
            return fd;
        }
        default: {
            int s[2];
            if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s) != 0) return Fd();
            ::close(s[1]);
            return Fd(s[0]);
        }
    }
}

/// One sendmsg of `bytes` with `fds` (none: a plain send), whole.
bool send_piece(int sock, std::span<const std::uint8_t> bytes, const std::vector<Fd>& fds) {
    std::vector<int> raw;
    for (const Fd& fd : fds) raw.push_back(fd.get());
    return send_with_fds(sock, bytes, raw) == static_cast<ssize_t>(bytes.size());
}

void run(fuzz::Input& in) {
    int s[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, s) != 0) return;
    Fd sender(s[0]), receiver(s[1]);

    // The descriptors (up to 8: more than a setup has is a case too), split between the pieces.
    const std::uint8_t shape = in.byte();
    const std::size_t nfds = shape % 9;
    const bool fds_on_second = (shape & 0x10) != 0;
    const bool half_close = (shape & 0x20) != 0;
    std::size_t ring_capacity = 4096;
    std::vector<Fd> fds;
    for (std::size_t i = 0; i < nfds; ++i)
        if (Fd fd = make_fd(in, ring_capacity)) fds.push_back(std::move(fd));
    const std::size_t max_capacity = std::size_t{4096} << (in.byte() % 5);

    // The message: a valid one for the ring chosen, with the input's bytes xored in.
    SetupMessage msg;
    msg.capacity = ring_capacity;
    std::uint8_t bytes[sizeof msg + 16] = {};
    std::memcpy(bytes, &msg, sizeof msg);
    const auto mix = in.take(sizeof msg);
    for (std::size_t i = 0; i < mix.size(); ++i) bytes[i] ^= mix[i];
    const std::size_t length = sizeof msg + in.byte() % 17;  // (trailing bytes are never read)
    const std::size_t split = in.byte() % (length + 1);  // (0 or the whole length: one piece)

    const std::vector<Fd> none;
    const std::span<const std::uint8_t> all(bytes, length);
    bool sent = false;
    if (split == 0 || split == length) {
        sent = send_piece(sender.get(), all, fds);
    } else {
        sent = send_piece(sender.get(), all.first(split), fds_on_second ? none : fds) &&
               send_piece(sender.get(), all.subspan(split), fds_on_second ? fds : none);
    }
    fds.clear();  // (the receiver has its own copies now)
    if (half_close || !sent) ::shutdown(sender.get(), SHUT_WR);

    SetupReceiver r;
    Result<bool> whole = false;
    {
        fuzz::AllocationBound bound;
        for (int i = 0; i < 4 && whole && !*whole; ++i) whole = r.poll(receiver.get());
        TP_FUZZ_CHECK(bound.within(64));
    }
    if (!whole) {
        const Errc c = whole.error().code();
        TP_FUZZ_CHECK(c == Errc::protocol_error || c == Errc::connection_lost || c == Errc::io_error);
        TP_FUZZ_CHECK(!whole.error().message().empty());
        return;
    }
    if (!*whole) return;  // waiting for the rest: the receiver (and what it holds) goes with the peer
    Result<PeerEnd> end = r.finish(max_capacity);
    if (!end) {
        const Errc c = end.error().code();
        TP_FUZZ_CHECK(c == Errc::protocol_error || c == Errc::io_error);
        TP_FUZZ_CHECK(!end.error().message().empty());
        return;
    }
    // Accepted: a ring within the bound, mapped whole, and two doorbells that never block us.
    TP_FUZZ_CHECK(valid_capacity(end->capacity, max_capacity));
    TP_FUZZ_CHECK(end->outbox.base() != nullptr && end->outbox.bytes() == mapping_bytes(end->capacity));
    TP_FUZZ_CHECK(end->data_bell && end->space_bell);
    TP_FUZZ_CHECK(is_eventfd_nonblocking(end->data_bell.get()) && is_eventfd_nonblocking(end->space_bell.get()));
    TP_FUZZ_CHECK(check_ring(end->outbox.base(), end->outbox.bytes(), end->capacity).has_value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const int before = open_fds();
    {
        fuzz::Input in(data, size);
        run(in);
    }
    // Every descriptor the peer sent is closed, accepted or refused, whole or not.
    TP_FUZZ_CHECK(open_fds() == before);
    return 0;
}
