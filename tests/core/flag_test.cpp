// Flag (many waiters on one executor, resumed in place by set) and RemoteSignal (completed from
// any thread, resumed on the waiter's executor).
#include "core/asio_compat.hpp"
#include "core/flag.hpp"

#include <tensorplay/core/timeout.hpp>

#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <memory>
#include <thread>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_flag_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::Flag;
using detail::RemoteSignal;

namespace {

struct Sentinel {
    bool* flag;
    ~Sentinel() { *flag = true; }
};

Task<void> wait_into(Flag& e, std::vector<std::error_code>& out) {
    auto ec = co_await e.wait();
    out.push_back(ec);
}

}  // namespace

TEST_CASE("Flag: set() resumes every waiter in place, once; later waits return at once", "[core][event]") {
    asio::io_context ctx(1);
    Flag e;
    std::vector<std::error_code> got;
    for (int i = 0; i < 3; ++i) asio::co_spawn(ctx, wait_into(e, got), asio::detached);
    ctx.poll();
    REQUIRE(e.waiters() == 3);
    REQUIRE(got.empty());
    bool checked = false;
    asio::post(ctx, [&] {
        e.set(make_error_code(std::errc::broken_pipe));
        CHECK(got.size() == 3);  // all ran inside set()
        checked = true;
    });
    ctx.poll();
    REQUIRE(checked);
    for (auto& ec : got) CHECK(ec == std::errc::broken_pipe);
    CHECK(e.waiters() == 0);
    e.set();  // already set: nothing
    asio::co_spawn(ctx, wait_into(e, got), asio::detached);
    ctx.restart();
    ctx.poll();
    REQUIRE(got.size() == 4);
    CHECK(got[3] == std::errc::broken_pipe);  // the code it was set with
}

TEST_CASE("Flag: a cancelled waiter leaves; the others still wait for set()", "[core][event]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        Flag e;
        std::vector<std::error_code> got;
        auto ex = co_await asio::this_coro::executor;
        asio::co_spawn(ex, wait_into(e, got), asio::detached);
        auto waiting = [](Flag& e) -> Task<Result<void>> {
            auto ec = co_await e.wait();
            if (ec) co_return fail(from_error_code(ec, "event"));
            co_return ok();
        };
        auto r = co_await with_timeout(waiting(e), 20ms);  // the deadline cancels this wait
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK(e.waiters() == 1);
        e.set();
        CHECK(got.size() == 1);
        CHECK(e.waiters() == 0);
    });
}

TEST_CASE("Flag: a waiter may destroy the event from inside set(); reset() re-arms it", "[core][event]") {
    asio::io_context ctx(1);
    auto e = std::make_unique<Flag>();
    int resumed = 0;
    auto destroyer = [](std::unique_ptr<Flag>& owner, int& n) -> Task<void> {
        (void)co_await owner->wait();
        ++n;
        owner.reset();  // the event goes while set() is running
    };
    asio::co_spawn(ctx, destroyer(e, resumed), asio::detached);
    asio::co_spawn(ctx, destroyer(e, resumed), asio::detached);
    ctx.poll();
    REQUIRE(e->waiters() == 2);
    asio::post(ctx, [&] { e->set(); });  // ASan: no use of the freed event after the first waiter
    ctx.poll();
    CHECK(resumed >= 1);
    CHECK_FALSE(e);

    Flag again;
    again.set();
    again.reset();
    std::vector<std::error_code> got;
    asio::co_spawn(ctx, wait_into(again, got), asio::detached);
    ctx.restart();
    ctx.poll();
    CHECK(got.empty());  // re-armed: waits for the next set()
    again.set();         // (outside the event loop: the waiter's resumption is dispatched to it)
    ctx.restart();
    ctx.poll();
    CHECK(got.size() == 1);
}

TEST_CASE("Flag: destroyed with waiters parked, their waits end with operation_aborted", "[core][event]") {
    asio::io_context ctx(1);
    std::vector<std::error_code> got;
    {
        Flag e;
        asio::co_spawn(ctx, wait_into(e, got), asio::detached);
        asio::co_spawn(ctx, wait_into(e, got), asio::detached);
        ctx.poll();
        REQUIRE(e.waiters() == 2);
    }
    ctx.restart();
    ctx.poll();  // (destroyed outside the event loop: the resumptions were dispatched to it)
    REQUIRE(got.size() == 2);
    for (auto& ec : got) CHECK(ec == asio::error::operation_aborted);
}

TEST_CASE("RemoteSignal: notified from another thread, before or during the wait", "[core][event]") {
    const bool before = GENERATE(false, true);
    asio::io_context ctx(1);
    RemoteSignal sig(ctx.get_executor());
    std::thread::id resumed_on;
    std::error_code got = make_error_code(std::errc::invalid_argument);
    bool done = false;
    std::thread notifier;
    if (before) notifier = std::thread([n = sig.notifier()] { n.notify(); });
    asio::co_spawn(
        ctx,
        [&]() -> Task<void> {
            if (before) {
                notifier.join();
            } else {
                // Posted: it runs once this coroutine is parked in the wait below.
                asio::post(ctx, [&notifier, n = sig.notifier()] {
                    notifier = std::thread([n] {
                        n.notify(make_error_code(std::errc::timed_out));
                        n.notify();  // a second notify does nothing
                    });
                });
            }
            got = co_await sig.wait();
            resumed_on = std::this_thread::get_id();
            done = true;
        },
        asio::detached);
    // No work guard: the parked wait itself keeps run() going until the notification.
    ctx.run_for(5s);
    if (notifier.joinable()) notifier.join();
    REQUIRE(done);
    CHECK(resumed_on == std::this_thread::get_id());
    if (before) CHECK_FALSE(got);
    else CHECK(got == std::errc::timed_out);
}

TEST_CASE("RemoteSignal: a cancelled wait ends; a late notify completes nothing", "[core][event]") {
    asio::io_context ctx(1);
    RemoteSignal sig(ctx.get_executor());
    auto n = sig.notifier();
    bool done = false;
    asio::co_spawn(
        ctx,
        [&]() -> Task<void> {
            auto waiting = [](RemoteSignal& s) -> Task<Result<void>> {
                auto ec = co_await s.wait();
                if (ec) co_return fail(from_error_code(ec, "signal"));
                co_return ok();
            };
            auto r = co_await with_timeout(waiting(sig), 20ms);
            CHECK_FALSE(r);
            done = true;
        },
        asio::detached);
    ctx.run_for(5s);
    REQUIRE(done);
    std::thread([n] { n.notify(); }).join();  // nobody waits: the posted completion finds no one
    ctx.restart();
    ctx.run_for(100ms);
    SUCCEED();
}

TEST_CASE("RemoteSignal: a waiter parked when its event loop is destroyed goes with it; a later notify touches nothing", "[core][event]") {
    bool gone = false;
    RemoteSignal::Notifier late;
    {
        asio::io_context ctx(1);
        auto sig = std::make_shared<RemoteSignal>(ctx.get_executor());
        late = sig->notifier();
        asio::co_spawn(
            ctx,
            [](std::shared_ptr<RemoteSignal> s, bool* flag) -> Task<void> {
                Sentinel guard{flag};
                (void)co_await s->wait();
            }(sig, &gone),
            asio::detached);
        ctx.poll();
        CHECK_FALSE(gone);
    }
    CHECK(gone);
    // The event loop is gone: a late notification must not post into it (ASan: stack-use-after-scope).
    std::thread([late] { late.notify(); }).join();
}

}  // namespace tp_flag_test
