// Connection: handshake, a buffered frame reader that reads tensor bytes straight into their
// storage, and one writer coroutine that gathers every queued frame into one async_write.
#include <tensorplay/transport/connection.hpp>

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/device/backend.hpp>

#include "core/asio_compat.hpp"
#include "core/resolve.hpp"
#include "transport/edge_read.hpp"
#include "transport/frame.hpp"

#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/ip/address.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace tensorplay {
namespace detail {

namespace {
constexpr std::size_t kReadBufferSize = 256 * 1024;
/// A flushed frame with at most this many tensors may be written by send() itself.
constexpr std::size_t kDirectSendTensors = 14;
/// Reads of at least this many bytes go straight into the destination, bypassing the buffer.
constexpr std::size_t kDirectReadMin = 32 * 1024;

/// One non-blocking sendmsg of `iov`: the bytes written (0 when the socket is full); other
/// failures set `ec`.
std::size_t sendmsg_now(int fd, iovec* iov, std::size_t count, std::error_code& ec) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    for (;;) {
        // One buffer (a small frame, payload inlined): send(), which spares the kernel copying
        // in a msghdr and an iovec array (about 0.1 us per call here).
        ssize_t n = count == 1 ? ::send(fd, iov[0].iov_base, iov[0].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL)
                               : ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0) return static_cast<std::size_t>(n);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) ec = std::error_code(errno, asio::error::get_system_category());
        return 0;
    }
}

/// One non-blocking sendmsg of as many buffers as one call takes (IOV_MAX). Writing before
/// handing the rest to the event loop saves a submission round trip on the latency path.
std::size_t try_write_now(asio::ip::tcp::socket& sock, const std::vector<asio::const_buffer>& bufs,
                          std::vector<iovec>& iov, std::error_code& ec) {
    iov.clear();
    for (const auto& b : bufs) {
        if (iov.size() == IOV_MAX) break;
        iov.push_back(iovec{const_cast<void*>(b.data()), b.size()});
    }
    return sendmsg_now(sock.native_handle(), iov.data(), iov.size(), ec);
}

/// Completion condition for async_read/async_write: all of it, and all of the rest in every
/// system call. (Asio's transfer_all caps each call at 64 KiB: a 64 MiB tensor took 1024 passes
/// through the event loop, one epoll_wait each.)
struct TransferRest {
    std::size_t total;
    std::size_t operator()(const std::error_code& ec, std::size_t done) const { return ec ? 0 : total - done; }
};

/// Drops the first `n` bytes of a buffer sequence.
void consume(std::vector<asio::const_buffer>& bufs, std::size_t n) {
    std::size_t i = 0;
    while (i < bufs.size() && n >= bufs[i].size()) {
        n -= bufs[i].size();
        ++i;
    }
    bufs.erase(bufs.begin(), bufs.begin() + static_cast<std::ptrdiff_t>(i));
    if (n > 0 && !bufs.empty()) bufs[0] += n;
}
}  // namespace

struct OutFrame {
    Bytes head;
    Bytes payload;  // empty when inlined into head
    std::vector<Tensor> tensors;
};

struct ConnectionState {
    ConnectionState(asio::ip::tcp::socket s, ConnectionLimits l)
        : socket(std::move(s)), limits(std::move(l)), wake(socket.get_executor()) {
        wake.expires_at(asio::steady_timer::time_point::max());
        rbuf.resize(kReadBufferSize);
    }

    asio::ip::tcp::socket socket;
    ConnectionLimits limits;
    HelloInfo peer;
    std::string endpoint;
    TensorAllocator allocator;

    Bytes rbuf;
    std::size_t rbeg = 0, rend = 0;
    EdgeReadState edge;

    std::vector<OutFrame> queue, batch;
    Bytes scratch;                  ///< the head of a frame sent directly (send_direct)
    std::size_t queue_written = 0;  ///< bytes at the front of `queue` already written by a flush
    bool writing = false;           ///< the writer is between taking a batch and finishing its write
    std::vector<asio::const_buffer> bufs;
    std::vector<iovec> iov;
    asio::steady_timer wake;

    bool open = true;
    std::optional<Error> reason;
    ConnectionStats stats;

    [[nodiscard]] std::string who() const {
        std::string s = peer.name.empty() ? std::string("peer") : "worker \"" + peer.name + "\"";
        if (!endpoint.empty()) s += " at " + endpoint;
        return s;
    }

    [[nodiscard]] Error closed_error() const {
        if (reason) return *reason;
        return Error(Errc::connection_lost, "connection to " + who() + " is closed", peer.name);
    }

    void close(std::optional<Error> why) {
        if (!open) return;
        open = false;
        if (why) reason = std::move(why);
        std::error_code ec;
        socket.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
        socket.close(ec);
        wake.cancel();
    }

    /// Points `bufs` at every byte of `frames`, skipping the first `skip` (already written).
    void gather(std::vector<OutFrame>& frames, std::size_t skip) {
        bufs.clear();
        for (auto& f : frames) {
            bufs.push_back(asio::buffer(f.head));
            if (!f.payload.empty()) bufs.push_back(asio::buffer(f.payload));
            for (auto& t : f.tensors)
                if (t.nbytes() > 0) bufs.push_back(asio::buffer(t.data(), t.nbytes()));
        }
        if (skip) consume(bufs, skip);
    }

    /// Writes the queue now with one non-blocking sendmsg; the writer is woken for any rest.
    void flush_now() {
        gather(queue, queue_written);
        std::error_code ec;
        const std::size_t total = asio::buffer_size(bufs);
        const std::size_t n = try_write_now(socket, bufs, iov, ec);
        ++stats.writes;
        if (ec) {
            close(from_error_code(ec, "writing to " + who()).on_worker(peer.name));
            return;
        }
        if (n == total) {
            stats.frames_sent += queue.size();
            queue.clear();
            queue_written = 0;
            return;
        }
        queue_written += n;
        wake.cancel();
    }

    /// Writes a frame (head in `scratch`) with one non-blocking sendmsg; queues what the socket
    /// did not take for the writer (taking `payload` and `tensors`). The queue must be empty and
    /// no write in progress.
    Result<void> send_direct(Bytes& payload, std::vector<Tensor>& tensors, bool payload_inline) {
        iovec v[2 + kDirectSendTensors];
        std::size_t cnt = 0, total = 0;
        auto add = [&](const void* p, std::size_t n) {
            if (n == 0) return;
            v[cnt++] = iovec{const_cast<void*>(p), n};
            total += n;
        };
        add(scratch.data(), scratch.size());
        if (!payload_inline) add(payload.data(), payload.size());
        for (auto& t : tensors) add(t.data(), t.nbytes());
        std::error_code ec;
        const std::size_t written = sendmsg_now(socket.native_handle(), v, cnt, ec);
        ++stats.writes;
        if (ec) {
            close(from_error_code(ec, "writing to " + who()).on_worker(peer.name));
            return fail(closed_error());
        }
        if (written == total) {
            ++stats.frames_sent;
            return ok();
        }
        queue.push_back(OutFrame{scratch, payload_inline ? Bytes{} : std::move(payload), std::move(tensors)});
        queue_written = written;
        wake.cancel();
        return ok();
    }

    /// Fails the connection with `e` (the stream cannot be trusted any more) and returns it.
    Error broken(Error e) {
        close(e);
        return e;
    }

    Task<Result<void>> fill(std::size_t n) {
        if (rend - rbeg >= n) co_return ok();
        if (rbeg == rend) rbeg = rend = 0;
        if (rbuf.size() - rbeg < n) {
            std::memmove(rbuf.data(), rbuf.data() + rbeg, rend - rbeg);
            rend -= rbeg;
            rbeg = 0;
            if (rbuf.size() < n) rbuf.resize(n);
        }
        while (rend - rbeg < n) {
            if (!open) co_return fail(closed_error());
            // (a read that empties the socket tells the reactor so: no EAGAIN read next time)
            auto [ec, k] = co_await async_edge_read(socket, asio::buffer(rbuf.data() + rend, rbuf.size() - rend), edge, use_nothrow);
            ++stats.reads;
            if (ec) {
                if (!open) co_return fail(closed_error());
                if (ec == asio::error::eof && rend - rbeg > 0)
                    co_return fail(broken(Error(Errc::connection_lost,
                                                "connection to " + who() + " closed in the middle of a frame (" +
                                                    std::to_string(rend - rbeg) + " of " + std::to_string(n) + " bytes)",
                                                peer.name, ec)));
                co_return fail(broken(from_error_code(ec, "reading from " + who()).on_worker(peer.name)));
            }
            rend += k;
        }
        co_return ok();
    }

    Task<Result<void>> read_into(std::uint8_t* dst, std::size_t n) {
        std::size_t have = std::min(n, rend - rbeg);
        if (have) std::memcpy(dst, rbuf.data() + rbeg, have);
        rbeg += have;
        dst += have;
        n -= have;
        if (n == 0) co_return ok();
        if (n >= kDirectReadMin) {
            // Edge reads here too: each chunk the kernel holds is read once, with no EAGAIN read
            // between chunks.
            while (n > 0) {
                auto [ec, k] = co_await async_edge_read(socket, asio::buffer(dst, n), edge, use_nothrow);
                ++stats.reads;
                if (ec) {
                    if (!open) co_return fail(closed_error());
                    co_return fail(broken(Error(Errc::connection_lost,
                                                "connection to " + who() + " lost in the middle of a frame: " + ec.message(),
                                                peer.name, ec)));
                }
                dst += k;
                n -= k;
            }
            co_return ok();
        }
        if (auto r = co_await fill(n); !r) co_return r;
        std::memcpy(dst, rbuf.data() + rbeg, n);
        rbeg += n;
        co_return ok();
    }

    Task<Result<void>> skip(std::size_t n) {
        while (n > 0) {
            if (rbeg == rend) {
                if (auto r = co_await fill(1); !r) co_return r;
            }
            std::size_t k = std::min(n, rend - rbeg);
            rbeg += k;
            n -= k;
        }
        co_return ok();
    }

    enum class Parse { frame, more, general, bad };

    /// The common case without waiting: a whole frame without tensors in the buffer, viewed where
    /// it lies (and consumed: the views stay valid until the buffer is next read into or
    /// compacted). `more`: read first (the buffer has room for the whole frame); `general`:
    /// read_general's path.
    Parse parse_view(FrameView& f, std::optional<Error>& err) {
        const std::size_t avail = rend - rbeg;
        std::size_t need = kFrameHeaderSize;
        if (avail >= kFrameHeaderSize) {
            const std::uint8_t* p = rbuf.data() + rbeg;
            auto h = decode_frame_header({p, kFrameHeaderSize}, limits);
            if (!h) {
                err = broken(std::move(h).error().context("frame from " + who()).on_worker(peer.name));
                return Parse::bad;
            }
            const std::uint64_t body = std::uint64_t(h->meta_len) + h->payload_len;
            if (body > rbuf.size() - kFrameHeaderSize) return Parse::general;
            need += body;
            if (avail >= need) {
                const std::span<const std::uint8_t> meta{p + kFrameHeaderSize, h->meta_len};
                if (!decode_small_meta(meta, limits, f.name)) {
                    // Tensors (the general path), or malformed: decode_frame_meta says which.
                    auto m = decode_frame_meta(meta, limits);
                    if (m) return Parse::general;
                    err = broken(std::move(m).error().context("frame from " + who()).on_worker(peer.name));
                    return Parse::bad;
                }
                f.kind = h->kind;
                f.id = h->id;
                f.payload = {p + kFrameHeaderSize + h->meta_len, h->payload_len};
                rbeg += need;
                if (rbeg == rend) rbeg = rend = 0;
                ++stats.frames_received;
                return Parse::frame;
            }
        }
        if (rbuf.size() - rbeg < need) {  // make room for the whole frame
            std::memmove(rbuf.data(), rbuf.data() + rbeg, avail);
            rend = avail;
            rbeg = 0;
        }
        return Parse::more;
    }

    /// parse_view, into a Frame.
    Parse parse_buffered(Frame& f, std::optional<Error>& err) {
        FrameView v;
        const Parse p = parse_view(v, err);
        if (p != Parse::frame) return p;
        f.kind = v.kind;
        f.id = v.id;
        f.name = v.name;
        f.payload.assign(v.payload.begin(), v.payload.end());
        return p;
    }

    /// The error of a failed socket read (the connection is closed by it).
    Error read_error(std::error_code ec) {
        if (!open) return closed_error();
        if (ec == asio::error::eof && rend > rbeg)
            return broken(Error(Errc::connection_lost,
                                "connection to " + who() + " closed in the middle of a frame (" + std::to_string(rend - rbeg) +
                                    " bytes of it read)",
                                peer.name, ec));
        return broken(from_error_code(ec, "reading from " + who()).on_worker(peer.name));
    }

    /// Reads one frame; `keep` holds this state for the read. Frames without tensors that fit the
    /// buffer are read with one reactor operation per socket read, awaited here, and parsed in
    /// place; the general path (tensors, large payloads) is read_general. (This coroutine's frame
    /// stays small, under what Asio's per-thread frame cache keeps: a larger one is a malloc.)
    Task<Result<Frame>> read_frame(std::shared_ptr<ConnectionState> keep) {
        (void)keep;
        for (;;) {
            if (!open) co_return fail(closed_error());
            Result<Frame> f;
            std::optional<Error> err;
            const Parse p = parse_buffered(*f, err);
            if (p == Parse::frame) co_return std::move(f);
            if (p == Parse::bad) co_return fail(std::move(*err));
            if (p == Parse::general) break;
            auto [ec, k] = co_await async_edge_read(socket, asio::buffer(rbuf.data() + rend, rbuf.size() - rend), edge, use_nothrow);
            ++stats.reads;
            if (ec) co_return fail(read_error(ec));
            rend += k;
        }
        co_return co_await read_general();
    }

    /// Reads a frame with tensors, or one larger than the buffer.
    Task<Result<Frame>> read_general() {
        if (rend - rbeg < kFrameHeaderSize)
            if (auto r = co_await fill(kFrameHeaderSize); !r) co_return fail(r.error());
        auto h = decode_frame_header({rbuf.data() + rbeg, kFrameHeaderSize}, limits);
        if (!h) co_return fail(broken(std::move(h).error().context("frame from " + who()).on_worker(peer.name)));
        rbeg += kFrameHeaderSize;
        if (rend - rbeg < h->meta_len)
            if (auto r = co_await fill(h->meta_len); !r) co_return fail(r.error());
        auto meta = decode_frame_meta({rbuf.data() + rbeg, h->meta_len}, limits);
        if (!meta) co_return fail(broken(std::move(meta).error().context("frame from " + who()).on_worker(peer.name)));
        rbeg += h->meta_len;

        Frame f;
        f.kind = h->kind;
        f.id = h->id;
        f.name = std::move(meta->name);
        f.payload.resize(h->payload_len);
        if (f.payload.size() <= rend - rbeg) {
            if (!f.payload.empty()) std::memcpy(f.payload.data(), rbuf.data() + rbeg, f.payload.size());
            rbeg += f.payload.size();
        } else if (auto r = co_await read_into(f.payload.data(), f.payload.size()); !r) {
            co_return fail(r.error());
        }
        f.tensors.reserve(meta->tensors.size());
        for (auto& desc : meta->tensors) {
            Result<Tensor> t = allocator ? allocator(desc) : fail(Errc::device_error, "no tensor allocator on this connection");
            if (t && (t->nbytes() != desc.nbytes || (desc.nbytes > 0 && t->data() == nullptr)))
                t = fail(Errc::internal, "the allocator returned a tensor of the wrong size");
            if (!t) {
                if (!f.alloc_error) f.alloc_error = std::move(t).error();
                if (auto r = co_await skip(desc.nbytes); !r) co_return fail(r.error());
                continue;
            }
            if (auto r = co_await read_into(t->data(), desc.nbytes); !r) co_return fail(r.error());
            f.tensors.push_back(std::move(*t));
        }
        ++stats.frames_received;
        co_return f;
    }

    Result<HelloInfo> parse_hello_body(std::size_t len) {
        auto h = decode_hello_body({rbuf.data() + rbeg, len}, limits);
        rbeg += len;
        return h;
    }
};

namespace {

Task<void> writer_loop(std::shared_ptr<ConnectionState> s) {
    while (s->open) {
        if (s->queue.empty()) {
            auto [ec] = co_await s->wake.async_wait(use_nothrow);
            (void)ec;  // cancel() is the wake-up signal
            continue;
        }
        s->batch.swap(s->queue);
        s->gather(s->batch, s->queue_written);
        s->queue_written = 0;
        s->writing = true;
        ++s->stats.writes;
        s->stats.frames_sent += s->batch.size();
        std::error_code ec;
        const std::size_t total = asio::buffer_size(s->bufs);
        const std::size_t n = try_write_now(s->socket, s->bufs, s->iov, ec);
        if (!ec && n < total) {
            consume(s->bufs, n);
            auto [aec, m] = co_await asio::async_write(s->socket, s->bufs, TransferRest{total - n}, use_nothrow);
            ec = aec;
        }
        s->writing = false;
        s->batch.clear();
        if (ec) {
            if (s->open) s->close(from_error_code(ec, "writing to " + s->who()).on_worker(s->peer.name));
            break;
        }
    }
    s->queue.clear();
}

void start_writer(const std::shared_ptr<ConnectionState>& s) {
    asio::co_spawn(s->socket.get_executor(), writer_loop(s), [](std::exception_ptr e) {
        if (e) log(LogLevel::error, "transport", detail::error_from_exception_ptr(e, "connection writer").to_string());
    });
}

}  // namespace

struct DispatchReader;
/// Hands the buffered frames to the reader's sink, then reads on (see DispatchReader).
void dispatch_frames(DispatchReader r);

/// A connection's reader in dispatch mode (Connection::dispatch_to): the completion handler of its
/// socket reads. It hands every whole frame in the buffer to the sink, then starts the next read
/// with itself as the handler; a frame for the general path goes to a coroutine, which carries on
/// the same way when that frame is done.
struct DispatchReader {
    std::shared_ptr<ConnectionState> s;
    std::shared_ptr<FrameSink> sink;

    using executor_type = Executor;
    [[nodiscard]] executor_type get_executor() const noexcept { return s->socket.get_executor(); }

    void operator()(std::error_code ec, std::size_t n) {
        ++s->stats.reads;
        if (ec) {
            sink->on_closed(s->read_error(ec));
            return;
        }
        s->rend += n;
        dispatch_frames(std::move(*this));
    }
};

namespace {
Task<void> dispatch_general(DispatchReader r) {
    auto f = co_await r.s->read_general();
    if (!f) {
        r.sink->on_closed(f.error());
        co_return;
    }
    r.sink->on_frame(std::move(*f));
    dispatch_frames(std::move(r));
}
}  // namespace

void dispatch_frames(DispatchReader r) {
    ConnectionState& s = *r.s;
    try {
        for (;;) {
            if (!s.open) {
                r.sink->on_closed(s.closed_error());
                return;
            }
            FrameView v;
            std::optional<Error> err;
            switch (s.parse_view(v, err)) {
            case ConnectionState::Parse::frame:
                r.sink->on_small_frame(v);
                continue;
            case ConnectionState::Parse::bad:
                r.sink->on_closed(*err);
                return;
            case ConnectionState::Parse::general: {
                auto ex = s.socket.get_executor();
                asio::co_spawn(ex, dispatch_general(std::move(r)), [](std::exception_ptr e) {
                    if (e) log(LogLevel::error, "transport", detail::error_from_exception_ptr(e, "connection reader").to_string());
                });
                return;
            }
            case ConnectionState::Parse::more:
                async_edge_read(s.socket, asio::buffer(s.rbuf.data() + s.rend, s.rbuf.size() - s.rend), s.edge, std::move(r));
                return;
            }
        }
    } catch (...) {
        // A sink that throws (out of memory) ends this connection, not the event loop.
        auto e = error_from_current_exception("connection reader").on_worker(s.peer.name);
        s.close(e);
        if (r.sink) r.sink->on_closed(e);
    }
}

namespace {

Result<Tensor> default_allocate(const TensorDesc& d) { return empty(d.target, d.dtype, d.shape); }

Task<Result<void>> write_all(asio::ip::tcp::socket& sock, Bytes bytes, std::string what) {
    auto [ec, n] = co_await asio::async_write(sock, asio::buffer(bytes), use_nothrow);
    if (ec) co_return fail(from_error_code(ec, what));
    co_return ok();
}

Result<void> check_version(const HelloPrefix& p) {
    if (p.version != kProtocolVersion)
        return fail(Errc::protocol_error, "peer speaks protocol version " + std::to_string(p.version) +
                                              ", this side speaks version " + std::to_string(kProtocolVersion));
    return ok();
}

Task<Result<HelloInfo>> client_handshake(std::shared_ptr<ConnectionState> s, std::string host, std::uint16_t port,
                                         HelloInfo local) {
    std::error_code ec;
    auto eps = co_await resolve_host(host, port);  // (a numeric host: at once; a name: see resolve.hpp)
    if (!eps) co_return fail(eps.error());
    {
        auto [cec, ep] = co_await asio::async_connect(s->socket, *eps, use_nothrow);
        if (cec) co_return fail(from_error_code(cec, "connecting to " + host + ":" + std::to_string(port)));
    }
    s->socket.set_option(asio::ip::tcp::no_delay(true), ec);
    s->endpoint = host + ":" + std::to_string(port);
    if (auto w = co_await write_all(s->socket, encode_hello(local), "sending the handshake to " + s->endpoint); !w)
        co_return fail(w.error());
    if (auto r = co_await s->fill(kHelloPrefixSize); !r) co_return fail(r.error());
    auto p = decode_hello_prefix({s->rbuf.data() + s->rbeg, kHelloPrefixSize});
    if (!p) co_return fail(p.error());
    s->rbeg += kHelloPrefixSize;
    if (auto v = check_version(*p); !v) co_return fail(v.error());
    if (auto r = co_await s->fill(p->body_len); !r) co_return fail(r.error());
    co_return s->parse_hello_body(p->body_len);
}

Task<Result<HelloInfo>> server_handshake(std::shared_ptr<ConnectionState> s, HelloInfo local) {
    if (auto r = co_await s->fill(kHelloPrefixSize); !r) co_return fail(r.error());
    auto p = decode_hello_prefix({s->rbuf.data() + s->rbeg, kHelloPrefixSize});
    if (!p) co_return fail(p.error());
    s->rbeg += kHelloPrefixSize;
    if (auto r = co_await s->fill(p->body_len); !r) co_return fail(r.error());
    auto peer = s->parse_hello_body(p->body_len);
    // Answer even on a version mismatch, so that the client can say which versions disagree.
    if (auto w = co_await write_all(s->socket, encode_hello(local), "sending the handshake to " + s->endpoint); !w)
        co_return fail(w.error());
    if (auto v = check_version(*p); !v) co_return fail(v.error());
    co_return peer;
}

}  // namespace
}  // namespace detail

Connection::Connection(std::shared_ptr<detail::ConnectionState> state) : state_(std::move(state)) {}

Connection::~Connection() {
    if (state_) state_->close(std::nullopt);
}

Task<Result<std::shared_ptr<Connection>>> Connection::connect(std::string host, std::uint16_t port, HelloInfo local,
                                                              ConnectionLimits limits) {
    auto ex = co_await asio::this_coro::executor;
    auto timeout = limits.handshake_timeout;
    auto s = std::make_shared<detail::ConnectionState>(asio::ip::tcp::socket(ex), std::move(limits));
    auto peer = co_await with_timeout(detail::client_handshake(s, host, port, std::move(local)), timeout);
    if (!peer) {
        s->close(std::nullopt);
        co_return fail(std::move(peer).error().context("connecting to " + host + ":" + std::to_string(port)));
    }
    s->peer = std::move(*peer);
    s->allocator = detail::default_allocate;
    detail::start_writer(s);
    co_return std::shared_ptr<Connection>(new Connection(std::move(s)));
}

Task<Result<std::shared_ptr<Connection>>> Connection::accept(asio::ip::tcp::socket socket, HelloInfo local,
                                                             ConnectionLimits limits) {
    auto timeout = limits.handshake_timeout;
    auto s = std::make_shared<detail::ConnectionState>(std::move(socket), std::move(limits));
    std::error_code ec;
    s->socket.set_option(asio::ip::tcp::no_delay(true), ec);
    auto ep = s->socket.remote_endpoint(ec);
    if (!ec) s->endpoint = ep.address().to_string() + ":" + std::to_string(ep.port());
    auto peer = co_await with_timeout(detail::server_handshake(s, std::move(local)), timeout);
    if (!peer) {
        s->close(std::nullopt);
        co_return fail(std::move(peer).error().context("handshake with " + s->endpoint));
    }
    s->peer = std::move(*peer);
    s->allocator = detail::default_allocate;
    detail::start_writer(s);
    co_return std::shared_ptr<Connection>(new Connection(std::move(s)));
}

const HelloInfo& Connection::peer() const noexcept { return state_->peer; }

std::string Connection::describe() const { return state_->who(); }

Executor Connection::get_executor() const { return state_->socket.get_executor(); }

void Connection::set_allocator(TensorAllocator allocator) { state_->allocator = std::move(allocator); }

Result<void> Connection::send(Frame frame, bool flush) {
    return send(frame.kind, frame.id, frame.name, frame.payload, frame.tensors, frame.targets, flush);
}

Result<void> Connection::send(FrameKind kind, std::uint64_t id, std::string_view name, Bytes& payload,
                              std::vector<Tensor>& tensors, std::span<const Device> targets, bool flush) {
    auto& s = *state_;
    if (!s.open) return fail(s.closed_error());
    const detail::FrameParts parts{kind, id, name, payload, tensors, targets};
    bool inl = false;
    // A flushed frame with nothing ahead of it goes out from here, its head encoded into a reused
    // buffer; only a rest the socket does not take is queued for the writer.
    if (flush && !s.writing && s.queue.empty() && tensors.size() <= detail::kDirectSendTensors) {
        if (auto h = detail::encode_frame_head(parts, s.limits, s.scratch, inl); !h)
            return fail(std::move(h).error().context("sending to " + s.who()));
        return s.send_direct(payload, tensors, inl);
    }
    Bytes head;
    if (auto h = detail::encode_frame_head(parts, s.limits, head, inl); !h)
        return fail(std::move(h).error().context("sending to " + s.who()));
    detail::OutFrame out{std::move(head), inl ? Bytes{} : std::move(payload), std::move(tensors)};
    bool was_empty = s.queue.empty();
    s.queue.push_back(std::move(out));
    // A partly written queue (queue_written > 0) is the writer's to finish: the socket is full.
    if (flush && !s.writing && s.queue_written == 0) {
        s.flush_now();
        if (!s.open) return fail(s.closed_error());
    } else if (was_empty) {
        s.wake.cancel();
    }
    return ok();
}

void Connection::set_idle_reads(std::function<bool()> may_idle) { state_->edge.may_idle = std::move(may_idle); }

bool Connection::input_pending() const noexcept { return state_->rend > state_->rbeg; }

Task<Result<Frame>> Connection::receive() {
    return state_->read_frame(state_);  // the state stays alive across the read even if this handle goes
}

void Connection::dispatch_to(std::shared_ptr<FrameSink> sink) {
    detail::dispatch_frames(detail::DispatchReader{state_, std::move(sink)});
}

void Connection::close(std::optional<Error> reason) { state_->close(std::move(reason)); }

bool Connection::is_open() const noexcept { return state_->open; }

const ConnectionStats& Connection::stats() const noexcept { return state_->stats; }

}  // namespace tensorplay
