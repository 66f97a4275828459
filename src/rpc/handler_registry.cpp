// HandlerRegistry: lookups with a one-entry cache, running counts, and draining removal.
#include "rpc/handler_registry.hpp"

namespace tensorplay::detail {

Result<void> HandlerRegistry::add(std::string name, RpcHandler coro, BlockingRpcHandler blocking) {
    if (!coro && !blocking) return fail(Errc::invalid_argument, "handler \"" + name + "\" is empty");
    auto entry = std::make_shared<HandlerEntry>();
    entry->name = name;
    entry->coro = std::move(coro);
    entry->blocking = std::move(blocking);
    std::lock_guard lock(mutex_);
    auto [it, inserted] = by_name_.try_emplace(std::move(name), std::move(entry));
    if (!inserted)
        return fail(Errc::already_registered,
                    "a handler named \"" + it->first + "\" is already registered on worker \"" + worker_ + "\"");
    return ok();
}

std::shared_ptr<HandlerEntry> HandlerRegistry::enter(std::string_view name) {
    std::shared_ptr<HandlerEntry> entry;
    if (last_ && last_->name == name) {
        entry = last_;
    } else {
        std::lock_guard lock(mutex_);
        if (auto it = by_name_.find(name); it != by_name_.end()) entry = last_ = it->second;
    }
    if (entry) ++entry->running;
    return entry;
}

void HandlerRegistry::leave(HandlerEntry& entry) {
    if (--entry.running == 0) entry.drained.complete();
}

Error HandlerRegistry::not_found(std::string_view name) const {
    return Error(Errc::not_found, "no handler named \"" + std::string(name) + "\" is registered on worker \"" + worker_ + "\"",
                 worker_);
}

Task<Result<void>> HandlerRegistry::remove(std::string name) {
    std::shared_ptr<HandlerEntry> h;
    {
        std::lock_guard lock(mutex_);
        auto it = by_name_.find(name);
        if (it == by_name_.end()) co_return fail(not_found(name));
        h = std::move(it->second);
        by_name_.erase(it);
    }
    if (last_ == h) last_.reset();
    while (h->running > 0) {
        co_await h->drained.wait();
        if (h->drained.error())
            co_return fail(Errc::cancelled, "unregistering handler \"" + name + "\" on worker \"" + worker_ +
                                                "\": cancelled while " + std::to_string(h->running) + " call(s) of it still ran");
    }
    co_return ok();
}

}  // namespace tensorplay::detail
