// Fuzzes the device-map exchange's record decoder: what decodes is within the limits, survives
// encode -> decode unchanged, and never allocates much more than the record's size.
#include <tensorplay/rpc/device_map_exchange.hpp>

#include "fuzz_util.hpp"

using namespace tensorplay;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::uint8_t> in(data, size);
    Result<WorkerDeviceInfo> info = fail(Errc::internal, "not decoded");
    {
        fuzz::AllocationBound bound;
        info = decode_worker_device_info(in);
        TP_FUZZ_CHECK(bound.within(in.size()));
    }
    if (!info) {
        TP_FUZZ_CHECK(info.error().code() == Errc::protocol_error && !info.error().message().empty());
        return 0;
    }
    TP_FUZZ_CHECK(info->name.size() <= kMaxDeviceInfoNameLen && info->device_count >= 0);
    TP_FUZZ_CHECK(info->device_maps.size() <= kMaxDeviceInfoMaps && info->devices.size() <= kMaxDeviceInfoDevices);
    for (const auto& [target, map] : info->device_maps) {
        TP_FUZZ_CHECK(target.size() <= kMaxDeviceInfoNameLen && map.size() <= kMaxDeviceInfoDevices);
        for (const auto& [from, to] : map) TP_FUZZ_CHECK(from.index >= -1 && to.index >= -1);
    }
    for (const Device& d : info->devices) TP_FUZZ_CHECK(d.index >= -1);
    // Maps are ordered, so the encoding is canonical only once decoded: compare values, and the
    // re-encoded record has the input's size (every field has a fixed or length-given size).
    const Bytes again = encode_worker_device_info(*info);
    TP_FUZZ_CHECK(again.size() == in.size());
    auto round = decode_worker_device_info(again);
    TP_FUZZ_CHECK(round && *round == *info);
    TP_FUZZ_CHECK(encode_worker_device_info(*round) == again);
    return 0;
}
