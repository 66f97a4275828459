// Tests of the built-in TENSORPIPE backend's handlers: options from typed keyword arguments, and the
// init handler's checks before it hands over to the native agent factory.
#include <tensorplay/rpc/backend_registry.hpp>

#include "rpc/native_agent_factory.hpp"
#include "rpc/test_agent.hpp"
#include "support/deadline.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/store/hash_store.hpp>

#include <mutex>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_tensorpipe_backend_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

Device c(int i) { return Device::cuda(i); }

std::shared_ptr<TensorPipeRpcBackendOptions> tensorpipe_options(const BackendKwargs& kwargs = {}) {
    auto r = construct_rpc_backend_options(BackendType::tensorpipe(), 7.5, "tcp://localhost:1", kwargs);
    REQUIRE(r);
    auto tp = std::dynamic_pointer_cast<TensorPipeRpcBackendOptions>(*r);
    REQUIRE(tp);
    return tp;
}

Error options_error(const BackendKwargs& kwargs) {
    auto r = construct_rpc_backend_options("TENSORPIPE", 7.5, "env://", kwargs);
    REQUIRE_FALSE(r);
    return r.error();
}

// Replaces the native agent factory for one test and puts the previous one back.
struct FactoryOverride {
    explicit FactoryOverride(detail::NativeAgentFactory f) : saved(detail::native_agent_factory()) {
        detail::set_native_agent_factory(std::move(f));
    }
    ~FactoryOverride() { detail::set_native_agent_factory(std::move(saved)); }
    detail::NativeAgentFactory saved;
};

// Collects warnings logged while it lives.
struct LogCapture {
    LogCapture() {
        set_log_sink([this](LogLevel level, std::string_view component, std::string_view message) {
            std::lock_guard lock(mutex);
            lines.push_back(std::string(to_string(level)) + " " + std::string(component) + ": " + std::string(message));
        });
    }
    ~LogCapture() { set_log_sink({}); }
    std::mutex mutex;
    std::vector<std::string> lines;
};

Result<std::shared_ptr<RpcAgent>> init_blocking(BackendInitArgs args) {
    std::optional<Result<std::shared_ptr<RpcAgent>>> out;
    test::run_with_deadline(5s, [&]() -> Task<void> { out = co_await init_backend(BackendType::tensorpipe(), args); });
    REQUIRE(out);
    return std::move(*out);
}

}  // namespace

TEST_CASE("TENSORPIPE options have the seed's defaults", "[rpc][tensorpipe]") {
    auto r = construct_rpc_backend_options("TENSORPIPE");
    REQUIRE(r);
    auto tp = std::dynamic_pointer_cast<TensorPipeRpcBackendOptions>(*r);
    REQUIRE(tp);
    CHECK(tp->rpc_timeout == DEFAULT_RPC_TIMEOUT_SEC);
    CHECK(tp->init_method == "env://");
    CHECK(tp->num_worker_threads == DEFAULT_NUM_WORKER_THREADS);
    CHECK(tp->device_maps.empty());
    CHECK(tp->devices.empty());
    CHECK_FALSE(tp->transports);
    CHECK_FALSE(tp->channels);
}

TEST_CASE("TENSORPIPE options take every keyword of the seed's set", "[rpc][tensorpipe]") {
    auto tp = tensorpipe_options({
        {"num_worker_threads", std::int64_t{4}},
        {"device_maps", DeviceMaps{{"w1", {{c(0), c(1)}}}, {"w2", {{Device::cpu(), c(0)}}}}},
        {"devices", std::vector<Device>{c(0)}},
        {"_transports", std::vector<std::string>{"tcp", "uds"}},
        {"_channels", std::vector<std::string>{"basic"}},
    });
    CHECK(tp->rpc_timeout == 7.5);
    CHECK(tp->init_method == "tcp://localhost:1");
    CHECK(tp->num_worker_threads == 4);
    CHECK(tp->device_maps == DeviceMaps{{"w1", {{c(0), c(1)}}}, {"w2", {{Device::cpu(), c(0)}}}});
    CHECK(tp->devices == std::vector<Device>{c(0)});
    CHECK(tp->transports == std::vector<std::string>{"tcp", "uds"});
    CHECK(tp->channels == std::vector<std::string>{"basic"});
    // A name no transport has is refused when the options are built.
    auto e = options_error({{"_transports", std::vector<std::string>{"uv", "unix"}}});
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.message().find("\"unix\"") != std::string::npos);
}

TEST_CASE("TENSORPIPE options accept None and device strings", "[rpc][tensorpipe]") {
    auto tp = tensorpipe_options({
        {"device_maps", std::monostate{}},
        {"devices", std::vector<std::string>{"cuda:1", "0", "cpu"}},
        {"_transports", std::monostate{}},
        {"_channels", std::monostate{}},
    });
    CHECK(tp->device_maps.empty());
    CHECK(tp->devices == std::vector<Device>{c(1), c(0), Device::cpu()});
    CHECK_FALSE(tp->transports);
    CHECK_FALSE(tp->channels);

    auto bad = options_error({{"devices", std::vector<std::string>{"cuda:0", "gpu:1"}}});
    CHECK(bad.code() == Errc::invalid_argument);
    CHECK_THAT(bad.message(), Catch::StartsWith("TENSORPIPE backend option devices: invalid device string 'gpu:1'"));
}

TEST_CASE("a TENSORPIPE keyword of the wrong type is a type_error naming the key", "[rpc][tensorpipe]") {
    auto [key, value, expected] = GENERATE(table<std::string, BackendKwarg, std::string>({
        {"num_worker_threads", 4.0, "TENSORPIPE backend option num_worker_threads must be int, got float"},
        {"num_worker_threads", std::string("4"), "TENSORPIPE backend option num_worker_threads must be int, got str"},
        {"num_worker_threads", true, "TENSORPIPE backend option num_worker_threads must be int, got bool"},
        {"num_worker_threads", std::monostate{}, "TENSORPIPE backend option num_worker_threads must be int, got None"},
        {"device_maps", std::vector<Device>{c(0)},
         "TENSORPIPE backend option device_maps must be dict[str, DeviceMap] or None, got list[Device]"},
        {"devices", std::int64_t{0},
         "TENSORPIPE backend option devices must be list[Device], list[str] or None, got int"},
        {"_transports", std::string("tcp"), "TENSORPIPE backend option _transports must be list[str] or None, got str"},
        {"_channels", DeviceMaps{}, "TENSORPIPE backend option _channels must be list[str] or None, got dict[str, DeviceMap]"},
    }));
    auto e = options_error({{key, value}});
    CHECK(e.code() == Errc::type_error);
    CHECK(e.message() == expected);
}

TEST_CASE("TENSORPIPE options check values", "[rpc][tensorpipe]") {
    auto zero = options_error({{"num_worker_threads", std::int64_t{0}}});
    CHECK(zero.code() == Errc::invalid_argument);
    CHECK(zero.message() == "num_worker_threads must be positive, got 0");
    auto huge = options_error({{"num_worker_threads", std::int64_t{1} << 40}});
    CHECK(huge.code() == Errc::invalid_argument);
    auto timeout = construct_rpc_backend_options("TENSORPIPE", -2.0);
    REQUIRE_FALSE(timeout);
    CHECK(timeout.error().code() == Errc::invalid_argument);
    auto not_one_to_one = options_error({{"device_maps", DeviceMaps{{"w1", {{c(0), c(3)}, {c(1), c(3)}}}}}});
    CHECK(not_one_to_one.code() == Errc::invalid_argument);
    CHECK(not_one_to_one.message() == "`device_map` only supports 1-to-1 mapping, trying to map cuda:1 and cuda:0 to cuda:3");
}

TEST_CASE("TENSORPIPE drops keywords outside the seed's set with a warning naming them", "[rpc][tensorpipe]") {
    LogCapture capture;
    auto tp = tensorpipe_options({{"rpc_timeout", 1.0}, {"num_worker_threads", std::int64_t{2}}, {"zebra", true}});
    CHECK(tp->num_worker_threads == 2);
    CHECK(tp->rpc_timeout == 7.5);  // the keyword did not override the argument
    std::lock_guard lock(capture.mutex);
    REQUIRE(capture.lines.size() == 1);
    CHECK(capture.lines[0] ==
          "warn rpc: construct_rpc_backend_options: the TENSORPIPE backend ignores the keyword argument(s) rpc_timeout, zebra");
}

TEST_CASE("the TENSORPIPE init handler wants TensorPipeRpcBackendOptions", "[rpc][tensorpipe]") {
    auto store = std::make_shared<HashStore>(1s);
    for (auto options : {std::make_shared<RpcBackendOptions>(), std::shared_ptr<RpcBackendOptions>()}) {
        auto r = init_blocking(BackendInitArgs{store, "w0", 0, 1, options});
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::type_error);
        CHECK(r.error().message() == "rpc_backend_options must be TensorPipeRpcBackendOptions");
    }
}

TEST_CASE("the TENSORPIPE init handler checks values and the worker's own maps", "[rpc][tensorpipe]") {
    FactoryOverride none({});
    auto store = std::make_shared<HashStore>(1s);
    const int n = cuda_device_count();

    auto threads = std::make_shared<TensorPipeRpcBackendOptions>();
    threads->num_worker_threads = 0;
    auto r0 = init_blocking(BackendInitArgs{store, "w0", 0, 1, threads});
    REQUIRE_FALSE(r0);
    CHECK(r0.error().message() == "num_worker_threads must be positive, got 0");

    auto devices = std::make_shared<TensorPipeRpcBackendOptions>();
    devices->devices = {c(n)};  // one past this machine's last GPU
    auto r1 = init_blocking(BackendInitArgs{store, "me", 0, 1, devices});
    REQUIRE_FALSE(r1);
    CHECK(r1.error().code() == Errc::invalid_argument);
    CHECK(r1.error().message() == "worker me has invalid devices");

    auto source = std::make_shared<TensorPipeRpcBackendOptions>();
    source->device_maps["peer"] = {{c(n + 1), c(0)}};
    auto r2 = init_blocking(BackendInitArgs{store, "me", 0, 1, source});
    REQUIRE_FALSE(r2);
    CHECK(r2.error().message() == "worker me has invalid source devices");

    auto duplicated = std::make_shared<TensorPipeRpcBackendOptions>();
    duplicated->device_maps["peer"] = {{Device::cpu(), c(5)}, {c(0), c(5)}};
    auto r3 = init_blocking(BackendInitArgs{store, "me", 0, 1, duplicated});
    REQUIRE_FALSE(r3);
    CHECK(r3.error().message() == "worker me maps multiple devices to one target");
}

TEST_CASE("the TENSORPIPE init handler without an agent factory says so", "[rpc][tensorpipe]") {
    FactoryOverride none({});
    auto options = std::make_shared<TensorPipeRpcBackendOptions>();
    // A map to a peer that is not known yet passes: the dynamic-group rules skip unknown targets.
    options->device_maps["later"] = {{Device::cpu(), c(42)}};
    auto r = init_blocking(BackendInitArgs{std::make_shared<HashStore>(1s), "w0", 0, 1, options});
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == Errc::not_supported);
    CHECK(r.error().message() ==
          "the native TENSORPIPE agent is not available in this build (no agent factory is registered)");

    auto no_store = init_blocking(BackendInitArgs{nullptr, "w0", 0, 1, options});
    REQUIRE_FALSE(no_store);
    CHECK(no_store.error().code() == Errc::type_error);
}

TEST_CASE("the TENSORPIPE init handler hands valid arguments to the agent factory", "[rpc][tensorpipe]") {
    std::optional<BackendInitArgs> seen;
    FactoryOverride fake([&](BackendInitArgs args) -> Task<Result<std::shared_ptr<RpcAgent>>> {
        seen = args;
        return [](BackendInitArgs a) -> Task<Result<std::shared_ptr<RpcAgent>>> {
            co_return std::make_shared<test::TestAgent>(a.name, a.rank, a.options);
        }(std::move(args));
    });
    auto store = std::make_shared<HashStore>(1s);
    auto options = tensorpipe_options({{"device_maps", DeviceMaps{{"w1", {{Device::cpu(), Device::cpu()}}}}}});
    auto r = init_blocking(BackendInitArgs{store, "w3", 3, 4, options});
    REQUIRE(r);
    CHECK((*r)->get_worker_info() == WorkerInfo{"w3", 3});
    REQUIRE(seen);
    CHECK(seen->store == store);
    CHECK(seen->world_size == 4);
    CHECK(seen->options == options);

    FactoryOverride failing([](BackendInitArgs) -> Task<Result<std::shared_ptr<RpcAgent>>> {
        return []() -> Task<Result<std::shared_ptr<RpcAgent>>> { co_return fail(Errc::io_error, "cannot listen"); }();
    });
    auto f = init_blocking(BackendInitArgs{store, "w3", 3, 4, options});
    REQUIRE_FALSE(f);
    CHECK(f.error().code() == Errc::io_error);
    CHECK(f.error().message() == "cannot listen");
}

}  // namespace tp_tensorpipe_backend_test
