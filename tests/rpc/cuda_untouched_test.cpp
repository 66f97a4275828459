// A GPU host as a CPU-only worker sees it (issue 34, on the fake CUDA runtime, a test double that
// counts contexts per device): agents whose options name no cuda device create no context on any
// GPU and allocate no pinned memory, nor do agents that name GPUs but move only CPU tensors, and one
// that names only cuda:1 touches cuda:1 alone, even while it stages tensors there. Its own
// process: the fake's contexts are process-wide.
#include "rpc/agent_test_util.hpp"
#include "rpc/cuda_test_util.hpp"

#include <tensorplay/device/backend.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_cuda_untouched_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {
/// A CPU tensor echoed each way, then a graceful shutdown.
Task<void> cpu_echoes(test::AgentGroup& g) {
    test::register_echo(g);
    for (int from = 0; from < 2; ++from) {
        auto t = empty(Device::cpu(), DType::float32, {1024});
        REQUIRE(t);
        Message m{bytes("cpu only"), {*t}};
        auto r = co_await g[from]->rpc_async(test::worker_name(1 - from), "echo", std::move(m));
        REQUIRE(r);
        CHECK(r->tensors.size() == 1);
    }
    auto down = co_await test::shutdown_all(g);
    for (auto& d : down) CHECK(d);
}
}  // namespace

TEST_CASE("agents on a host with GPUs touch only the cuda devices their options name", "[rpc][agent][device]") {
    if (cuda_device_count() < 2 || !test::fake().present || test::fake().contexts == nullptr) {
        WARN("not on the fake CUDA runtime with two devices: skipped");
        return;
    }
    const auto& fake = test::fake();
    REQUIRE(fake.contexts() == 0);  // (counting devices made none)
    const long host_allocs = fake.host_alloc_calls();

    // CPU-only workers with default options: every channel offered, CPU tensors both ways.
    test::run_with_deadline(30s, []() -> Task<void> {
        auto g = co_await test::make_group(2);
        co_await cpu_echoes(g);
    });
    CHECK(fake.contexts() == 0);
    CHECK(fake.host_alloc_calls() == host_allocs);

    // Workers that name both GPUs (devices and maps) but move only CPU tensors: no context either.
    // Their cuda_ipc outboxes are made at the first tensor that goes by one, not at the start.
    test::run_with_deadline(30s, []() -> Task<void> {
        auto g = co_await test::make_group(2, [](int rank, TensorPipeRpcBackendOptions& o) {
            o.devices = {Device::cuda(0), Device::cuda(1)};
            if (rank == 0) o.device_maps["worker1"] = DeviceMap{{Device::cuda(0), Device::cuda(1)}, {Device::cuda(1), Device::cuda(0)}};
        });
        co_await cpu_echoes(g);
    });
    CHECK(fake.contexts() == 0);
    CHECK(fake.host_alloc_calls() == host_allocs);

    // A worker that maps cuda:1 to its peer's cuda:1: a context there and nowhere else (no device
    // guard falls back to cuda:0, the staging pool is made under cuda:1).
    test::run_with_deadline(30s, []() -> Task<void> {
        auto g = co_await test::make_group(2, [](int rank, TensorPipeRpcBackendOptions& o) {
            if (rank == 0) o.device_maps["worker1"] = DeviceMap{{Device::cuda(1), Device::cuda(1)}};
        });
        test::register_echo(g);
        auto s = test::cuda().acquire_stream(Device::cuda(1));
        REQUIRE(s);
        const std::size_t n = 4096;
        auto t = test::filled(*s, n, 3);
        REQUIRE(t);
        Message m{bytes("on cuda:1"), {*t}};
        m.streams.push_back(*s);
        const std::string to = "worker1", handler = "echo";
        auto r = co_await g[0]->rpc_async(to, handler, std::move(m));
        REQUIRE(r);
        REQUIRE(r->tensors.size() == 1);
        CHECK(r->tensors[0].device() == Device::cuda(1));
        auto back = co_await test::read_back(r->tensors[0], test::stream_of(*r, Device::cuda(1)));
        CHECK(back == test::pattern(n, 3));
        auto down = co_await test::shutdown_all(g);
        for (auto& d : down) CHECK(d);
    });
    CHECK(fake.contexts() == 0b10);
}

}  // namespace tp_cuda_untouched_test
