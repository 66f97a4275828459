// The seed's device-map rules (backend_registry.py), branch for branch, with the seed's wording.
#include <tensorplay/device/device_map.hpp>

#include <algorithm>
#include <set>
#include <tuple>

namespace tensorplay {
namespace {

Failure map_error(const std::string& worker, std::string_view what) {
    return fail(Errc::invalid_argument, "worker " + worker + " " + std::string(what));
}

template <class Range>
bool has_duplicates(const Range& devices) {
    std::set<Device> seen(std::begin(devices), std::end(devices));
    return seen.size() != static_cast<std::size_t>(std::size(devices));
}

// Every element of `items` occurs in `pool` (Python's set(items).issubset(pool)).
template <class Range>
bool is_subset(const Range& items, const std::vector<Device>& pool) {
    const std::set<Device> allowed(pool.begin(), pool.end());
    return std::all_of(std::begin(items), std::end(items), [&](const Device& d) { return allowed.count(d) != 0; });
}

std::vector<Device> keys_of(const DeviceMap& m) {
    std::vector<Device> out;
    out.reserve(m.size());
    for (const auto& [source, target] : m) out.push_back(source);
    return out;
}

std::vector<Device> values_of(const DeviceMap& m) {
    std::vector<Device> out;
    out.reserve(m.size());
    for (const auto& [source, target] : m) out.push_back(target);
    return out;
}

template <class Map>
const typename Map::mapped_type* find_in(const Map& m, std::string_view key) {
    auto it = m.find(key);
    return it == m.end() ? nullptr : &it->second;
}

}  // namespace

bool validate_devices(std::span<const Device> devices, int device_count) {
    for (const Device& d : devices) {
        if (d.is_cpu()) continue;
        if (!d.is_cuda() || !d.has_index()) return false;
        if (d.index < 0 || d.index >= device_count) return false;
    }
    return true;
}

Result<void> validate_device_maps(const std::vector<std::string>& all_names,
                                  const std::map<std::string, int, std::less<>>& all_device_counts,
                                  const std::map<std::string, DeviceMaps, std::less<>>& all_device_maps,
                                  const std::map<std::string, std::vector<Device>, std::less<>>& all_devices,
                                  bool is_static_group) {
    static const std::vector<Device> no_devices;
    static const DeviceMaps no_maps;
    const std::set<std::string, std::less<>> names(all_names.begin(), all_names.end());
    auto devices_of = [&](std::string_view node) -> const std::vector<Device>& {
        const auto* d = find_in(all_devices, node);
        return d ? *d : no_devices;
    };

    for (const std::string& node : all_names) {
        const auto& devices = devices_of(node);
        if (has_duplicates(devices)) return map_error(node, "has duplicated devices");
        const int* count = find_in(all_device_counts, node);
        if (!count) return map_error(node, "has no device count");  // the seed raises KeyError here
        if (!validate_devices(devices, *count)) return map_error(node, "has invalid devices");
    }

    for (const std::string& source_node : all_names) {
        const auto* found = find_in(all_device_maps, source_node);
        const DeviceMaps& source_maps = found ? *found : no_maps;
        if (is_static_group) {
            for (const auto& [target_node, mapping] : source_maps)
                if (!names.count(target_node)) return map_error(source_node, "has an unknown map target");
        }
        for (const auto& [target_node, mapping] : source_maps) {
            const auto targets = values_of(mapping);
            if (has_duplicates(targets)) return map_error(source_node, "maps multiple devices to one target");
            const auto sources = keys_of(mapping);
            const auto& source_devices = devices_of(source_node);
            if (!source_devices.empty()) {
                if (!is_subset(sources, source_devices)) return map_error(source_node, "maps an unlisted source device");
            } else if (!validate_devices(sources, all_device_counts.find(source_node)->second)) {
                return map_error(source_node, "has invalid source devices");
            }
            const auto& target_devices = devices_of(target_node);
            if (!target_devices.empty()) {
                if (!is_subset(targets, target_devices)) return map_error(source_node, "maps to an unlisted target device");
            } else if (const int* target_count = find_in(all_device_counts, target_node);
                       target_count && !validate_devices(targets, *target_count)) {
                return map_error(source_node, "has invalid target devices");
            }
        }
    }
    return ok();
}

DeviceMaps create_reverse_mapping(const std::string& my_name, const std::vector<std::string>& all_names,
                                  const std::map<std::string, DeviceMaps, std::less<>>& all_device_maps) {
    DeviceMaps reverse;
    for (const std::string& node : all_names) {
        const auto* maps = find_in(all_device_maps, node);
        if (!maps) continue;
        const auto* mapping = find_in(*maps, my_name);
        if (!mapping || mapping->empty()) continue;
        DeviceMap inverted;
        // As the seed's dict comprehension: on a (invalid) non-injective map the last source wins.
        for (const auto& [source, target] : *mapping) inverted[target] = source;
        reverse[node] = std::move(inverted);
    }
    return reverse;
}

bool device_sort_less(const Device& a, const Device& b) {
    return std::make_tuple(!a.has_index(), a.index, a.str()) < std::make_tuple(!b.has_index(), b.index, b.str());
}

std::vector<Device> create_device_list(std::vector<Device> my_devices, const DeviceMaps& my_device_maps,
                                       const DeviceMaps& reverse_device_maps) {
    if (my_devices.empty()) {
        std::set<Device> devices;
        for (const auto& [peer, mapping] : my_device_maps)
            for (const auto& [source, target] : mapping) devices.insert(source);
        for (const auto& [peer, mapping] : reverse_device_maps)
            for (const auto& [local, remote] : mapping) devices.insert(local);
        for (const Device& d : devices)
            if (!d.is_cpu()) my_devices.push_back(d);
    }
    std::stable_sort(my_devices.begin(), my_devices.end(), device_sort_less);
    return my_devices;
}

}  // namespace tensorplay
