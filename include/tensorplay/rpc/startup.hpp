// Startup handlers: registered before init, installed by every agent this process starts before it
// reports ready, so that no peer's first call can find them missing. Typed forms: typed.hpp.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/rpc/agent.hpp>

#include <string>
#include <string_view>

namespace tensorplay {

/// Registers a handler that every agent this process starts from now on installs before it
/// reports ready, so that no peer's first call can arrive before the handler exists (a handler
/// registered on the agent after init_rpc may miss a fast peer's first call: not_found).
/// Errc::already_registered if the name is taken. Thread-safe.
[[nodiscard]] TP_API Result<void> register_startup_handler(std::string name, RpcHandler handler);
/// The blocking-handler variant of register_startup_handler (runs on the agent's worker pool).
[[nodiscard]] TP_API Result<void> register_startup_blocking_handler(std::string name, BlockingRpcHandler handler);
/// Forgets startup handler `name` for agents started from now on (agents running keep theirs).
/// Errc::not_found if there is none. Thread-safe.
[[nodiscard]] TP_API Result<void> unregister_startup_handler(std::string_view name);

}  // namespace tensorplay
