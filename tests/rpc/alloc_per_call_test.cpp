// Heap allocations per call at steady state (issue 36, item 4): a caller and a callee, each agent
// on its own thread (as in two processes: Asio's and the library's block caches are per thread),
// call over each same-host transport; after a warm-up, a run of calls allocates nothing on either
// side's thread. The requests are built before the count starts (the user's allocations). Links
// support/alloc_probe.cpp (operator new counts its blocks), hence an executable of its own.
#include "rpc/agent_test_util.hpp"
#include "support/alloc_probe.hpp"

#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/use_future.hpp>

#include <cstdio>
#include <future>
#include <thread>

namespace {

using namespace tensorplay;
using namespace std::chrono_literals;
namespace alloc_probe = tensorplay::test::alloc_probe;

constexpr int kWarmUp = 2000;
constexpr int kCalls = 2000;

struct PerCall {
    double caller = -1, callee = -1;
};

/// The callee's thread: an io_context of its own.
struct CalleeThread {
    asio::io_context io;
    asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
    std::thread thread{[this] { io.run(); }};
    ~CalleeThread() {
        work.reset();
        io.stop();
        thread.join();
    }
    /// Blocks allocated on the callee's thread so far.
    std::size_t allocations() {
        return asio::post(io, asio::use_future([] { return alloc_probe::thread_allocations(); })).get();
    }
};

/// Allocations per call, per side, of `kCalls` echo calls from worker0 to worker1 over `transport`.
PerCall allocations_per_call(const std::string& transport) {
    PerCall out;
    CalleeThread callee;
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(5s);
        auto configure = [&](int, TensorPipeRpcBackendOptions& o) { o.transports = std::vector<std::string>(1, transport); };
        auto started = asio::co_spawn(callee.io, detail::NativeAgent::create(test::init_args(store, 1, 2, configure)), asio::use_future);
        auto caller = co_await detail::NativeAgent::create(test::init_args(store, 0, 2, configure));
        REQUIRE(caller);
        auto worker1 = started.get();
        REQUIRE(worker1);
        REQUIRE((*worker1)->register_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; }));
        const Bytes payload(64, 7);
        std::vector<Message> requests(kWarmUp + kCalls, Message{payload, {}});
        std::size_t next = 0;
        auto run = [&](int n) -> Task<void> {
            for (int i = 0; i < n; ++i) {
                auto r = co_await (*caller)->rpc_async("worker1", "echo", std::move(requests[next++]), 10);
                REQUIRE(r);
            }
        };
        co_await run(kWarmUp);
        const std::size_t caller_before = alloc_probe::thread_allocations(), callee_before = callee.allocations();
        co_await run(kCalls);
        out.caller = static_cast<double>(alloc_probe::thread_allocations() - caller_before) / kCalls;
        out.callee = static_cast<double>(callee.allocations() - callee_before) / kCalls;
        auto stopped = asio::co_spawn(callee.io, (*worker1)->shutdown(true, 5), asio::use_future);
        auto s0 = co_await (*caller)->shutdown(true, 5);
        CHECK(s0);
        CHECK(stopped.get());
    });
    std::printf("figure: %s allocations per call: caller %.3f, callee %.3f\n", transport.c_str(), out.caller, out.callee);
    return out;
}

}  // namespace

// (Not exactly 0 over a run, and no timing in it: Asio recycles at most two coroutine frames per
// thread, and when one of the agent's background coroutines takes one at the wrong moment the next
// call's frame comes from malloc. Over shm a loaded machine also makes the reader park on its
// doorbell, through the reactor (a coroutine frame and an operation, from the same small caches):
// the more load, the more parks. Measured: 0.003 on the caller's side and 0 on the callee's over
// uv and uds whatever the load; over shm 0.003 to 0.03 idle, 0.12 beside two fuzzers and a build.
// What these bound is an allocation per call: before the recycled payloads and the smaller call
// frame there was one on each side, 2.5 when both sides share a thread.)
// (A property of the optimized build: a sanitizer build, whose CI configuration also takes Asio's
// portable paths, reports the figures without bounding them.)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kBounded = false;
#else
constexpr bool kBounded = true;
#endif

TEST_CASE("a call allocates nothing at steady state, on either side", "[rpc][alloc]") {
    for (const char* transport : {"uv", "uds", "shm"}) {
        INFO("transport " << transport);
        const double at_most = std::string_view(transport) == "shm" ? 0.5 : 0.1;
        const auto per_call = allocations_per_call(transport);
        if (!kBounded) continue;
        CHECK(per_call.caller <= at_most);
        CHECK(per_call.callee <= at_most);
    }
}
