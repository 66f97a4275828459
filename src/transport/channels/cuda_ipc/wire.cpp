// cuda_ipc's wire codecs (wire.hpp).
#include "transport/channels/cuda_ipc/wire.hpp"

#include <tensorplay/core/wire.hpp>

#include <cstring>

namespace tensorplay::detail {

namespace {
constexpr std::uint8_t kParamsVersion = 5;  // (3: device UUIDs; 4: pool descriptors; 5: outboxes announced, not offered)
constexpr std::uint32_t kMaxRing = 64;
constexpr std::uint32_t kMaxParamDevices = 64;
constexpr std::size_t kMaxBusId = 64;

void put_handle(WireWriter& w, const IpcHandle& h) { w.raw(std::span<const std::uint8_t>(h.data(), h.size())); }

IpcHandle get_handle(WireReader& r) {
    IpcHandle h{};
    auto b = r.raw(h.size(), "ipc handle");
    if (!r.failed()) std::memcpy(h.data(), b.data(), h.size());
    return h;
}
}  // namespace

std::string encode_ipc_params(const IpcParams& params) {
    WireWriter w;
    w.u8(kParamsVersion).i32(params.pid).u32(static_cast<std::uint32_t>(params.devices.size()));
    for (const auto& d : params.devices) {
        w.i32(d.index).str32(d.bus_id).str32(d.uuid).u8(d.outbox ? 1 : 0);
        if (!d.outbox) continue;
        put_handle(w, d.memory);
        w.u64(d.size).u64(d.chunk).u32(d.ring).u32(static_cast<std::uint32_t>(d.events.size()));
        for (const auto& e : d.events) put_handle(w, e);
        w.i32(d.pool_fd);
    }
    const Bytes b = std::move(w).take();
    return std::string(b.begin(), b.end());
}

Result<IpcParams> decode_ipc_params(std::string_view bytes) {
    WireReader r({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
    const auto version = r.u8();
    if (!r.failed() && version != kParamsVersion)
        return fail(Errc::protocol_error, "cuda_ipc parameters of unknown version " + std::to_string(version));
    IpcParams params;
    params.pid = r.i32();
    if (!r.failed() && params.pid <= 0) return fail(Errc::protocol_error, "cuda_ipc parameters name pid " + std::to_string(params.pid));
    const auto n = r.u32();
    if (!r.failed() && n > kMaxParamDevices)
        return fail(Errc::protocol_error, "cuda_ipc parameters list " + std::to_string(n) + " devices (at most " +
                                              std::to_string(kMaxParamDevices) + ")");
    auto& out = params.devices;
    for (std::uint32_t i = 0; i < n && !r.failed(); ++i) {
        IpcDeviceParams d;
        d.index = r.i32();
        d.bus_id = std::string(r.str32(kMaxBusId, "bus id"));
        d.uuid = std::string(r.str32(kMaxBusId, "uuid"));
        const auto has = r.u8();
        if (r.failed()) break;
        if (d.index < 0 || has > 1) return fail(Errc::protocol_error, "cuda_ipc parameters: bad device entry " + std::to_string(i));
        for (const auto& seen : out)
            if (seen.index == d.index)
                return fail(Errc::protocol_error, "cuda_ipc parameters list device " + std::to_string(d.index) + " twice");
        d.outbox = has == 1;
        if (d.outbox) {
            d.memory = get_handle(r);
            d.size = r.u64();
            d.chunk = r.u64();
            d.ring = r.u32();
            const auto events = r.u32();
            if (r.failed()) break;
            if (d.size == 0 || events == 0 || events > 255)
                return fail(Errc::protocol_error, "cuda_ipc parameters: outbox of cuda:" + std::to_string(d.index) + " with " +
                                                      std::to_string(d.size) + " bytes and " + std::to_string(events) + " events");
            if (d.chunk < kOutboxAlign || d.chunk > d.size || d.ring < 2 || d.ring > kMaxRing || d.chunk * d.ring > d.size)
                return fail(Errc::protocol_error, "cuda_ipc parameters: outbox of cuda:" + std::to_string(d.index) + " with " +
                                                      std::to_string(d.size) + " bytes has rings of " + std::to_string(d.ring) +
                                                      " chunks of " + std::to_string(d.chunk) + " bytes");
            for (std::uint32_t k = 0; k < events && !r.failed(); ++k) d.events.push_back(get_handle(r));
            d.pool_fd = r.i32();
            if (!r.failed() && d.pool_fd < -1)
                return fail(Errc::protocol_error, "cuda_ipc parameters: cuda:" + std::to_string(d.index) + "'s pool descriptor is " +
                                                      std::to_string(d.pool_fd));
        }
        out.push_back(std::move(d));
    }
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding cuda_ipc parameters"));
    return params;
}

Result<IpcRef> decode_ipc_ref(std::uint64_t ref) {
    const auto marker = ref & 0xff;
    if (marker != 1 && marker != 3 && marker != 5)
        return fail(Errc::protocol_error, "cuda_ipc reference " + std::to_string(ref) + " lacks its marker");
    return IpcRef{ref >> 16, static_cast<int>((ref >> 8) & 0xff), marker == 3, marker == 5};
}

Bytes encode_pool_export(const PoolExport& e) {
    WireWriter w;
    w.u64(e.id).i32(e.device).u64(e.offset);
    put_handle(w, e.data);
    return std::move(w).take();
}

Result<PoolExport> decode_pool_export(std::span<const std::uint8_t> payload) {
    WireReader r(payload);
    PoolExport e;
    e.id = r.u64();
    e.device = r.i32();
    e.offset = r.u64();
    e.data = get_handle(r);
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding a cuda_ipc export notice"));
    if (e.device < 0) return fail(Errc::protocol_error, "a cuda_ipc export notice names cuda:" + std::to_string(e.device));
    return e;
}

Bytes encode_ring_notice(const RingNotice& n) {
    WireWriter w;
    w.i32(n.device).u64(n.offset).u32(n.chunk);
    return std::move(w).take();
}

Result<RingNotice> decode_ring_notice(std::span<const std::uint8_t> payload) {
    WireReader r(payload);
    RingNotice n;
    n.device = r.i32();
    n.offset = r.u64();
    n.chunk = r.u32();
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding a cuda_ipc ring notice"));
    return n;
}

}  // namespace tensorplay::detail
