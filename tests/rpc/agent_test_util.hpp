// Test helpers for the native agent: a group of in-process agents sharing one HashStore.
#pragma once

#include <tensorplay/store/hash_store.hpp>

#include "core/asio_compat.hpp"
#include "rpc/native_agent.hpp"
#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <functional>
#include <optional>

namespace tensorplay::test {

using AgentPtr = std::shared_ptr<detail::NativeAgent>;
using Configure = std::function<void(int rank, TensorPipeRpcBackendOptions&)>;

struct AgentGroup {
    std::shared_ptr<HashStore> store;
    std::vector<AgentPtr> agents;
    AgentPtr& operator[](int i) { return agents[i]; }
};

inline std::string worker_name(int r) { return "worker" + std::to_string(r); }

inline BackendInitArgs init_args(std::shared_ptr<Store> store, int rank, int world, const Configure& configure) {
    auto opts = std::make_shared<TensorPipeRpcBackendOptions>();
    opts->listen_address = "127.0.0.1";
    opts->rpc_timeout = 10;
    if (configure) configure(rank, *opts);
    BackendInitArgs a;
    a.store = std::move(store);
    a.name = worker_name(rank);
    a.rank = rank;
    a.world_size = world;
    a.options = std::move(opts);
    return a;
}

/// Starts `n` agents on the awaiting coroutine's executor; fails the test if one does not start.
inline Task<AgentGroup> make_group(int n, Configure configure = {}, detail::NativeAgentTuning tuning = {}) {
    auto ex = co_await asio::this_coro::executor;
    AgentGroup g;
    g.store = std::make_shared<HashStore>(std::chrono::seconds(5));
    g.agents.resize(n);
    std::vector<std::optional<Error>> errors(n);
    detail::Channel<void(std::error_code, int)> done(ex, n);
    for (int r = 0; r < n; ++r) {
        asio::co_spawn(ex, detail::NativeAgent::create(init_args(g.store, r, n, configure), tuning),
                       [&g, &errors, &done, r](std::exception_ptr e, Result<AgentPtr> a) {
                           if (e) errors[r] = Error(Errc::internal, "exception while starting");
                           else if (a) g.agents[r] = *a;
                           else errors[r] = a.error();
                           done.try_send(std::error_code{}, r);
                       });
    }
    for (int i = 0; i < n; ++i) co_await done.async_receive(asio::use_awaitable);
    for (int r = 0; r < n; ++r) {
        if (errors[r]) FAIL("worker" << r << " did not start: " << errors[r]->to_string());
    }
    co_return g;
}

/// Shuts every agent down at once (graceful shutdowns need each other); returns the results.
inline Task<std::vector<Result<void>>> shutdown_all(AgentGroup& g, bool graceful = true, double timeout = 5) {
    auto ex = co_await asio::this_coro::executor;
    std::vector<Result<void>> results(g.agents.size());
    detail::Channel<void(std::error_code, int)> done(ex, g.agents.size());
    for (std::size_t r = 0; r < g.agents.size(); ++r) {
        asio::co_spawn(ex, g.agents[r]->shutdown(graceful, timeout),
                       [&results, &done, r](std::exception_ptr, Result<void> res) {
                           results[r] = std::move(res);
                           done.try_send(std::error_code{}, static_cast<int>(r));
                       });
    }
    for (std::size_t i = 0; i < g.agents.size(); ++i) co_await done.async_receive(asio::use_awaitable);
    co_return results;
}

inline Message text_message(std::string_view s) {
    Message m;
    m.payload = bytes(s);
    return m;
}

/// Registers "echo" (returns the request) on every agent.
inline void register_echo(AgentGroup& g) {
    for (auto& a : g.agents) {
        auto r = a->register_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; });
        REQUIRE(r);
    }
}

/// The names of the workers `a` lists now, sorted.
inline std::vector<std::string> member_names(const RpcAgent& a) {
    std::vector<std::string> n;
    for (const auto& w : a.get_worker_infos()) n.push_back(w.name);
    std::sort(n.begin(), n.end());
    return n;
}

/// A call of "echo" from `from` to `to`: its result, checked to echo the request.
inline Task<Result<Message>> call_echo(RpcAgent& from, std::string to, double timeout = 5) {
    const std::string handler = "echo";
    const Bytes body = bytes("ping " + to);
    Message m{body, {}};
    auto r = co_await from.rpc_async(std::move(to), handler, std::move(m), timeout);
    if (r && r->payload != body) co_return fail(Errc::internal, "echo answered with other bytes");
    co_return r;
}

/// An event for tests: try_send(std::error_code{}, n) signals, async_receive awaits.
using Signal = detail::Channel<void(std::error_code, int)>;

/// A handler that signals `entered`, then holds the call until `release` is signalled.
inline RpcHandler held_handler(Signal& entered, Signal& release) {
    return [&entered, &release](WorkerInfo, Message m) -> Task<Result<Message>> {
        entered.try_send(std::error_code{}, 0);
        auto [ec, unused] = co_await release.async_receive(detail::use_nothrow);
        (void)ec;
        (void)unused;
        co_return m;
    };
}

}  // namespace tensorplay::test
