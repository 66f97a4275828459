// Tests of the seed's device-map rules: every branch of validate_device_maps with its exact error,
// reverse mapping, the derived device list, and property tests over random valid maps.
#include <tensorplay/device/device_map.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_device_map_test {

using namespace tensorplay;

namespace {

using Counts = std::map<std::string, int, std::less<>>;
using AllMaps = std::map<std::string, DeviceMaps, std::less<>>;
using AllDevices = std::map<std::string, std::vector<Device>, std::less<>>;

const Device cpu = Device::cpu();
const Device cuda = Device::cuda();
Device c(int i) { return Device::cuda(i); }

struct Case {
    const char* what;
    std::vector<std::string> names;
    Counts counts;
    AllMaps maps;
    AllDevices devices;
    bool is_static;
    std::string error;  // empty: valid
};

}  // namespace

TEST_CASE("validate_devices accepts CPU and indexed CUDA devices below the count", "[device]") {
    CHECK(validate_devices(std::vector<Device>{}, 0));
    CHECK(validate_devices(std::vector<Device>{cpu}, 0));
    CHECK(validate_devices(std::vector<Device>{cpu, c(0), c(1)}, 2));
    CHECK_FALSE(validate_devices(std::vector<Device>{c(2)}, 2));
    CHECK_FALSE(validate_devices(std::vector<Device>{c(0)}, 0));
    CHECK_FALSE(validate_devices(std::vector<Device>{cuda}, 4));  // an index-less "cuda" is not a device here
}

TEST_CASE("validate_device_maps reaches every branch with the seed's error", "[device]") {
    // clang-format off
    std::vector<Case> cases = {
        {"empty group", {}, {}, {}, {}, true, ""},
        {"no maps, no devices", {"w0", "w1"}, {{"w0", 0}, {"w1", 2}}, {}, {}, true, ""},
        {"valid listed devices", {"w0"}, {{"w0", 2}}, {}, {{"w0", {c(1), c(0), cpu}}}, true, ""},
        {"duplicated devices", {"w0"}, {{"w0", 2}}, {}, {{"w0", {c(0), c(0)}}}, true,
         "worker w0 has duplicated devices"},
        {"duplicated cpu", {"w0"}, {{"w0", 0}}, {}, {{"w0", {cpu, cpu}}}, true, "worker w0 has duplicated devices"},
        {"duplicates are found before invalid indices", {"w0"}, {{"w0", 1}}, {}, {{"w0", {c(5), c(5)}}}, true,
         "worker w0 has duplicated devices"},
        {"missing device count", {"w0", "w1"}, {{"w0", 1}}, {}, {}, true, "worker w1 has no device count"},
        {"device index at the count", {"w0"}, {{"w0", 2}}, {}, {{"w0", {c(2)}}}, true, "worker w0 has invalid devices"},
        {"cuda without index in devices", {"w0"}, {{"w0", 2}}, {}, {{"w0", {cuda}}}, true,
         "worker w0 has invalid devices"},
        {"cuda device without any GPU", {"w0"}, {{"w0", 0}}, {}, {{"w0", {c(0)}}}, true,
         "worker w0 has invalid devices"},
        {"device checks of every worker run before any map check", {"w0", "w1"}, {{"w0", 1}, {"w1", 1}},
         {{"w0", {{"w1", {{c(0), c(0)}, {c(1), c(0)}}}}}}, {{"w1", {c(0), c(0)}}}, true,
         "worker w1 has duplicated devices"},
        {"unknown map target in a static group", {"w0"}, {{"w0", 1}}, {{"w0", {{"ghost", {{c(0), c(0)}}}}}}, {}, true,
         "worker w0 has an unknown map target"},
        {"unknown map target allowed in a dynamic group", {"w0"}, {{"w0", 1}}, {{"w0", {{"ghost", {{c(0), c(7)}}}}}},
         {}, false, ""},
        {"unknown target is found before a bad map", {"w0"}, {{"w0", 1}},
         {{"w0", {{"w0", {{c(0), c(0)}, {cpu, c(0)}}}, {"zz", {}}}}}, {}, true, "worker w0 has an unknown map target"},
        {"two sources to one target", {"w0", "w1"}, {{"w0", 2}, {"w1", 2}},
         {{"w0", {{"w1", {{c(0), c(1)}, {c(1), c(1)}}}}}}, {}, true, "worker w0 maps multiple devices to one target"},
        {"cpu and cuda to one target", {"w0", "w1"}, {{"w0", 2}, {"w1", 2}},
         {{"w0", {{"w1", {{cpu, c(0)}, {c(1), c(0)}}}}}}, {}, true, "worker w0 maps multiple devices to one target"},
        {"multiple-to-one is found before an invalid source", {"w0", "w1"}, {{"w0", 1}, {"w1", 2}},
         {{"w0", {{"w1", {{c(5), c(1)}, {c(6), c(1)}}}}}}, {}, true, "worker w0 maps multiple devices to one target"},
        {"unlisted source device", {"w0", "w1"}, {{"w0", 2}, {"w1", 2}}, {{"w0", {{"w1", {{c(1), c(0)}}}}}},
         {{"w0", {c(0)}}}, true, "worker w0 maps an unlisted source device"},
        {"cpu source not among listed devices", {"w0", "w1"}, {{"w0", 2}, {"w1", 2}},
         {{"w0", {{"w1", {{cpu, c(0)}}}}}}, {{"w0", {c(0)}}}, true, "worker w0 maps an unlisted source device"},
        {"listed cpu source", {"w0", "w1"}, {{"w0", 0}, {"w1", 0}}, {{"w0", {{"w1", {{cpu, cpu}}}}}},
         {{"w0", {cpu}}}, true, ""},
        {"source index beyond the count", {"w0", "w1"}, {{"w0", 1}, {"w1", 2}}, {{"w0", {{"w1", {{c(1), c(0)}}}}}}, {},
         true, "worker w0 has invalid source devices"},
        {"index-less cuda source", {"w0", "w1"}, {{"w0", 1}, {"w1", 2}}, {{"w0", {{"w1", {{cuda, c(0)}}}}}}, {}, true,
         "worker w0 has invalid source devices"},
        {"source checks run before target checks", {"w0", "w1"}, {{"w0", 1}, {"w1", 1}},
         {{"w0", {{"w1", {{c(3), c(3)}}}}}}, {}, true, "worker w0 has invalid source devices"},
        {"unlisted target device", {"w0", "w1"}, {{"w0", 2}, {"w1", 2}}, {{"w0", {{"w1", {{c(0), c(1)}}}}}},
         {{"w1", {c(0)}}}, true, "worker w0 maps to an unlisted target device"},
        {"target index beyond the target's count", {"w0", "w1"}, {{"w0", 2}, {"w1", 1}},
         {{"w0", {{"w1", {{c(0), c(1)}}}}}}, {}, true, "worker w0 has invalid target devices"},
        {"index-less cuda target", {"w0", "w1"}, {{"w0", 2}, {"w1", 1}}, {{"w0", {{"w1", {{c(0), cuda}}}}}}, {}, true,
         "worker w0 has invalid target devices"},
        {"target without a count is not checked (dynamic)", {"w0"}, {{"w0", 1}}, {{"w0", {{"w1", {{c(0), c(9)}}}}}},
         {}, false, ""},
        {"map to itself is checked against its own count", {"w0"}, {{"w0", 1}}, {{"w0", {{"w0", {{c(0), c(1)}}}}}}, {},
         false, "worker w0 has invalid target devices"},
        {"cpu to cpu is valid without GPUs", {"w0", "w1"}, {{"w0", 0}, {"w1", 0}}, {{"w0", {{"w1", {{cpu, cpu}}}}}}, {},
         true, ""},
        {"cpu to cuda and back", {"w0", "w1"}, {{"w0", 1}, {"w1", 1}},
         {{"w0", {{"w1", {{cpu, c(0)}}}}}, {"w1", {{"w0", {{c(0), cpu}}}}}}, {}, true, ""},
        {"sources are checked in all_names order", {"w1", "w0"}, {{"w0", 1}, {"w1", 1}},
         {{"w0", {{"w1", {{c(4), c(0)}}}}}, {"w1", {{"w0", {{c(0), c(4)}}}}}}, {}, true,
         "worker w1 has invalid target devices"},
        {"maps of names outside all_names are ignored", {"w0"}, {{"w0", 1}}, {{"zz", {{"w0", {{c(9), c(9)}}}}}}, {},
         true, ""},
        {"devices of names outside all_names are ignored", {"w0"}, {{"w0", 1}}, {}, {{"zz", {c(9), c(9)}}}, true, ""},
    };
    // clang-format on
    for (const auto& k : cases) {
        INFO(k.what);
        auto r = validate_device_maps(k.names, k.counts, k.maps, k.devices, k.is_static);
        if (k.error.empty()) {
            CHECK(r);
            if (!r) UNSCOPED_INFO(r.error().message());
        } else {
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::invalid_argument);
            CHECK(r.error().message() == k.error);
        }
    }
}

TEST_CASE("create_reverse_mapping inverts every non-empty map to me", "[device]") {
    AllMaps maps = {
        {"w0", {{"w1", {{c(0), c(1)}, {cpu, c(0)}}}, {"w2", {{c(0), c(0)}}}}},
        {"w1", {{"w1", {{c(1), c(0)}}}}},  // a map to itself counts
        {"w2", {{"w1", {}}}},              // empty: skipped
    };
    auto reverse = create_reverse_mapping("w1", {"w0", "w1", "w2", "w3"}, maps);
    CHECK(reverse == DeviceMaps{{"w0", {{c(1), c(0)}, {c(0), cpu}}}, {"w1", {{c(0), c(1)}}}});
    CHECK(create_reverse_mapping("w3", {"w0", "w1", "w2", "w3"}, maps).empty());
    // Only workers named in all_names contribute.
    CHECK(create_reverse_mapping("w1", {"w1"}, maps) == DeviceMaps{{"w1", {{c(0), c(1)}}}});
}

TEST_CASE("create_device_list derives sorted, CPU-free devices from the maps when none are listed", "[device]") {
    DeviceMaps mine = {{"w1", {{c(3), c(0)}, {cpu, c(1)}}}, {"w2", {{c(1), c(1)}}}};
    DeviceMaps reverse = {{"w1", {{c(0), c(3)}, {cpu, c(2)}}}, {"w2", {{c(10), c(2)}}}};
    CHECK(create_device_list({}, mine, reverse) == std::vector<Device>{c(0), c(1), c(3), c(10)});
    CHECK(create_device_list({}, {}, {}).empty());
}

TEST_CASE("create_device_list keeps listed devices, CPU included, sorted by the seed's key", "[device]") {
    std::vector<Device> listed = {cuda, c(2), cpu, c(0), Device{DeviceType::cpu, 1}};
    // (index is None, index, str): indexed first by index (cuda:0, then cpu:1, cuda:2), then "cpu" < "cuda".
    CHECK(create_device_list(listed, {{"w1", {{c(7), c(7)}}}}, {}) ==
          std::vector<Device>{c(0), Device{DeviceType::cpu, 1}, c(2), cpu, cuda});
}

// ---- property tests over random valid maps ----

namespace {

struct Group {
    std::vector<std::string> names;
    Counts counts;
    AllMaps maps;
    AllDevices devices;
};

// The devices a worker may use: its listed devices, else CPU and every CUDA index below its count.
std::vector<Device> usable(const Group& g, const std::string& name) {
    if (auto it = g.devices.find(name); it != g.devices.end() && !it->second.empty()) return it->second;
    std::vector<Device> out{cpu};
    for (int i = 0; i < g.counts.at(name); ++i) out.push_back(c(i));
    return out;
}

Group random_group(std::mt19937& rng) {
    Group g;
    const int n = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int i = 0; i < n; ++i) {
        std::string name = "w" + std::to_string(i);
        g.names.push_back(name);
        g.counts[name] = std::uniform_int_distribution<int>(0, 4)(rng);
        if (rng() % 3 == 0) {  // list a random subset of the valid devices
            std::vector<Device> all = {cpu};
            for (int d = 0; d < g.counts[name]; ++d) all.push_back(c(d));
            std::shuffle(all.begin(), all.end(), rng);
            all.resize(std::uniform_int_distribution<std::size_t>(1, all.size())(rng));
            g.devices[name] = all;
        }
    }
    for (const auto& source : g.names) {
        for (const auto& target : g.names) {
            if (rng() % 2) continue;
            auto from = usable(g, source);
            auto to = usable(g, target);
            std::shuffle(from.begin(), from.end(), rng);
            std::shuffle(to.begin(), to.end(), rng);
            const std::size_t k = std::uniform_int_distribution<std::size_t>(0, std::min(from.size(), to.size()))(rng);
            DeviceMap m;
            for (std::size_t i = 0; i < k; ++i) m[from[i]] = to[i];  // injective by construction
            g.maps[source][target] = m;
        }
    }
    return g;
}

Result<void> validate(const Group& g) { return validate_device_maps(g.names, g.counts, g.maps, g.devices, true); }

}  // namespace

TEST_CASE("random valid device maps are accepted and reversing twice gives them back", "[device][property]") {
    for (unsigned seed = 1; seed <= 300; ++seed) {
        std::mt19937 rng(seed);
        const Group g = random_group(rng);
        INFO("seed " << seed);
        auto r = validate(g);
        REQUIRE(r);

        AllMaps reversed;  // reversed[me] = create_reverse_mapping(me, ...)
        for (const auto& me : g.names) reversed[me] = create_reverse_mapping(me, g.names, g.maps);
        for (const auto& node : g.names) {
            DeviceMaps expected;
            if (auto it = g.maps.find(node); it != g.maps.end())
                for (const auto& [target, m] : it->second)
                    if (!m.empty()) expected[target] = m;
            CHECK(create_reverse_mapping(node, g.names, reversed) == expected);
        }
    }
}

TEST_CASE("a derived device list is sorted, CPU-free and covers every mapped device", "[device][property]") {
    for (unsigned seed = 1; seed <= 300; ++seed) {
        std::mt19937 rng(seed);
        const Group g = random_group(rng);
        INFO("seed " << seed);
        for (const auto& me : g.names) {
            const auto reverse = create_reverse_mapping(me, g.names, g.maps);
            const DeviceMaps mine = g.maps.count(me) ? g.maps.at(me) : DeviceMaps{};
            const auto list = create_device_list({}, mine, reverse);
            CHECK(std::is_sorted(list.begin(), list.end(), device_sort_less));
            CHECK(std::adjacent_find(list.begin(), list.end()) == list.end());
            CHECK(std::none_of(list.begin(), list.end(), [](const Device& d) { return d.is_cpu(); }));
            auto covered = [&](const Device& d) {
                return d.is_cpu() || std::find(list.begin(), list.end(), d) != list.end();
            };
            for (const auto& [peer, m] : mine)
                for (const auto& [s, t] : m) CHECK(covered(s));
            for (const auto& [peer, m] : reverse)
                for (const auto& [local, remote] : m) CHECK(covered(local));
            // A listed device list is kept as it is, sorted.
            if (auto it = g.devices.find(me); it != g.devices.end()) {
                auto kept = create_device_list(it->second, mine, reverse);
                CHECK(std::is_permutation(kept.begin(), kept.end(), it->second.begin(), it->second.end()));
                CHECK(std::is_sorted(kept.begin(), kept.end(), device_sort_less));
            }
        }
    }
}

TEST_CASE("each single corruption of valid maps is rejected with the matching error", "[device][property]") {
    int applied[6] = {};
    for (unsigned seed = 1; seed <= 400; ++seed) {
        std::mt19937 rng(seed);
        const Group base = random_group(rng);
        const std::string& w = base.names[rng() % base.names.size()];
        const int kind = static_cast<int>(seed % 6);
        Group g = base;
        std::string expected;
        const bool listed = g.devices.count(w) != 0;
        switch (kind) {
            case 0: {  // duplicate a device
                auto& d = g.devices[w];
                d.push_back(d.empty() ? cpu : d.front());
                if (d.size() == 1) d.push_back(cpu);
                expected = "worker " + w + " has duplicated devices";
                break;
            }
            case 1:  // a device beyond the count
                g.devices[w].push_back(c(g.counts[w]));
                expected = "worker " + w + " has invalid devices";
                break;
            case 2:  // a map to a worker that is not in the group
                g.maps[w]["ghost"] = {};
                expected = "worker " + w + " has an unknown map target";
                break;
            case 3: {  // two sources to one target
                bool done = false;
                for (auto& [target, m] : g.maps[w]) {
                    if (m.empty()) continue;
                    for (const Device& s : usable(g, w)) {
                        if (m.count(s)) continue;
                        m[s] = m.begin()->second;
                        done = true;
                        break;
                    }
                    if (done) break;
                }
                if (!done) continue;
                expected = "worker " + w + " maps multiple devices to one target";
                break;
            }
            case 4:  // a source device that is not the worker's
            case 5: {  // a target device that is not the target's
                const std::string& t = g.names[rng() % g.names.size()];
                DeviceMap& m = g.maps[w][t];
                std::vector<Device> targets;
                for (const Device& d : usable(g, t)) {
                    bool used = false;
                    for (const auto& [s2, t2] : m) used = used || t2 == d;
                    if (!used) targets.push_back(d);
                }
                std::vector<Device> sources;
                for (const Device& d : usable(g, w))
                    if (!m.count(d)) sources.push_back(d);
                if (kind == 4) {
                    if (targets.empty()) continue;
                    m[c(g.counts[w])] = targets.front();
                    expected = listed ? "worker " + w + " maps an unlisted source device"
                                      : "worker " + w + " has invalid source devices";
                } else {
                    if (sources.empty()) continue;
                    m[sources.front()] = c(g.counts[t]);
                    expected = g.devices.count(t) ? "worker " + w + " maps to an unlisted target device"
                                                  : "worker " + w + " has invalid target devices";
                }
                break;
            }
        }
        INFO("seed " << seed << " corruption " << kind << " of " << w);
        REQUIRE(validate(base));
        auto r = validate(g);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::invalid_argument);
        CHECK(r.error().message() == expected);
        ++applied[kind];
    }
    for (int k = 0; k < 6; ++k) {
        INFO("corruption " << k);
        CHECK(applied[k] > 20);  // the generator really exercises every corruption
    }
}

}  // namespace tp_device_map_test
