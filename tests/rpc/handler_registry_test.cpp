// HandlerRegistry: lookups, refusals, and a removal that waits for the calls still running.
#include "rpc/handler_registry.hpp"

#include <tensorplay/core/timeout.hpp>

#include "core/asio_compat.hpp"
#include "support/deadline.hpp"

#include <asio/co_spawn.hpp>
#include <asio/steady_timer.hpp>

#include <catch2/catch.hpp>

#include <optional>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_handler_registry_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using detail::HandlerRegistry;

namespace {
Task<void> pause(std::chrono::milliseconds d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(detail::use_nothrow);
}

RpcHandler echo() {
    return [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; };
}
}  // namespace

TEST_CASE("a handler registry refuses empty handlers and taken names, and finds what it holds", "[rpc][handlers]") {
    HandlerRegistry reg("w0");
    auto empty = reg.add("none", {}, {});
    REQUIRE_FALSE(empty);
    CHECK(empty.error().code() == Errc::invalid_argument);
    REQUIRE(reg.add("echo", echo(), {}));
    auto twice = reg.add("echo", {}, [](const WorkerInfo&, Message m) -> Result<Message> { return m; });
    REQUIRE_FALSE(twice);
    CHECK(twice.error().code() == Errc::already_registered);
    CHECK(twice.error().message().find("\"w0\"") != std::string::npos);
    auto e = reg.enter("echo");
    REQUIRE(e);
    CHECK(e->running == 1);
    CHECK(e->coro);
    CHECK_FALSE(e->blocking);
    CHECK(reg.enter("echo") == e);  // (the cached one)
    CHECK(e->running == 2);
    reg.leave(*e);
    reg.leave(*e);
    CHECK(e->running == 0);
    CHECK(reg.enter("nope") == nullptr);
    CHECK(reg.not_found("nope").code() == Errc::not_found);
}

TEST_CASE("removing a handler stops new calls at once and completes when its running calls have left", "[rpc][handlers]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        HandlerRegistry reg("w0");
        REQUIRE(reg.add("h", echo(), {}));
        auto a = reg.enter("h");
        auto b = reg.enter("h");
        REQUIRE(a);
        std::optional<Result<void>> removed;
        asio::co_spawn(ex, reg.remove("h"), [&removed](std::exception_ptr, Result<void> r) { removed = std::move(r); });
        co_await pause(10ms);
        CHECK_FALSE(removed);               // two calls still run
        CHECK(reg.enter("h") == nullptr);   // but no new one enters
        reg.leave(*a);
        co_await pause(10ms);
        CHECK_FALSE(removed);
        reg.leave(*b);                      // the last one: the removal completes
        co_await pause(1ms);
        REQUIRE(removed);
        CHECK(*removed);
        auto again = co_await reg.remove("h");
        REQUIRE_FALSE(again);
        CHECK(again.error().code() == Errc::not_found);
        // A new handler under the old name is a new entry.
        REQUIRE(reg.add("h", echo(), {}));
        auto c = reg.enter("h");
        REQUIRE(c);
        CHECK(c != a);
        reg.leave(*c);
    });
}

TEST_CASE("a removal whose wait is cancelled ends with an error and leaves the handler unregistered", "[rpc][handlers]") {
    test::run_with_deadline(5s, []() -> Task<void> {
        HandlerRegistry reg("w0");
        REQUIRE(reg.add("h", echo(), {}));
        auto a = reg.enter("h");
        auto r = co_await with_timeout(reg.remove("h"), 20ms);
        REQUIRE_FALSE(r);
        CHECK(reg.enter("h") == nullptr);
        reg.leave(*a);  // (the entry itself is still valid for its caller)
        CHECK(a->running == 0);
    });
}

}  // namespace tp_handler_registry_test
