// Connection: a framed, bidirectional stream (TCP, a Unix socket, shared-memory rings) with a
// versioned handshake that authenticates and negotiates the transport and channels (see
// docs/protocol.md). ConnectionListener (listener.hpp) accepts them.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/secret.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/device/device.hpp>
#include <tensorplay/device/tensor.hpp>
#include <tensorplay/transport/address.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay {

/// Protocol constants: every connection starts with this magic and version (docs/protocol.md,
/// "Handshake": 7 reveals no offers before the key is proven; other versions are refused by name).
inline constexpr std::uint32_t kProtocolMagic = 0x43505254;  // "TRPC" little-endian
inline constexpr std::uint16_t kProtocolVersion = 7;

/// Bytes that a group of connections (an agent's) may hold for frames still arriving: a payload
/// as its bytes come in, a tensor once allocated; given back when the frame is handed over or
/// lost. A frame that would pass the limit is answered with an error (Frame::alloc_error, its
/// bytes read and dropped), not buffered. Thread-safe.
class TP_API ReceiveBudget {
public:
    explicit ReceiveBudget(std::size_t limit) noexcept : limit_(limit) {}
    /// Takes `n` bytes; false (nothing taken) when that would pass the limit.
    [[nodiscard]] bool try_take(std::size_t n) noexcept;
    /// Gives back `n` bytes taken before.
    void give_back(std::size_t n) noexcept;
    /// Bytes taken now.
    [[nodiscard]] std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::size_t limit() const noexcept { return limit_; }

private:
    std::atomic<std::size_t> used_{0};
    std::size_t limit_;
};

/// Bounds applied to everything read from the network, before anything is allocated.
struct TP_API ConnectionLimits {
    std::size_t max_name_len = 1024;                      ///< handler and worker names
    std::size_t max_meta_bytes = 1u << 20;                ///< a frame's metadata block
    std::size_t max_payload_bytes = std::size_t(1) << 31; ///< a frame's payload
    std::size_t max_tensors = 4096;                       ///< tensors in one frame
    std::size_t max_ndim = 32;                            ///< dimensions of one tensor
    std::size_t max_tensor_bytes = std::size_t(1) << 36;  ///< bytes of one tensor (and of all, summed)
    /// Payload plus tensor bytes of one frame: what one connection holds before handing a frame
    /// over (a larger announcement is a protocol_error; payloads grow as their bytes arrive).
    std::size_t max_frame_bytes = std::size_t(1) << 36;
    /// Shared by the connections of a group (null: none); the native agent gives its own one.
    std::shared_ptr<ReceiveBudget> budget;
    Duration handshake_timeout = std::chrono::seconds(10);
    /// A frame whose first bytes arrived must be whole within this, or the connection closes with
    /// Errc::timeout (checked every timeout: it closes between once and twice it). 0: no bound.
    Duration frame_timeout = std::chrono::seconds(120);
    /// A connection that receives nothing for this long closes with Errc::timeout (between once
    /// and twice it). 0 (default): never; a peer's request racing such a close would be lost.
    Duration idle_timeout{0};
    /// When nothing was sent for this long, a keep-alive goes out (a control frame that the peer's
    /// connection drops), so that a live connection does not trip the peer's idle_timeout. Set it
    /// to well under the peer's idle_timeout (the agent: a third of it). 0 (default): none.
    Duration keepalive_interval{0};
    /// Backpressure on a peer that does not read what is sent to it (docs/protocol.md,
    /// "Backpressure"): over `max_queued_soft` bytes of frames queued for writing, the connection
    /// stops reading that peer until the writer has brought them under; past `max_queued_hard`
    /// bytes in two or more frames, it closes (Errc::connection_lost). 0 (default): no bound.
    std::size_t max_queued_soft = 0;
    std::size_t max_queued_hard = 0;
    /// Bytes of tensors sent by reference (a same-host channel reads them from our memory) that the
    /// peer has not released yet: past it, further tensors go on the stream, into the queue that
    /// the bounds above bound. 0 (default): no bound.
    std::size_t max_held_bytes = 0;
};

/// A transport a side offers in its hello (docs/protocol.md, "Negotiation").
struct TransportOffer {
    std::string name;     ///< "uv", "uds"
    std::string domain;   ///< whom it reaches: usable when both sides' are equal
    std::string address;  ///< where this side listens for it (an Address URL); empty: nowhere
};

/// A channel a side offers for one of its device types.
struct TP_API ChannelOffer {
    ChannelOffer() = default;
    /// An offer; `params` is left for the connection to fill (cma).
    ChannelOffer(std::string n, std::string type, std::string dom, std::string p = {})
        : name(std::move(n)), device_type(std::move(type)), domain(std::move(dom)), params(std::move(p)) {}
    std::string name;         ///< "basic", "cma"
    std::string device_type;  ///< "cpu", "cuda"
    std::string domain;       ///< usable when both sides' are equal ("any" for basic; cma: filled by the connection)
    std::string params;       ///< the channel's setup data (cma: identity and probe target; filled by the connection)
};

/// The channel chosen for tensors from a client's device type to a server's.
struct ChannelChoice {
    std::string client_device;
    std::string server_device;
    std::string channel;
    friend bool operator==(const ChannelChoice&, const ChannelChoice&) = default;
};

/// What a handshake chose: the transport data goes over (and, when it is not the one the
/// handshake ran on, the server's address for it), and per device pair the channel.
struct TP_API Negotiated {
    std::string transport;
    std::string address;
    std::vector<ChannelChoice> channels;
    friend bool operator==(const Negotiated&, const Negotiated&) = default;
};

/// What each side says about itself in the handshake. The lists are in the side's priority
/// order, highest first; the server's order decides.
struct TP_API HelloInfo {
    std::string name;
    int rank = -1;
    std::vector<TransportOffer> transports{TransportOffer{"uv", "uv", ""}};
    std::vector<ChannelOffer> channels{ChannelOffer{"basic", "cpu", "any"}};
};

/// How a handshake authenticates the peer and whom the accepting side admits (docs/protocol.md,
/// "Handshake").
struct TP_API HandshakeAuth {
    /// The group's shared secret (any bytes); empty: none. With one, both sides prove that they
    /// hold it (HMAC-SHA256 over the handshake, fresh nonces each side); a side without one, or
    /// with another, is refused with Errc::unauthorized. Never logged nor sent; a copy of it
    /// (shared, not duplicated) is kept only for the handshake.
    Secret key;
    /// Accepting side: whether the peer, as it introduced itself (and proved, with a key), may
    /// connect; an error refuses it, and its message is sent to the peer as the reason. Null:
    /// everyone. Called on the connection's executor.
    std::function<Result<void>(const HelloInfo& peer)> admit;
};

/// What a frame is. `control`: a channel's own message, never a call: its name says which
/// ("cuda_ipc.ready", ...), and it carries no tensors; the connection handles cma's releases
/// itself and hands the others to its reader like any frame (docs/protocol.md, "Control frames").
enum class FrameKind : std::uint8_t { request = 1, response = 2, error = 3, control = 4 };

/// A tensor as announced in a frame: what the receiver must allocate before reading its bytes.
struct TensorDesc {
    DType dtype = DType::uint8;
    std::vector<std::int64_t> shape;
    std::uint64_t nbytes = 0;
    Device source;  ///< where the sender holds it
    Device target;  ///< where the receiver should put it
};

/// One message on a connection. `id` matches a response to its request; `name` is the handler.
/// When sending, `targets[i]` is where tensor i should land (missing entries: its own device).
/// When receiving, `tensors` were allocated by the connection's allocator for their targets, and
/// `targets[i]` is the target the sender asked for.
struct Frame {
    FrameKind kind = FrameKind::request;
    std::uint64_t id = 0;
    std::string name;
    Bytes payload;
    std::vector<Tensor> tensors;
    std::vector<Device> targets;
    /// Receive side only: set when the allocator refused a tensor (its bytes were skipped and
    /// `tensors` is incomplete); the connection stays usable.
    std::optional<Error> alloc_error;
};

/// Allocates the destination of an incoming tensor (called on the connection's executor).
using TensorAllocator = std::function<Result<Tensor>(const TensorDesc&)>;

/// Counters for tests and benchmarks.
struct ConnectionStats {
    std::uint64_t frames_sent = 0;
    std::uint64_t writes = 0;          ///< async_write operations (each gathers all queued frames)
    std::uint64_t frames_received = 0;
    std::uint64_t reads = 0;           ///< socket read operations
    std::uint64_t keepalives_sent = 0;      ///< ConnectionLimits::keepalive_interval's frames
    std::uint64_t keepalives_received = 0;  ///< the peer's keep-alives (dropped, never handed on)
};

namespace detail {
struct ConnectionState;
struct ConnectionAccess;
}

/// A framed connection. Strand-bound: every member must be called on the executor it was
/// created on (which must be a strand or a single-threaded context). Frames queued with send()
/// are written by one writer coroutine that gathers all queued frames into one async_write.
/// A malformed frame closes the connection; receive() then returns Errc::protocol_error.
class TP_API Connection {
public:
    ~Connection();
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    /// Connects to `address` over its transport and runs the handshake; when the server chooses
    /// another transport, connects again there (its address from the answer) and runs the
    /// handshake once more, which must settle on it. All bounded by limits.handshake_timeout.
    /// Errors as connect(host, port), and not_supported when the sides share no transport.
    [[nodiscard]] static Task<Result<std::shared_ptr<Connection>>> connect(Address address, HelloInfo local,
                                                                          ConnectionLimits limits, HandshakeAuth auth);
    /// Connects to `host:port` over TCP and runs the handshake (bounded by limits.handshake_timeout).
    /// Errors: connection_lost / io_error (connect), protocol_error (bad magic or version),
    /// unauthorized (a key on one side only, different keys, or the server refused us), timeout.
    [[nodiscard]] static Task<Result<std::shared_ptr<Connection>>> connect(std::string host, std::uint16_t port,
                                                                          HelloInfo local, ConnectionLimits limits,
                                                                          HandshakeAuth auth);
    /// As connect() without a key. (An overload, not a default argument: GCC 12 copies a
    /// coroutine's defaulted class-type argument bitwise.)
    [[nodiscard]] static Task<Result<std::shared_ptr<Connection>>> connect(std::string host, std::uint16_t port,
                                                                          HelloInfo local, ConnectionLimits limits = {});
    /// The peer's handshake.
    [[nodiscard]] const HelloInfo& peer() const noexcept;
    /// The transport this connection runs on ("uv", "uds", "shm").
    [[nodiscard]] const std::string& transport() const noexcept;
    /// What the handshake chose (the transport, the channel per device pair).
    [[nodiscard]] const Negotiated& negotiated() const noexcept;
    /// Server side: the handshake chose another transport, so this connection carries nothing.
    [[nodiscard]] bool redirected() const noexcept;
    /// "name (rank r) at ip:port", for messages.
    [[nodiscard]] std::string describe() const;
    [[nodiscard]] Executor get_executor() const;

    /// Replaces the allocator for incoming tensors (default: CPU tensors only, others refused).
    void set_allocator(TensorAllocator allocator);
    /// Queues `frame` for writing; the tensors are referenced, not copied, until written (or, those
    /// the cma channel carries, until the peer has read them: do not change them meanwhile).
    /// `flush`: when no write is in progress, write everything queued now, in this call (one
    /// non-blocking sendmsg; the writer takes any rest). Use it when no other frame will follow
    /// soon; without it, frames queued in the same turn of the event loop share one write.
    /// Errc::connection_lost (or the close reason) when the connection is closed.
    [[nodiscard]] Result<void> send(Frame frame, bool flush = false);
    /// Reads the next frame. One reader at a time. Cancellation: terminal only, closes the
    /// connection (a frame may be half read).
    [[nodiscard]] Task<Result<Frame>> receive();
    /// Closes the socket; pending and later operations fail with `reason` (default connection_lost).
    /// Cancels the connection's background coroutines (writer, watchdog, dispatch reader).
    void close(std::optional<Error> reason = std::nullopt);
    /// Completes once every background coroutine of this connection has ended (after close(), or
    /// the peer's): none of them runs afterwards (a frame sink has had its on_closed).
    /// Does not close. One joiner at a time; cancelling the join ends only the join. A frame
    /// reader that would start after the join began is refused (the connection closes).
    [[nodiscard]] Task<void> join();
    [[nodiscard]] bool is_open() const noexcept;
    [[nodiscard]] const ConnectionStats& stats() const noexcept;

private:
    friend struct detail::ConnectionAccess;  // the library's own extensions (its agent's dispatch, by-parts sends)
    explicit Connection(std::shared_ptr<detail::ConnectionState> state);
    std::shared_ptr<detail::ConnectionState> state_;
};

}  // namespace tensorplay
