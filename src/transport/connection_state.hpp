// Private: the state behind a Connection, shared by its writing side (connection.cpp: sends, the
// writer, the handshake) and its reading side (connection_read.cpp: the frame reader in both forms).
#pragma once

#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"

#include "core/resume_slot.hpp"
#include "core/task_group.hpp"
#include "transport/channels/channel.hpp"
#include "transport/edge_read.hpp"
#include "transport/rearmed_read.hpp"
#include "transport/frame.hpp"
#include "transport/byte_stream.hpp"

#include <asio/steady_timer.hpp>

#include <sys/uio.h>

#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace tensorplay::detail {

inline constexpr std::size_t kReadBufferSize = 256 * 1024;
/// The read buffer until the handshake is done (it grows for a larger hello): a socket that has
/// not introduced itself costs this, not kReadBufferSize.
inline constexpr std::size_t kHandshakeBufferSize = 512;
/// A payload larger than this grows as its bytes arrive (doubling from here), so that a claimed
/// length costs memory only once its bytes come.
inline constexpr std::size_t kPayloadStep = 256 * 1024;
/// A flushed frame with at most this many tensors may be written by send() itself.
inline constexpr std::size_t kDirectSendTensors = 14;
/// Reads of at least this many bytes go straight into the destination, bypassing the buffer.
inline constexpr std::size_t kDirectReadMin = 32 * 1024;

struct OutFrame {
    Bytes head;
    Bytes payload;  // empty when inlined into head
    std::vector<Tensor> tensors;
    /// Per tensor, where set: its bytes come from this source (SendPlan::streamed), written by
    /// the writer only (write_streamed).
    std::vector<std::shared_ptr<ByteSource>> sources;
};

/// The read buffer: grown without zero-filling (every byte is written by a read before it is
/// looked at), so its pages cost memory only once bytes land in them.
class ReadBuffer {
public:
    [[nodiscard]] std::uint8_t* data() noexcept { return p_.get(); }
    [[nodiscard]] const std::uint8_t* data() const noexcept { return p_.get(); }
    [[nodiscard]] std::size_t size() const noexcept { return n_; }
    /// Makes it at least `cap` bytes, keeping the bytes [beg, end) (moved to the front).
    void grow(std::size_t cap, std::size_t& beg, std::size_t& end) {
        if (cap <= n_) return;
        std::unique_ptr<std::uint8_t[]> q(new std::uint8_t[cap]);  // (default-initialised: not zeroed)
        if (end > beg) std::memcpy(q.get(), p_.get() + beg, end - beg);
        end -= beg;
        beg = 0;
        p_ = std::move(q);
        n_ = cap;
    }

private:
    std::unique_ptr<std::uint8_t[]> p_;
    std::size_t n_ = 0;
};

struct ConnectionState {
    /// `tcp`: the stream is TCP (TCP_INQ may be asked); any other stream reads short (a Unix
    /// stream socket, like TCP, hands over all it holds up to the buffer's size).
    ConnectionState(asio::generic::stream_protocol::socket s, ConnectionLimits l, bool is_tcp)
        : socket(std::move(s)),
          limits(std::move(l)),
          tcp(is_tcp),
          watchdog(socket.get_executor()),
          tasks(socket.get_executor()) {
        rbuf.grow(kHandshakeBufferSize, rbeg, rend);
        edge.short_reads = !tcp;
    }

    asio::generic::stream_protocol::socket socket;
    /// Set: the bytes run over this stream, polled (its transport set it up after the handshake:
    /// shm's rings), and `socket` stays closed, lending only its executor. Every read and write
    /// point below looks at it first; the socket paths are unchanged.
    std::unique_ptr<ByteStream> polled;
    /// polled: how long a read that finds nothing keeps looking, letting the event loop run between
    /// looks, before it waits (ByteStream::poll_spin).
    std::chrono::microseconds poll_spin{0};
    /// polled: polled_read yields its core every this many turns (1 while yielding runs another task).
    unsigned poll_yield_every = 1;
    ConnectionLimits limits;
    bool tcp = true;
    std::string transport = "uv";  ///< the transport this stream is of
    Negotiated negotiated;          ///< what the handshake chose
    bool redirected = false;        ///< server side: the handshake chose another transport
    /// The handshake's last message was ours: a transport that sets up another stream after it
    /// (Transport::finish) then waits for the peer's setup before sending ours (its side read
    /// last, and may have read ahead: it sends first).
    bool wrote_last = false;
    HelloInfo peer;
    HandshakeAuth auth;  ///< during the handshake only
    std::string endpoint;
    int peer_pid = -1;  ///< the peer's pid as the kernel reported it (Stream::peer_pid); -1: unknown (TCP)
    TensorAllocator allocator;
    SinkAllocator sink_allocator;  ///< asked before `allocator` (set_sink_allocator)
    /// Which channel carries each tensor's bytes (set when the handshake is done).
    ChannelTable channels;
    /// What a frame sent by reference keeps until the peer's release (or the close), under the
    /// frame's hold id: cma's tensors (the peer reads them from our memory) and its lease, or a
    /// device channel's `keep` (cuda_ipc: outbox ranges) under ids with the top bit set
    /// (device_holds counts them).
    struct Hold {
        std::vector<Tensor> tensors;
        std::size_t bytes = 0;  ///< of `tensors` (counted in held_bytes)
        /// Declared last: let go first (a cma lease's word is cleared before its tensors go).
        std::shared_ptr<void> keep;
    };
    std::uint64_t device_holds = 0;
    /// Our holds by id, until the peer's release frame or the close; held_bytes their tensors'
    /// bytes (bounded by limits.max_held_bytes).
    std::unordered_map<std::uint64_t, Hold> holds;
    std::size_t held_bytes = 0;

    ReadBuffer rbuf;
    std::size_t rbeg = 0, rend = 0;
    EdgeReadState edge;
    bool in_frame = false;  ///< the general path is reading a frame (read_general)
    /// The references and hold of the frame read_general read last (a device channel's: cuda_ipc),
    /// taken when it is handed over (hand_over, refuse_refs).
    DeviceRefs reading_refs;
    bool reading = false;   ///< a socket read is pending
    /// Frames queued by send(), and their count when the last read completed: a send since then
    /// provokes the reset by which a dead peer's FIN that came with that read shows (recheck).
    std::uint64_t sends = 0, sends_at_read = 0;

    std::vector<OutFrame> queue, batch;
    /// Bytes of the frames in `queue` and in `batch` (the writer's): a reader stops while they are
    /// over limits.max_queued_soft and waits on `output_drained`.
    std::size_t queue_bytes = 0, batch_bytes = 0;
    ResumeSlot output_drained;
    [[nodiscard]] bool output_over() const noexcept {
        return limits.max_queued_soft != 0 && queue_bytes + batch_bytes > limits.max_queued_soft;
    }
    /// The sink dispatch_to reads for (null before, and once its reader ended): asked by
    /// Flush::paced whether replies are awaited.
    FrameSink* dispatch_sink = nullptr;
    /// Whether a frame of `kind` sent with `flush` is written now (Flush::paced's rules).
    [[nodiscard]] bool flushes(Flush flush, FrameKind kind) const {
        if (flush != Flush::paced) return flush == Flush::now;
        if (kind == FrameKind::request) return !(dispatch_sink && dispatch_sink->awaiting_input());
        return rend == rbeg;  // (a reply: unless further requests are buffered already)
    }
    /// The writer took a batch off, or wrote it: a paused reader resumes once under the bound.
    void output_written() {
        if (output_drained.waiting() && !output_over()) output_drained.complete_later();
    }
    [[nodiscard]] static std::size_t out_size(const OutFrame& f) noexcept {
        std::size_t n = f.head.size() + f.payload.size();
        for (const auto& t : f.tensors) n += t.nbytes();
        return n;
    }
    Bytes scratch;                  ///< the head of a frame sent directly (send_direct)
    std::size_t queue_written = 0;  ///< bytes at the front of `queue` already written by a flush
    bool writing = false;           ///< the writer is between taking a batch and finishing its write
    bool streamed_queued = false;   ///< `queue` holds a frame with sources: only the writer writes it
    std::vector<asio::const_buffer> bufs;
    std::vector<iovec> iov;
    /// The writer parks here while the queue is empty; a send wakes it with a posted completion,
    /// so that the frames queued in the same turn of the event loop go out in one write.
    ResumeSlot wake;
    asio::steady_timer watchdog;  ///< ticks of the frame and idle timeouts (watchdog_loop)

    bool open = true;
    std::optional<Error> reason;
    ConnectionStats stats;
    ChannelStats channel_stats;
    /// The connection's background coroutines: the writer, the watchdog and the dispatch reader's
    /// coroutines (each holds this state). close() cancels them; Connection::join awaits them.
    /// Declared last: destroyed first, while what they wait on still exists.
    TaskGroup tasks;

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
        socket.shutdown(asio::socket_base::shutdown_both, ec);
        socket.close(ec);
        if (polled) polled->close();
        wake.complete_later();
        output_drained.complete_later();
        watchdog.cancel();
        tasks.cancel();
        // Each lease is let go before its tensors: a peer still reading them sees that (cma/cma_lease.hpp)
        // and fails that frame instead of handing over memory we may reuse.
        holds.clear();
        held_bytes = 0;
        channel_stats.cma_held = 0;
    }

    /// Queues a frame as its channels planned it (SendPlan: inline, streamed, by reference under a
    /// hold), flushed as queue_frame.
    Result<void> queue_planned(FrameKind kind, std::uint64_t id, std::string_view name, Bytes& payload,
                               std::vector<Tensor>& tensors, std::span<const Device> targets, const SendPlan& plan, bool flush);
    /// Queues `out` for the writer; `flush`: when no write is in progress, writes the queue now.
    /// A queue over limits.max_queued_hard closes the connection (its error is returned).
    Result<void> queue_frame(OutFrame out, bool flush);

    /// Queues a release frame for `hold` (the peer's tensors were read by cma): written with the
    /// next frame this turn sends, or by the writer.
    void send_release(std::uint64_t hold);
    /// Drops our hold `id` on the peer's release; false (and `err`, the connection broken) when no
    /// such hold exists.
    bool take_release(std::uint64_t id, std::optional<Error>& err);
    /// Handles the whole release frames at the front of the read buffer (parse_view's first step);
    /// false on a bad one (see take_release).
    bool take_buffered_releases(std::optional<Error>& err);

    /// Whether the next read must look at the socket at once even if the last one drained it (a
    /// FIN or reset that came with those bytes has spent its readiness edge): a frame (or the
    /// handshake) is unfinished, or `awaited` (something waits for the peer to send) and nothing
    /// was sent since the last read, whose reset would show such an end.
    [[nodiscard]] bool recheck(bool awaited) const noexcept {
        return in_frame || rend > rbeg || (awaited && sends == sends_at_read);
    }

    /// Points `bufs` at every byte of `frames`, skipping the first `skip` (already written).
    void gather(std::span<OutFrame> frames, std::size_t skip);

    /// Writes the queue now with one non-blocking sendmsg; the writer is woken for any rest.
    void flush_now();

    /// Writes a frame (head in `scratch`) with one non-blocking sendmsg; queues what the socket
    /// did not take for the writer (taking `payload` and `tensors`). The queue must be empty and
    /// no write in progress.
    Result<void> send_direct(Bytes& payload, std::vector<Tensor>& tensors, bool payload_inline);

    /// Fails the connection with `e` (the stream cannot be trusted any more) and returns it.
    Error broken(Error e) {
        close(e);
        return e;
    }

    /// Reads until at least `n` bytes are buffered (compacting or growing the buffer first).
    Task<Result<void>> fill(std::size_t n);
    /// Reads `n` bytes into `dst`: what is buffered, then large rests straight from the socket.
    Task<Result<void>> read_into(std::uint8_t* dst, std::size_t n);
    /// Reads and drops `n` bytes (a refused tensor's).
    Task<Result<void>> skip(std::size_t n);
    /// Reads `n` bytes into `sink`, piece by piece. A sink's error is returned in `refused` (the
    /// rest of the bytes skipped); a read's error is the result (the connection is closed).
    Task<Result<void>> read_sunk(ByteSink& sink, std::size_t n, std::optional<Error>& refused);

    /// polled: reads up to `n` bytes into `dst`, at least one: what has arrived, else it looks
    /// again for poll_spin (yielding to the event loop between looks), then waits until readable.
    /// Errors as ByteStream::read_some (pass them through polled_read_error).
    Task<Result<std::size_t>> polled_read(std::uint8_t* dst, std::size_t n);
    /// polled: the error of a failed read, as read_error's (the connection is closed by it).
    Error polled_read_error(Error e);
    /// polled: one write of `v` (null: of `bufs`); false when it failed (the
    /// connection is then closed). Out of line: the socket paths stay as they were.
    [[gnu::noinline]] bool polled_write_iov(iovec* v, std::size_t count, std::size_t& written);
    /// polled: writes every byte of `b` (consuming it), waiting for room.
    Task<Result<void>> polled_write(std::vector<asio::const_buffer>& b);
    /// polled: read_frame over the polled stream (read_frame's loop; the general path is shared).
    Task<Result<Frame>> polled_read_frame(std::shared_ptr<ConnectionState> keep);

    enum class Parse { frame, more, general, bad };

    /// The common case without waiting: a whole frame without tensors in the buffer, viewed where
    /// it lies (and consumed: the views stay valid until the buffer is next read into or
    /// compacted). `more`: read first (the buffer has room for the whole frame); `general`:
    /// read_general's path.
    Parse parse_view(FrameView& f, std::optional<Error>& err);

    /// parse_view, into a Frame.
    Parse parse_buffered(Frame& f, std::optional<Error>& err);

    /// The error of a failed socket read (the connection is closed by it).
    Error read_error(std::error_code ec);

    /// Reads one frame; `keep` holds this state for the read. Frames without tensors that fit the
    /// buffer are read with one reactor operation per socket read, awaited here, and parsed in
    /// place; the general path (tensors, large payloads) is read_general. (This coroutine's frame
    /// stays small, under what Asio's per-thread frame cache keeps: a larger one is a malloc.)
    Task<Result<Frame>> read_frame(std::shared_ptr<ConnectionState> keep);

    /// Reads a frame with tensors, or one larger than the buffer.
    Task<Result<Frame>> read_general();
    /// Hands read_general's frame to `sink`: with its references (on_device_frame) when a device
    /// channel left some, else (or when the sink does not take them: refuse_refs) to on_frame.
    void hand_over(FrameSink& sink, Frame&& f);
    /// A frame whose reader takes no references: when a device channel left some, the frame fails
    /// (alloc_error) and the peer's hold is released.
    void refuse_refs(Frame& f);

    /// Memory for the tensor `desc` describes, from the allocator (checked: the size it says).
    [[nodiscard]] Result<Tensor> allocate(const TensorDesc& desc);
    /// allocate(), its bytes taken from the receive budget first (and counted in `held`, which the
    /// frame gives back when it is read): for a tensor whose bytes a channel brings (cma).
    [[nodiscard]] Result<Tensor> take_tensor(const TensorDesc& desc, std::size_t& held);
    /// The error of a receive budget that cannot give `n` bytes for `what` (a frame fails with it).
    [[nodiscard]] Error budget_error(std::size_t n, const char* what) const;

    /// Reads a payload of `len` bytes into `f` (growing as its bytes arrive, taking from the
    /// receive budget as it grows: `held`); a refused budget leaves f.alloc_error set and the
    /// bytes skipped.
    Task<Result<void>> read_payload(Frame& f, std::size_t len, std::size_t& held);

    /// Decodes (and consumes) a buffered handshake body of `len` bytes.
    Result<Hello> parse_hello_body(std::size_t len);
};

/// The client's side of the handshake (connection_handshake.cpp) on `s`'s connected socket:
/// hellos and, with a key, the challenge-response; then the check of the server's answer (set in
/// s->negotiated). The server's introduction, or why not. With `s->auth`.
Task<Result<HelloInfo>> client_handshake(std::shared_ptr<ConnectionState> s, HelloInfo local);
/// The server's side on an accepted socket: the client's introduction once it is admitted (the
/// answer it was given in s->negotiated).
Task<Result<HelloInfo>> server_handshake(std::shared_ptr<ConnectionState> s, HelloInfo local);
/// Once the handshake admitted the peer: the transport's own setup over the socket the handshake
/// ran on (Transport::finish: shm's rings), which may give the stream the bytes run over from then
/// on (`polled`). The side that wrote the handshake's last message waits for the other's setup
/// first: the side that read it may have read ahead, so nothing may follow that message until it
/// sends. Nothing for transports whose socket carries the bytes.
Task<Result<void>> finish_transport(ConnectionState& s, Duration timeout);

/// A connection's reader in dispatch mode (Connection::dispatch_to), run by the socket reads of
/// one RearmedRead. It hands every whole frame in the buffer to the sink, then starts the next
/// read; a frame for the general path goes to a coroutine, which carries on the same way when that
/// frame is done.
struct DispatchReader {
    std::shared_ptr<ConnectionState> s;
    std::shared_ptr<FrameSink> sink;

    DispatchReader(std::shared_ptr<ConnectionState> st, std::shared_ptr<FrameSink> k) : s(std::move(st)), sink(std::move(k)) {}
    DispatchReader(DispatchReader&&) noexcept = default;
    DispatchReader& operator=(DispatchReader&&) noexcept = default;
    /// Once the reader ends, its sink is no longer asked (ConnectionState::dispatch_sink).
    ~DispatchReader() {
        if (s && sink && s->dispatch_sink == sink.get()) s->dispatch_sink = nullptr;
    }

    using executor_type = Executor;
    [[nodiscard]] executor_type get_executor() const noexcept { return s->socket.get_executor(); }

    void operator()(RearmedRead<DispatchReader>& op, std::error_code ec, std::size_t n);
};
/// The connection's writer: gathers what is queued into one write per turn until the connection
/// closes (connection_writer.cpp).
Task<void> writer_loop(std::shared_ptr<ConnectionState> s);

using DispatchOp = RearmedRead<DispatchReader>;

/// Hands the buffered frames to the reader's sink, then reads on (see DispatchReader). Takes `op`:
/// it is started again, handed on, or ended.
void dispatch_frames(DispatchOp& op);

/// dispatch_frames over a polled stream: one coroutine for the connection's life that hands on what is
/// buffered (the same parsing), reads what arrived, and waits (ConnectionState::polled_read) when
/// nothing did. Takes `op` (its reader and sink; no socket read is ever started on it).
void dispatch_polled_frames(DispatchOp& op);

}  // namespace tensorplay::detail
