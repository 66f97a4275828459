// Private: the built-in TENSORPIPE backend's two handlers, registered by the backend registry.
#pragma once

#include <tensorplay/rpc/backend_registry.hpp>

namespace tensorplay::detail {

/// The seed's _tensorpipe_construct_rpc_backend_options_handler: keeps the keys num_worker_threads,
/// device_maps, devices, _transports, _channels (others are dropped with a warning naming them);
/// a value of the wrong type is Errc::type_error naming the key; values are checked (validate()).
[[nodiscard]] Result<std::shared_ptr<RpcBackendOptions>> tensorpipe_construct_rpc_backend_options_handler(
    double rpc_timeout, std::string init_method, const BackendKwargs& kwargs);

/// The seed's _tensorpipe_init_backend_handler: options must be TensorPipeRpcBackendOptions
/// (Errc::type_error), the worker's own maps are validated against cuda_device_count() with
/// dynamic-group rules, then the native agent factory creates the agent (Errc::not_supported
/// while none is set).
[[nodiscard]] Task<Result<std::shared_ptr<RpcAgent>>> tensorpipe_init_backend_handler(BackendInitArgs args);

}  // namespace tensorplay::detail
