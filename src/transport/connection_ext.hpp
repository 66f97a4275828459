// Private: what the library itself uses of a Connection beyond its public API: frame sinks that
// take frames as the reads complete (the agent's dispatch), sends by parts, the read hint, and
// accepting a stream a transport's Listener produced.
#pragma once

#include <tensorplay/transport/connection.hpp>

#include "transport/channels/channel_kind.hpp"
#include "transport/transport.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace tensorplay {

/// A frame without tensors as it lies in the connection's read buffer (FrameSink::on_small_frame):
/// the views are valid only during that call.
struct FrameView {
    FrameKind kind = FrameKind::request;
    std::uint64_t id = 0;
    std::string_view name;
    std::span<const std::uint8_t> payload;
};

/// A tensor of a received frame that a device channel carries by reference (cuda_ipc): its bytes
/// are not on the connection; the receiver resolves `ref` (docs/protocol.md, "Channels").
struct DeviceRef {
    std::size_t index = 0;  ///< its place in Frame::tensors (left undefined there)
    TensorDesc desc;
    std::uint64_t ref = 0;
};

/// What a received frame's device channel left for the receiver: the tensors it carries by
/// reference, and the sender's hold on them, which the receiver releases once it has copied them
/// (release_hold).
struct DeviceRefs {
    std::vector<DeviceRef> refs;
    std::uint64_t hold = 0;
    [[nodiscard]] bool empty() const noexcept { return refs.empty() && hold == 0; }
};

/// Takes a connection's frames as they arrive (detail::dispatch_to). Called on the
/// connection's executor, from inside its reader: the calls must not block.
class FrameSink {
public:
    virtual ~FrameSink() = default;
    /// A whole frame without tensors that fitted the read buffer, parsed where it lies (no copy).
    virtual void on_small_frame(const FrameView& frame) = 0;
    /// Any other frame (tensors, a large payload): read by the general path, tensors in place.
    virtual void on_frame(Frame&& frame) = 0;
    /// A frame some of whose tensors a device channel carries by reference (`refs`; their places
    /// in frame.tensors left undefined): true when the sink took it (moved from both, and releases
    /// refs.hold once it copied them). Default: false; the connection then fails the frame
    /// (alloc_error), releases the hold and hands it to on_frame.
    [[nodiscard]] virtual bool on_device_frame(Frame& frame, DeviceRefs& refs) {
        (void)frame;
        (void)refs;
        return false;
    }
    /// The connection failed or was closed (`why`); nothing follows.
    virtual void on_closed(const Error& why) = 0;
    /// Asked before each read (on the connection's executor): true while something waits for the
    /// peer to send (a reply). A read that drained the socket is then followed by one more unless
    /// a frame was sent since, so that a FIN or reset that came with the last bytes is seen at
    /// once (docs/protocol.md, "Receiving"). Default: false (each request gets a reply, whose send
    /// finds such an end).
    [[nodiscard]] virtual bool awaiting_input() const { return false; }
    /// True when every request this sink takes is answered on the connection (the agent's): a FIN
    /// that came with a request's last bytes then shows at the answer's send, so the connection
    /// may take a read that fills less than its buffer as draining the socket (set_short_reads).
    /// Default: false (TCP reads ask the kernel what is left).
    [[nodiscard]] virtual bool answers_requests() const { return false; }
};

}  // namespace tensorplay

namespace tensorplay::detail {

/// Reaches a Connection's state (friend of Connection).
struct ConnectionAccess {
    static ConnectionState& state(Connection& c) noexcept { return *c.state_; }
    static const ConnectionState& state(const Connection& c) noexcept { return *c.state_; }
    static std::shared_ptr<ConnectionState> shared_state(Connection& c) noexcept { return c.state_; }
    static std::shared_ptr<Connection> wrap(std::shared_ptr<ConnectionState> s) {
        return std::shared_ptr<Connection>(new Connection(std::move(s)));
    }
};

/// Counters of the channels that carry tensors by reference (tests and benchmarks).
struct ChannelStats {
    std::uint64_t cma_sent = 0;      ///< tensors sent by reference (the peer read them by cma)
    std::uint64_t cma_received = 0;  ///< tensors read from the peer's memory by cma
    std::uint64_t cma_held = 0;      ///< frames sent by reference whose tensors the peer has not released yet
};
[[nodiscard]] const ChannelStats& channel_stats(const Connection& c) noexcept;

/// As ConnectionListener::accept(), on a stream a transport's Listener accepted (the library's agent; an
/// shm stream's ring setup runs first, within the handshake timeout).
[[nodiscard]] Task<Result<std::shared_ptr<Connection>>> accept_stream(TransportStream stream, HelloInfo local, ConnectionLimits limits,
                                                                     HandshakeAuth auth);

/// When a frame that send_parts queues is written.
enum class Flush : std::uint8_t {
    later,  ///< by the writer, with whatever else this turn of the event loop queues
    now,    ///< at once, when no write is in progress (Connection::send's `flush`)
    /// As the connection paces an exchange of requests and replies (docs/protocol.md, "Sending"):
    /// a request at once unless replies to earlier ones are awaited on it (FrameSink::awaiting_input:
    /// then the calls made this turn share one write, as their replies will); a reply or an error
    /// at once unless more requests are buffered already (their replies then share one write).
    paced,
};

/// As Connection::send(Frame), without building a Frame: `payload` and `tensors` are moved from
/// only when the frame has to wait for the writer; `targets[i]` is where tensor i should land.
[[nodiscard]] Result<void> send_parts(Connection& c, FrameKind kind, std::uint64_t id, std::string_view name, Bytes& payload,
                                      std::vector<Tensor>& tensors, std::span<const Device> targets, Flush flush);

/// A tensor's bytes, produced piece by piece while its frame is written (cuda_basic's staging
/// slots): the writer asks for the next piece once it has written the previous one, whose memory
/// the source may then reuse. Used on the connection's executor.
class ByteSource {
public:
    virtual ~ByteSource() = default;
    /// The next piece, valid until the next call; empty once every byte came. An error (or more or
    /// fewer bytes than the tensor has) closes the connection: the frame is partly written.
    [[nodiscard]] virtual Task<Result<std::span<const std::uint8_t>>> next() = 0;
};

/// Takes a tensor's bytes piece by piece as the reader reads them (cuda_basic's receiving slots),
/// instead of the connection's allocator giving memory for all of them. Used on the connection's
/// executor.
class ByteSink {
public:
    virtual ~ByteSink() = default;
    /// Where the next bytes go (the piece given before is filled): at least one byte, at most the
    /// bytes left; may wait (a slot's previous copy). An error fails the frame only: the rest of
    /// the tensor is read and dropped.
    [[nodiscard]] virtual Task<Result<std::span<std::uint8_t>>> next() = 0;
    /// Every byte was read (the last piece filled): the tensor they make.
    [[nodiscard]] virtual Result<Tensor> finish() = 0;
};

/// Gives a sink for the tensor `desc` describes, or null: the connection's allocator then.
using SinkAllocator = std::function<Result<std::shared_ptr<ByteSink>>(const TensorDesc&)>;

/// Sets `c`'s sink allocator (asked first, for each tensor whose bytes are on the stream).
void set_sink_allocator(Connection& c, SinkAllocator allocator);

/// How a frame's tensors travel, as their channels planned it (the sending side of the channel
/// seam, docs/map.md): each one inline (its storage's bytes, or a ByteSource's pieces) or by a
/// reference that the peer's channel resolves. basic plans nothing (every tensor inline); cma
/// (channels/cma/) plans references into our memory under a lease; the device channels
/// (device_channels.hpp) staged copies, streamed sources and cuda_ipc references.
struct SendPlan {
    /// Per tensor the device it was sent from, when not its own (a staged host copy of a device
    /// tensor); missing entries: its own.
    std::vector<Device> sources;
    /// Per tensor its reference for the peer's channel (0 or missing: its bytes go inline). With
    /// any nonzero, the frame goes by reference under hold `hold` (0: a new one the connection
    /// numbers) that keeps `held` and `keep` until the peer's release (or the close). Its tensors
    /// with refs need not be host-addressable.
    std::vector<std::uint64_t> refs;
    std::uint64_t hold = 0;
    /// Tensors the peer reads from our memory (cma), kept by the hold, and their bytes (bounded by
    /// ConnectionLimits::max_held_bytes).
    std::vector<Tensor> held;
    std::size_t held_bytes = 0;
    /// Let go last: cma's lease, whose word is cleared before the held tensors go.
    std::shared_ptr<void> keep;
    /// Per tensor (missing or null: none) the source its bytes are written from instead of its
    /// storage, which need not be host-addressable then. Such a frame waits for the writer.
    std::vector<std::shared_ptr<ByteSource>> streamed;
    /// Control frames (name, payload) the peer's channel must read before this frame:
    /// queued right before it, so that they go when it goes.
    std::vector<std::pair<std::string, Bytes>> preface;
};

/// As send_parts, for a frame a device channel prepared (no cma: CPU tensors go inline).
[[nodiscard]] Result<void> send_parts(Connection& c, FrameKind kind, std::uint64_t id, std::string_view name, Bytes& payload,
                                      std::vector<Tensor>& tensors, std::span<const Device> targets, const SendPlan& plan,
                                      Flush flush);

/// Tells the peer that we are done with its hold `hold` (DeviceRefs::hold): a device channel's
/// receiver, once its copies of the frame's tensors have run. Nothing when closed.
void release_hold(Connection& c, std::uint64_t hold);

/// Read hint (docs/protocol.md, "Receiving"): take a read that fills less than the buffer as
/// draining the socket (recv) instead of asking the kernel (recvmsg with TCP_INQ, about 0.4 us
/// a round trip dearer here). Either way a FIN or reset that arrives with the last bytes of an
/// unfinished frame, or while a receive() (or FrameSink::awaiting_input) waits with nothing
/// sent since, is seen at once. Default: false; dispatch_to sets it from its sink
/// (FrameSink::answers_requests). Tests set it either way.
void set_short_reads(Connection& c, bool short_reads);


/// The channel the handshake chose for a tensor this side sends from `source` to the peer's `target`.
[[nodiscard]] ChannelKind send_channel(const Connection& c, Device source, Device target) noexcept;

/// The peer's pid as cma proved it (the process at the other end of the socket, which we read and
/// which reads us), or -1 without cma.
[[nodiscard]] int cma_peer_pid(const Connection& c) noexcept;

/// "uv, uds" (the names of `offers`): for messages.
[[nodiscard]] std::string offer_names(const std::vector<TransportOffer>& offers);

/// Hands every incoming frame to `sink` as it is read, until the connection closes (then
/// on_closed, and the sink is released). Instead of receive(), not beside it. A frame without
/// tensors is parsed in the read buffer and delivered from the read's completion: no coroutine
/// runs and nothing is allocated per frame.
void dispatch_to(Connection& c, std::shared_ptr<FrameSink> sink);

}  // namespace tensorplay::detail
