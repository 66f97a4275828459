// Private: the hook through which the native agent's source file plugs itself into TENSORPIPE.
#pragma once

#include <tensorplay/rpc/backend_registry.hpp>

#include <functional>
#include <memory>

namespace tensorplay::detail {

/// Creates the native TENSORPIPE agent from already validated init arguments.
using NativeAgentFactory = std::function<Task<Result<std::shared_ptr<RpcAgent>>>(BackendInitArgs)>;

/// Installs (or, with an empty function, removes) the factory. Thread-safe; safe to call from a
/// static initialiser of another file (the storage is a function-local static).
void set_native_agent_factory(NativeAgentFactory factory);
/// The factory installed now; empty while none is.
[[nodiscard]] NativeAgentFactory native_agent_factory();

}  // namespace tensorplay::detail

namespace tensorplay {
// Both spellings work for the agent's registrar: tensorplay::set_native_agent_factory and detail::.
using detail::NativeAgentFactory;
using detail::native_agent_factory;
using detail::set_native_agent_factory;
}  // namespace tensorplay
