// RpcAgent: the interface every RPC backend's agent implements (the native TENSORPIPE one first).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/rpc/message.hpp>
#include <tensorplay/rpc/worker_info.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace tensorplay {

struct RpcBackendOptions;

/// An RPC agent: one worker's endpoint in a group. Thread-safe.
class RpcAgent {
public:
    virtual ~RpcAgent() = default;

    /// This worker.
    [[nodiscard]] virtual const WorkerInfo& get_worker_info() const = 0;
    /// A worker by name; Errc::invalid_argument when there is none.
    [[nodiscard]] virtual Result<WorkerInfo> get_worker_info(std::string_view name) const = 0;
    /// Every worker of the group, this one included, by id.
    [[nodiscard]] virtual std::vector<WorkerInfo> get_worker_infos() const = 0;
    /// The options the agent was created with.
    [[nodiscard]] virtual const RpcBackendOptions& get_backend_options() const = 0;

    /// Calls handler `handler` on worker `to` with `message`. `timeout_sec`: seconds;
    /// UNSET_RPC_TIMEOUT (-1) uses the options' rpc_timeout; 0 means no timeout.
    /// Errors: invalid_argument (unknown worker), timeout, connection_lost, remote_error,
    /// shutdown, device_error. Cancellation: before sending, the call is never sent; after,
    /// the caller stops waiting and the late reply is dropped.
    [[nodiscard]] virtual Task<Result<Message>> rpc_async(std::string to, std::string handler, Message message,
                                                          double timeout_sec = -1.0) = 0;
    /// Graceful: waits until no worker may still call this one, and outstanding calls finish;
    /// otherwise local. `timeout_sec` 0 means no limit. Later calls return Errc::shutdown.
    [[nodiscard]] virtual Task<Result<void>> shutdown(bool graceful = true, double timeout_sec = 0) = 0;
};

}  // namespace tensorplay
