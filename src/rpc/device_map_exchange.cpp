// The device-map exchange: a versioned record per worker, all-gathered over the store, checked
// with the seed's static-group rules; plus the pure part of the seed's dynamic-group check.
#include <tensorplay/rpc/device_map_exchange.hpp>

#include <tensorplay/core/wire.hpp>
#include <tensorplay/store/collectives.hpp>
#include <tensorplay/store/prefix_store.hpp>

namespace tensorplay {
namespace {

constexpr std::uint32_t kMagic = 0x4D445054;  // "TPDM" in little-endian byte order
constexpr std::size_t kDeviceBytes = 1 + 4;   // u8 type, i32 index

void write_device(WireWriter& w, const Device& d) {
    w.u8(static_cast<std::uint8_t>(d.type));
    w.i32(d.index);
}

Device read_device(WireReader& r) {
    const std::uint8_t type = r.u8();
    const std::int32_t index = r.i32();
    if (r.failed()) return {};
    if (type > static_cast<std::uint8_t>(DeviceType::cuda)) {
        r.set_error(Errc::protocol_error, "unknown device type " + std::to_string(type));
        return {};
    }
    if (index < -1) {
        r.set_error(Errc::protocol_error, "invalid device index " + std::to_string(index));
        return {};
    }
    return Device{static_cast<DeviceType>(type), index};
}

// Reads a u32 element count and checks it against `limit` and the bytes left (each element takes
// at least `min_bytes`), so that a hostile count allocates nothing.
std::uint32_t read_count(WireReader& r, std::size_t limit, std::size_t min_bytes, std::string_view what) {
    const std::uint32_t n = r.u32();
    if (r.failed()) return 0;
    if (n > limit || static_cast<std::uint64_t>(n) * min_bytes > r.remaining()) {
        r.set_error(Errc::protocol_error, std::string(what) + " count " + std::to_string(n) + " exceeds the limit of " +
                                              std::to_string(limit) + " or the " + std::to_string(r.remaining()) +
                                              " bytes left");
        return 0;
    }
    return n;
}

}  // namespace

Bytes encode_worker_device_info(const WorkerDeviceInfo& info) {
    WireWriter w;
    w.u32(kMagic).u16(kDeviceInfoWireVersion).str32(info.name).i32(info.device_count);
    w.u32(static_cast<std::uint32_t>(info.device_maps.size()));
    for (const auto& [target, map] : info.device_maps) {
        w.str32(target).u32(static_cast<std::uint32_t>(map.size()));
        for (const auto& [source, dest] : map) {
            write_device(w, source);
            write_device(w, dest);
        }
    }
    w.u32(static_cast<std::uint32_t>(info.devices.size()));
    for (const Device& d : info.devices) write_device(w, d);
    return std::move(w).take();
}

Result<WorkerDeviceInfo> decode_worker_device_info(std::span<const std::uint8_t> record) {
    WireReader r(record);
    WorkerDeviceInfo info;
    const std::uint32_t magic = r.u32();
    const std::uint16_t version = r.u16();
    if (!r.failed() && magic != kMagic) r.set_error(Errc::protocol_error, "not a device-map record (bad magic)");
    if (!r.failed() && version != kDeviceInfoWireVersion)
        r.set_error(Errc::protocol_error, "device-map record version " + std::to_string(version) +
                                              " is not supported (this build speaks version " +
                                              std::to_string(kDeviceInfoWireVersion) + ")");
    info.name = std::string(r.str32(kMaxDeviceInfoNameLen, "worker name"));
    info.device_count = r.i32();
    if (!r.failed() && info.device_count < 0)
        r.set_error(Errc::protocol_error, "negative device count " + std::to_string(info.device_count));
    const std::uint32_t n_maps = read_count(r, kMaxDeviceInfoMaps, 4 + 4, "device map");
    for (std::uint32_t i = 0; i < n_maps && !r.failed(); ++i) {
        std::string target(r.str32(kMaxDeviceInfoNameLen, "map target name"));
        const std::uint32_t n_pairs = read_count(r, kMaxDeviceInfoDevices, 2 * kDeviceBytes, "device pair");
        DeviceMap map;
        for (std::uint32_t j = 0; j < n_pairs && !r.failed(); ++j) {
            const Device source = read_device(r);
            const Device dest = read_device(r);
            if (!r.failed() && !map.emplace(source, dest).second)
                r.set_error(Errc::protocol_error, "source device " + source.str() + " repeated in the map to " + target);
        }
        if (!r.failed() && !info.device_maps.emplace(std::move(target), std::move(map)).second)
            r.set_error(Errc::protocol_error, "map target repeated");
    }
    const std::uint32_t n_devices = read_count(r, kMaxDeviceInfoDevices, kDeviceBytes, "device");
    if (!r.failed()) info.devices.reserve(n_devices);
    for (std::uint32_t i = 0; i < n_devices && !r.failed(); ++i) info.devices.push_back(read_device(r));
    if (auto done = r.finish(); !done) return fail(std::move(done).error().context("malformed device-map record"));
    return info;
}

Task<Result<DeviceMapExchangeResult>> exchange_and_check_all_device_maps(Store& store, std::string my_name, int rank,
                                                                          int world_size, int my_device_count,
                                                                          DeviceMaps my_device_maps,
                                                                          std::vector<Device> my_devices) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
        co_return fail(Errc::invalid_argument, "device-map exchange: rank " + std::to_string(rank) +
                                                   " is outside a group of world size " + std::to_string(world_size));
    if (my_device_count < 0)
        co_return fail(Errc::invalid_argument,
                       "device-map exchange: negative device count " + std::to_string(my_device_count));
    if (my_name.empty() || my_name.size() > kMaxDeviceInfoNameLen)
        co_return fail(Errc::invalid_argument, "device-map exchange: the worker name must have 1 to " +
                                                   std::to_string(kMaxDeviceInfoNameLen) + " characters");

    Bytes mine = encode_worker_device_info({my_name, my_device_count, my_device_maps, my_devices});
    // Under its own prefix, so that its rounds never mix with other collectives on the same store.
    PrefixStore scoped(std::string(kDeviceMapExchangePrefix), std::shared_ptr<Store>(std::shared_ptr<Store>(), &store));
    scoped.set_timeout(store.timeout());
    auto gathered = co_await all_gather(scoped, rank, world_size, std::move(mine));
    if (!gathered) co_return fail(std::move(gathered).error().context("device-map exchange"));
    if (gathered->size() != static_cast<std::size_t>(world_size))
        co_return fail(Errc::internal, "device-map exchange: all_gather returned " + std::to_string(gathered->size()) +
                                           " records for a world size of " + std::to_string(world_size));

    // As the seed: names in rank order; per-name tables where a later rank wins a repeated name.
    std::vector<std::string> all_names;
    std::map<std::string, int, std::less<>> all_device_counts;
    std::map<std::string, DeviceMaps, std::less<>> all_device_maps;
    std::map<std::string, std::vector<Device>, std::less<>> all_devices;
    for (std::size_t i = 0; i < gathered->size(); ++i) {
        auto info = decode_worker_device_info((*gathered)[i]);
        if (!info)
            co_return fail(std::move(info).error().context("device-map exchange: the record of rank " + std::to_string(i)));
        all_names.push_back(info->name);
        all_device_counts[info->name] = info->device_count;
        all_device_maps[info->name] = std::move(info->device_maps);
        all_devices[info->name] = std::move(info->devices);
    }
    if (auto valid = validate_device_maps(all_names, all_device_counts, all_device_maps, all_devices); !valid)
        co_return fail(std::move(valid).error());

    DeviceMapExchangeResult result;
    result.reverse_device_maps = create_reverse_mapping(my_name, all_names, all_device_maps);
    result.devices = create_device_list(std::move(my_devices), my_device_maps, result.reverse_device_maps);
    result.all_names = std::move(all_names);
    co_return result;
}

WorkerDeviceInfo local_device_info(std::string name, const TensorPipeRpcBackendOptions& options) {
    return {std::move(name), cuda_device_count(), options.device_maps, options.devices};
}

Result<DynamicDeviceMapResult> check_dynamic_group_device_maps(const std::string& my_name,
                                                               const std::vector<WorkerDeviceInfo>& infos) {
    std::vector<std::string> names;
    std::map<std::string, int, std::less<>> counts;
    std::map<std::string, DeviceMaps, std::less<>> maps;
    std::map<std::string, std::vector<Device>, std::less<>> devices;
    for (const auto& info : infos) {
        names.push_back(info.name);
        counts[info.name] = info.device_count;
        maps[info.name] = info.device_maps;
        devices[info.name] = info.devices;
    }
    if (auto valid = validate_device_maps(names, counts, maps, devices, /*is_static_group=*/false); !valid)
        return fail(std::move(valid).error());
    DynamicDeviceMapResult result;
    result.reverse_device_maps = create_reverse_mapping(my_name, names, maps);
    for (const auto& name : names)
        result.devices[name] = create_device_list(devices[name], maps[name], result.reverse_device_maps);
    return result;
}

}  // namespace tensorplay
