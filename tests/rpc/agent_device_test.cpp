// Tensors whose memory the host cannot address (cuda, here on the fake CUDA runtime, a test
// double loaded through TP_CUDART): the `basic` channel refuses them with device_error instead of
// reading device pointers as host memory; the call fails alone and the connection goes on.
#include "rpc/agent_test_util.hpp"

#include <tensorplay/device/backend.hpp>

using namespace tensorplay;
using namespace std::chrono_literals;

TEST_CASE("a cuda tensor in a call is refused with device_error until a device channel exists; the link goes on",
          "[rpc][agent][device]") {
    if (cuda_device_count() < 1) {
        WARN("no cuda device (the fake runtime was not loaded): skipped");
        return;
    }
    test::run_with_deadline(20s, []() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto t = empty(Device{DeviceType::cuda, 0}, DType::float32, {4});
        REQUIRE(t);
        Message m = test::text_message("with a cuda tensor");
        m.tensors.push_back(*t);
        auto r = co_await g[0]->rpc_async(test::worker_name(1), "echo", std::move(m));
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::device_error);
        INFO(r.error().to_string());
        CHECK(r.error().to_string().find("cuda:0") != std::string::npos);
        // The same link serves the next call.
        auto ok_call = co_await g[0]->rpc_async(test::worker_name(1), "echo", test::text_message("cpu only"));
        REQUIRE(ok_call);
        CHECK(to_string(ok_call->payload) == "cpu only");
        auto down = co_await test::shutdown_all(g);
        for (auto& d : down) CHECK(d);
    });
}
