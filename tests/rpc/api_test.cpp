// Tests of the top-level API: init_rpc, the process default agent, rpc_async/rpc_sync, shutdown.
#include <tensorplay/rpc/api.hpp>

#include <tensorplay/rpc/typed.hpp>

#include "rpc/fake_agent.hpp"
#include "support/deadline.hpp"
#include "support/processes.hpp"

#include <tensorplay/core/runtime.hpp>
#include <tensorplay/store/hash_store.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>

#include <catch2/catch.hpp>

#include <future>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_api_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

// A backend whose agents are in-memory fakes with an "echo" handler; registered once.
std::string fake_backend() {
    static const bool registered = [] {
        auto r = register_backend(
            "API_TEST_FAKE",
            [](double timeout, std::string init_method, const BackendKwargs&) -> Result<std::shared_ptr<RpcBackendOptions>> {
                return std::make_shared<RpcBackendOptions>(timeout, std::move(init_method));
            },
            [](BackendInitArgs args) -> Task<Result<std::shared_ptr<RpcAgent>>> {
                if (args.name == "refused") co_return fail(Errc::invalid_argument, "refused by the fake backend");
                auto agent = std::make_shared<test::FakeAgent>(args.name, std::vector<std::string>{"peer"});
                auto echo = agent->register_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> {
                    co_return m;
                });
                if (!echo) co_return fail(echo.error());
                co_return std::shared_ptr<RpcAgent>(agent);
            });
        return r.has_value();
    }();
    REQUIRE(registered);
    return "API_TEST_FAKE";
}

struct ClearDefault {
    ~ClearDefault() { set_default_agent(nullptr, {}); }
};

}  // namespace

TEST_CASE("the first agent started becomes the default one that the free functions use", "[rpc][api]") {
    ClearDefault clear;
    Runtime rt;
    auto store = std::make_shared<HashStore>();
    test::run_with_deadline_on(rt.get_executor(), 5s, [&]() -> Task<void> {
        auto a = co_await init_rpc_with_store(store, "first", fake_backend(), 0, 1);
        REQUIRE(a);
        auto b = co_await init_rpc_with_store(store, "second", fake_backend(), 0, 1);
        REQUIRE(b);
        CHECK(default_agent() == *a);
        auto me = get_worker_info();
        REQUIRE(me);
        CHECK(me->name == "first");
        auto peer = get_worker_info("peer");
        REQUIRE(peer);
        CHECK(peer->id == 1);
        auto all = get_worker_infos();
        REQUIRE(all);
        CHECK(all->size() == 2);
        // (the Message is built first: GCC 12 destroys a braced aggregate temporary twice inside co_await)
        Message hi{bytes("hi"), {}};
        auto reply = co_await rpc_async("peer", "echo", std::move(hi));
        REQUIRE(reply);
        CHECK(to_string(reply->payload) == "hi");
    });
}

TEST_CASE("rpc_sync works from another thread and is refused on the agent's own thread", "[rpc][api]") {
    ClearDefault clear;
    Runtime rt;
    auto store = std::make_shared<HashStore>();
    test::run_with_deadline_on(rt.get_executor(), 5s, [&]() -> Task<void> {
        auto a = co_await init_rpc_with_store(store, "sync", fake_backend(), 0, 1);
        REQUIRE(a);
        auto refused = rpc_sync("peer", "echo", Message{bytes("x"), {}});
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code() == Errc::invalid_argument);
        CHECK_THAT(refused.error().message(), Catch::Contains("deadlock"));
    });
    auto reply = rpc_sync("peer", "echo", Message{bytes("from main"), {}});
    REQUIRE(reply);
    CHECK(to_string(reply->payload) == "from main");
    Result<Message> from_thread = fail(Errc::internal, "not run");
    std::thread t([&] { from_thread = rpc_sync("peer", "echo", Message{bytes("t"), {}}); });
    t.join();
    REQUIRE(from_thread);
    CHECK(to_string(from_thread->payload) == "t");
}

TEST_CASE("after shutdown the free functions say that RPC is not initialized", "[rpc][api]") {
    ClearDefault clear;
    Runtime rt;
    auto store = std::make_shared<HashStore>();
    test::run_with_deadline_on(rt.get_executor(), 5s, [&]() -> Task<void> {
        auto a = co_await init_rpc_with_store(store, "down", fake_backend(), 0, 1);
        REQUIRE(a);
        auto s = co_await shutdown();
        REQUIRE(s);
        CHECK(default_agent() == nullptr);
        auto again = co_await shutdown();
        REQUIRE_FALSE(again);
        CHECK(again.error().code() == Errc::invalid_argument);
        Message empty_message;
        auto call = co_await rpc_async("peer", "echo", std::move(empty_message));
        REQUIRE_FALSE(call);
        CHECK_THAT(call.error().message(), Catch::Contains("init_rpc"));
    });
    CHECK_FALSE(get_worker_info());
    CHECK_FALSE(rpc_sync("peer", "echo", Message{}));
}

TEST_CASE("init_rpc reports unknown backends, a null store and the backend's own errors", "[rpc][api][fault]") {
    ClearDefault clear;
    Runtime rt;
    auto store = std::make_shared<HashStore>();
    test::run_with_deadline_on(rt.get_executor(), 5s, [&]() -> Task<void> {
        auto unknown = co_await init_rpc_with_store(store, "w", "NO_SUCH_BACKEND", 0, 1);
        REQUIRE_FALSE(unknown);
        CHECK(unknown.error().code() == Errc::unknown_backend);
        auto null_store = co_await init_rpc_with_store(nullptr, "w", fake_backend(), 0, 1);
        REQUIRE_FALSE(null_store);
        CHECK(null_store.error().code() == Errc::invalid_argument);
        auto refused = co_await init_rpc_with_store(store, "refused", fake_backend(), 0, 1);
        REQUIRE_FALSE(refused);
        CHECK_THAT(refused.error().message(), Catch::Contains("refused") && Catch::Contains("init_rpc"));
        CHECK(default_agent() == nullptr);
    });
}

TEST_CASE("running_in_executor tells the executor's threads from others", "[rpc][api]") {
    Runtime rt;
    CHECK_FALSE(running_in_executor(rt.get_executor()));
    test::run_with_deadline_on(rt.get_executor(), 5s, [&]() -> Task<void> {
        CHECK(running_in_executor(co_await asio::this_coro::executor));
        co_return;
    });
    // A strand over a thread pool: told by its own type, not taken for an io_context's executor
    // (Asio 1.22's any_executor::target<T>() does not check T).
    asio::thread_pool pool(1);
    const Executor strand = asio::make_strand(pool.get_executor());
    CHECK_FALSE(running_in_executor(strand));
    std::promise<bool> inside;
    asio::post(strand, [&] { inside.set_value(running_in_executor(strand)); });
    CHECK(inside.get_future().get());
    pool.join();
}

TEST_CASE("init_rpc rendezvouses over tcp:// and a real agent answers typed calls to itself", "[rpc][api]") {
    ClearDefault clear;
    Runtime rt;
    test::run_with_deadline_on(rt.get_executor(), 20s, [&]() -> Task<void> {
        auto options = std::make_shared<TensorPipeRpcBackendOptions>();
        options->init_method = "tcp://127.0.0.1:0";
        options->listen_address = "127.0.0.1";
        auto agent = co_await init_rpc("solo", BackendType::tensorpipe(), 0, 1, options);
        REQUIRE(agent);
        CHECK(default_agent() == *agent);
        auto me = get_worker_info();
        REQUIRE(me);
        CHECK(me->name == "solo");
        REQUIRE(define<std::vector<std::int64_t>(std::vector<std::int64_t>, std::int64_t)>(
            **agent, "scale", [](std::vector<std::int64_t> v, std::int64_t k) {
                for (auto& x : v) x *= k;
                return v;
            }));
        std::vector<std::int64_t> v{1, 2, 3};
        auto scaled = co_await call<std::vector<std::int64_t>>(**agent, "solo", "scale", v, std::int64_t{10});
        REQUIRE(scaled);
        std::vector<std::int64_t> expected{10, 20, 30};
        CHECK(*scaled == expected);
        auto t = Tensor::from_bytes(bytes("tensor through the agent"));
        REQUIRE(define<Tensor(Tensor)>(**agent, "same", [](Tensor x) { return x; }));
        auto back = co_await call<Tensor>(**agent, "solo", "same", t);
        REQUIRE(back);
        CHECK(to_string(back->bytes()) == std::string("tensor through the agent"));
        auto down = co_await shutdown();
        REQUIRE(down);
        CHECK(default_agent() == nullptr);
    });
}

TEST_CASE("init_rpc starts the store it hosts with the options' hosted_store limits", "[rpc][api]") {
    ClearDefault clear;
    Runtime rt;
    test::run_with_deadline_on(rt.get_executor(), 20s, [&]() -> Task<void> {
        const std::uint16_t port = test::free_port();
        auto options = std::make_shared<TensorPipeRpcBackendOptions>();
        options->init_method = "tcp://127.0.0.1:" + std::to_string(port);
        options->listen_address = "127.0.0.1";
        options->hosted_store.max_value_size = 1024;
        auto agent = co_await init_rpc("solo", BackendType::tensorpipe(), 0, 1, options);
        REQUIRE(agent);
        TcpStoreOptions o;
        o.host = "127.0.0.1";
        o.port = port;
        o.timeout = 5s;
        auto client = co_await TcpStore::connect(co_await asio::this_coro::executor, o);
        REQUIRE(client);
        const Bytes fits(1024, 2);
        auto small = co_await (*client)->set("fits", fits);
        CHECK(small);
        const Bytes over(1025, 2);
        (void)co_await (*client)->set("over", over);  // (SET has no reply: the server closes this connection)
        const std::vector<std::string> keys(1, "over");
        auto stored = co_await (*client)->check(keys);  // the connection is gone, or the key is not there
        CHECK_FALSE((stored && *stored));
        auto down = co_await shutdown();
        REQUIRE(down);
    });
}

TEST_CASE("init_rpc reports a malformed init method with its URL", "[rpc][api][fault]") {
    ClearDefault clear;
    Runtime rt;
    test::run_with_deadline_on(rt.get_executor(), 10s, [&]() -> Task<void> {
        auto options = std::make_shared<TensorPipeRpcBackendOptions>();
        options->init_method = "bogus://nowhere";
        auto agent = co_await init_rpc("w", BackendType::tensorpipe(), 0, 1, options);
        REQUIRE_FALSE(agent);
        CHECK(agent.error().code() == Errc::invalid_argument);
        CHECK_THAT(agent.error().message(), Catch::Contains("init_rpc"));
    });
}

}  // namespace tp_api_test
