// A minimal RpcAgent for registry tests: knows its name and options, refuses every call.
#pragma once

#include <tensorplay/rpc/agent.hpp>
#include <tensorplay/rpc/options.hpp>

#include <memory>

namespace tensorplay::test {

class TestAgent final : public RpcAgent {
public:
    TestAgent(std::string name, int rank, std::shared_ptr<RpcBackendOptions> options)
        : info_{std::move(name), rank}, options_(std::move(options)) {}

    const WorkerInfo& get_worker_info() const override { return info_; }
    Result<WorkerInfo> get_worker_info(std::string_view name) const override {
        if (name == info_.name) return info_;
        return fail(Errc::invalid_argument, "unknown worker " + std::string(name));
    }
    std::vector<WorkerInfo> get_worker_infos() const override { return {info_}; }
    const RpcBackendOptions& get_backend_options() const override { return *options_; }
    Result<void> register_handler(std::string, RpcHandler) override { return fail(Errc::not_supported, "test agent"); }
    Result<void> register_blocking_handler(std::string, BlockingRpcHandler) override {
        return fail(Errc::not_supported, "test agent");
    }
    Task<Result<void>> unregister_handler(std::string) override { co_return fail(Errc::not_supported, "test agent"); }
    Task<Result<Message>> rpc_async(std::string, std::string, Message, double) override {
        co_return fail(Errc::not_supported, "test agent");
    }
    Task<Result<void>> shutdown(bool, double) override { co_return ok(); }

private:
    WorkerInfo info_;
    std::shared_ptr<RpcBackendOptions> options_;
};

}  // namespace tensorplay::test
