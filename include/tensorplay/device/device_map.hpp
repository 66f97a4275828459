// Device maps and the seed's rules for them: validate, reverse, derive a worker's device list.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/device/device.hpp>

#include <map>
#include <span>
#include <string>
#include <vector>

namespace tensorplay {

/// Where each local device's tensors land on one peer: source device -> target device.
using DeviceMap = std::map<Device, Device>;
/// A worker's device maps: peer worker name -> DeviceMap.
using DeviceMaps = std::map<std::string, DeviceMap, std::less<>>;

/// True when every device is a CPU or a CUDA device with an index in [0, device_count)
/// (the seed's _tensorpipe_validate_devices). An index-less "cuda" is not valid here.
[[nodiscard]] TP_API bool validate_devices(std::span<const Device> devices, int device_count);

/// The seed's _validate_device_maps. Checks run in the seed's order and the first failure decides
/// the error (Errc::invalid_argument, the seed's wording), e.g. "worker w1 has duplicated devices".
/// Per worker (in all_names order): duplicated devices, invalid devices. Then per source worker:
/// unknown map target (static groups only), and per target (in name order): several devices mapped to
/// one target, unlisted or invalid source devices, unlisted or invalid target devices. CPU is valid
/// everywhere. A worker of all_names without a device count is Errc::invalid_argument (the seed's KeyError).
[[nodiscard]] TP_API Result<void> validate_device_maps(const std::vector<std::string>& all_names,
                                                const std::map<std::string, int, std::less<>>& all_device_counts,
                                                const std::map<std::string, DeviceMaps, std::less<>>& all_device_maps,
                                                const std::map<std::string, std::vector<Device>, std::less<>>& all_devices,
                                                bool is_static_group = true);

/// The seed's _create_reverse_mapping: for every worker whose maps have a non-empty map to `my_name`,
/// that map inverted (target -> source), keyed by that worker's name.
[[nodiscard]] TP_API DeviceMaps create_reverse_mapping(const std::string& my_name, const std::vector<std::string>& all_names,
                                                const std::map<std::string, DeviceMaps, std::less<>>& all_device_maps);

/// The seed's _create_device_list: `my_devices` when not empty, else every source device of
/// `my_device_maps` and every key of `reverse_device_maps` with CPU dropped; sorted by device_sort_less.
[[nodiscard]] TP_API std::vector<Device> create_device_list(std::vector<Device> my_devices, const DeviceMaps& my_device_maps,
                                                     const DeviceMaps& reverse_device_maps);

/// The seed's sort key (index is None, index, str): indexed devices first by index, then by name.
[[nodiscard]] TP_API bool device_sort_less(const Device& a, const Device& b);

}  // namespace tensorplay
