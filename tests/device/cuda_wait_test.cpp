// Tests of waiting for cuda events from coroutines: resumption on the caller's executor, already
// complete events, thousands of concurrent waits on one thread, cancellation, destroying the
// io_context with waits pending, and interprocess events between two processes.
#include "cuda_support.hpp"
#include "device/backend_impl.hpp"
#include "support/deadline.hpp"
#include "support/processes.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <cstdio>
#include <optional>
#include <vector>

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

TEST_CASE("awaiting a cuda event resumes on the caller's executor while it keeps serving others", "[cuda][wait]") {
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    StreamHold hold(b, *s);
    auto ev = b.record_event(*s);
    REQUIRE(ev);
    CHECK_FALSE(ev->ready());
    run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto ticked = std::make_shared<std::atomic<bool>>(false);
        asio::steady_timer timer(ex, 5ms);
        timer.async_wait([ticked, &hold](std::error_code ec) {
            if (!ec) *ticked = true;
            hold.release();  // the GPU passes the event only after the loop ran the timer
        });
        auto r = co_await wait_for(b, *ev);
        REQUIRE(r);
        CHECK(ticked->load());
        CHECK(ex.target<asio::io_context::executor_type>()->running_in_this_thread());
    });
    CHECK(ev->ready());
}

TEST_CASE("a slow release on the completion thread blocks no event loop that adds a wait meanwhile", "[cuda][wait]") {
    auto& b = cuda();
    auto s1 = b.acquire_stream(Device::cuda(0));
    auto s2 = b.acquire_stream(Device::cuda(0));
    REQUIRE(s1);
    REQUIRE(s2);
    REQUIRE(s1->id != s2->id);
    std::optional<StreamHold> hold1(std::in_place, b, *s1);
    auto e1 = b.record_event(*s1);
    REQUIRE(e1);
    // What the completion thread runs for e1 stands for a keep-alive whose release is slow (a
    // cudaFreeHost, a cudaIpcCloseMemHandle behind the driver's lock).
    std::atomic<bool> releasing{false};
    detail::EventAccess::state(*e1)->on_ready([&releasing] {
        releasing = true;
        releasing.notify_all();
        std::this_thread::sleep_for(1s);  // (the slow release itself)
    });
    hold1.reset();
    releasing.wait(false);
    StreamHold hold2(b, *s2);
    auto e2 = b.record_event(*s2);
    REQUIRE(e2);
    std::chrono::steady_clock::duration timer_late{};
    run_with_deadline(10s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto t0 = std::chrono::steady_clock::now();
        asio::steady_timer timer(ex, 50ms);
        timer.async_wait([&](std::error_code) {
            timer_late = std::chrono::steady_clock::now() - t0 - 50ms;
            hold2.release();
        });
        // Adding this wait to the engine must not wait for the release above.
        auto r = co_await wait_for(b, *e2);
        CHECK(r);
    });
    INFO("the timer fired " << std::chrono::duration_cast<std::chrono::milliseconds>(timer_late).count() << " ms late");
    CHECK(timer_late < 500ms);  // (before: the add waited for the engine's lock, held through the release: ~1 s)
}

TEST_CASE("a wait on an event that already completed resumes without suspending", "[cuda][wait]") {
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    auto ev = b.record_event(*s);
    REQUIRE(ev);
    run_with_deadline(10s, [&]() -> Task<void> {
        auto r0 = co_await b.synchronize(*s);
        REQUIRE(r0);
        REQUIRE(ev->ready());
        auto other_ran = std::make_shared<bool>(false);  // (the posted function outlives this frame)
        auto ex = co_await asio::this_coro::executor;  // (not inside the post: GCC 12, temporaries of a co_await)
        asio::post(ex, [other_ran] { *other_ran = true; });
        auto r = co_await wait_for(b, *ev);
        REQUIRE(r);
        CHECK_FALSE(*other_ran);  // it did not go through the loop (nor through the GPU)
        const Event complete;
        auto none = co_await wait_for(b, complete);
        CHECK(none);
    });
}

TEST_CASE("5,000 concurrent waits cost no thread each and all complete", "[cuda][wait]") {
    auto& b = cuda();
    constexpr int waits = 5000;
    auto s1 = b.acquire_stream(Device::cuda(0));
    auto s2 = b.acquire_stream(Device::cuda(0));
    REQUIRE(s1);
    REQUIRE(s2);
    StreamHold h1(b, *s1), h2(b, *s2);
    std::vector<Event> events;
    for (int i = 0; i < waits; ++i) {
        auto ev = b.record_event(i % 2 ? *s1 : *s2);
        REQUIRE(ev);
        events.push_back(*ev);
    }
    asio::io_context ctx(1);
    int done = 0, failed = 0;
    for (int i = 0; i < waits; ++i) {
        asio::co_spawn(ctx, [&b, ev = events[static_cast<std::size_t>(i)]]() -> Task<Result<void>> { co_return co_await wait_for(b, ev); },
                       [&](std::exception_ptr e, Result<void> r) {
                           ++done;
                           if (e || !r) ++failed;
                       });
    }
    const int before = thread_count();
    ctx.run_for(200ms);  // every wait is pending now
    CHECK(done == 0);
    const int during = thread_count();
    CHECK(during <= before + 1);  // at most the process-wide completion thread appeared
    h1.release();
    h2.release();
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (done < waits && std::chrono::steady_clock::now() < deadline) ctx.run_for(50ms);
    CHECK(done == waits);
    CHECK(failed == 0);
    INFO("threads before " << before << ", while 5000 waits were pending " << during);
}

TEST_CASE("a cancelled wait ends with Errc::cancelled and the GPU work still completes", "[cuda][wait]") {
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    StreamHold hold(b, *s);
    auto ev = b.record_event(*s);
    REQUIRE(ev);
    asio::io_context ctx(1);
    asio::cancellation_signal signal;
    std::optional<Result<void>> result;
    asio::co_spawn(ctx, [&b, e = *ev]() -> Task<Result<void>> { co_return co_await wait_for(b, e); },
                   asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr, Result<void> r) { result = r; }));
    ctx.run_for(50ms);
    REQUIRE_FALSE(result);
    signal.emit(asio::cancellation_type::terminal);
    ctx.run_for(200ms);
    REQUIRE(result);
    REQUIRE_FALSE(*result);
    CHECK(result->error().code() == Errc::cancelled);
    CHECK_FALSE(ev->ready());
    hold.release();
    run_with_deadline(10s, [&]() -> Task<void> {
        auto r = co_await wait_for(b, *ev);
        CHECK(r);
    });
}

TEST_CASE("destroying the io_context with waits pending neither crashes nor leaks", "[cuda][wait]") {
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    StreamHold hold(b, *s);
    auto ev = b.record_event(*s);
    REQUIRE(ev);
    auto frames = std::make_shared<int>(0);  // one reference per live coroutine frame
    bool completed = false;
    {
        asio::io_context ctx(1);
        for (int i = 0; i < 100; ++i)
            asio::co_spawn(ctx, [&b, e = *ev, frames]() -> Task<Result<void>> { co_return co_await wait_for(b, e); },
                           [&](std::exception_ptr, Result<void>) { completed = true; });
        ctx.run_for(50ms);
        CHECK(frames.use_count() == 101);
    }  // destroyed with all 100 pending
    CHECK(frames.use_count() == 1);
    CHECK_FALSE(completed);
    hold.release();
    run_with_deadline(10s, [&]() -> Task<void> {
        auto r = co_await wait_for(b, *ev);  // the engine carries on for everyone else
        CHECK(r);
    });
    CHECK_FALSE(completed);
}

namespace {
std::string hex(const IpcHandle& h) {
    std::string out;
    char buf[3];
    for (auto c : h) {
        std::snprintf(buf, sizeof buf, "%02x", c);
        out += buf;
    }
    return out;
}
}  // namespace

// The second process of the interprocess test: opens the event named by TP_TEST_IPC_EVENT, makes
// one of its streams wait on it, and waits for that stream.
TEST_CASE("ipc child", "[.ipc_child]") {
    const char* text = std::getenv("TP_TEST_IPC_EVENT");
    REQUIRE(text != nullptr);
    IpcHandle h{};
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint8_t>(std::stoi(std::string(text + 2 * i, 2), nullptr, 16));
    auto& b = cuda();
    auto ev = b.open_ipc_event(Device::cuda(0), h);
    REQUIRE(ev);
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    REQUIRE(b.wait_event(*s, *ev));
    test::Steps steps;
    const char* fds = std::getenv("TP_TEST_IPC_STEPS");
    REQUIRE(fds != nullptr);
    REQUIRE(std::sscanf(fds, "%d", &steps.out) == 1);
    REQUIRE(steps.mark("opened"));
    run_with_deadline(20s, [&]() -> Task<void> {
        auto r = co_await wait_for(b, *ev);
        REQUIRE(r);
        auto r2 = co_await b.synchronize(*s);
        REQUIRE(r2);
    });
    std::puts("passed the event");
}

TEST_CASE("another process waits on an interprocess event until this process passes it", "[cuda][ipc]") {
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    StreamHold hold(b, *s);
    auto ipc = b.record_ipc_event(*s);
    REQUIRE(ipc);
    char self[4096];
    const auto len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(len > 0);
    self[len] = '\0';
    int up[2];  // child -> parent; the parent's end is not inherited
    REQUIRE(::pipe(up) == 0);
    REQUIRE(::fcntl(up[0], F_SETFD, FD_CLOEXEC) == 0);
    std::vector<Child> child{
        spawn({self, "[.ipc_child]"}, {"TP_TEST_IPC_EVENT=" + hex(ipc->second), "TP_TEST_IPC_STEPS=" + std::to_string(up[1])})};
    ::close(up[1]);  // (the child's end: the wait below ends with EOF once it is gone)
    test::Steps steps{up[0], -1, {}};
    const bool opened = steps.await("opened");
    ::close(up[0]);
    if (!opened) {
        wait_all(child, 1s);
        FAIL("the child did not open the event: " << child[0].describe());
    }
    std::this_thread::sleep_for(200ms);  // (a negative window: the child would pass the event by now without the wait)
    CHECK(output_of(child[0]).find("passed the event") == std::string::npos);  // held back by our stream
    hold.release();
    wait_all(child, 20s);
    INFO(child[0].describe());
    CHECK(child[0].exited_ok());
    CHECK(output_of(child[0]).find("passed the event") != std::string::npos);
}

TEST_CASE("a wait ends when its own event completes, not behind a later interprocess event", "[cuda][wait][ipc]") {
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    StreamHold first_hold(b, *s);
    auto first = b.record_event(*s);
    REQUIRE(first);
    StreamHold second_hold(b, *s);
    auto ipc = b.record_ipc_event(*s);
    REQUIRE(ipc);
    asio::io_context ctx(1);
    std::optional<Result<void>> later, earlier;
    asio::co_spawn(ctx, [&b, e = ipc->first]() -> Task<Result<void>> { co_return co_await wait_for(b, e); },
                   [&](std::exception_ptr, Result<void> r) { later = r; });
    ctx.run_for(20ms);  // the wait on the later event is registered first
    asio::co_spawn(ctx, [&b, e = *first]() -> Task<Result<void>> { co_return co_await wait_for(b, e); },
                   [&](std::exception_ptr, Result<void> r) { earlier = r; });
    first_hold.release();
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!earlier && std::chrono::steady_clock::now() < until) ctx.run_for(10ms);
    REQUIRE(earlier);
    CHECK(*earlier);
    CHECK_FALSE(later);
    second_hold.release();
    while (!later && std::chrono::steady_clock::now() < until + 5s) ctx.run_for(10ms);
    REQUIRE(later);
    CHECK(*later);
}
