// Frame and handshake encoding: every length is checked against ConnectionLimits before use.
#include "transport/frame.hpp"

#include <tensorplay/core/wire.hpp>

#include <cstdio>
#include <limits>

namespace tensorplay::detail {

namespace {

constexpr std::uint8_t kMaxDType = static_cast<std::uint8_t>(DType::boolean);

void put_device(WireWriter& w, Device d) {
    w.u8(static_cast<std::uint8_t>(d.type));
    w.u16(static_cast<std::uint16_t>(static_cast<std::int16_t>(d.index)));
}

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

Result<Bytes> encode_frame_head(const Frame& frame, const ConnectionLimits& limits, bool& payload_inline) {
    if (frame.name.size() > limits.max_name_len)
        return fail(Errc::invalid_argument, "handler name of " + std::to_string(frame.name.size()) +
                                                " bytes exceeds the limit of " + std::to_string(limits.max_name_len));
    if (frame.tensors.size() > limits.max_tensors)
        return fail(Errc::invalid_argument, std::to_string(frame.tensors.size()) + " tensors exceed the limit of " +
                                                std::to_string(limits.max_tensors) + " per message");
    if (frame.payload.size() > limits.max_payload_bytes)
        return fail(Errc::invalid_argument, "payload of " + std::to_string(frame.payload.size()) +
                                                " bytes exceeds the limit of " + std::to_string(limits.max_payload_bytes));
    payload_inline = frame.payload.size() <= kInlinePayloadMax;
    std::size_t reserve = kFrameHeaderSize + 8 + frame.name.size() + frame.tensors.size() * 64 +
                          (payload_inline ? frame.payload.size() : 0);
    Bytes buf;
    buf.reserve(reserve);
    WireWriter w(std::move(buf));
    w.u16(kFrameMarker).u8(static_cast<std::uint8_t>(frame.kind)).u8(0).u32(0).u64(frame.id).u64(frame.payload.size());
    w.str32(frame.name);
    w.u32(static_cast<std::uint32_t>(frame.tensors.size()));
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
        Device target = i < frame.targets.size() ? frame.targets[i] : t.device();
        w.u8(static_cast<std::uint8_t>(t.dtype()));
        put_device(w, t.device());
        put_device(w, target);
        w.u8(static_cast<std::uint8_t>(t.shape().size()));
        for (auto d : t.shape()) w.i64(d);
        w.u64(t.nbytes());
    }
    std::size_t meta_len = w.size() - kFrameHeaderSize;
    if (meta_len > limits.max_meta_bytes)
        return fail(Errc::invalid_argument, "frame metadata of " + std::to_string(meta_len) +
                                                " bytes exceeds the limit of " + std::to_string(limits.max_meta_bytes));
    w.patch_u32(4, static_cast<std::uint32_t>(meta_len));
    if (payload_inline) w.raw(frame.payload);
    return std::move(w).take();
}

Result<FrameHeader> decode_frame_header(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits) {
    WireReader r(bytes.first(kFrameHeaderSize));
    auto marker = r.u16();
    auto kind = r.u8();
    r.u8();  // flags, reserved
    FrameHeader h;
    h.meta_len = r.u32();
    h.id = r.u64();
    h.payload_len = r.u64();
    if (marker != kFrameMarker)
        return fail(Errc::protocol_error, "bad frame marker 0x" + std::to_string(marker) + " (garbage on the stream?)");
    if (kind < 1 || kind > 3) return fail(Errc::protocol_error, "unknown frame kind " + std::to_string(kind));
    h.kind = static_cast<FrameKind>(kind);
    if (h.meta_len > limits.max_meta_bytes)
        return fail(Errc::protocol_error, "frame metadata length " + std::to_string(h.meta_len) +
                                              " exceeds the limit of " + std::to_string(limits.max_meta_bytes));
    if (h.payload_len > limits.max_payload_bytes)
        return fail(Errc::protocol_error, "frame payload length " + std::to_string(h.payload_len) +
                                              " exceeds the limit of " + std::to_string(limits.max_payload_bytes));
    return h;
}

Result<FrameMeta> decode_frame_meta(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits) {
    WireReader r(bytes);
    FrameMeta m;
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
        std::uint64_t elems = 1;
        bool overflow = false;
        d.shape.reserve(ndim);
        for (unsigned k = 0; k < ndim; ++k) {
            auto dim = r.i64();
            if (dim < 0) return fail(Errc::protocol_error, "tensor " + std::to_string(i) + " has a negative dimension");
            if (dim != 0 && elems > std::numeric_limits<std::uint64_t>::max() / std::uint64_t(dim)) overflow = true;
            elems *= std::uint64_t(dim);
            d.shape.push_back(dim);
        }
        d.nbytes = r.u64();
        if (r.failed()) break;
        std::uint64_t esz = element_size(d.dtype);
        if (overflow || (esz != 0 && elems > std::numeric_limits<std::uint64_t>::max() / esz) || elems * esz != d.nbytes)
            return fail(Errc::protocol_error, "tensor " + std::to_string(i) + " announces " + std::to_string(d.nbytes) +
                                                  " bytes, which does not match its dtype and shape");
        if (d.nbytes > limits.max_tensor_bytes || total + d.nbytes > limits.max_tensor_bytes)
            return fail(Errc::protocol_error, "tensor bytes in one frame exceed the limit of " +
                                                  std::to_string(limits.max_tensor_bytes));
        total += d.nbytes;
        m.tensors.push_back(std::move(d));
    }
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding frame metadata"));
    return m;
}

Bytes encode_hello(const HelloInfo& hello, std::uint32_t magic, std::uint16_t version) {
    WireWriter w;
    w.u32(magic).u16(version).u16(0).u32(0);
    w.str32(hello.name).i32(hello.rank);
    w.u32(static_cast<std::uint32_t>(hello.transports.size()));
    for (auto& t : hello.transports) w.str32(t);
    w.u32(static_cast<std::uint32_t>(hello.channels.size()));
    for (auto& c : hello.channels) w.str32(c);
    w.patch_u32(8, static_cast<std::uint32_t>(w.size() - kHelloPrefixSize));
    return std::move(w).take();
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

Result<HelloInfo> decode_hello_body(std::span<const std::uint8_t> bytes, const ConnectionLimits& limits) {
    WireReader r(bytes);
    HelloInfo h;
    h.name = std::string(r.str32(limits.max_name_len, "worker name"));
    h.rank = r.i32();
    h.transports.clear();
    h.channels.clear();
    auto nt = r.u32();
    if (nt > 64) return fail(Errc::protocol_error, "handshake lists " + std::to_string(nt) + " transports (limit 64)");
    for (std::uint32_t i = 0; i < nt && !r.failed(); ++i) h.transports.emplace_back(r.str32(256, "transport name"));
    auto nc = r.u32();
    if (nc > 64) return fail(Errc::protocol_error, "handshake lists " + std::to_string(nc) + " channels (limit 64)");
    for (std::uint32_t i = 0; i < nc && !r.failed(); ++i) h.channels.emplace_back(r.str32(256, "channel name"));
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding the handshake"));
    return h;
}

}  // namespace tensorplay::detail
