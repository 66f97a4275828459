// The device-map exchange: every worker's (name, device count, maps, devices) all-gathered over the
// store and checked with the seed's rules, so that every worker reaches the same verdict.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/device.hpp>
#include <tensorplay/device/device_map.hpp>
#include <tensorplay/rpc/options.hpp>
#include <tensorplay/store/store.hpp>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace tensorplay {

/// What one worker contributes to the exchange (the seed's (name, device_count, device_maps, devices)).
struct WorkerDeviceInfo {
    std::string name;
    int device_count = 0;
    DeviceMaps device_maps;
    std::vector<Device> devices;
    friend bool operator==(const WorkerDeviceInfo&, const WorkerDeviceInfo&) = default;
};

/// Version of the record encode_worker_device_info writes (docs: magic "TPDM", u16 version, then fields).
inline constexpr std::uint16_t kDeviceInfoWireVersion = 1;
/// Limits a decoded record must respect (checked before anything is allocated).
inline constexpr std::size_t kMaxDeviceInfoNameLen = 1024;
inline constexpr std::size_t kMaxDeviceInfoMaps = 4096;
inline constexpr std::size_t kMaxDeviceInfoDevices = 4096;

/// The stable little-endian record: u32 magic 0x4D445054 ("TPDM"), u16 version, str32 name,
/// i32 device_count, u32 map count { str32 target, u32 pair count { device source, device target } },
/// u32 device count { device }; a device is u8 type (0 cpu, 1 cuda) and i32 index (-1: none).
[[nodiscard]] TP_API Bytes encode_worker_device_info(const WorkerDeviceInfo& info);
/// Decodes a record; anything malformed (bad magic or version, a length beyond the limits or the
/// data, an unknown device type, a repeated map target or source, trailing bytes) is Errc::protocol_error.
[[nodiscard]] TP_API Result<WorkerDeviceInfo> decode_worker_device_info(std::span<const std::uint8_t> record);

/// The exchange all-gathers under this prefix of the given store ("tensorplay_device_maps/" + all_gather's keys).
inline constexpr std::string_view kDeviceMapExchangePrefix = "tensorplay_device_maps";

/// What the exchange gives this worker.
struct DeviceMapExchangeResult {
    /// Per worker that maps devices to this one: that map inverted (used for responses).
    DeviceMaps reverse_device_maps;
    /// This worker's devices: the listed ones, else derived from the maps (CPU dropped); sorted.
    std::vector<Device> devices;
    /// Every worker's name, by rank.
    std::vector<std::string> all_names;
};

/// The seed's _tensorpipe_exchange_and_check_all_device_maps over a Store: all-gathers every worker's
/// record (tensorplay::all_gather), validates them as a static group and builds this worker's reverse
/// maps and device list. Every worker gets the same verdict: a malformed record is Errc::protocol_error
/// naming its rank, invalid maps are the seed's Errc::invalid_argument. Bad arguments (rank outside
/// [0, world_size), negative device count) are Errc::invalid_argument. Store errors and timeouts come
/// back as the store gives them, with context. Waits use the store's timeout(). Every worker of the
/// group must call it the same number of times (it is one all_gather round under kDeviceMapExchangePrefix).
/// `store` must outlive the coroutine.
[[nodiscard]] TP_API Task<Result<DeviceMapExchangeResult>> exchange_and_check_all_device_maps(
    Store& store, std::string my_name, int rank, int world_size, int my_device_count, DeviceMaps my_device_maps,
    std::vector<Device> my_devices);

/// The seed's _get_device_infos for this worker: cuda_device_count(), the options' maps and devices.
[[nodiscard]] TP_API WorkerDeviceInfo local_device_info(std::string name, const TensorPipeRpcBackendOptions& options);

/// What the dynamic-group check gives: the reverse maps and each worker's device list.
struct DynamicDeviceMapResult {
    DeviceMaps reverse_device_maps;
    std::map<std::string, std::vector<Device>, std::less<>> devices;
};

/// The pure part of the seed's _set_devices_and_reverse_device_map (the caller gathers `infos`, one per
/// current member, e.g. over RPC): validates with dynamic-group rules, builds my reverse maps and, as the
/// seed does, each worker's device list from its devices, its maps and my reverse maps.
[[nodiscard]] TP_API Result<DynamicDeviceMapResult> check_dynamic_group_device_maps(const std::string& my_name,
                                                                             const std::vector<WorkerDeviceInfo>& infos);

}  // namespace tensorplay
