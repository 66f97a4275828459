// The RPC layer's constants, with torch.distributed.rpc's values.
#pragma once

#include <chrono>
#include <string_view>

namespace tensorplay {

/// Default timeout of an RPC, in seconds (0 means no timeout).
inline constexpr double DEFAULT_RPC_TIMEOUT_SEC = 60.0;
/// Default rendezvous: MASTER_ADDR / MASTER_PORT from the environment.
inline constexpr std::string_view DEFAULT_INIT_METHOD = "env://";
/// Default size of the pool that runs blocking handlers.
inline constexpr int DEFAULT_NUM_WORKER_THREADS = 16;
/// Default timeout of a graceful shutdown, in seconds: a worker that never arrives (stopped, hung)
/// holds the others this long at most, and is named in their Errc::timeout. Pass 0 to wait forever.
inline constexpr double DEFAULT_SHUTDOWN_TIMEOUT = 60.0;
/// Timeout of the group's collectives during init (2^31-1 ms, about 24.8 days).
inline constexpr std::chrono::milliseconds DEFAULT_PROCESS_GROUP_TIMEOUT{2147483647};
/// The world size of a dynamic group's member (init_rpc / init_backend): no fixed number of
/// workers; members join and leave while the group runs. The rank is still given and unique.
inline constexpr int DYNAMIC_WORLD_SIZE = -1;
/// Default time, in seconds, a dynamic group's member may stay silent (its heartbeat standing
/// still) before the others probe it and, when it does not answer, remove it from the group.
inline constexpr double DEFAULT_MEMBER_TIMEOUT_SEC = 10.0;
/// "Use the agent's default timeout" sentinel for rpc_async and friends.
inline constexpr double UNSET_RPC_TIMEOUT = -1.0;

}  // namespace tensorplay
