// ResumeSlot: in-place resumption, cancellation, and waiters destroyed with their event loop; the
// per-thread free lists behind its waiters.
#include "core/asio_compat.hpp"
#include "core/resume_slot.hpp"

#include <tensorplay/core/timeout.hpp>

#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <thread>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_resume_slot_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::ResumeSlot;

namespace {

struct Parked {
    ResumeSlot slot;
    int resumed = 0;
    std::error_code ec;
};

/// Sets *flag when destroyed: tells whether a coroutine frame was destroyed.
struct Sentinel {
    bool* flag;
    ~Sentinel() { *flag = true; }
};

/// Waits on the slot: with wait() (`direct`) or async_wait(use_nothrow).
Task<std::error_code> wait_on(ResumeSlot& slot, bool direct) {
    if (direct) {
        co_await slot.wait();
        co_return slot.error();
    }
    auto [ec] = co_await slot.async_wait(detail::use_nothrow);
    co_return ec;
}

Task<void> park(std::shared_ptr<Parked> p, bool* frame_gone, bool direct) {
    Sentinel s{frame_gone};
    if (direct) {  // parked in this frame itself
        co_await p->slot.wait();
        p->ec = p->slot.error();
    } else {
        auto [ec] = co_await p->slot.async_wait(detail::use_nothrow);
        p->ec = ec;
    }
    ++p->resumed;
}

}  // namespace

TEST_CASE("complete() runs the waiter in place, before it returns", "[core][resume_slot]") {
    const bool direct = GENERATE(false, true);
    asio::io_context ctx(1);
    auto p = std::make_shared<Parked>();
    bool gone = false;
    asio::co_spawn(ctx, park(p, &gone, direct), asio::detached);
    ctx.poll();
    REQUIRE(p->slot.waiting());
    bool checked = false;
    asio::post(ctx, [&] {
        p->slot.complete();
        CHECK(p->resumed == 1);  // already ran, inside complete()
        CHECK_FALSE(p->ec);
        checked = true;
    });
    ctx.poll();
    CHECK(checked);
    CHECK_FALSE(p->slot.waiting());
    p->slot.complete();  // no waiter: nothing happens
    CHECK(p->resumed == 1);
}

TEST_CASE("a cancelled wait ends with operation_aborted", "[core][resume_slot]") {
    const bool direct = GENERATE(false, true);
    test::run_with_deadline(5s, [&]() -> Task<void> {
        auto p = std::make_shared<Parked>();
        auto wait = [](std::shared_ptr<Parked> p, bool direct) -> Task<Result<int>> {
            auto ec = co_await wait_on(p->slot, direct);  // (one frame deeper than the waiting one)
            if (ec) co_return fail(from_error_code(ec, "wait"));
            co_return 1;
        };
        auto r = co_await with_timeout(wait(p, direct), 20ms);  // the deadline cancels the wait
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::timeout);
        CHECK_FALSE(p->slot.waiting());
        p->slot.complete();  // late: nobody waits any more
    });
}

TEST_CASE("a waiter still parked when its event loop is destroyed is destroyed with it", "[core][resume_slot]") {
    const bool direct = GENERATE(false, true);
    bool gone = false;
    auto p = std::make_shared<Parked>();
    {
        asio::io_context ctx(1);
        // The frame owns `p`, which owns the slot, which owns the frame: only the event loop's
        // registry can end it.
        asio::co_spawn(ctx, park(p, &gone, direct), asio::detached);
        ctx.poll();
        REQUIRE(p->slot.waiting());
        CHECK_FALSE(gone);
    }
    CHECK(gone);
    CHECK_FALSE(p->slot.waiting());
    CHECK(p->resumed == 0);
}

TEST_CASE("wait(): completed from another thread, the waiter resumes on its own event loop's thread", "[core][resume_slot]") {
    asio::io_context ctx(1);
    auto guard = asio::make_work_guard(ctx);
    struct Result_ {
        std::thread::id resumed_on;
        std::error_code ec;
        int value = 0;
    } got;
    ResumeSlot slot;
    asio::co_spawn(
        ctx,
        [&]() -> Task<void> {
            auto inner = [&]() -> Task<int> {  // parked two frames deep; the value comes back up
                auto ec = co_await wait_on(slot, true);
                got.ec = ec;
                got.resumed_on = std::this_thread::get_id();
                co_return 42;
            };
            got.value = co_await inner();
            guard.reset();
        },
        asio::detached);
    // Queued behind the coroutine's start, which runs until it parks: by then it waits.
    std::promise<bool> parked;
    auto was_parked = parked.get_future();
    asio::post(ctx, [&] { parked.set_value(slot.waiting()); });
    std::thread loop([&] { ctx.run(); });
    const auto loop_id = loop.get_id();
    const bool was_waiting = was_parked.wait_for(5s) == std::future_status::ready && was_parked.get();
    if (was_waiting) slot.complete(asio::error::eof);  // from this thread: dispatched to the loop's
    else ctx.stop();
    loop.join();
    REQUIRE(was_waiting);
    CHECK(got.resumed_on == loop_id);
    CHECK(got.ec == asio::error::eof);
    CHECK(got.value == 42);
}

TEST_CASE("recycled blocks are reused by size and may be freed on another thread", "[core][recycled]") {
    // Reuse: a freed block of one size class comes back for the next request of that class.
    void* a = detail::recycled_allocate(40);
    std::memset(a, 0xab, 40);
    detail::recycled_free(a, 40);
    void* b = detail::recycled_allocate(48);  // same 16-byte class as 40
    CHECK(b == a);
    std::memset(b, 0xcd, 48);  // the whole requested size is usable

    // Blocks beyond the lists' sizes go straight to operator new/delete and are usable whole.
    void* big = detail::recycled_allocate(64 * 1024);
    std::memset(big, 0x11, 64 * 1024);
    detail::recycled_free(big, 64 * 1024);

    // A block allocated here, freed on another thread (its lists take it), then reused there. (A
    // thread's lists exist from its first allocation; before that, frees go to operator delete.)
    bool reused_there = false;  // (Catch2 v2 assertions are not thread-safe: checked after the join)
    std::thread other([b, &reused_there] {
        detail::recycled_free(detail::recycled_allocate(1000), 1000);  // creates this thread's lists
        detail::recycled_free(b, 48);
        void* again = detail::recycled_allocate(48);
        reused_there = again == b;
        detail::recycled_free(again, 48);
    });
    other.join();
    CHECK(reused_there);

    // A node-based container over the allocator behaves as with std::allocator.
    std::map<int, int, std::less<int>, detail::RecyclingAllocator<std::pair<const int, int>>> m;
    for (int i = 0; i < 1000; ++i) m.emplace(i, i * i);
    for (int i = 0; i < 1000; i += 2) m.erase(i);
    CHECK(m.size() == 500);
    CHECK(m.at(999) == 999 * 999);
}

}  // namespace tp_resume_slot_test
