// Frame and handshake encoding for Connection (private): layouts documented in docs/protocol.md.
#pragma once

#include <tensorplay/transport/connection.hpp>

#include <array>
#include <span>
#include <string_view>

namespace tensorplay::detail {

/// Fixed frame header: u16 marker, u8 kind, u8 flags, u32 meta_len, u64 id, u64 payload_len.
inline constexpr std::size_t kFrameHeaderSize = 24;
inline constexpr std::uint16_t kFrameMarker = 0x5054;  // "TP"
/// Fixed hello prefix: u32 magic, u16 version, u16 flags, u32 body_len.
inline constexpr std::size_t kHelloPrefixSize = 12;
inline constexpr std::size_t kMaxHelloBody = 64 * 1024;
/// Payloads up to this size are appended to the frame's head block (one iovec per frame).
inline constexpr std::size_t kInlinePayloadMax = 1024;

/// Frame head flag: the tensor descriptors carry each a u64 address in the sender's memory (0: the
/// bytes follow inline) and the metadata ends with the u64 hold the receiver releases (cma).
inline constexpr std::uint8_t kFrameByReference = 0x01;
/// cma's release, the one control frame with an empty name, which the connection handles itself
/// and never hands on: the receiver has read the tensors of the sender's hold `id` and the sender
/// may drop them. Its metadata is an empty name and no tensors; it has no payload.
inline constexpr std::uint32_t kReleaseMetaLen = 8;

struct FrameHeader {
    FrameKind kind = FrameKind::request;
    std::uint8_t flags = 0;
    std::uint32_t meta_len = 0;
    std::uint64_t id = 0;
    std::uint64_t payload_len = 0;
};

struct FrameMeta {
    std::string name;
    std::vector<TensorDesc> tensors;
    /// With kFrameByReference: per tensor its address in the sender (0: inline), and the hold.
    std::vector<std::uint64_t> remote;
    std::uint64_t hold = 0;
};

/// What encode_frame_head reads of a frame to send (views: no Frame need be built).
struct FrameParts {
    FrameKind kind = FrameKind::request;
    std::uint64_t id = 0;
    std::string_view name;
    std::span<const std::uint8_t> payload;
    std::span<const Tensor> tensors;
    std::span<const Device> targets;  ///< where tensor i lands (missing entries: its own device)
    /// Nonzero: the frame goes by reference (kFrameByReference) under this hold, each tensor by
    /// `refs[i]` (0 or missing: inline), which the peer's channel resolves (cma: an address in our
    /// memory; cuda_ipc: an outbox range and event).
    std::uint64_t hold = 0;
    std::span<const std::uint64_t> refs;
    /// Where each tensor is held at the sender, when not its own device (a device channel's staged
    /// copy in host memory names the device it came from); missing entries: its own device.
    std::span<const Device> sources;
};

/// Encodes header + meta (+ the payload when it is small: `payload_inline` says so) into `out`
/// (resized to fit; its capacity is reused).
[[nodiscard]] Result<void> encode_frame_head(const FrameParts& frame, const ConnectionLimits& limits, Bytes& out,
                                             bool& payload_inline);
[[nodiscard]] inline Result<void> encode_frame_head(const Frame& f, const ConnectionLimits& limits, Bytes& out,
                                                    bool& payload_inline) {
    return encode_frame_head(FrameParts{f.kind, f.id, f.name, f.payload, f.tensors, f.targets, 0, {}, {}}, limits, out,
                             payload_inline);
}
/// The common metadata block, read without allocating: a name and no tensors. False when the
/// block is anything else (decode_frame_meta then says what it is).
[[nodiscard]] bool decode_small_meta(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits,
                                     std::string_view& name) noexcept;
[[nodiscard]] Result<FrameHeader> decode_frame_header(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits);
/// As decode_frame_header for the kFrameHeaderSize bytes at `p`, without building an error: false
/// when they are not a valid header (decode_frame_header then says why). For the read loop.
[[nodiscard]] bool peek_frame_header(const std::uint8_t* p, const ConnectionLimits& limits, FrameHeader& h) noexcept;
[[nodiscard]] Result<FrameMeta> decode_frame_meta(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits,
                                                 std::uint8_t flags = 0);
/// A release frame (kReleaseFrame) for `hold`.
[[nodiscard]] Bytes encode_release(std::uint64_t hold);

/// The name of the keep-alive control frame (ConnectionLimits::keepalive_interval): no payload;
/// the receiving connection drops it.
inline constexpr std::string_view kKeepAliveName = "keepalive";
/// A keep-alive frame, whole.
[[nodiscard]] Bytes encode_keepalive();

/// How a hello's sender authenticates (docs/protocol.md, "Handshake").
enum class HelloAuth : std::uint8_t {
    none = 0,         ///< no shared key
    hmac_sha256 = 1,  ///< a nonce follows; proofs are HMAC-SHA256 over the transcript
};
/// Where the handshake stands after a hello (a client always sends `done`).
enum class HelloStep : std::uint8_t {
    done = 0,     ///< from the server: the client is admitted, frames follow
    proof = 1,    ///< from the server: its proof follows; the client answers with an AuthRecord
    refused = 2,  ///< from the server: a reason follows, then the connection closes
    /// With a key, after both proofs (version 7): the side's offers (and the server's answer),
    /// under a MAC in the proof field; a hello before the proofs names no offers.
    offers = 3,
};
inline constexpr std::uint8_t kMaxHelloAuth = 1;
inline constexpr std::uint8_t kMaxHelloStep = 3;
/// The longest refusal reason on the wire.
inline constexpr std::size_t kMaxRefusalReason = 1024;

/// Bounds of a hello's negotiation lists (checked before anything is kept).
inline constexpr std::uint32_t kMaxHelloTransports = 16;
inline constexpr std::uint32_t kMaxHelloChannels = 64;
inline constexpr std::uint32_t kMaxAnswerChannels = 256;
inline constexpr std::size_t kMaxOfferField = 256;  ///< a name, domain, address or device type
inline constexpr std::size_t kMaxChannelParamsField = 16 * 1024;  ///< a channel offer's parameters (cuda_ipc: per device an outbox and its events)

/// A hello as it is on the wire: what the side says about itself (with its transport and channel
/// offers), how it authenticates, from the server the step the handshake is at and, unless it
/// refuses, the negotiation's answer (version 4).
struct Hello {
    HelloInfo info;
    HelloAuth auth = HelloAuth::none;
    std::array<std::uint8_t, 32> nonce{};  ///< when auth is hmac_sha256
    HelloStep step = HelloStep::done;
    std::string reason;                    ///< when step is refused
    std::array<std::uint8_t, 32> proof{};  ///< when step is proof (the proof) or offers (the MAC)
    std::optional<Negotiated> answer;      ///< from a server that does not refuse
};

[[nodiscard]] Bytes encode_hello(const Hello& hello, std::uint32_t magic = kProtocolMagic,
                                 std::uint16_t version = kProtocolVersion);
/// A hello without authentication that admits (from a server) or asks (from a client).
[[nodiscard]] Bytes encode_hello(const HelloInfo& hello, std::uint32_t magic = kProtocolMagic,
                                 std::uint16_t version = kProtocolVersion);
struct HelloPrefix {
    std::uint32_t magic = 0;
    std::uint16_t version = 0;
    std::uint32_t body_len = 0;
};
[[nodiscard]] Result<HelloPrefix> decode_hello_prefix(std::span<const std::uint8_t> bytes);
/// Decodes a version-4 hello body. Errc::protocol_error for anything malformed or unknown.
[[nodiscard]] Result<Hello> decode_hello_body(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits);

/// What follows the hellos in an authenticated handshake: the client's proof (or its refusal of
/// the server's), then the server's verdict. Header: u8 kind, u8 0, u16 body length.
/// `channels` (body: u8 1 or 0): the client's verdict on a cma answer, whether it can read the
/// server's memory (0: the pairs that chose cma use the next channel; docs/protocol.md, "Channels").
enum class AuthRecordKind : std::uint8_t { proof = 1, accepted = 2, refused = 3, channels = 4 };
inline constexpr std::size_t kAuthRecordHeaderSize = 4;
struct AuthRecord {
    AuthRecordKind kind = AuthRecordKind::accepted;
    std::array<std::uint8_t, 32> proof{};  ///< kind proof
    std::string reason;                    ///< kind refused
    bool readable = false;                 ///< kind channels
};
[[nodiscard]] Bytes encode_auth_record(const AuthRecord& record);
/// The body length the header at `header` (kAuthRecordHeaderSize bytes) announces, checked
/// against its kind (a proof: 32 bytes; accepted: 0; refused: at most kMaxRefusalReason).
[[nodiscard]] Result<std::size_t> decode_auth_record_header(std::span<const std::uint8_t> header);
/// Decodes a whole record (header and body).
[[nodiscard]] Result<AuthRecord> decode_auth_record(std::span<const std::uint8_t> bytes);

}  // namespace tensorplay::detail
