// RpcBackendOptions / TensorPipeRpcBackendOptions: value checks and the one-to-one device-map merge.
#include <tensorplay/rpc/options.hpp>

#include "transport/transport.hpp"

#include <cmath>
#include <utility>
#include <sstream>

namespace tensorplay {

RpcBackendOptions::RpcBackendOptions(double timeout, std::string method)
    : rpc_timeout(timeout), init_method(std::move(method)) {}

Result<void> RpcBackendOptions::validate() const {
    if (std::isnan(rpc_timeout) || std::isinf(rpc_timeout) || rpc_timeout < 0) {
        std::ostringstream msg;
        msg << "RPC Timeout must be non-negative and finite (seconds; 0 means no timeout), got " << rpc_timeout;
        return fail(Errc::invalid_argument, msg.str());
    }
    return ok();
}

TensorPipeRpcBackendOptions::TensorPipeRpcBackendOptions(double timeout, std::string method, int threads)
    : RpcBackendOptions(timeout, std::move(method)), num_worker_threads(threads) {}

Result<void> TensorPipeRpcBackendOptions::set_device_map(const std::string& to, const DeviceMap& map) {
    DeviceMap merged;
    if (auto it = device_maps.find(to); it != device_maps.end()) merged = it->second;
    for (const auto& [source, target] : map) {
        auto [it, inserted] = merged.emplace(source, target);
        if (!inserted && it->second != target)
            return fail(Errc::invalid_argument, "`set_device_map` only supports 1-to-1 mapping, trying to map " +
                                                    source.str() + " to " + target.str() + " and " + it->second.str());
    }
    // torch checks only the map given; checking the merged one keeps device_maps one-to-one.
    DeviceMap reverse;
    for (const auto& [source, target] : merged) {
        auto [it, inserted] = reverse.emplace(target, source);
        if (!inserted)
            return fail(Errc::invalid_argument, "`device_map` only supports 1-to-1 mapping, trying to map " +
                                                    source.str() + " and " + it->second.str() + " to " + target.str());
    }
    device_maps[to] = std::move(merged);
    return ok();
}

void TensorPipeRpcBackendOptions::set_devices(std::vector<Device> new_devices) { devices = std::move(new_devices); }

Result<void> TensorPipeRpcBackendOptions::validate() const {
    if (auto r = RpcBackendOptions::validate(); !r) return r;
    if (num_worker_threads <= 0)
        return fail(Errc::invalid_argument,
                    "num_worker_threads must be positive, got " + std::to_string(num_worker_threads));
    if (!(member_timeout > 0) || !std::isfinite(member_timeout))
        return fail(Errc::invalid_argument, "member_timeout must be a positive number of seconds, got " + std::to_string(member_timeout));
    if (transports)
        if (auto r = detail::check_transport_names(*transports); !r) return r;
    if (channels)
        if (auto r = detail::check_channel_names(*channels); !r) return r;
    for (const auto& [name, v] : {std::pair{"max_frame_bytes", max_frame_bytes}, std::pair{"receive_budget_bytes", receive_budget_bytes},
                                  std::pair{"max_inbound_connections", max_inbound_connections}})
        if (v == 0) return fail(Errc::invalid_argument, std::string(name) + " must be positive, got 0");
    if (!(handshake_timeout > 0) || !std::isfinite(handshake_timeout))
        return fail(Errc::invalid_argument, "handshake_timeout must be a positive number of seconds, got " + std::to_string(handshake_timeout));
    for (const auto& [name, v] : {std::pair{"frame_timeout", frame_timeout}, std::pair{"idle_timeout", idle_timeout}})
        if (!(v >= 0) || !std::isfinite(v))
            return fail(Errc::invalid_argument, std::string(name) + " must be a number of seconds >= 0 (0: none), got " + std::to_string(v));
    // (The same bound as a key file's; the key itself is never put in a message.)
    if (auth_key.size() > 64 * 1024)
        return fail(Errc::invalid_argument, "auth_key is " + std::to_string(auth_key.size()) + " bytes, over the limit of 65536");
    return ok();
}

}  // namespace tensorplay
