// Tests of the backend registry: built-in TENSORPIPE, register/lookup/duplicate/unknown, concurrent
// registration, and init handlers as coroutines (a timer, a failure, an exception, no agent).
#include <tensorplay/rpc/backend_registry.hpp>

#include "rpc/test_agent.hpp"
#include "support/deadline.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <sstream>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_backend_registry_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

Result<std::shared_ptr<RpcBackendOptions>> plain_options(double timeout, std::string init_method, const BackendKwargs&) {
    return std::make_shared<RpcBackendOptions>(timeout, std::move(init_method));
}

Task<Result<std::shared_ptr<RpcAgent>>> never_called(BackendInitArgs) {
    co_return fail(Errc::internal, "this init handler must not run");
}

// Waits on a timer before making the agent, as a real backend waits on the network.
Task<Result<std::shared_ptr<RpcAgent>>> timer_init(BackendInitArgs args) {
    asio::steady_timer timer(co_await asio::this_coro::executor, 20ms);
    co_await timer.async_wait(asio::use_awaitable);
    co_return std::make_shared<test::TestAgent>(args.name, args.rank, args.options);
}

Task<Result<std::shared_ptr<RpcAgent>>> failing_init(BackendInitArgs args) {
    asio::steady_timer timer(co_await asio::this_coro::executor, 1ms);
    co_await timer.async_wait(asio::use_awaitable);
    co_return fail(Errc::device_error, "no device for " + args.name);
}

Task<Result<std::shared_ptr<RpcAgent>>> throwing_init(BackendInitArgs) {
    asio::steady_timer timer(co_await asio::this_coro::executor, 1ms);
    co_await timer.async_wait(asio::use_awaitable);
    throw std::runtime_error("init exploded");
}

Task<Result<std::shared_ptr<RpcAgent>>> null_init(BackendInitArgs) { co_return std::shared_ptr<RpcAgent>(); }

// Registers `name` unless an earlier test case in this process already did.
BackendType ensure(const std::string& name, InitBackendHandler init) {
    if (auto existing = backend_type(name)) return *existing;
    auto r = register_backend(name, plain_options, std::move(init));
    REQUIRE(r);
    return *r;
}

}  // namespace

TEST_CASE("TENSORPIPE is registered built in and prints as BackendType.TENSORPIPE", "[rpc][registry]") {
    CHECK(backend_registered("TENSORPIPE"));
    const BackendType tp = BackendType::tensorpipe();
    CHECK(tp.name() == "TENSORPIPE");
    CHECK(tp.str() == "BackendType.TENSORPIPE");
    std::ostringstream os;
    os << tp;
    CHECK(os.str() == "BackendType.TENSORPIPE");
    auto looked_up = backend_type("TENSORPIPE");
    REQUIRE(looked_up);
    CHECK(*looked_up == tp);
    auto all = registered_backends();
    CHECK(std::find(all.begin(), all.end(), tp) != all.end());
    auto value = backend_value(tp);
    REQUIRE(value);
    CHECK(value->construct_rpc_backend_options_handler);
    CHECK(value->init_backend_handler);
}

TEST_CASE("a registered backend can be looked up; a second registration is already_registered", "[rpc][registry]") {
    CHECK_FALSE(backend_registered("REG_LOOKUP"));
    auto r = register_backend("REG_LOOKUP", plain_options, never_called);
    REQUIRE(r);
    CHECK(r->name() == "REG_LOOKUP");
    CHECK(r->str() == "BackendType.REG_LOOKUP");
    CHECK(backend_registered("REG_LOOKUP"));
    CHECK(backend_type("REG_LOOKUP").value() == *r);
    CHECK_FALSE(backend_registered("reg_lookup"));  // names are case-sensitive, as enum members

    auto again = register_backend("REG_LOOKUP", plain_options, never_called);
    REQUIRE_FALSE(again);
    CHECK(again.error().code() == Errc::already_registered);
    CHECK(again.error().message() == "RPC backend REG_LOOKUP is already registered");

    auto tp = register_backend("TENSORPIPE", plain_options, never_called);
    REQUIRE_FALSE(tp);
    CHECK(tp.error().code() == Errc::already_registered);
    CHECK(tp.error().message() == "RPC backend TENSORPIPE is already registered");
}

TEST_CASE("registering needs a name and both handlers", "[rpc][registry]") {
    auto no_name = register_backend("", plain_options, never_called);
    REQUIRE_FALSE(no_name);
    CHECK(no_name.error().code() == Errc::invalid_argument);
    auto no_construct = register_backend("REG_EMPTY", {}, never_called);
    REQUIRE_FALSE(no_construct);
    CHECK(no_construct.error().code() == Errc::type_error);
    CHECK(no_construct.error().message() ==
          "construct_rpc_backend_options_handler of RPC backend REG_EMPTY is empty");
    auto no_init = register_backend("REG_EMPTY", plain_options, {});
    REQUIRE_FALSE(no_init);
    CHECK(no_init.error().code() == Errc::type_error);
    CHECK(no_init.error().message() == "init_backend_handler of RPC backend REG_EMPTY is empty");
    CHECK_FALSE(backend_registered("REG_EMPTY"));
}

TEST_CASE("an unknown backend name is unknown_backend, quoted as Python's repr", "[rpc][registry]") {
    auto [name, quoted] = GENERATE(table<const char*, const char*>({
        {"NOPE", "'NOPE'"},
        {"tensorpipe", "'tensorpipe'"},
        {"it's", "\"it's\""},
        {"say \"hi\"", "'say \"hi\"'"},
        {"both ' and \"", "'both \\' and \"'"},
        {"back\\slash", "'back\\\\slash'"},
        {"new\nline\t", "'new\\nline\\t'"},
        {"", "''"},
    }));
    const std::string expected = std::string("unknown RPC backend ") + quoted;
    auto options = construct_rpc_backend_options(std::string(name));
    REQUIRE_FALSE(options);
    CHECK(options.error().code() == Errc::unknown_backend);
    CHECK(options.error().message() == expected);
    auto type = backend_type(name);
    REQUIRE_FALSE(type);
    CHECK(type.error().message() == expected);
    CHECK_FALSE(backend_value(name));

    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto agent = co_await init_backend(std::string(name), BackendInitArgs{});
        REQUIRE_FALSE(agent);
        CHECK(agent.error().code() == Errc::unknown_backend);
        CHECK(agent.error().message() == expected);
    });
}

TEST_CASE("many threads registering different names at once all succeed", "[rpc][registry]") {
    constexpr int kThreads = 16;
    constexpr int kPerThread = 40;
    std::atomic<int> failures{0};
    std::atomic<int> shared_wins{0};
    std::atomic<int> shared_duplicates{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            while (!go.load()) std::this_thread::yield();
            for (int i = 0; i < kPerThread; ++i) {
                auto name = "CONCURRENT_" + std::to_string(t) + "_" + std::to_string(i);
                auto r = register_backend(name, plain_options, never_called);
                if (!r || r->name() != name || !backend_registered(name)) ++failures;
            }
            // Every thread also races for one shared name: exactly one wins.
            auto r = register_backend("CONCURRENT_SHARED", plain_options, never_called);
            if (r) ++shared_wins;
            else if (r.error().code() == Errc::already_registered) ++shared_duplicates;
        });
    }
    go = true;
    for (auto& th : threads) th.join();
    CHECK(failures == 0);
    CHECK(shared_wins == 1);
    CHECK(shared_duplicates == kThreads - 1);
    auto all = registered_backends();
    int concurrent = 0;
    for (const auto& b : all) concurrent += b.name().rfind("CONCURRENT_", 0) == 0 ? 1 : 0;
    CHECK(concurrent == kThreads * kPerThread + 1);
}

TEST_CASE("construct_rpc_backend_options passes timeout, init method and every kwarg to a custom handler",
          "[rpc][registry]") {
    BackendKwargs seen;
    double seen_timeout = 0;
    std::string seen_method;
    auto handler = [&](double timeout, std::string method, const BackendKwargs& kwargs)
        -> Result<std::shared_ptr<RpcBackendOptions>> {
        seen_timeout = timeout;
        seen_method = method;
        seen = kwargs;
        return std::make_shared<RpcBackendOptions>(timeout, method);
    };
    auto type = register_backend("REG_KWARGS_" + std::to_string(reinterpret_cast<std::uintptr_t>(&seen)), handler,
                                 never_called);
    REQUIRE(type);
    BackendKwargs kwargs{{"anything", std::int64_t{3}}, {"flag", true}};
    auto options = construct_rpc_backend_options(*type, 12.5, "tcp://h:1", kwargs);
    REQUIRE(options);
    CHECK((*options)->rpc_timeout == 12.5);
    CHECK((*options)->init_method == "tcp://h:1");
    CHECK(seen_timeout == 12.5);
    CHECK(seen_method == "tcp://h:1");
    CHECK(seen == kwargs);  // custom backends get every key; only TENSORPIPE filters

    // Defaults are the seed's.
    auto defaults = construct_rpc_backend_options(type->name());
    REQUIRE(defaults);
    CHECK(seen_timeout == DEFAULT_RPC_TIMEOUT_SEC);
    CHECK(seen_method == "env://");
}

TEST_CASE("construct_rpc_backend_options turns a handler's exception or null result into an error", "[rpc][registry]") {
    auto thrower = [](double, std::string, const BackendKwargs&) -> Result<std::shared_ptr<RpcBackendOptions>> {
        throw std::runtime_error("options exploded");
    };
    auto nuller = [](double, std::string, const BackendKwargs&) -> Result<std::shared_ptr<RpcBackendOptions>> {
        return std::shared_ptr<RpcBackendOptions>();
    };
    if (!backend_registered("REG_THROW_OPTIONS")) REQUIRE(register_backend("REG_THROW_OPTIONS", thrower, never_called));
    if (!backend_registered("REG_NULL_OPTIONS")) REQUIRE(register_backend("REG_NULL_OPTIONS", nuller, never_called));
    auto thrown = construct_rpc_backend_options("REG_THROW_OPTIONS");
    REQUIRE_FALSE(thrown);
    CHECK(thrown.error().code() == Errc::internal);
    CHECK_THAT(thrown.error().message(), Catch::Contains("options exploded"));
    auto null = construct_rpc_backend_options("REG_NULL_OPTIONS");
    REQUIRE_FALSE(null);
    CHECK(null.error().code() == Errc::internal);
    CHECK(null.error().message() == "construct_rpc_backend_options handler of RPC backend REG_NULL_OPTIONS returned no options");
}

TEST_CASE("a custom backend's init handler awaits a timer and returns its agent", "[rpc][registry]") {
    const BackendType type = ensure("REG_TIMER", timer_init);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto options = construct_rpc_backend_options(type, 5.0, "env://");
        REQUIRE(options);
        const auto start = Clock::now();
        auto agent = co_await init_backend(type, BackendInitArgs{nullptr, "trainer3", 3, 4, *options});
        REQUIRE(agent);
        CHECK(Clock::now() - start >= 20ms);
        CHECK((*agent)->get_worker_info() == WorkerInfo{"trainer3", 3});
        CHECK((*agent)->get_backend_options().rpc_timeout == 5.0);
        // By name too.
        auto by_name = co_await init_backend("REG_TIMER", BackendInitArgs{nullptr, "w0", 0, 1, *options});
        REQUIRE(by_name);
        CHECK((*by_name)->get_worker_info().name == "w0");
    });
}

TEST_CASE("many init_backend calls run concurrently on one executor", "[rpc][registry]") {
    const BackendType type = ensure("REG_TIMER", timer_init);
    asio::io_context ctx;
    int done = 0;
    for (int i = 0; i < 8; ++i) {
        asio::co_spawn(ctx, init_backend(type, BackendInitArgs{nullptr, "w" + std::to_string(i), i, 8, nullptr}),
                       [&, i](std::exception_ptr e, Result<std::shared_ptr<RpcAgent>> r) {
                           REQUIRE_FALSE(e);
                           REQUIRE(r);
                           CHECK((*r)->get_worker_info().id == i);
                           ++done;
                       });
    }
    const auto start = Clock::now();
    ctx.run_for(5s);
    CHECK(done == 8);
    CHECK(Clock::now() - start < 150ms);  // eight 20 ms timers overlap
}

TEST_CASE("an init handler's failure comes back through co_await init_backend", "[rpc][registry]") {
    const BackendType failing = ensure("REG_FAILING", failing_init);
    const BackendType throwing = ensure("REG_THROWING", throwing_init);
    const BackendType null = ensure("REG_NULL_AGENT", null_init);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto r = co_await init_backend(failing, BackendInitArgs{nullptr, "w7", 7, 8, nullptr});
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::device_error);
        CHECK(r.error().message() == "no device for w7");

        auto t = co_await init_backend(throwing, BackendInitArgs{});
        REQUIRE_FALSE(t);
        CHECK(t.error().code() == Errc::internal);
        CHECK_THAT(t.error().message(), Catch::Contains("init exploded"));

        auto n = co_await init_backend(null, BackendInitArgs{});
        REQUIRE_FALSE(n);
        CHECK(n.error().code() == Errc::internal);
        CHECK(n.error().message() == "init_backend handler of RPC backend REG_NULL_AGENT returned no agent");
    });
}

}  // namespace tp_backend_registry_test
