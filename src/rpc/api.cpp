// The top-level RPC API: init_rpc, the process default agent, shutdown, rpc_async / rpc_sync.
#include <tensorplay/rpc/api.hpp>

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/store/rendezvous.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include "core/asio_compat.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <mutex>

namespace tensorplay {

namespace {

// The Python module's process-wide state: one default agent, the executor it runs on, and the
// runtime init_rpc_blocking started (kept until shutdown_blocking or exit).
struct ProcessState {
    std::mutex mutex;
    std::shared_ptr<RpcAgent> agent;
    std::optional<Executor> executor;
    std::unique_ptr<Runtime> runtime;

    // Runs at exit, after main. An agent on the process runtime is closed before the runtime's
    // threads stop. One on the user's event loop is left alone: that loop has usually been destroyed
    // by now, and closing the agent would post to it (the agent's sockets go with the process).
    ~ProcessState() {
        const bool on_runtime = agent && runtime && executor && *executor == runtime->get_executor();
        if (agent && !on_runtime) {
            log(LogLevel::warn, "rpc", "the process exits with the RPC agent of worker \"" + agent->get_worker_info().name +
                                           "\" still running: shut it down (co_await agent->shutdown()) before its event loop ends");
            abandoned = new std::shared_ptr<RpcAgent>(std::move(agent));
        }
        agent.reset();  // before the runtime whose threads it uses
        runtime.reset();
    }
    static inline std::shared_ptr<RpcAgent>* abandoned = nullptr;  // reachable, so not reported as a leak
};

ProcessState& state() {
    static ProcessState s;
    return s;
}

Error no_default_agent(std::string_view what) {
    return Error(Errc::invalid_argument,
                 std::string(what) + ": RPC has not been initialized; call init_rpc first (or use an agent directly)");
}

struct DefaultAgent {
    std::shared_ptr<RpcAgent> agent;
    Executor executor;
};

Result<DefaultAgent> current(std::string_view what) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.agent || !s.executor) return fail(no_default_agent(what));
    return DefaultAgent{s.agent, *s.executor};
}

void adopt_as_default(const std::shared_ptr<RpcAgent>& agent, const Executor& ex) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.agent) {
        s.agent = agent;
        s.executor = ex;
    }
}

// Clears the process default when it is `agent`.
void forget_default(const RpcAgent* agent) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (s.agent.get() == agent) {
        s.agent.reset();
        s.executor.reset();
    }
}

template <class T>
Result<T> block_on_executor(const Executor& ex, Task<Result<T>> task, std::string_view what) {
    if (running_in_executor(ex))
        return fail(Errc::invalid_argument,
                    std::string(what) + " was called on one of the agent's I/O threads, where waiting would "
                                        "deadlock; co_await the asynchronous version there instead");
    auto promise = std::make_shared<std::promise<Result<T>>>();
    auto future = promise->get_future();
    asio::co_spawn(ex, std::move(task), [promise](std::exception_ptr e, Result<T> r) {
        if (e) r = fail(error_from_exception_ptr(e, "rpc"));
        promise->set_value(std::move(r));
    });
    try {
        return future.get();
    } catch (const std::future_error&) {
        // The executor was destroyed with the call still queued: the handler died unrun.
        return fail(Errc::shutdown, std::string(what) + ": the agent's executor stopped before the call finished");
    }
}

}  // namespace

bool running_in_executor(const Executor& ex) noexcept {
    if (!ex) return false;
    if (auto* io = detail::target_of<asio::io_context::executor_type>(ex)) return io->running_in_this_thread();
    if (auto* s = detail::target_of<asio::strand<asio::io_context::executor_type>>(ex))
        return s->get_inner_executor().running_in_this_thread();
    if (auto* p = detail::target_of<asio::thread_pool::executor_type>(ex)) return p->running_in_this_thread();
    if (auto* s = detail::target_of<asio::strand<asio::thread_pool::executor_type>>(ex))
        return s->get_inner_executor().running_in_this_thread();
    if (auto* s = detail::target_of<asio::strand<Executor>>(ex)) return running_in_executor(s->get_inner_executor());
    return false;
}

std::shared_ptr<RpcAgent> default_agent() {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    return s.agent;
}

void set_default_agent(std::shared_ptr<RpcAgent> agent, Executor executor) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    s.agent = std::move(agent);
    if (s.agent) s.executor = std::move(executor);
    else s.executor.reset();
}

namespace {

// The agent init_rpc and init_rpc_with_store return. It owns what the rendezvous made (the store
// client, and the server when this rank hosts the store) and, however it is shut down (the free
// shutdown() or this method), stops them and stops being the process default: nothing of it is
// left for a static destructor to close after the user's event loop has gone.
class InitRpcAgent final : public RpcAgent {
public:
    InitRpcAgent(std::shared_ptr<RpcAgent> inner, std::shared_ptr<Store> owned_store, std::shared_ptr<TcpStoreServer> server)
        : inner_(std::move(inner)), owned_store_(std::move(owned_store)), server_(std::move(server)) {}
    ~InitRpcAgent() override {
        inner_.reset();
        if (server_) server_->stop();
    }

    const WorkerInfo& get_worker_info() const override { return inner_->get_worker_info(); }
    Result<WorkerInfo> get_worker_info(std::string_view name) const override { return inner_->get_worker_info(name); }
    std::vector<WorkerInfo> get_worker_infos() const override { return inner_->get_worker_infos(); }
    const RpcBackendOptions& get_backend_options() const override { return inner_->get_backend_options(); }
    Result<void> register_handler(std::string name, RpcHandler handler) override {
        return inner_->register_handler(std::move(name), std::move(handler));
    }
    Result<void> register_blocking_handler(std::string name, BlockingRpcHandler handler) override {
        return inner_->register_blocking_handler(std::move(name), std::move(handler));
    }
    Task<Result<void>> unregister_handler(std::string name) override { return inner_->unregister_handler(std::move(name)); }
    Task<Result<Message>> rpc_async(std::string to, std::string handler, Message message, double timeout_sec) override {
        return inner_->rpc_async(std::move(to), std::move(handler), std::move(message), timeout_sec);
    }
    Task<Result<void>> shutdown(bool graceful, double timeout_sec) override;
    Task<Result<AgentDebugInfo>> get_debug_info() override { return inner_->get_debug_info(); }

private:
    std::shared_ptr<RpcAgent> inner_;
    std::shared_ptr<Store> owned_store_;        // null when the caller gave the store
    std::shared_ptr<TcpStoreServer> server_;    // set when this rank hosts the store
};

// How long the hosting rank keeps the store up after its graceful shutdown, for the others' last
// replies to reach them: the agent's own shutdown already waited until every rank had made its last
// store request, so this is a courtesy, bounded, never the 10 s it once was.
constexpr std::chrono::milliseconds kStoreLinger{1000};

Task<Result<void>> InitRpcAgent::shutdown(bool graceful, double timeout_sec) {
    const auto start = std::chrono::steady_clock::now();
    auto r = co_await inner_->shutdown(graceful, timeout_sec);
    if (graceful && server_ && r) {
        auto limit = std::chrono::steady_clock::now() + kStoreLinger;
        if (timeout_sec > 0)  // charged to the caller's timeout too
            limit = std::min(limit, start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                std::chrono::duration<double>(timeout_sec)));
        auto ex = co_await asio::this_coro::executor;
        // Our own store client is the one connection allowed to remain.
        while (std::chrono::steady_clock::now() < limit) {
            if (co_await server_->num_connections() <= 1) break;
            asio::steady_timer t(ex, std::chrono::milliseconds(5));
            auto [ec] = co_await t.async_wait(detail::use_nothrow);
            if (ec) break;
        }
    }
    if (auto* tcp = dynamic_cast<TcpStore*>(owned_store_.get())) tcp->close();
    if (server_) server_->stop();
    forget_default(this);
    co_return r;
}

}  // namespace

Task<Result<std::shared_ptr<RpcAgent>>> init_rpc_with_store(std::shared_ptr<Store> store, std::string name,
                                                            BackendRef backend, int rank, int world_size,
                                                            std::shared_ptr<RpcBackendOptions> options) {
    const std::string what = "init_rpc as \"" + name + "\"";
    if (!store) co_return fail(Errc::invalid_argument, what + ": the store is null");
    if (!options) {
        auto made = construct_rpc_backend_options(backend);
        if (!made) co_return fail(std::move(made).error().context(what));
        options = std::move(*made);
    }
    auto ex = co_await asio::this_coro::executor;
    auto agent = co_await init_backend(backend, BackendInitArgs(std::move(store), name, rank, world_size, options));
    if (!agent) co_return fail(std::move(agent).error().context(what));
    std::shared_ptr<RpcAgent> result = std::make_shared<InitRpcAgent>(std::move(*agent), nullptr, nullptr);
    adopt_as_default(result, ex);
    co_return result;
}

namespace {
/// The store server options of `o` (TensorPipeRpcBackendOptions::hosted_store), else the defaults.
TcpStoreServerOptions hosted_store_of(const RpcBackendOptions* o) {
    if (const auto* tp = dynamic_cast<const TensorPipeRpcBackendOptions*>(o)) return tp->hosted_store;
    return TcpStoreServerOptions();
}
}  // namespace

Task<Result<std::shared_ptr<RpcAgent>>> init_rpc(std::string name, BackendRef backend, int rank, int world_size,
                                                 std::shared_ptr<RpcBackendOptions> options) {
    const std::string what = "init_rpc as \"" + name + "\"";
    if (!options) {
        auto made = construct_rpc_backend_options(backend);
        if (!made) co_return fail(std::move(made).error().context(what));
        options = std::move(*made);
    }
    const double t = options->init_timeout;  // seconds; see options.hpp
    const Duration init_timeout = std::isfinite(t) && t > 0
                                      ? std::chrono::duration_cast<Duration>(std::chrono::duration<double>(t))
                                      : Store::kDefaultTimeout;
    const TcpStoreServerOptions hosted = hosted_store_of(options.get());
    auto rv = co_await rendezvous(options->init_method, rank, world_size, init_timeout, hosted);
    if (!rv) co_return fail(std::move(rv).error().context(what));
    auto ex = co_await asio::this_coro::executor;
    auto agent = co_await init_backend(backend, BackendInitArgs(rv->store, name, rv->rank, rv->world_size, options));
    if (!agent) co_return fail(std::move(agent).error().context(what));
    std::shared_ptr<RpcAgent> result = std::make_shared<InitRpcAgent>(std::move(*agent), rv->store, rv->server);
    adopt_as_default(result, ex);
    co_return result;
}

Result<std::shared_ptr<RpcAgent>> init_rpc_blocking(std::string name, BackendRef backend, int rank, int world_size,
                                                    std::shared_ptr<RpcBackendOptions> options) {
    Executor ex;
    {
        auto& s = state();
        std::lock_guard lock(s.mutex);
        if (!s.runtime) s.runtime = std::make_unique<Runtime>(RuntimeOptions{1, 1});
        ex = s.runtime->get_executor();
    }
    return block_on_executor<std::shared_ptr<RpcAgent>>(
        ex, init_rpc(std::move(name), std::move(backend), rank, world_size, std::move(options)), "init_rpc_blocking");
}

Task<Result<void>> shutdown(bool graceful, double timeout_sec) {
    auto d = current("shutdown");
    if (!d) co_return fail(std::move(d).error());
    auto r = co_await d->agent->shutdown(graceful, timeout_sec);
    {
        auto& s = state();
        std::lock_guard lock(s.mutex);
        if (s.agent == d->agent) {
            s.agent.reset();
            s.executor.reset();
        }
    }
    co_return r;
}

Result<void> shutdown_blocking(bool graceful, double timeout_sec) {
    auto d = current("shutdown_blocking");
    if (!d) return fail(std::move(d).error());
    auto r = block_on_executor<void>(d->executor, shutdown(graceful, timeout_sec), "shutdown_blocking");
    if (running_in_executor(d->executor)) return r;
    std::unique_ptr<Runtime> runtime;
    {
        auto& s = state();
        std::lock_guard lock(s.mutex);
        if (!s.agent) runtime = std::move(s.runtime);
    }
    d->agent.reset();
    if (runtime) {
        runtime->stop();
        runtime->join();
    }
    return r;
}

Result<WorkerInfo> get_worker_info() {
    auto d = current("get_worker_info");
    if (!d) return fail(std::move(d).error());
    return d->agent->get_worker_info();
}

Result<WorkerInfo> get_worker_info(std::string_view name) {
    auto d = current("get_worker_info");
    if (!d) return fail(std::move(d).error());
    return d->agent->get_worker_info(name);
}

Result<std::vector<WorkerInfo>> get_worker_infos() {
    auto d = current("get_worker_infos");
    if (!d) return fail(std::move(d).error());
    return d->agent->get_worker_infos();
}

Task<Result<Message>> rpc_async(std::string to, std::string handler, Message message, double timeout_sec) {
    auto d = current("rpc_async");
    if (!d) co_return fail(std::move(d).error());
    co_return co_await d->agent->rpc_async(std::move(to), std::move(handler), std::move(message), timeout_sec);
}

Result<Message> rpc_sync(std::string to, std::string handler, Message message, double timeout_sec) {
    auto d = current("rpc_sync");
    if (!d) return fail(std::move(d).error());
    return rpc_sync(*d->agent, d->executor, std::move(to), std::move(handler), std::move(message), timeout_sec);
}

Result<Message> rpc_sync(RpcAgent& agent, Executor executor, std::string to, std::string handler, Message message,
                         double timeout_sec) {
    return block_on_executor<Message>(
        executor, agent.rpc_async(std::move(to), std::move(handler), std::move(message), timeout_sec), "rpc_sync");
}

}  // namespace tensorplay
