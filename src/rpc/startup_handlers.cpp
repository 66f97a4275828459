// The process-wide startup handlers (see api.hpp: register_startup_handler).
#include "rpc/startup_handlers.hpp"

#include <tensorplay/rpc/startup.hpp>

#include <algorithm>
#include <mutex>

namespace tensorplay {
namespace {

struct Registry {
    std::mutex mutex;
    std::vector<detail::StartupHandler> handlers;
};

Registry& registry() {
    static auto* r = new Registry;  // never destroyed: agents may start during static destruction
    return *r;
}

Result<void> add(detail::StartupHandler h) {
    if (h.name.empty()) return fail(Errc::invalid_argument, "a startup handler needs a name");
    if (!h.coro && !h.blocking) return fail(Errc::invalid_argument, "startup handler \"" + h.name + "\" is empty");
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    const bool taken = std::any_of(r.handlers.begin(), r.handlers.end(),
                                   [&](const detail::StartupHandler& x) { return x.name == h.name; });
    if (taken) return fail(Errc::already_registered, "a startup handler named \"" + h.name + "\" is already registered");
    r.handlers.push_back(std::move(h));
    return ok();
}

}  // namespace

Result<void> register_startup_handler(std::string name, RpcHandler handler) {
    return add(detail::StartupHandler{std::move(name), std::move(handler), {}});
}

Result<void> register_startup_blocking_handler(std::string name, BlockingRpcHandler handler) {
    return add(detail::StartupHandler{std::move(name), {}, std::move(handler)});
}

Result<void> unregister_startup_handler(std::string_view name) {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = std::find_if(r.handlers.begin(), r.handlers.end(), [&](const detail::StartupHandler& x) { return x.name == name; });
    if (it == r.handlers.end())
        return fail(Errc::not_found, "no startup handler named \"" + std::string(name) + "\" is registered");
    r.handlers.erase(it);
    return ok();
}

namespace detail {
std::vector<StartupHandler> startup_handlers() {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    return r.handlers;
}
}  // namespace detail

}  // namespace tensorplay
