// Private: the process-wide handlers that every agent installs before it reports ready.
#pragma once

#include <tensorplay/rpc/agent.hpp>

#include <string>
#include <vector>

namespace tensorplay::detail {

/// One handler of register_startup_handler / register_startup_blocking_handler (one of the two set).
struct StartupHandler {
    std::string name;
    RpcHandler coro;
    BlockingRpcHandler blocking;
};

/// A copy of the startup handlers registered so far, in registration order. Thread-safe.
[[nodiscard]] std::vector<StartupHandler> startup_handlers();

}  // namespace tensorplay::detail
