// Native agent, in process: echo, many calls out of order, self calls, handler kinds, errors, timeouts, shutdown.
#include "rpc/agent_test_util.hpp"

#include <tensorplay/rpc/api.hpp>

#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/io_context.hpp>

#include <atomic>
#include <future>
#include <optional>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_agent_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

Tensor filled(std::size_t n, std::uint8_t seed) {
    Tensor t = Tensor::cpu(DType::uint8, std::vector<std::int64_t>(1, static_cast<std::int64_t>(n)));
    for (std::size_t i = 0; i < n; ++i) t.data()[i] = static_cast<std::uint8_t>(i * 13 + seed);
    return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::equal(a.bytes().begin(), a.bytes().end(), b.bytes().begin());
}

}  // namespace

TEST_CASE("an agent echoes a payload and tensors through another agent", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        CHECK(g[0]->get_worker_info().name == "worker0");
        REQUIRE(g[0]->get_worker_infos().size() == 2);
        CHECK(g[0]->get_worker_info("worker1")->id == 1);
        CHECK(g[0]->get_worker_info("nobody").error().code() == Errc::invalid_argument);

        Message m = test::text_message("hello over tcp");
        m.tensors.push_back(filled(1 << 20, 5));
        m.tensors.push_back(filled(3, 9));
        auto r = co_await g[0]->rpc_async("worker1", "echo", m);
        REQUIRE(r);
        CHECK(r->payload == bytes("hello over tcp"));
        REQUIRE(r->tensors.size() == 2);
        CHECK(same_bytes(r->tensors[0], m.tensors[0]));
        CHECK(same_bytes(r->tensors[1], m.tensors[1]));
        CHECK(r->tensors[0].data() != m.tensors[0].data());

        auto back = co_await g[1]->rpc_async("worker0", "echo", test::text_message("and back"));
        REQUIRE(back);
        CHECK(back->payload == bytes("and back"));
        auto results = co_await test::shutdown_all(g);
        for (auto& s : results) CHECK(s);
    });
}

TEST_CASE("a handler sees the caller's WorkerInfo", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(3);
        for (auto& a : g.agents)
            REQUIRE(a->register_handler("who", [](WorkerInfo caller, Message) -> Task<Result<Message>> {
                co_return test::text_message(caller.name + "/" + std::to_string(caller.id));
            }));
        auto r = co_await g[2]->rpc_async("worker0", "who", {});
        REQUIRE(r);
        CHECK(to_string(r->payload) == "worker2/2");
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("1000 calls outstanding at once all complete, out of order", "[rpc][agent]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        auto ex = co_await asio::this_coro::executor;
        constexpr int n = 1000;
        // Each call is held in its handler until all have arrived; they are then let go in a
        // scrambled order, so the replies come back out of order by construction.
        std::vector<std::unique_ptr<asio::steady_timer>> held(n);
        test::Signal arrived(ex, n);
        REQUIRE(g[1]->register_handler("held", [&held, &arrived, ex](WorkerInfo, Message m) -> Task<Result<Message>> {
            const int v = std::stoi(to_string(m.payload));
            held[v] = std::make_unique<asio::steady_timer>(ex, asio::steady_timer::time_point::max());
            arrived.try_send(std::error_code{}, v);
            co_await held[v]->async_wait(detail::use_nothrow);  // (cancel() lets it go)
            co_return m;
        }));
        std::vector<int> order;
        int failures = 0;
        test::Signal done(ex, n);
        for (int i = 0; i < n; ++i) {
            asio::co_spawn(ex, g[0]->rpc_async("worker1", "held", test::text_message(std::to_string(i))),
                           [&, i](std::exception_ptr, Result<Message> r) {
                               if (!r || to_string(r->payload) != std::to_string(i)) ++failures;
                               order.push_back(i);
                               done.try_send(std::error_code{}, i);
                           });
        }
        for (int i = 0; i < n; ++i) co_await arrived.async_receive(asio::use_awaitable);
        for (int k = 0; k < n; ++k) held[(k * 389 + 17) % n]->cancel();  // (389 is prime to 1000: each once)
        for (int i = 0; i < n; ++i) co_await done.async_receive(asio::use_awaitable);
        CHECK(failures == 0);
        CHECK(order.size() == std::size_t(n));
        CHECK_FALSE(std::is_sorted(order.begin(), order.end()));
        auto conn = g[0]->connection_to(1);
        REQUIRE(conn);
        // Calls queued together were gathered: far fewer writes than frames.
        CHECK(conn->stats().writes < conn->stats().frames_sent / 4);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("a call to oneself runs the handler without a socket", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        Message m = test::text_message("me");
        m.tensors.push_back(filled(10, 1));
        auto r = co_await g[0]->rpc_async("worker0", "echo", m);
        REQUIRE(r);
        CHECK(r->payload == bytes("me"));
        REQUIRE(r->tensors.size() == 1);
        auto missing = co_await g[0]->rpc_async("worker0", "missing", {});
        REQUIRE_FALSE(missing);
        CHECK(missing.error().code() == Errc::not_found);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("a blocking handler runs on the worker pool, not the I/O thread", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto ex = co_await asio::this_coro::executor;
        std::thread::id io_thread = std::this_thread::get_id();
        std::atomic<bool> on_pool{false};
        test::Signal entered(ex, 1), done(ex, 1);
        std::promise<void> release;
        auto released = release.get_future().share();
        REQUIRE(g[1]->register_blocking_handler("block", [&, released](const WorkerInfo&, Message m) -> Result<Message> {
            on_pool = std::this_thread::get_id() != io_thread;
            asio::post(ex, [&] { entered.try_send(std::error_code{}, 0); });
            released.wait_for(5s);  // blocks its thread until the test lets it go
            return m;
        }));
        std::optional<Result<Message>> blocked;
        asio::co_spawn(ex, g[0]->rpc_async("worker1", "block", test::text_message("b")),
                       [&](std::exception_ptr, Result<Message> r) {
                           blocked = std::move(r);
                           done.try_send(std::error_code{}, 0);
                       });
        co_await entered.async_receive(asio::use_awaitable);
        // The handler holds its thread; the I/O thread still serves other calls.
        auto meanwhile = co_await g[0]->rpc_async("worker1", "echo", test::text_message("meanwhile"));
        REQUIRE(meanwhile);
        CHECK(meanwhile->payload == bytes("meanwhile"));
        CHECK_FALSE(blocked);
        release.set_value();
        co_await done.async_receive(asio::use_awaitable);
        REQUIRE(blocked);
        REQUIRE(*blocked);
        CHECK((*blocked)->payload == bytes("b"));
        CHECK(on_pool);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("an unknown handler is not_found and names the handler", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        auto r = co_await g[0]->rpc_async("worker1", "no_such_handler", {});
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::not_found);
        CHECK(r.error().message().find("no_such_handler") != std::string::npos);
        CHECK(r.error().worker() == "worker1");
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("a handler that fails or throws gives remote_error with the worker and the message", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        REQUIRE(g[1]->register_handler("fails", [](WorkerInfo, Message) -> Task<Result<Message>> {
            co_return fail(Errc::invalid_argument, "the input was bad");
        }));
        REQUIRE(g[1]->register_handler("throws", [](WorkerInfo, Message) -> Task<Result<Message>> {
            throw std::runtime_error("boom in a coroutine");
            co_return Message{};
        }));
        REQUIRE(g[1]->register_blocking_handler("throws_blocking", [](const WorkerInfo&, Message) -> Result<Message> {
            throw std::runtime_error("boom on the pool");
        }));
        auto a = co_await g[0]->rpc_async("worker1", "fails", {});
        REQUIRE_FALSE(a);
        CHECK(a.error().code() == Errc::remote_error);
        CHECK(a.error().worker() == "worker1");
        CHECK(a.error().message().find("the input was bad") != std::string::npos);
        auto b = co_await g[0]->rpc_async("worker1", "throws", {});
        REQUIRE_FALSE(b);
        CHECK(b.error().code() == Errc::remote_error);
        CHECK(b.error().message().find("boom in a coroutine") != std::string::npos);
        auto c = co_await g[0]->rpc_async("worker1", "throws_blocking", {});
        REQUIRE_FALSE(c);
        CHECK(c.error().code() == Errc::remote_error);
        CHECK(c.error().message().find("boom on the pool") != std::string::npos);
        // The connection survived all of that.
        test::register_echo(g);
        {
            auto awaited = co_await g[0]->rpc_async("worker1", "echo", {});
            CHECK(awaited);
        }
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("an unknown worker is invalid_argument", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        auto r = co_await g[0]->rpc_async("worker9", "echo", {});
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::invalid_argument);
        CHECK(r.error().message().find("worker9") != std::string::npos);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("registering a handler name twice is already_registered", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto again = g[0]->register_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; });
        REQUIRE_FALSE(again);
        CHECK(again.error().code() == Errc::already_registered);
        auto before = co_await g[0]->rpc_async("worker1", "echo", test::text_message("first"));
        REQUIRE(before);  // (the callee now remembers this handler as the last one found)
        auto un = co_await g[1]->unregister_handler("echo");
        INFO((un ? std::string("ok") : un.error().to_string()));
        REQUIRE(un);
        auto gone = co_await g[0]->rpc_async("worker1", "echo", {});
        CHECK(gone.error().code() == Errc::not_found);
        {
            auto awaited = co_await g[1]->unregister_handler("echo");
            CHECK(awaited.error().code() == Errc::not_found);
        }
        // A new handler under the old name is the one that answers.
        REQUIRE(g[1]->register_handler("echo", [](WorkerInfo, Message) -> Task<Result<Message>> { co_return test::text_message("new"); }));
        auto renewed = co_await g[0]->rpc_async("worker1", "echo", test::text_message("first"));
        REQUIRE(renewed);
        CHECK(renewed->payload == bytes("new"));
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("startup handlers are installed in every new agent before it reports ready", "[rpc][agent]") {
    // Process-wide: the names are this test's own.
    auto reg = register_startup_handler("startup/echo", [](WorkerInfo caller, Message m) -> Task<Result<Message>> {
        m.payload.insert(m.payload.end(), caller.name.begin(), caller.name.end());
        co_return m;
    });
    REQUIRE(reg);
    auto twice = register_startup_blocking_handler("startup/echo", [](const WorkerInfo&, Message m) -> Result<Message> { return m; });
    REQUIRE_FALSE(twice);
    CHECK(twice.error().code() == Errc::already_registered);
    CHECK(register_startup_handler("startup/empty", {}).error().code() == Errc::invalid_argument);
    REQUIRE(register_startup_blocking_handler("startup/size", [](const WorkerInfo&, Message m) -> Result<Message> {
        return test::text_message(std::to_string(m.payload.size()));
    }));
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(3);
        // The very first calls, with no registration on the agents themselves.
        auto r = co_await g[0]->rpc_async("worker2", "startup/echo", test::text_message("from "));
        REQUIRE(r);
        CHECK(r->payload == bytes("from worker0"));
        auto n = co_await g[2]->rpc_async("worker1", "startup/size", test::text_message("12345"));
        REQUIRE(n);
        CHECK(n->payload == bytes("5"));
        auto clash = g[1]->register_handler("startup/echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; });
        CHECK(clash.error().code() == Errc::already_registered);
        co_await test::shutdown_all(g);
    });
}

namespace {
/// Starts a one-worker group whose options carry these transport and channel choices.
/// (References, not values: the caller's locals outlive the awaited call.)
Task<Result<test::AgentPtr>> start_alone(const std::optional<std::vector<std::string>>& transports,
                                         const std::optional<std::vector<std::string>>& channels) {
    auto store = std::make_shared<HashStore>(std::chrono::seconds(5));
    auto args = test::init_args(store, 0, 1, [&](int, TensorPipeRpcBackendOptions& o) {
        o.transports = transports;
        o.channels = channels;
    });
    co_return co_await detail::NativeAgent::create(std::move(args));
}
}  // namespace

TEST_CASE("_transports and _channels must name one that the agent has", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        // (arguments built first: GCC 12 destroys temporaries of a co_await expression twice)
        using Names = std::optional<std::vector<std::string>>;
        Names ibv = std::vector<std::string>{"ibv"}, cuda_gdr = std::vector<std::string>{"cuda_gdr", "xth"};
        Names shm_uv = std::vector<std::string>{"shm", "uv"}, cma_basic = std::vector<std::string>{"cma", "basic"}, none;
        auto a = co_await start_alone(ibv, none);
        REQUIRE_FALSE(a);
        CHECK(a.error().code() == Errc::not_supported);
        CHECK(a.error().message().find("[ibv]") != std::string::npos);
        CHECK(a.error().message().find("available: shm, uds, uv") != std::string::npos);
        auto b = co_await start_alone(none, cuda_gdr);  // (recognised, not built)
        REQUIRE_FALSE(b);
        CHECK(b.error().message().find("_channels") != std::string::npos);
        // TensorPipe's names for what the agent has are accepted.
        auto c = co_await start_alone(shm_uv, cma_basic);
        REQUIRE(c);
        auto down = co_await (*c)->shutdown(true, 5);
        CHECK(down);
    });
}

TEST_CASE("a call that times out returns timeout, and its late reply is dropped", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 2), release(ex, 2), second_done(ex, 1), self_entered(ex, 1), self_release(ex, 1);
        REQUIRE(g[1]->register_handler("held", test::held_handler(entered, release)));
        REQUIRE(g[0]->register_handler("held", test::held_handler(self_entered, self_release)));
        auto t0 = Clock::now();
        auto r = co_await g[0]->rpc_async("worker1", "held", test::text_message("late"), 0.05);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK(Clock::now() - t0 < 4s);
        // A second call is pending when the first one's late reply comes; it must not take it.
        std::optional<Result<Message>> r2;
        asio::co_spawn(ex, g[0]->rpc_async("worker1", "held", test::text_message("on time"), 0),
                       [&](std::exception_ptr, Result<Message> m) {
                           r2 = std::move(m);
                           second_done.try_send(std::error_code{}, 0);
                       });
        for (int i = 0; i < 2; ++i) co_await entered.async_receive(asio::use_awaitable);  // both in the handler
        release.try_send(std::error_code{}, 0);  // the first (timed-out) call's handler replies
        // An echo on the same connection comes back after that late reply: it has been read.
        auto echo = co_await g[0]->rpc_async("worker1", "echo", test::text_message("after the late reply"));
        REQUIRE(echo);
        CHECK_FALSE(r2);  // the late reply did not complete the second call
        release.try_send(std::error_code{}, 0);
        co_await second_done.async_receive(asio::use_awaitable);
        REQUIRE(r2);
        REQUIRE(*r2);
        CHECK((*r2)->payload == bytes("on time"));
        auto self = co_await g[0]->rpc_async("worker0", "held", {}, 0.05);
        CHECK(self.error().code() == Errc::timeout);
        self_release.try_send(std::error_code{}, 0);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("a short timeout fires on time while a call with a longer one is pending", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 2), release(ex, 2), long_done(ex, 1);
        REQUIRE(g[1]->register_handler("held", test::held_handler(entered, release)));
        asio::co_spawn(ex, g[0]->rpc_async("worker1", "held", test::text_message("long"), 5),
                       [&](std::exception_ptr, Result<Message> r) { long_done.try_send(std::error_code{}, r ? 1 : 0); });
        co_await entered.async_receive(asio::use_awaitable);  // the 5 s deadline is registered
        const auto t0 = Clock::now();
        auto r = co_await g[0]->rpc_async("worker1", "held", test::text_message("short"), 0.05);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK(Clock::now() - t0 < 4s);  // its own deadline, not the earlier-registered 5 s one
        for (int i = 0; i < 2; ++i) release.try_send(std::error_code{}, 0);
        const int long_ok = co_await long_done.async_receive(asio::use_awaitable);
        CHECK(long_ok == 1);  // the long call still succeeds
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("a caller cancelled while waiting gets cancelled at once; the late reply is dropped", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 1), release(ex, 1);
        REQUIRE(g[1]->register_handler("held", test::held_handler(entered, release)));
        // No rpc timeout (0): only the caller's own deadline (per-operation cancellation) ends it.
        const auto t0 = Clock::now();
        auto call = g[0]->rpc_async("worker1", "held", test::text_message("late"), 0);
        auto r = co_await with_timeout(std::move(call), 50ms);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK(Clock::now() - t0 < 4s);
        co_await entered.async_receive(asio::use_awaitable);
        release.try_send(std::error_code{}, 0);  // its reply now arrives for a call that is gone
        for (int i = 0; i < 20; ++i) {
            auto e = co_await g[0]->rpc_async("worker1", "echo", test::text_message("after " + std::to_string(i)), 5);
            REQUIRE(e);
            CHECK(e->payload == bytes("after " + std::to_string(i)));
        }
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("graceful shutdown lets calls in flight finish", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 1), release(ex, 1), down(ex, 1);
        REQUIRE(g[1]->register_handler("slow", test::held_handler(entered, release)));
        std::optional<Result<Message>> in_flight;
        asio::co_spawn(ex, g[0]->rpc_async("worker1", "slow", test::text_message("finish me")),
                       [&](std::exception_ptr, Result<Message> r) { in_flight = std::move(r); });
        co_await entered.async_receive(asio::use_awaitable);  // the call is in the handler
        std::vector<Result<void>> results;
        asio::co_spawn(ex, test::shutdown_all(g), [&](std::exception_ptr, std::vector<Result<void>> r) {
            results = std::move(r);
            down.try_send(std::error_code{}, 0);
        });
        co_await asio::post(ex, asio::use_awaitable);  // both shutdowns have begun
        CHECK_FALSE(in_flight);                        // and wait for the call in the handler
        release.try_send(std::error_code{}, 0);
        co_await down.async_receive(asio::use_awaitable);
        REQUIRE(results.size() == 2);
        for (auto& r : results) CHECK(r);
        REQUIRE(in_flight);
        REQUIRE(*in_flight);
        CHECK((*in_flight)->payload == bytes("finish me"));
        auto after = co_await g[0]->rpc_async("worker1", "slow", {});
        CHECK(after.error().code() == Errc::shutdown);
    });
}

TEST_CASE("a local shutdown ends pending calls with shutdown", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 1), release(ex, 1), finished(ex, 1);
        REQUIRE(g[1]->register_handler("never", test::held_handler(entered, release)));
        std::optional<Result<Message>> pending;
        asio::co_spawn(ex, g[0]->rpc_async("worker1", "never", {}, 0), [&](std::exception_ptr, Result<Message> r) {
            pending = std::move(r);
            finished.try_send(std::error_code{}, 0);
        });
        co_await entered.async_receive(asio::use_awaitable);  // the call is pending on worker1
        {
            auto awaited = co_await g[0]->shutdown(false);
            REQUIRE(awaited);
        }
        co_await finished.async_receive(asio::use_awaitable);
        release.try_send(std::error_code{}, 0);
        REQUIRE(pending);
        REQUIRE_FALSE(*pending);
        CHECK(pending->error().code() == Errc::shutdown);
        {
            auto awaited = co_await g[1]->shutdown(false);
            REQUIRE(awaited);
        }
    });
}

TEST_CASE("a graceful shutdown with a worker that never arrives times out and names it", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(3);
        auto t0 = Clock::now();
        auto r = co_await g[0]->shutdown(true, 0.2);
        CHECK(Clock::now() - t0 < 2s);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK(r.error().message().find("worker1") != std::string::npos);
        CHECK(r.error().message().find("worker2") != std::string::npos);
        {
            auto awaited = co_await g[1]->shutdown(false);
            REQUIRE(awaited);
        }
        {
            auto awaited = co_await g[2]->shutdown(false);
            REQUIRE(awaited);
        }
    });
}

TEST_CASE("destroying agents that were not shut down neither crashes nor hangs", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        {
            auto awaited = co_await g[0]->rpc_async("worker1", "echo", {});
            REQUIRE(awaited);
        }
        g.agents.clear();  // the deadline fails the test if anything they left behind never ends
    });
}

TEST_CASE("a graceful shutdown without a timeout does not hang on a worker that is gone", "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        {
            auto gone = co_await g[1]->shutdown(false);  // worker1 leaves without the barrier
            REQUIRE(gone);
        }
        auto t0 = Clock::now();
        auto r = co_await g[0]->shutdown(true, 0);
        CHECK(Clock::now() - t0 < 2s);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::connection_lost);
        CHECK(r.error().message().find("worker1") != std::string::npos);
    });
}

// Hidden ([.perf]): rough in-process figures for the report; both agents share one thread.
TEST_CASE("in-process echo latency, calls per second and tensor bandwidth", "[.perf][rpc][agent]") {
    test::run_with_deadline(120s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto ex = co_await asio::this_coro::executor;
        std::vector<double> rtt;
        for (int i = 0; i < 22000; ++i) {
            auto t0 = Clock::now();
            auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message(std::string(64, 'x')));
            if (!r) FAIL("call " << i << " failed: " << r.error().to_string());
            if (i >= 2000) rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
        std::sort(rtt.begin(), rtt.end());
        WARN("echo p50 " << rtt[rtt.size() / 2] << " us, p99 " << rtt[rtt.size() * 99 / 100] << " us");
        for (int depth : {1, 16, 128}) {
            long total = 100000, issued = 0, finished = 0;
            test::Signal done(ex, 1);
            auto t0 = Clock::now();
            std::function<void()> issue;
            issue = [&] {
                if (issued >= total) return;
                ++issued;
                asio::co_spawn(ex, g[0]->rpc_async("worker1", "echo", test::text_message(std::string(64, 'c'))),
                               [&](std::exception_ptr, Result<Message>) {
                                   if (++finished == total) done.try_send(std::error_code{}, 0);
                                   issue();
                               });
            };
            for (int i = 0; i < depth; ++i) issue();
            co_await done.async_receive(asio::use_awaitable);
            double secs = std::chrono::duration<double>(Clock::now() - t0).count();
            WARN("depth " << depth << ": " << total / secs << " calls/s");
        }
        for (std::size_t size : {std::size_t(1) << 20, std::size_t(64) << 20}) {
            Message m;
            m.tensors.push_back(filled(size, 1));
            std::vector<double> gbps;
            for (int i = 0; i < 6; ++i) {
                auto t0 = Clock::now();
                auto r = co_await g[0]->rpc_async("worker1", "echo", m);
                REQUIRE(r);
                if (i > 0) gbps.push_back(2.0 * double(size) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
            }
            std::sort(gbps.begin(), gbps.end());
            WARN(size << " B tensor echo: " << gbps[gbps.size() / 2] << " GB/s (both directions)");
        }
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("unregistering a handler with a call in flight refuses new calls at once and returns when that call has finished",
          "[rpc][agent]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto g = co_await test::make_group(2);
        test::Signal entered(ex, 1), release(ex, 1);
        REQUIRE(g[1]->register_handler("held", test::held_handler(entered, release)));
        std::optional<Result<Message>> first;
        test::Signal done(ex, 2);
        asio::co_spawn(ex, g[0]->rpc_async("worker1", "held", test::text_message("in flight")),
                       [&first, &done](std::exception_ptr, Result<Message> r) {
                           first = std::move(r);
                           done.try_send(std::error_code{}, 0);
                       });
        co_await entered.async_receive(asio::use_awaitable);
        std::optional<Result<void>> unregistered;
        asio::co_spawn(ex, g[1]->unregister_handler("held"), [&unregistered, &done](std::exception_ptr, Result<void> r) {
            unregistered = std::move(r);
            done.try_send(std::error_code{}, 1);
        });
        // A round trip later (the refused call), the unregister still waits for the call in flight.
        auto refused = co_await g[0]->rpc_async("worker1", "held", test::text_message("late"));
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code() == Errc::not_found);
        CHECK_FALSE(unregistered);
        release.try_send(std::error_code{}, 0);
        for (int i = 0; i < 2; ++i) co_await done.async_receive(asio::use_awaitable);
        REQUIRE(unregistered);
        CHECK(*unregistered);
        REQUIRE(first);
        REQUIRE(*first);
        CHECK((*first)->payload == bytes("in flight"));
        co_await test::shutdown_all(g);
    });
}

}  // namespace tp_agent_test
