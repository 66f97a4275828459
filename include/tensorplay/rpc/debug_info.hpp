// AgentDebugInfo: a snapshot of an agent's counters (like PyTorch's _get_debug_info), for logs,
// dashboards and `echo_cluster --stats`.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/device/device_map.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tensorplay {

/// Counters of one peer worker, since the agent started.
struct TP_API PeerDebugInfo {
    std::string worker;
    int rank = -1;
    bool connected = false;             ///< an outgoing connection to it is open
    std::string transport;              ///< what that connection negotiated ("uv", "uds"); empty: none
    std::string channel;                ///< the channel per device pair ("cpu->cpu:basic", comma-separated)
    std::uint64_t calls_in_flight = 0;  ///< this worker's calls to it awaiting their replies
    std::uint64_t calls_done = 0;       ///< this worker's calls to it that have ended (with a reply or an error)
    std::uint64_t calls_failed = 0;     ///< of calls_done, the ones that ended with an error
    std::uint64_t requests_served = 0;  ///< its calls to this worker that were answered
    std::uint64_t bytes_sent = 0;       ///< message bytes (payloads and tensors) of requests and replies sent to it
    std::uint64_t bytes_received = 0;   ///< message bytes of replies and requests received from it
    DeviceMap device_map;               ///< where this worker's tensors land on it (device_maps[it])
    DeviceMap reverse_device_map;       ///< where tensors of replies to its calls land on it (its map, inverted)
};

/// A snapshot of an agent.
struct TP_API AgentDebugInfo {
    std::string worker;
    int rank = -1;
    int world_size = 0;
    std::vector<PeerDebugInfo> peers;         ///< every other worker, by rank
    std::vector<Device> devices;              ///< this worker's devices, as the device-map exchange computed them
    std::map<std::string, std::uint64_t> errors;  ///< this worker's failed calls by error code ("timeout", ...)
    std::uint64_t requests_running = 0;       ///< handler queue depth: requests being served now
    std::uint64_t latency_samples = 0;        ///< calls that got a reply, timed from send to reply
    double latency_p50_us = 0;                ///< percentiles of those round trips, in microseconds
    double latency_p90_us = 0;
    double latency_p99_us = 0;
    double latency_max_us = 0;

    /// The snapshot as one JSON object.
    [[nodiscard]] std::string to_json() const;
};

}  // namespace tensorplay
