// The top-level RPC API: init_rpc / shutdown, worker lookup, and rpc_async / rpc_sync on a process
// default agent, like the Python module (agents also stay explicit objects: several per process).
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/rpc/agent.hpp>
#include <tensorplay/rpc/backend_registry.hpp>
#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/rpc/options.hpp>
#include <tensorplay/rpc/startup.hpp>
#include <tensorplay/store/store.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay {

/// Starts this worker's agent: rendezvous through `options->init_method` ("env://" reads
/// MASTER_ADDR, MASTER_PORT and, where rank/world_size are -1, RANK and WORLD_SIZE; "tcp://host:port";
/// "file://path"), then the backend's options and init handlers. `options` null: the backend's
/// defaults. The agent runs on the awaiting coroutine's executor, which must be single-threaded or a
/// strand (a thread pool's, or an io_context's made for several threads, is invalid_argument). The
/// first agent started while there is no default becomes the process default (used by the free
/// functions below). A world size that neither the argument, the URL nor WORLD_SIZE gives
/// (DYNAMIC_WORLD_SIZE) starts a member of a dynamic group, which joins the running group (the
/// store must exist: rank 0 hosts it, or an external one). Errors: the rendezvous' and the
/// backend's (unknown_backend, timeout, ...).
[[nodiscard]] TP_API Task<Result<std::shared_ptr<RpcAgent>>> init_rpc(std::string name,
                                                               BackendRef backend = BackendType::tensorpipe(),
                                                               int rank = -1, int world_size = -1,
                                                               std::shared_ptr<RpcBackendOptions> options = nullptr);

/// init_rpc with a store the caller already has (no rendezvous); rank and world_size must be set.
[[nodiscard]] TP_API Task<Result<std::shared_ptr<RpcAgent>>> init_rpc_with_store(std::shared_ptr<Store> store, std::string name,
                                                                          BackendRef backend, int rank, int world_size,
                                                                          std::shared_ptr<RpcBackendOptions> options = nullptr);

/// For code that is not a coroutine: starts (once) a process runtime with one I/O thread and runs
/// init_rpc on it. Refuses (invalid_argument) on that runtime's own threads.
[[nodiscard]] TP_API Result<std::shared_ptr<RpcAgent>> init_rpc_blocking(std::string name,
                                                                  BackendRef backend = BackendType::tensorpipe(),
                                                                  int rank = -1, int world_size = -1,
                                                                  std::shared_ptr<RpcBackendOptions> options = nullptr);

/// The process default agent; null when there is none. Thread-safe.
[[nodiscard]] TP_API std::shared_ptr<RpcAgent> default_agent();
/// Makes `agent` (running on `executor`) the process default; null clears it. Thread-safe.
TP_API void set_default_agent(std::shared_ptr<RpcAgent> agent, Executor executor);

/// Shuts the default agent down (see RpcAgent::shutdown) and clears the default.
/// Errors: invalid_argument when there is no default agent; the agent's.
[[nodiscard]] TP_API Task<Result<void>> shutdown(bool graceful = true, double timeout_sec = DEFAULT_SHUTDOWN_TIMEOUT);
/// Blocking shutdown for code that is not a coroutine (refused on the agent's I/O threads); also
/// stops the runtime init_rpc_blocking started.
[[nodiscard]] TP_API Result<void> shutdown_blocking(bool graceful = true, double timeout_sec = DEFAULT_SHUTDOWN_TIMEOUT);

/// This worker, by the default agent.
[[nodiscard]] TP_API Result<WorkerInfo> get_worker_info();
/// A worker by name (invalid_argument when unknown or when there is no default agent).
[[nodiscard]] TP_API Result<WorkerInfo> get_worker_info(std::string_view name);
/// Every worker of the default agent's group, by id.
[[nodiscard]] TP_API Result<std::vector<WorkerInfo>> get_worker_infos();

/// RpcAgent::rpc_async on the default agent (invalid_argument when there is none).
[[nodiscard]] TP_API Task<Result<Message>> rpc_async(std::string to, std::string handler, Message message,
                                              double timeout_sec = UNSET_RPC_TIMEOUT);
/// Blocking call on the default agent. Refused (invalid_argument) on one of the agent's I/O threads,
/// where waiting would deadlock; allowed on other threads (a blocking handler's included).
[[nodiscard]] TP_API Result<Message> rpc_sync(std::string to, std::string handler, Message message,
                                       double timeout_sec = UNSET_RPC_TIMEOUT);
/// Blocking call on an explicit agent that runs on `executor` (same rules as rpc_sync).
[[nodiscard]] TP_API Result<Message> rpc_sync(RpcAgent& agent, Executor executor, std::string to, std::string handler,
                                       Message message, double timeout_sec = UNSET_RPC_TIMEOUT);

/// True when the calling thread is running `executor` (io_context, thread_pool and strands of
/// them; false for executor types it cannot inspect).
[[nodiscard]] TP_API bool running_in_executor(const Executor& executor) noexcept;

}  // namespace tensorplay
