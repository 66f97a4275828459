// Tests of the RPC constants, WorkerInfo printing and the backend options (value checks, set_device_map).
#include <tensorplay/rpc/options.hpp>

#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/rpc/worker_info.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_options_test {

using namespace tensorplay;

namespace {
Device c(int i) { return Device::cuda(i); }
}  // namespace

TEST_CASE("the constants have torch's values, but for a finite shutdown timeout", "[rpc]") {
    STATIC_REQUIRE(DEFAULT_RPC_TIMEOUT_SEC == 60.0);
    STATIC_REQUIRE(DEFAULT_INIT_METHOD == "env://");
    STATIC_REQUIRE(DEFAULT_NUM_WORKER_THREADS == 16);
    // torch's 0 waits forever, so one stopped worker held every other's graceful shutdown.
    STATIC_REQUIRE(DEFAULT_SHUTDOWN_TIMEOUT == 60.0);
    STATIC_REQUIRE(DEFAULT_PROCESS_GROUP_TIMEOUT.count() == 2147483647);
    STATIC_REQUIRE(UNSET_RPC_TIMEOUT == -1.0);
}

TEST_CASE("WorkerInfo prints as torch's repr", "[rpc]") {
    WorkerInfo w{"worker1", 1};
    CHECK(w.str() == "WorkerInfo(id=1, name=worker1)");
    std::ostringstream os;
    os << w;
    CHECK(os.str() == "WorkerInfo(id=1, name=worker1)");
}

TEST_CASE("options have the seed's defaults and are polymorphic", "[rpc]") {
    TensorPipeRpcBackendOptions tp;
    CHECK(tp.rpc_timeout == 60.0);
    CHECK(tp.init_method == "env://");
    CHECK(tp.num_worker_threads == 16);
    CHECK(tp.device_maps.empty());
    CHECK(tp.devices.empty());
    CHECK_FALSE(tp.transports);
    CHECK_FALSE(tp.channels);
    CHECK(tp.listen_address.empty());
    CHECK(tp.validate());
    const RpcBackendOptions& base = tp;
    CHECK(dynamic_cast<const TensorPipeRpcBackendOptions*>(&base) != nullptr);
    std::shared_ptr<RpcBackendOptions> plain = std::make_shared<RpcBackendOptions>();
    CHECK(std::dynamic_pointer_cast<TensorPipeRpcBackendOptions>(plain) == nullptr);
}

TEST_CASE("validate refuses negative, NaN and infinite timeouts and non-positive thread counts", "[rpc]") {
    for (double bad : {-1.0, -0.001, std::nan(""), std::numeric_limits<double>::infinity()}) {
        TensorPipeRpcBackendOptions o(bad, "env://");
        auto r = o.validate();
        INFO(bad);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::invalid_argument);
        CHECK_THAT(r.error().message(), Catch::StartsWith("RPC Timeout must be non-negative and finite"));
        CHECK_FALSE(RpcBackendOptions(bad, "env://").validate());
    }
    CHECK(RpcBackendOptions(0.0, "env://").validate());  // 0 means no timeout
    for (int bad : {0, -3}) {
        TensorPipeRpcBackendOptions o(1.0, "env://", bad);
        auto r = o.validate();
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::invalid_argument);
        CHECK(r.error().message() == "num_worker_threads must be positive, got " + std::to_string(bad));
    }
}

TEST_CASE("the connection bounds are options with their defaults, and validate refuses bad ones naming the option", "[rpc]") {
    const TensorPipeRpcBackendOptions o;
    CHECK(o.max_frame_bytes == std::size_t(1) << 36);
    CHECK(o.receive_budget_bytes == std::size_t(16) << 30);
    CHECK(o.handshake_timeout == 10);
    CHECK(o.frame_timeout == 120);
    CHECK(o.idle_timeout == 600);
    CHECK(o.max_inbound_connections == 4096);
    using Set = std::function<void(TensorPipeRpcBackendOptions&)>;
    const std::vector<std::pair<std::string, Set>> bad{
        {"max_frame_bytes must be positive", [](auto& b) { b.max_frame_bytes = 0; }},
        {"receive_budget_bytes must be positive", [](auto& b) { b.receive_budget_bytes = 0; }},
        {"max_inbound_connections must be positive", [](auto& b) { b.max_inbound_connections = 0; }},
        {"handshake_timeout must be a positive number", [](auto& b) { b.handshake_timeout = 0; }},
        {"frame_timeout must be a number of seconds >= 0", [](auto& b) { b.frame_timeout = -1; }},
        {"idle_timeout must be a number of seconds >= 0", [](auto& b) { b.idle_timeout = std::nan(""); }},
    };
    for (const auto& [says, set] : bad) {
        TensorPipeRpcBackendOptions b;
        set(b);
        auto r = b.validate();
        INFO(says);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::invalid_argument);
        CHECK_THAT(r.error().message(), Catch::StartsWith(says));
    }
}

TEST_CASE("set_device_map merges maps to the same worker", "[rpc]") {
    TensorPipeRpcBackendOptions o;
    REQUIRE(o.set_device_map("w1", {{c(0), c(1)}}));
    REQUIRE(o.set_device_map("w1", {{c(1), c(0)}, {c(0), c(1)}}));  // repeating a pair is fine
    REQUIRE(o.set_device_map("w2", {{Device::cpu(), c(0)}}));
    CHECK(o.device_maps == DeviceMaps{{"w1", {{c(0), c(1)}, {c(1), c(0)}}}, {"w2", {{Device::cpu(), c(0)}}}});
}

TEST_CASE("set_device_map keeps every map one-to-one and changes nothing on error", "[rpc]") {
    TensorPipeRpcBackendOptions o;
    REQUIRE(o.set_device_map("w1", {{c(0), c(1)}}));
    const auto before = o.device_maps;

    auto remap = o.set_device_map("w1", {{c(0), c(2)}});
    REQUIRE_FALSE(remap);
    CHECK(remap.error().code() == Errc::invalid_argument);
    CHECK(remap.error().message() == "`set_device_map` only supports 1-to-1 mapping, trying to map cuda:0 to cuda:2 and cuda:1");

    // torch accepts this and fails later at init; we refuse it here.
    auto merged = o.set_device_map("w1", {{c(2), c(1)}});
    REQUIRE_FALSE(merged);
    CHECK(merged.error().message() == "`device_map` only supports 1-to-1 mapping, trying to map cuda:2 and cuda:0 to cuda:1");

    auto within = o.set_device_map("w3", {{c(0), c(5)}, {c(1), c(5)}});
    REQUIRE_FALSE(within);
    CHECK(within.error().message() == "`device_map` only supports 1-to-1 mapping, trying to map cuda:1 and cuda:0 to cuda:5");
    CHECK(o.device_maps == before);
}

TEST_CASE("set_devices replaces the device list", "[rpc]") {
    TensorPipeRpcBackendOptions o;
    o.set_devices({c(1), c(0)});
    o.set_devices({c(2)});
    CHECK(o.devices == std::vector<Device>{c(2)});
}

}  // namespace tp_options_test
