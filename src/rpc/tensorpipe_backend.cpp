// The built-in TENSORPIPE backend's handlers (the seed's _tensorpipe_* functions) and the hook
// through which the native agent plugs in.
#include "rpc/tensorpipe_backend.hpp"

#include "rpc/native_agent_factory.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/device/device.hpp>
#include <tensorplay/device/device_map.hpp>

#include <algorithm>
#include <array>
#include <limits>
#include <mutex>

namespace tensorplay::detail {
namespace {

struct FactorySlot {
    std::mutex mutex;
    NativeAgentFactory factory;
};

FactorySlot& factory_slot() {
    static FactorySlot slot;  // function-local: the agent's static registrar may run first
    return slot;
}

// The seed's set of keyword arguments TensorPipeRpcBackendOptions takes.
constexpr std::array<std::string_view, 5> kTensorPipeKeys = {"num_worker_threads", "device_maps", "devices",
                                                             "_transports", "_channels"};

Failure wrong_type(std::string_view key, std::string_view expected, const BackendKwarg& got) {
    return fail(Errc::type_error, "TENSORPIPE backend option " + std::string(key) + " must be " + std::string(expected) +
                                      ", got " + std::string(kwarg_type_name(got)));
}

// _transports / _channels: a list of names, or None for "all built in".
Result<std::optional<std::vector<std::string>>> name_list(std::string_view key, const BackendKwarg& value) {
    if (std::holds_alternative<std::monostate>(value)) return std::nullopt;
    if (const auto* v = std::get_if<std::vector<std::string>>(&value)) return *v;
    return wrong_type(key, "list[str] or None", value);
}

}  // namespace

void set_native_agent_factory(NativeAgentFactory factory) {
    auto& slot = factory_slot();
    std::lock_guard lock(slot.mutex);
    slot.factory = std::move(factory);
}

NativeAgentFactory native_agent_factory() {
    auto& slot = factory_slot();
    std::lock_guard lock(slot.mutex);
    return slot.factory;
}

Result<std::shared_ptr<RpcBackendOptions>> tensorpipe_construct_rpc_backend_options_handler(
    double rpc_timeout, std::string init_method, const BackendKwargs& kwargs) {
    auto options = std::make_shared<TensorPipeRpcBackendOptions>(rpc_timeout, std::move(init_method));

    std::string dropped;
    for (const auto& [key, value] : kwargs) {
        if (std::find(kTensorPipeKeys.begin(), kTensorPipeKeys.end(), key) == kTensorPipeKeys.end())
            dropped += (dropped.empty() ? "" : ", ") + key;
    }
    if (!dropped.empty())
        log(LogLevel::warn, "rpc",
            "construct_rpc_backend_options: the TENSORPIPE backend ignores the keyword argument(s) " + dropped);

    if (auto it = kwargs.find("num_worker_threads"); it != kwargs.end()) {
        const auto* n = std::get_if<std::int64_t>(&it->second);
        if (!n) return wrong_type("num_worker_threads", "int", it->second);
        if (*n < std::numeric_limits<int>::min() || *n > std::numeric_limits<int>::max())
            return fail(Errc::invalid_argument, "num_worker_threads must be positive, got " + std::to_string(*n));
        options->num_worker_threads = static_cast<int>(*n);
    }
    if (auto it = kwargs.find("device_maps"); it != kwargs.end()) {
        if (const auto* maps = std::get_if<DeviceMaps>(&it->second)) {
            // Through set_device_map, so that each map is checked one-to-one as torch's constructor does.
            for (const auto& [to, map] : *maps)
                if (auto r = options->set_device_map(to, map); !r) return fail(std::move(r).error());
        } else if (!std::holds_alternative<std::monostate>(it->second)) {
            return wrong_type("device_maps", "dict[str, DeviceMap] or None", it->second);
        }
    }
    if (auto it = kwargs.find("devices"); it != kwargs.end()) {
        if (const auto* devices = std::get_if<std::vector<Device>>(&it->second)) {
            options->set_devices(*devices);
        } else if (const auto* names = std::get_if<std::vector<std::string>>(&it->second)) {
            std::vector<Device> parsed;
            for (const auto& text : *names) {
                auto d = parse_device(text);
                if (!d) return fail(std::move(d).error().context("TENSORPIPE backend option devices"));
                parsed.push_back(*d);
            }
            options->set_devices(std::move(parsed));
        } else if (!std::holds_alternative<std::monostate>(it->second)) {
            return wrong_type("devices", "list[Device], list[str] or None", it->second);
        }
    }
    if (auto it = kwargs.find("_transports"); it != kwargs.end()) {
        auto v = name_list("_transports", it->second);
        if (!v) return fail(std::move(v).error());
        options->transports = std::move(*v);
    }
    if (auto it = kwargs.find("_channels"); it != kwargs.end()) {
        auto v = name_list("_channels", it->second);
        if (!v) return fail(std::move(v).error());
        options->channels = std::move(*v);
    }
    if (auto r = options->validate(); !r) return fail(std::move(r).error());
    return std::shared_ptr<RpcBackendOptions>(std::move(options));
}

Task<Result<std::shared_ptr<RpcAgent>>> tensorpipe_init_backend_handler(BackendInitArgs args) {
    const auto* options = dynamic_cast<const TensorPipeRpcBackendOptions*>(args.options.get());
    if (!options) co_return fail(Errc::type_error, "rpc_backend_options must be TensorPipeRpcBackendOptions");
    // Python's constructor refuses bad values; ours are public fields, so check them here.
    if (auto r = options->validate(); !r) co_return fail(std::move(r).error());

    const int device_count = cuda_device_count();
    const std::string& name = args.name;
    if (auto r = validate_device_maps({name}, {{name, device_count}}, {{name, options->device_maps}},
                                      {{name, options->devices}}, /*is_static_group=*/false);
        !r)
        co_return fail(std::move(r).error());

    if (!args.store) co_return fail(Errc::type_error, "store must be provided to initialise the TENSORPIPE backend");
    auto factory = native_agent_factory();
    if (!factory)
        co_return fail(Errc::not_supported,
                       "the native TENSORPIPE agent is not available in this build (no agent factory is registered)");
    co_return co_await factory(std::move(args));
}

}  // namespace tensorplay::detail
