// Dynamic groups under churn (issue 19): a member joins while 1,000 calls are in flight, two
// joins at the same moment serialise, a graceful leaver's calls in flight still get their replies,
// a member that dies without leaving is removed, and after every change each member's device
// list and maps are what the static exchange computes over the current members (sim devices),
// with tensors still routed through the maps.
#include "agent_test_util.hpp"

#include <tensorplay/device/backend.hpp>
#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/rpc/device_map_exchange.hpp>

#include "core/flag.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_dynamic_churn_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using test::AgentPtr;

namespace {

Task<Result<Message>> echo(WorkerInfo, Message m) { co_return m; }

Task<Result<AgentPtr>> try_join(std::shared_ptr<Store> store, int rank, test::Configure configure = {}) {
    auto args = test::init_args(std::move(store), rank, DYNAMIC_WORLD_SIZE, configure);
    auto a = co_await detail::NativeAgent::create(std::move(args));
    if (!a) co_return fail(std::move(a).error());
    if (auto r = (*a)->register_handler("echo", echo); !r) co_return fail(std::move(r).error());
    co_return *a;
}

Task<AgentPtr> join(std::shared_ptr<Store> store, int rank, test::Configure configure = {}) {
    auto a = co_await try_join(std::move(store), rank, std::move(configure));
    if (!a) FAIL("worker" << rank << " did not join: " << a.error().to_string());
    co_return *a;
}

/// Waits until every agent of `group` lists exactly `expect`; false at `limit`.
Task<bool> until_members(const std::vector<AgentPtr>& group, std::vector<std::string> expect, std::chrono::milliseconds limit) {
    for (const auto& a : group)
        if (!co_await a->until_members(expect, limit)) co_return false;
    co_return true;
}

/// Calls started in the background; counts their outcomes.
struct InFlight {
    explicit InFlight(Executor ex, std::size_t n) : done(ex, n) {}
    test::Signal done;
    std::size_t started = 0, ok = 0;
    std::vector<Error> errors;

    void start(Executor ex, AgentPtr from, std::string to, std::string handler) {
        ++started;
        asio::co_spawn(ex, from->rpc_async(std::move(to), std::move(handler), test::text_message("load"), 30),
                       [this](std::exception_ptr, Result<Message> r) {
                           if (r) ++ok;
                           else errors.push_back(r.error());
                           done.try_send(std::error_code{}, 0);
                       });
    }
    Task<void> all_ended() {
        for (std::size_t i = 0; i < started; ++i) co_await done.async_receive(asio::use_awaitable);
    }
};

/// Calls held in a handler: `all_in` is set once `expect` of them have entered, and `open`
/// releases them all.
struct Gate {
    explicit Gate(std::size_t n) : expect(n) {}
    detail::Flag open, all_in;
    std::size_t expect, entered = 0;
};

RpcHandler gated(Gate& g) {
    return [&g](WorkerInfo, Message m) -> Task<Result<Message>> {
        if (++g.entered == g.expect) g.all_in.set();
        (void)co_await g.open.wait();
        co_return m;
    };
}

Task<void> shutdown_all(std::vector<AgentPtr>& group) {
    for (auto it = group.rbegin(); it != group.rend(); ++it) {
        auto s = co_await (*it)->shutdown(true, 10);
        CHECK(s);
    }
}

}  // namespace

TEST_CASE("a member joins while 1,000 calls are in flight; none is lost and everyone calls it", "[rpc][dynamic]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 3; ++r) group.push_back(co_await join(store, r));
        Gate gate(1000);
        for (auto& a : group) REQUIRE(a->register_handler("held", gated(gate)));
        InFlight load(ex, 1000);
        for (int i = 0; i < 1000; ++i) {
            const int from = i % 3, to = (i + 1 + i / 3 % 2) % 3;
            load.start(ex, group[from], test::worker_name(to), "held");
        }
        (void)co_await gate.all_in.wait();
        group.push_back(co_await join(store, 3));  // every member serves the join beside the held calls
        gate.open.set();
        co_await load.all_ended();
        CHECK(load.ok == 1000);
        for (const auto& e : load.errors) FAIL_CHECK(e.to_string());
        const std::vector<std::string> all{"worker0", "worker1", "worker2", "worker3"};
        for (const auto& a : group) CHECK(test::member_names(*a) == all);
        const std::string newcomer = "worker3";
        for (const auto& a : group) {
            auto r = co_await test::call_echo(*a, newcomer);
            INFO(a->get_worker_info().name);
            CHECK(r);
        }
        co_await shutdown_all(group);
    });
}

TEST_CASE("two members that join at the same moment are serialised by the group token", "[rpc][dynamic]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        group.push_back(co_await join(store, 0));
        std::vector<std::optional<Result<AgentPtr>>> joined(2);
        test::Signal done(ex, 2);
        for (int i = 0; i < 2; ++i)
            asio::co_spawn(ex, try_join(store, i + 1), [&joined, &done, i](std::exception_ptr, Result<AgentPtr> a) {
                joined[i] = std::move(a);
                done.try_send(std::error_code{}, i);
            });
        for (int i = 0; i < 2; ++i) co_await done.async_receive(asio::use_awaitable);
        for (auto& j : joined) {
            REQUIRE(*j);
            group.push_back(**j);
        }
        for (const auto& a : group) CHECK(test::member_names(*a) == std::vector<std::string>{"worker0", "worker1", "worker2"});
        for (const auto& a : group)
            for (int to = 0; to < 3; ++to) {
                const std::string name = test::worker_name(to);
                auto r = co_await test::call_echo(*a, name);
                CHECK(r);
            }
        co_await shutdown_all(group);
    });
}

TEST_CASE("a member leaves gracefully while the others' calls to it are in flight: every call gets its reply", "[rpc][dynamic]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 3; ++r) group.push_back(co_await join(store, r));
        Gate gate(100);
        REQUIRE(group[1]->register_handler("held", gated(gate)));
        InFlight load(ex, 100);
        for (int i = 0; i < 100; ++i) load.start(ex, group[i % 2 == 0 ? 0 : 2], "worker1", "held");
        (void)co_await gate.all_in.wait();
        std::optional<Result<void>> left;
        test::Signal leave_done(ex, 1);
        asio::co_spawn(ex, group[1]->shutdown(true, 20), [&](std::exception_ptr, Result<void> r) {
            left = std::move(r);
            leave_done.try_send(std::error_code{}, 0);
        });
        // The others take the update (worker1 is gone from their lists) while their calls still wait.
        std::vector<AgentPtr> survivors{group[0], group[2]};
        const std::vector<std::string> expect{"worker0", "worker2"};
        const bool updated = co_await until_members(survivors, expect, 10s);
        CHECK(updated);
        CHECK(load.ok == 0);
        gate.open.set();
        co_await load.all_ended();
        co_await leave_done.async_receive(asio::use_awaitable);
        CHECK(load.ok == 100);
        for (const auto& e : load.errors) FAIL_CHECK(e.to_string());
        REQUIRE(left);
        CHECK(*left);
        const std::string departed = "worker1";
        for (const auto& a : survivors) {
            auto r = co_await test::call_echo(*a, departed);
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::invalid_argument);
            CHECK(r.error().message().find("worker1") != std::string::npos);
        }
        co_await shutdown_all(survivors);
    });
}

TEST_CASE("a member that stops without leaving is removed by the others, and its name may join again", "[rpc][dynamic]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 3; ++r) group.push_back(co_await join(store, r));
        // worker1 closes everything without telling anyone (as a crash would, minus the process).
        (void)co_await group[1]->shutdown(false);
        std::vector<AgentPtr> survivors{group[0], group[2]};
        const std::vector<std::string> two{"worker0", "worker2"}, three{"worker0", "worker1", "worker2"};
        const bool removed = co_await until_members(survivors, two, 20s);
        REQUIRE(removed);
        const std::string dead = "worker1";
        for (const auto& a : survivors) {
            auto r = co_await test::call_echo(*a, dead);
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::invalid_argument);
        }
        survivors.insert(survivors.begin() + 1, co_await join(store, 1));
        const bool back = co_await until_members(survivors, three, 5s);
        CHECK(back);
        for (const auto& a : survivors) {
            auto r = co_await test::call_echo(*a, dead);
            CHECK(r);
        }
        co_await shutdown_all(survivors);
    });
}

namespace {

/// Each worker's options in the device-map test: worker0 maps cuda:0 to worker1's cuda:1, worker1
/// maps cuda:1 to worker0's cuda:0, worker2 maps cuda:0 to worker0's cuda:1 and cuda:1 to
/// worker1's cuda:1.
void sim_maps(int rank, TensorPipeRpcBackendOptions& o) {
    auto map = [&o](const char* to, Device from, Device at) {
        DeviceMap m;
        m[from] = at;
        REQUIRE(o.set_device_map(to, m));
    };
    if (rank == 0) map("worker1", Device::cuda(0), Device::cuda(1));
    if (rank == 1) map("worker0", Device::cuda(1), Device::cuda(0));
    if (rank == 2) {
        map("worker0", Device::cuda(0), Device::cuda(1));
        map("worker1", Device::cuda(1), Device::cuda(1));
    }
}

/// The static exchange over the current members (ranks renumbered in rank order), each map
/// target outside the group dropped (a static group refuses those): what each member's device
/// list and reverse maps must be. `full`: also compare device lists (only meaningful when no map
/// of a member targets a worker outside the group, as a static group's cannot).
Task<void> check_against_static(const std::vector<AgentPtr>& group, int device_count) {
    auto ex = co_await asio::this_coro::executor;
    auto store = std::make_shared<HashStore>(5s);
    const int n = static_cast<int>(group.size());
    std::vector<std::string> names;
    for (const auto& a : group) names.push_back(a->get_worker_info().name);
    std::vector<std::optional<Result<DeviceMapExchangeResult>>> expect(group.size());
    bool full = true;
    test::Signal done(ex, group.size());
    for (int i = 0; i < n; ++i) {
        const auto& opts = static_cast<const TensorPipeRpcBackendOptions&>(group[i]->get_backend_options());
        DeviceMaps maps;
        for (const auto& [to, m] : opts.device_maps) {
            if (std::find(names.begin(), names.end(), to) != names.end()) maps[to] = m;
            else full = false;
        }
        asio::co_spawn(ex, exchange_and_check_all_device_maps(*store, names[i], i, n, device_count, maps, opts.devices),
                       [&expect, &done, i](std::exception_ptr, Result<DeviceMapExchangeResult> r) {
                           expect[i] = std::move(r);
                           done.try_send(std::error_code{}, i);
                       });
    }
    for (int i = 0; i < n; ++i) co_await done.async_receive(asio::use_awaitable);
    for (int i = 0; i < n; ++i) {
        INFO("member " << names[i] << " of " << n);
        REQUIRE(*expect[i]);
        auto d = co_await group[i]->get_debug_info();
        REQUIRE(d);
        if (full) CHECK(d->devices == (*expect[i])->devices);
        for (const auto& p : d->peers) {
            INFO("its peer " << p.worker);
            const auto& rev = (*expect[i])->reverse_device_maps;
            const auto it = rev.find(p.worker);
            CHECK(p.reverse_device_map == (it != rev.end() ? it->second : DeviceMap{}));
        }
    }
}

/// worker2 sends a cuda:0 tensor to worker0: it lands on cuda:1 there, and comes back on cuda:0.
Task<void> routes(AgentPtr from, const char* to, Device sent, Device lands) {
    auto t = empty(sent, DType::uint8, std::vector<std::int64_t>(1, 64));
    REQUIRE(t);
    for (int i = 0; i < 64; ++i) t->data()[i] = static_cast<std::uint8_t>(i * 3);
    Message m;
    m.tensors.push_back(*t);
    const std::string name = to;
    auto r = co_await from->rpc_async(name, "where", std::move(m), 5);
    INFO(from->get_worker_info().name << " -> " << to);
    REQUIRE(r);
    REQUIRE(r->tensors.size() == 2);
    CHECK(r->tensors[0].device() == sent);        // the reply's tensor, back through the reverse map
    CHECK(r->tensors[0].data()[63] == 63 * 3);
    CHECK(to_string(r->payload) == lands.str());  // where it landed
}

Task<Result<Message>> where(WorkerInfo, Message m) {
    Message out{bytes(m.tensors.at(0).device().str()), {}};
    out.tensors.push_back(m.tensors[0]);
    out.tensors.push_back(Tensor::cpu(DType::uint8, std::vector<std::int64_t>(1, 1)));
    co_return out;
}

}  // namespace

TEST_CASE("after every join, leave and removal each member's devices and reverse maps are the static exchange's, and tensors still route",
          "[rpc][dynamic][device]") {
    install_sim_backend(2);
    test::run_with_deadline(90s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(10s);
        std::vector<AgentPtr> group;
        auto add = [&](int rank) -> Task<void> {
            auto a = co_await join(store, rank, sim_maps);
            REQUIRE(a->register_handler("where", where));
            group.push_back(a);
            std::sort(group.begin(), group.end(), [](const AgentPtr& x, const AgentPtr& y) {
                return x->get_worker_info().id < y->get_worker_info().id;
            });
        };
        for (int r = 0; r < 3; ++r) {
            co_await add(r);
            co_await check_against_static(group, 2);
        }
        co_await routes(group[2], "worker0", Device::cuda(0), Device::cuda(1));
        co_await routes(group[0], "worker1", Device::cuda(0), Device::cuda(1));
        // worker1 leaves: the survivors keep their maps and reverse maps (torch's leave path would
        // send them empty ones).
        auto left = co_await group[1]->shutdown(true, 10);
        CHECK(left);
        group.erase(group.begin() + 1);
        co_await check_against_static(group, 2);
        co_await routes(group[1], "worker0", Device::cuda(0), Device::cuda(1));
        co_await add(1);
        co_await check_against_static(group, 2);
        co_await routes(group[2], "worker1", Device::cuda(1), Device::cuda(1));
        // worker2 stops without leaving, and is removed.
        (void)co_await group[2]->shutdown(false);
        group.pop_back();
        const std::vector<std::string> pair{"worker0", "worker1"};
        const bool removed = co_await until_members(group, pair, 20s);
        REQUIRE(removed);
        co_await check_against_static(group, 2);
        co_await routes(group[0], "worker1", Device::cuda(0), Device::cuda(1));
        co_await routes(group[1], "worker0", Device::cuda(1), Device::cuda(0));
        co_await shutdown_all(group);
    });
    uninstall_sim_backend();
}

}  // namespace tp_dynamic_churn_test
