// Tests of the device backends: cpu allocation, the sim backend's streams and events, the registry.
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/device/backend.hpp>

#include "support/deadline.hpp"

#include <catch2/catch.hpp>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_backend_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {
struct SimGuard {
    explicit SimGuard(SimBackendOptions o) : backend(install_sim_backend(o)) {}
    ~SimGuard() { uninstall_sim_backend(); }
    DeviceBackend& backend;
};
SimBackendOptions sim(int n, std::chrono::microseconds delay = 0us) {
    SimBackendOptions o;
    o.devices = n;
    o.op_delay = delay;
    return o;
}
}  // namespace

TEST_CASE("the cpu backend allocates host memory and runs copies at once", "[device][backend]") {
    auto& cpu = cpu_backend();
    CHECK(cpu.name() == "cpu");
    CHECK(cpu.device_count() == 1);
    CHECK(cpu.host_accessible());
    auto s = cpu.allocate(Device::cpu(), 100);
    REQUIRE(s);
    CHECK((*s)->size() == 100);
    CHECK((*s)->device() == Device::cpu());
    auto stream = cpu.acquire_stream(Device::cpu());
    REQUIRE(stream);
    std::uint8_t src[4] = {1, 2, 3, 4};
    REQUIRE(cpu.copy_async(*stream, (*s)->data(), src, 4));
    CHECK((*s)->data()[3] == 4);
    auto ev = cpu.record_event(*stream);
    REQUIRE(ev);
    CHECK(ev->ready());
}

TEST_CASE("the cpu backend refuses cuda devices with a device error", "[device][backend]") {
    auto r = cpu_backend().allocate(Device::cuda(0), 10);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == Errc::device_error);
    CHECK_THAT(r.error().message(), Catch::Contains("cuda:0"));
}

TEST_CASE("without a sim or CUDA backend a cuda device is refused clearly", "[device][backend]") {
    uninstall_sim_backend();
    auto b = backend_for(Device::cuda(0));
    if (b) {
        SUCCEED("a CUDA backend is registered here");
        return;
    }
    CHECK((b.error().code() == Errc::not_supported || b.error().code() == Errc::device_error));
    CHECK_THAT(b.error().message(), Catch::Contains("cuda:0"));
    auto t = empty(Device::cuda(0), DType::float32, {4});
    REQUIRE_FALSE(t);
    CHECK(t.error().code() == b.error().code());
    REQUIRE(backend_for(Device::cpu()));
    CHECK((*backend_for(Device::cpu()))->name() == "cpu");
}

TEST_CASE("the sim backend answers for cuda devices it has and refuses others", "[device][backend][sim]") {
    SimGuard g(sim(2));
    auto b0 = backend_for(Device::cuda(1));
    REQUIRE(b0);
    CHECK((*b0)->name() == "sim");
    CHECK((*b0)->device_count() == 2);
    auto b2 = backend_for(Device::cuda(2));
    REQUIRE_FALSE(b2);
    CHECK(b2.error().code() == Errc::device_error);
    CHECK_THAT(b2.error().message(), Catch::Contains("cuda:2") && Catch::Contains("2 device"));

    auto t = empty(Device::cuda(1), DType::int32, {8});
    REQUIRE(t);
    CHECK(t->device() == Device::cuda(1));
    CHECK(t->nbytes() == 32);
    auto bad = g.backend.allocate(Device::cpu(), 8);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code() == Errc::device_error);
    auto bad_stream = g.backend.copy_async(Stream{Device::cuda(0), 99}, nullptr, nullptr, 0);
    REQUIRE_FALSE(bad_stream);
    CHECK(bad_stream.error().code() == Errc::device_error);
}

TEST_CASE("work queued on one sim stream runs in order", "[device][backend][sim]") {
    SimGuard g(sim(1, 200us));
    auto stream = g.backend.acquire_stream(Device::cuda(0));
    REQUIRE(stream);
    std::mutex m;
    std::vector<int> order;
    for (int i = 0; i < 20; ++i)
        REQUIRE(g.backend.enqueue_host(*stream, [&, i] { std::lock_guard l(m); order.push_back(i); }));
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto r = co_await g.backend.synchronize(*stream);
        REQUIRE(r);
    });
    std::lock_guard l(m);
    REQUIRE(order.size() == 20);
    for (int i = 0; i < 20; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("a stream waiting on another stream's event sees that stream's copy", "[device][backend][sim]") {
    SimGuard g(sim(2, 20ms));
    auto a = g.backend.acquire_stream(Device::cuda(0));
    auto b = g.backend.acquire_stream(Device::cuda(1));
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(a->device == Device::cuda(0));
    auto src = empty(Device::cuda(0), DType::uint8, {4});
    auto mid = empty(Device::cuda(0), DType::uint8, {4});
    auto dst = empty(Device::cuda(1), DType::uint8, {4});
    REQUIRE(src);
    REQUIRE(mid);
    REQUIRE(dst);
    for (int i = 0; i < 4; ++i) {
        src->data()[i] = static_cast<std::uint8_t>(10 + i);
        mid->data()[i] = 0;
        dst->data()[i] = 0;
    }
    // a: slow copy src -> mid; b: waits for a, then copies mid -> dst.
    REQUIRE(g.backend.copy_async(*a, mid->data(), src->data(), 4, src->storage()));
    auto ev = g.backend.record_event(*a);
    REQUIRE(ev);
    CHECK_FALSE(ev->ready());
    REQUIRE(g.backend.wait_event(*b, *ev));
    REQUIRE(g.backend.copy_async(*b, dst->data(), mid->data(), 4));
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto r = co_await g.backend.synchronize(*b);
        REQUIRE(r);
    });
    CHECK(ev->ready());
    for (int i = 0; i < 4; ++i) CHECK(dst->data()[i] == 10 + i);
}

TEST_CASE("awaiting a sim event resumes the coroutine on its executor without blocking it",
          "[device][backend][sim]") {
    SimGuard g(sim(1, 30ms));
    auto s = g.backend.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    std::atomic<bool> ran{false};
    REQUIRE(g.backend.enqueue_host(*s, [&] { ran = true; }));
    auto ev = g.backend.record_event(*s);
    REQUIRE(ev);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        // A timer on the same single-threaded executor fires while the event is pending: the
        // wait does not hold the thread.
        auto ticked = std::make_shared<std::atomic<bool>>(false);
        asio::steady_timer timer(ex, 1ms);
        timer.async_wait([ticked](std::error_code ec) { if (!ec) *ticked = true; });
        auto r = co_await g.backend.wait(*ev);
        REQUIRE(r);
        CHECK(ran.load());
        CHECK(ticked->load());
        CHECK(ex.target<asio::io_context::executor_type>()->running_in_this_thread());
    });
}

TEST_CASE("a wait on a sim event ends when cancelled (a timeout); the event completing later harms nothing",
          "[device][backend][sim]") {
    SimGuard g(sim(1));
    auto s = g.backend.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    std::promise<void> release;
    auto released = release.get_future().share();
    REQUIRE(g.backend.enqueue_host(*s, [released] { released.wait(); }));  // holds the stream until told
    auto ev = g.backend.record_event(*s);
    REQUIRE(ev);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto waiting = g.backend.wait(*ev);
        auto r = co_await with_timeout(std::move(waiting), 30ms);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
    });
    CHECK_FALSE(ev->ready());
    release.set_value();  // the event completes with nobody waiting (its notification finds no one)
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto again = g.backend.wait(*ev);
        auto r = co_await std::move(again);
        CHECK(r);
    });
    CHECK(ev->ready());
}

TEST_CASE("pooled sim streams of a device are distinct from its default stream", "[device][backend][sim]") {
    SimGuard g(sim(1));
    auto d = g.backend.default_stream(Device::cuda(0));
    REQUIRE(d);
    CHECK(d->id == 0);
    auto s1 = g.backend.acquire_stream(Device::cuda(0));
    auto s2 = g.backend.acquire_stream(Device::cuda());
    REQUIRE(s1);
    REQUIRE(s2);
    CHECK(s1->id != 0);
    CHECK(s2->id != 0);
    CHECK_FALSE(*s1 == *s2);
}

}  // namespace tp_backend_test
