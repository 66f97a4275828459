// Frame and handshake encoding: every length is checked against ConnectionLimits before use.
#include "transport/frame.hpp"

#include <tensorplay/core/wire.hpp>

#include <cstdio>
#include <cstring>
#include <limits>

namespace tensorplay::detail {

namespace {

constexpr std::uint8_t kMaxDType = static_cast<std::uint8_t>(DType::boolean);
constexpr std::size_t kProofBytes = 32;

Device get_device(WireReader& r, std::string_view what) {
    auto type = r.u8();
    auto index = static_cast<std::int16_t>(r.u16());
    if (r.failed()) return {};
    if (type > static_cast<std::uint8_t>(DeviceType::cuda)) {
        r.set_error(Errc::protocol_error, std::string(what) + " has unknown device type " + std::to_string(type));
        return {};
    }
    if (index < -1) {
        r.set_error(Errc::protocol_error, std::string(what) + " has device index " + std::to_string(index));
        return {};
    }
    return Device{static_cast<DeviceType>(type), index};
}

}  // namespace

namespace {

/// Little-endian stores into a buffer sized beforehand (one store per field on x86, where the
/// compiler folds store_le's byte loop; WireWriter's push_back per byte cost a check per byte).
struct Put {
    std::uint8_t* p;
    template <class U>
    Put& le(U v) {
        store_le(p, v);
        p += sizeof(U);
        return *this;
    }
    Put& raw(const void* src, std::size_t n) {
        if (n) std::memcpy(p, src, n);
        p += n;
        return *this;
    }
    Put& device(Device d) { return le(static_cast<std::uint8_t>(d.type)).le(static_cast<std::uint16_t>(static_cast<std::int16_t>(d.index))); }
};

/// Bytes of one tensor descriptor on the wire (and its address when the frame goes by reference).
std::size_t desc_size(const Tensor& t, bool refs) { return 1 + 3 + 3 + 1 + 8 * t.shape().size() + 8 + (refs ? 8 : 0); }

}  // namespace

Result<void> encode_frame_head(const FrameParts& frame, const ConnectionLimits& limits, Bytes& out, bool& payload_inline) {
    if (frame.name.size() > limits.max_name_len)
        return fail(Errc::invalid_argument, "handler name of " + std::to_string(frame.name.size()) +
                                                " bytes exceeds the limit of " + std::to_string(limits.max_name_len));
    if (frame.tensors.size() > limits.max_tensors)
        return fail(Errc::invalid_argument, std::to_string(frame.tensors.size()) + " tensors exceed the limit of " +
                                                std::to_string(limits.max_tensors) + " per message");
    if (frame.payload.size() > limits.max_payload_bytes)
        return fail(Errc::invalid_argument, "payload of " + std::to_string(frame.payload.size()) +
                                                " bytes exceeds the limit of " + std::to_string(limits.max_payload_bytes));
    const bool refs = frame.hold != 0;
    std::size_t meta_len = 4 + frame.name.size() + 4 + (refs ? 8 : 0);
    std::size_t total = 0;
    for (std::size_t i = 0; i < frame.tensors.size(); ++i) {
        const Tensor& t = frame.tensors[i];
        if (!t.defined()) return fail(Errc::invalid_argument, "tensor " + std::to_string(i) + " is undefined");
        if (t.shape().size() > limits.max_ndim)
            return fail(Errc::invalid_argument, "tensor " + std::to_string(i) + " has " + std::to_string(t.shape().size()) +
                                                    " dimensions, over the limit of " + std::to_string(limits.max_ndim));
        if (t.nbytes() > limits.max_tensor_bytes || total + t.nbytes() > limits.max_tensor_bytes)
            return fail(Errc::invalid_argument, "tensor bytes exceed the limit of " + std::to_string(limits.max_tensor_bytes));
        total += t.nbytes();
        meta_len += desc_size(t, refs);
    }
    if (meta_len > limits.max_meta_bytes)
        return fail(Errc::invalid_argument, "frame metadata of " + std::to_string(meta_len) +
                                                " bytes exceeds the limit of " + std::to_string(limits.max_meta_bytes));
    payload_inline = frame.payload.size() <= kInlinePayloadMax;
    out.resize(kFrameHeaderSize + meta_len + (payload_inline ? frame.payload.size() : 0));
    Put w{out.data()};
    w.le(kFrameMarker).le(static_cast<std::uint8_t>(frame.kind)).le(refs ? kFrameByReference : std::uint8_t{0});
    w.le(static_cast<std::uint32_t>(meta_len)).le(frame.id).le(static_cast<std::uint64_t>(frame.payload.size()));
    w.le(static_cast<std::uint32_t>(frame.name.size())).raw(frame.name.data(), frame.name.size());
    w.le(static_cast<std::uint32_t>(frame.tensors.size()));
    for (std::size_t i = 0; i < frame.tensors.size(); ++i) {
        const Tensor& t = frame.tensors[i];
        const Device source = i < frame.sources.size() ? frame.sources[i] : t.device();
        w.le(static_cast<std::uint8_t>(t.dtype())).device(source).device(i < frame.targets.size() ? frame.targets[i] : t.device());
        w.le(static_cast<std::uint8_t>(t.shape().size()));
        for (auto d : t.shape()) w.le(static_cast<std::uint64_t>(d));
        w.le(static_cast<std::uint64_t>(t.nbytes()));
        if (refs) w.le(i < frame.refs.size() ? frame.refs[i] : std::uint64_t{0});
    }
    if (refs) w.le(frame.hold);
    if (payload_inline) w.raw(frame.payload.data(), frame.payload.size());
    return ok();
}

Bytes encode_release(std::uint64_t hold) {
    Bytes out(kFrameHeaderSize + kReleaseMetaLen);
    Put w{out.data()};
    w.le(kFrameMarker).le(static_cast<std::uint8_t>(FrameKind::control)).le(std::uint8_t{0});
    w.le(kReleaseMetaLen).le(hold).le(std::uint64_t{0});
    w.le(std::uint32_t{0}).le(std::uint32_t{0});
    return out;
}

Bytes encode_keepalive() {
    Bytes out;
    bool inlined = false;
    const FrameParts parts{FrameKind::control, 0, kKeepAliveName, {}, {}, {}, 0, {}, {}};
    // (Cannot fail: no tensors, a short name, an empty payload, under any limits.)
    (void)encode_frame_head(parts, ConnectionLimits{}, out, inlined);
    return out;
}

namespace {
/// A head's kind and flags together: requests, responses and errors may go by reference; a
/// control frame never does, and one with an empty name (cma's release: 8 bytes of metadata) has
/// no payload.
bool kind_fits(std::uint8_t kind, std::uint8_t flags, std::uint32_t meta_len, std::uint64_t payload_len) noexcept {
    if (kind == static_cast<std::uint8_t>(FrameKind::control))
        return flags == 0 && meta_len >= kReleaseMetaLen && (meta_len > kReleaseMetaLen || payload_len == 0);
    return kind >= 1 && kind <= 3 && (flags & ~kFrameByReference) == 0;
}
}  // namespace

bool peek_frame_header(const std::uint8_t* p, const ConnectionLimits& limits, FrameHeader& h) noexcept {
    const auto kind = p[2];
    h.flags = p[3];
    h.meta_len = load_le<std::uint32_t>(p + 4);
    h.id = load_le<std::uint64_t>(p + 8);
    h.payload_len = load_le<std::uint64_t>(p + 16);
    h.kind = static_cast<FrameKind>(kind);
    return load_le<std::uint16_t>(p) == kFrameMarker && kind_fits(kind, h.flags, h.meta_len, h.payload_len) &&
           h.meta_len <= limits.max_meta_bytes && h.payload_len <= limits.max_payload_bytes;
}

Result<FrameHeader> decode_frame_header(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits) {
    if (bytes.size() < kFrameHeaderSize)
        return fail(Errc::protocol_error, "frame header of " + std::to_string(bytes.size()) + " bytes (needs " +
                                              std::to_string(kFrameHeaderSize) + ")");
    FrameHeader h;
    if (peek_frame_header(bytes.data(), limits, h)) return h;
    // What is wrong with it, in the order a reader would notice.
    if (const auto marker = load_le<std::uint16_t>(bytes.data()); marker != kFrameMarker) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "%04x", static_cast<unsigned>(marker));
        return fail(Errc::protocol_error, std::string("bad frame marker 0x") + hex + " (garbage on the stream?)");
    }
    if (const auto kind = bytes[2]; kind < 1 || kind > 4)
        return fail(Errc::protocol_error, "unknown frame kind " + std::to_string(kind));
    if (!kind_fits(bytes[2], h.flags, h.meta_len, h.payload_len))
        return fail(Errc::protocol_error, "frame of kind " + std::to_string(bytes[2]) + " with flags " + std::to_string(h.flags) +
                                              (bytes[2] == 4 ? " is not a control frame (flags 0; a release: 8 bytes "
                                                                               "of metadata, no payload)"
                                                             : " names unknown flags"));
    if (h.meta_len > limits.max_meta_bytes)
        return fail(Errc::protocol_error, "frame metadata length " + std::to_string(h.meta_len) +
                                              " exceeds the limit of " + std::to_string(limits.max_meta_bytes));
    return fail(Errc::protocol_error, "frame payload length " + std::to_string(h.payload_len) + " exceeds the limit of " +
                                          std::to_string(limits.max_payload_bytes));
}

bool decode_small_meta(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits, std::string_view& name) noexcept {
    // A name and a zero tensor count, exactly.
    if (bytes.size() < 8) return false;
    const std::size_t name_len = load_le<std::uint32_t>(bytes.data());
    if (name_len > limits.max_name_len || bytes.size() != 8 + name_len || load_le<std::uint32_t>(bytes.data() + 4 + name_len) != 0)
        return false;
    name = std::string_view(reinterpret_cast<const char*>(bytes.data() + 4), name_len);
    return true;
}

Result<FrameMeta> decode_frame_meta(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits, std::uint8_t flags) {
    FrameMeta m;
    const bool refs = (flags & kFrameByReference) != 0;
    if (std::string_view name; !refs && decode_small_meta(bytes, limits, name)) {
        m.name = name;
        return m;
    }
    WireReader r(bytes);
    m.name = std::string(r.str32(limits.max_name_len, "handler name"));
    auto count = r.u32();
    if (!r.failed() && count > limits.max_tensors)
        return fail(Errc::protocol_error, "frame announces " + std::to_string(count) + " tensors, over the limit of " +
                                              std::to_string(limits.max_tensors));
    // Each descriptor needs at least 15 bytes, so a count larger than the block is refused before reserving.
    if (!r.failed() && std::size_t(count) * 15 > r.remaining())
        return fail(Errc::protocol_error, "frame announces " + std::to_string(count) + " tensors in a block of " +
                                              std::to_string(r.remaining()) + " bytes");
    m.tensors.reserve(count);
    std::uint64_t total = 0;
    for (std::uint32_t i = 0; i < count && !r.failed(); ++i) {
        TensorDesc d;
        auto dt = r.u8();
        d.source = get_device(r, "tensor source");
        d.target = get_device(r, "tensor target");
        auto ndim = r.u8();
        if (r.failed()) break;
        if (dt > kMaxDType) return fail(Errc::protocol_error, "tensor " + std::to_string(i) + " has unknown dtype " + std::to_string(dt));
        d.dtype = static_cast<DType>(dt);
        if (ndim > limits.max_ndim)
            return fail(Errc::protocol_error, "tensor " + std::to_string(i) + " has " + std::to_string(ndim) +
                                                  " dimensions, over the limit of " + std::to_string(limits.max_ndim));
        d.shape.reserve(ndim);
        for (unsigned k = 0; k < ndim; ++k) {
            auto dim = r.i64();
            if (dim < 0) return fail(Errc::protocol_error, "tensor " + std::to_string(i) + " has a negative dimension");
            d.shape.push_back(dim);
        }
        d.nbytes = r.u64();
        if (r.failed()) break;
        // The same rule as every tensor's (checked_nbytes): no partial product of the shape may
        // overflow, even one that a later zero dimension would bring back to 0.
        auto need = checked_nbytes(d.dtype, d.shape);
        if (!need)
            return fail(Errc::protocol_error, "tensor " + std::to_string(i) + " has a shape whose size overflows (" +
                                                  need.error().message() + ")");
        if (*need != d.nbytes)
            return fail(Errc::protocol_error, "tensor " + std::to_string(i) + " announces " + std::to_string(d.nbytes) +
                                                  " bytes, which does not match its dtype and shape");
        if (d.nbytes > limits.max_tensor_bytes || total + d.nbytes > limits.max_tensor_bytes)
            return fail(Errc::protocol_error, "tensor bytes in one frame exceed the limit of " +
                                                  std::to_string(limits.max_tensor_bytes));
        total += d.nbytes;
        if (refs) {
            const auto addr = r.u64();
            if (r.failed()) break;
            // (Bounded by the announced nbytes, which the limits bound: the range must not wrap.)
            if (addr != 0 && (d.nbytes == 0 || addr > std::numeric_limits<std::uint64_t>::max() - d.nbytes))
                return fail(Errc::protocol_error, "tensor " + std::to_string(i) + " announces a remote range of " +
                                                      std::to_string(d.nbytes) + " bytes at an impossible address");
            m.remote.push_back(addr);
        }
        m.tensors.push_back(std::move(d));
    }
    if (refs) {
        m.hold = r.u64();
        if (!r.failed() && m.hold == 0) return fail(Errc::protocol_error, "frame by reference names hold 0");
    }
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding frame metadata"));
    return m;
}

Bytes encode_hello(const Hello& hello, std::uint32_t magic, std::uint16_t version) {
    WireWriter w;
    w.u32(magic).u16(version).u16(0).u32(0);
    w.str32(hello.info.name).i32(hello.info.rank);
    w.u32(static_cast<std::uint32_t>(hello.info.transports.size()));
    for (auto& t : hello.info.transports) w.str32(t.name).str32(t.domain).str32(t.address);
    w.u32(static_cast<std::uint32_t>(hello.info.channels.size()));
    for (auto& c : hello.info.channels) w.str32(c.name).str32(c.device_type).str32(c.domain).str32(c.params);
    w.u8(static_cast<std::uint8_t>(hello.auth));
    if (hello.auth == HelloAuth::hmac_sha256) w.raw(hello.nonce);
    w.u8(static_cast<std::uint8_t>(hello.step));
    if (hello.step == HelloStep::refused)
        w.str32(std::string_view(hello.reason).substr(0, kMaxRefusalReason));
    else if (hello.step == HelloStep::proof || hello.step == HelloStep::offers)
        w.raw(hello.proof);
    w.u8(hello.answer && hello.step != HelloStep::refused ? 1 : 0);
    if (hello.answer && hello.step != HelloStep::refused) {
        w.str32(hello.answer->transport).str32(hello.answer->address);
        w.u32(static_cast<std::uint32_t>(hello.answer->channels.size()));
        for (auto& c : hello.answer->channels) w.str32(c.client_device).str32(c.server_device).str32(c.channel);
    }
    w.patch_u32(8, static_cast<std::uint32_t>(w.size() - kHelloPrefixSize));
    return std::move(w).take();
}

Bytes encode_hello(const HelloInfo& hello, std::uint32_t magic, std::uint16_t version) {
    Hello h;
    h.info = hello;
    return encode_hello(h, magic, version);
}

Result<HelloPrefix> decode_hello_prefix(std::span<const std::uint8_t> bytes) {
    WireReader r(bytes.first(kHelloPrefixSize));
    HelloPrefix p;
    p.magic = r.u32();
    p.version = r.u16();
    r.u16();
    p.body_len = r.u32();
    if (p.magic != kProtocolMagic)
        return fail(Errc::protocol_error, "bad handshake magic 0x" + [&] {
            char buf[16];
            std::snprintf(buf, sizeof buf, "%08x", p.magic);
            return std::string(buf);
        }() + " (not a tensorplay-rpc peer)");
    if (p.body_len > kMaxHelloBody)
        return fail(Errc::protocol_error, "handshake body length " + std::to_string(p.body_len) + " exceeds the limit of " +
                                              std::to_string(kMaxHelloBody));
    return p;
}

Result<Hello> decode_hello_body(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits) {
    WireReader r(bytes);
    Hello hello;
    HelloInfo& h = hello.info;
    h.name = std::string(r.str32(limits.max_name_len, "worker name"));
    h.rank = r.i32();
    h.transports.clear();
    h.channels.clear();
    auto nt = r.u32();
    if (nt > kMaxHelloTransports)
        return fail(Errc::protocol_error, "handshake lists " + std::to_string(nt) + " transports (limit " +
                                              std::to_string(kMaxHelloTransports) + ")");
    for (std::uint32_t i = 0; i < nt && !r.failed(); ++i) {
        TransportOffer t;
        t.name = std::string(r.str32(kMaxOfferField, "transport name"));
        t.domain = std::string(r.str32(kMaxOfferField, "transport domain"));
        t.address = std::string(r.str32(kMaxOfferField, "transport address"));
        h.transports.push_back(std::move(t));
    }
    auto nc = r.u32();
    if (nc > kMaxHelloChannels)
        return fail(Errc::protocol_error, "handshake lists " + std::to_string(nc) + " channels (limit " +
                                              std::to_string(kMaxHelloChannels) + ")");
    for (std::uint32_t i = 0; i < nc && !r.failed(); ++i) {
        ChannelOffer c;
        c.name = std::string(r.str32(kMaxOfferField, "channel name"));
        c.device_type = std::string(r.str32(kMaxOfferField, "channel device type"));
        c.domain = std::string(r.str32(kMaxOfferField, "channel domain"));
        c.params = std::string(r.str32(kMaxChannelParamsField, "channel parameters"));
        h.channels.push_back(std::move(c));
    }
    const auto auth = r.u8();
    if (!r.failed() && auth > kMaxHelloAuth)
        return fail(Errc::protocol_error, "handshake names unknown authentication method " + std::to_string(auth));
    hello.auth = static_cast<HelloAuth>(auth);
    if (hello.auth == HelloAuth::hmac_sha256) {
        auto n = r.raw(hello.nonce.size(), "handshake nonce");
        if (!r.failed()) std::memcpy(hello.nonce.data(), n.data(), n.size());
    }
    const auto step = r.u8();
    if (!r.failed() && step > kMaxHelloStep)
        return fail(Errc::protocol_error, "handshake names unknown step " + std::to_string(step));
    hello.step = static_cast<HelloStep>(step);
    if (hello.step == HelloStep::refused) {
        hello.reason = std::string(r.str32(kMaxRefusalReason, "refusal reason"));
    } else if (hello.step == HelloStep::proof || hello.step == HelloStep::offers) {
        if (hello.auth != HelloAuth::hmac_sha256)
            return fail(Errc::protocol_error, "handshake carries a proof without naming an authentication method");
        auto p = r.raw(hello.proof.size(), "handshake proof");
        if (!r.failed()) std::memcpy(hello.proof.data(), p.data(), p.size());
    }
    const auto has_answer = r.u8();
    if (!r.failed() && (has_answer > 1 || (has_answer == 1 && hello.step == HelloStep::refused)))
        return fail(Errc::protocol_error, "handshake has a bad negotiation flag " + std::to_string(has_answer));
    if (has_answer == 1 && !r.failed()) {
        Negotiated a;
        a.transport = std::string(r.str32(kMaxOfferField, "chosen transport"));
        a.address = std::string(r.str32(kMaxOfferField, "chosen address"));
        const auto na = r.u32();
        if (na > kMaxAnswerChannels)
            return fail(Errc::protocol_error, "handshake answers " + std::to_string(na) + " channel choices (limit " +
                                                  std::to_string(kMaxAnswerChannels) + ")");
        for (std::uint32_t i = 0; i < na && !r.failed(); ++i) {
            ChannelChoice c;
            c.client_device = std::string(r.str32(kMaxOfferField, "client device type"));
            c.server_device = std::string(r.str32(kMaxOfferField, "server device type"));
            c.channel = std::string(r.str32(kMaxOfferField, "chosen channel"));
            a.channels.push_back(std::move(c));
        }
        hello.answer = std::move(a);
    }
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding the handshake"));
    return hello;
}

Bytes encode_auth_record(const AuthRecord& record) {
    WireWriter w;
    const std::string_view reason = std::string_view(record.reason).substr(0, kMaxRefusalReason);
    const std::size_t len = record.kind == AuthRecordKind::proof      ? record.proof.size()
                            : record.kind == AuthRecordKind::refused  ? reason.size()
                            : record.kind == AuthRecordKind::channels ? 1
                                                                      : 0;
    w.u8(static_cast<std::uint8_t>(record.kind)).u8(0).u16(static_cast<std::uint16_t>(len));
    if (record.kind == AuthRecordKind::proof) w.raw(record.proof);
    if (record.kind == AuthRecordKind::refused) w.raw(reason);
    if (record.kind == AuthRecordKind::channels) w.u8(record.readable ? 1 : 0);
    return std::move(w).take();
}

Result<std::size_t> decode_auth_record_header(std::span<const std::uint8_t> header) {
    if (header.size() < kAuthRecordHeaderSize)
        return fail(Errc::protocol_error, "handshake record header of " + std::to_string(header.size()) + " bytes");
    const auto kind = header[0];
    const std::size_t len = load_le<std::uint16_t>(header.data() + 2);
    switch (kind) {
    case static_cast<std::uint8_t>(AuthRecordKind::proof):
        if (len != kProofBytes) break;
        return len;
    case static_cast<std::uint8_t>(AuthRecordKind::accepted):
        if (len != 0) break;
        return len;
    case static_cast<std::uint8_t>(AuthRecordKind::refused):
        if (len > kMaxRefusalReason) break;
        return len;
    case static_cast<std::uint8_t>(AuthRecordKind::channels):
        if (len != 1) break;
        return len;
    default:
        return fail(Errc::protocol_error, "unknown handshake record kind " + std::to_string(kind));
    }
    return fail(Errc::protocol_error, "handshake record of kind " + std::to_string(kind) + " announces " +
                                          std::to_string(len) + " bytes");
}

Result<AuthRecord> decode_auth_record(std::span<const std::uint8_t> bytes) {
    auto len = decode_auth_record_header(bytes);
    if (!len) return fail(len.error());
    if (bytes.size() != kAuthRecordHeaderSize + *len)
        return fail(Errc::protocol_error, "handshake record of " + std::to_string(bytes.size()) + " bytes, announced " +
                                              std::to_string(kAuthRecordHeaderSize + *len));
    AuthRecord rec;
    rec.kind = static_cast<AuthRecordKind>(bytes[0]);
    const auto body = bytes.subspan(kAuthRecordHeaderSize);
    if (rec.kind == AuthRecordKind::proof) std::memcpy(rec.proof.data(), body.data(), body.size());
    if (rec.kind == AuthRecordKind::refused) rec.reason.assign(reinterpret_cast<const char*>(body.data()), body.size());
    if (rec.kind == AuthRecordKind::channels) {
        if (body[0] > 1) return fail(Errc::protocol_error, "channel verdict " + std::to_string(body[0]) + " (0 or 1)");
        rec.readable = body[0] == 1;
    }
    return rec;
}

}  // namespace tensorplay::detail
