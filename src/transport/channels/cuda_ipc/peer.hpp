// Private to the device channels' files: what an agent knows of one connection's peer for
// cuda_ipc, and the per-device stream lookup both sides use.
#pragma once

#include "transport/channels/cuda_ipc/outbox.hpp"
#include "transport/channels/cuda_ipc/rings.hpp"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace tensorplay::detail {

/// What this agent knows of one connection's peer for cuda_ipc: its offer's devices, the outboxes
/// and events of theirs it opened (receiving), and which of its devices ours can reach (sending).
struct PeerDevices {
    bool decoded = false;
    std::optional<Error> bad;  ///< its offer did not decode, or names this process
    std::vector<IpcDeviceParams> devices;
    std::map<std::pair<int, int>, std::shared_ptr<Storage>> memory;  ///< (its index, our index)
    std::map<std::tuple<int, int, int>, tensorplay::Event> events;   ///< (its index, our index, event)
    std::map<std::pair<int, int>, bool> reach;                        ///< (our index, its index)
    std::map<std::pair<int, int>, Error> refused;                     ///< (its index, our index): opening failed
    std::int32_t pid = 0;                                              ///< the offering process
    std::set<int> announced;                                           ///< our outboxes it was told of (our index)
    // One copy (PoolExport): receiving, the exports announced and not landed yet (by id), its pools
    // imported here (by its index) and the pairs whose import failed; sending, the pairs it refused
    // and the next export id.
    std::map<std::uint64_t, PoolExport> exports;
    std::map<int, std::shared_ptr<ImportedPool>> pools;
    std::map<std::pair<int, int>, Error> pool_refused;                ///< (its index, our index)
    std::map<std::pair<int, int>, bool> pool_off;                      ///< (our index, its index)
    std::uint64_t next_export = 1;

    const IpcDeviceParams* device(int index) const {
        for (const auto& d : devices)
            if (d.index == index) return &d;
        return nullptr;
    }
};

/// The entry of `d` in `v`, or null.
[[nodiscard]] DeviceStream* find_stream(std::vector<DeviceStream>& v, Device d);

}  // namespace tensorplay::detail
