// FakeAgent: an in-memory RpcAgent for tests of layers above the agent (handlers run in-process).
#pragma once

#include <tensorplay/rpc/agent.hpp>
#include <tensorplay/rpc/options.hpp>

#include <map>
#include <mutex>
#include <string>

namespace tensorplay::test {

/// Every call goes to this agent's own handlers, as if `peers` were other workers. Coroutine
/// handlers run on the caller's executor, blocking handlers inline. Handler errors come back as
/// remote_error naming the worker, like the real agent.
class FakeAgent final : public RpcAgent {
public:
    explicit FakeAgent(std::string self = "self", std::vector<std::string> peers = {"peer"}) {
        infos_.push_back({std::move(self), 0});
        for (auto& p : peers) infos_.push_back({std::move(p), static_cast<int>(infos_.size())});
    }

    const WorkerInfo& get_worker_info() const override { return infos_.front(); }
    Result<WorkerInfo> get_worker_info(std::string_view name) const override {
        for (const auto& w : infos_)
            if (w.name == name) return w;
        return fail(Errc::invalid_argument, "unknown worker \"" + std::string(name) + "\"");
    }
    std::vector<WorkerInfo> get_worker_infos() const override { return infos_; }
    const RpcBackendOptions& get_backend_options() const override { return options_; }

    Result<void> register_handler(std::string name, RpcHandler handler) override {
        std::lock_guard l(mutex_);
        if (handlers_.count(name) || blocking_.count(name))
            return fail(Errc::already_registered, "handler \"" + name + "\" is already registered");
        handlers_.emplace(std::move(name), std::move(handler));
        return ok();
    }
    Result<void> register_blocking_handler(std::string name, BlockingRpcHandler handler) override {
        std::lock_guard l(mutex_);
        if (handlers_.count(name) || blocking_.count(name))
            return fail(Errc::already_registered, "handler \"" + name + "\" is already registered");
        blocking_.emplace(std::move(name), std::move(handler));
        return ok();
    }
    Task<Result<void>> unregister_handler(std::string name) override {
        std::lock_guard l(mutex_);
        if (handlers_.erase(name) + blocking_.erase(name) == 0)
            co_return fail(Errc::not_found, "no handler \"" + name + "\"");
        co_return ok();
    }

    Task<Result<Message>> rpc_async(std::string to, std::string handler, Message message, double) override {
        auto target = get_worker_info(to);
        if (!target) co_return fail(std::move(target).error());
        ++calls;
        RpcHandler coro;
        BlockingRpcHandler blocking;
        {
            std::lock_guard l(mutex_);
            if (auto it = handlers_.find(handler); it != handlers_.end()) coro = it->second;
            else if (auto b = blocking_.find(handler); b != blocking_.end()) blocking = b->second;
        }
        Result<Message> r = fail(Errc::not_found, "no handler \"" + handler + "\"");
        if (coro) r = co_await coro(get_worker_info(), std::move(message));
        else if (blocking) r = blocking(get_worker_info(), std::move(message));
        else co_return fail(Errc::remote_error, "no handler \"" + handler + "\"", to);
        if (!r) co_return fail(Errc::remote_error, r.error().to_string(), to);
        co_return r;
    }
    Task<Result<void>> shutdown(bool, double) override { co_return ok(); }

    int calls = 0;

private:
    std::vector<WorkerInfo> infos_;
    RpcBackendOptions options_;
    std::mutex mutex_;
    std::map<std::string, RpcHandler, std::less<>> handlers_;
    std::map<std::string, BlockingRpcHandler, std::less<>> blocking_;
};

}  // namespace tensorplay::test
