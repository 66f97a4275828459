// RpcAgent: the interface every RPC backend's agent implements (the native TENSORPIPE one first).
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/rpc/debug_info.hpp>
#include <tensorplay/rpc/message.hpp>
#include <tensorplay/rpc/worker_info.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay {

struct RpcBackendOptions;

/// A handler that runs as a coroutine on the agent's I/O executor (must not block).
using RpcHandler = std::function<Task<Result<Message>>(WorkerInfo caller, Message request)>;
/// A handler that may block; it runs on the agent's pool of num_worker_threads.
using BlockingRpcHandler = std::function<Result<Message>(const WorkerInfo& caller, Message request)>;

/// An RPC agent: one worker's endpoint in a group. Thread-safe.
class TP_API RpcAgent {
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

    /// Registers a coroutine handler under `name` (Errc::already_registered if taken).
    [[nodiscard]] virtual Result<void> register_handler(std::string name, RpcHandler handler) = 0;
    /// Registers a blocking handler under `name`, run on the worker pool.
    [[nodiscard]] virtual Result<void> register_blocking_handler(std::string name, BlockingRpcHandler handler) = 0;
    /// Removes a handler after the calls it is running have finished (Errc::not_found if absent).
    [[nodiscard]] virtual Task<Result<void>> unregister_handler(std::string name) = 0;

    /// Calls handler `handler` on worker `to` with `message`. `timeout_sec`: seconds;
    /// UNSET_RPC_TIMEOUT (-1) uses the options' rpc_timeout; 0 means no timeout.
    /// Errors: invalid_argument (unknown worker), timeout, connection_lost, remote_error,
    /// shutdown, device_error. Cancellation: before sending, the call is never sent; after,
    /// the caller stops waiting and the late reply is dropped.
    [[nodiscard]] virtual Task<Result<Message>> rpc_async(std::string to, std::string handler, Message message,
                                                          double timeout_sec = -1.0) = 0;
    /// Graceful: waits until no worker may still call this one, and outstanding calls finish;
    /// otherwise local. Every wait is charged to `timeout_sec` (0 means no limit); when it passes,
    /// Errc::timeout names the workers that did not arrive, and the agent closes all the same.
    /// Later calls return Errc::shutdown. Any way an agent is shut down releases what init made.
    [[nodiscard]] virtual Task<Result<void>> shutdown(bool graceful = true, double timeout_sec = DEFAULT_SHUTDOWN_TIMEOUT) = 0;
    /// A snapshot of the agent's counters (calls per peer, errors by code, bytes, latency). The
    /// default answers Errc::not_supported, for backends that keep none.
    [[nodiscard]] virtual Task<Result<AgentDebugInfo>> get_debug_info();
};

}  // namespace tensorplay
