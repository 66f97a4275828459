// Typed startup handlers (define_startup): registered before init, present in every agent started
// afterwards before it reports ready, and removable for agents started later.
#include "rpc/agent_test_util.hpp"

#include <tensorplay/rpc/startup.hpp>
#include <tensorplay/rpc/typed.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_startup_test {

using namespace tensorplay;
using namespace std::chrono_literals;

TEST_CASE("typed startup handlers answer the first calls of a new group", "[rpc][typed]") {
    REQUIRE(define_startup<std::int64_t(std::int64_t)>("st_plain", [](std::int64_t x) { return x + 1; }));
    REQUIRE(define_startup_inline<std::string(std::string)>("st_inline", [](std::string s) { return s + "!"; }));
    REQUIRE(define_startup<std::int64_t(std::int64_t)>(
        "st_coro", [](const WorkerInfo& caller, std::int64_t x) -> Task<std::int64_t> { co_return x * 100 + caller.id; }));
    auto again = define_startup<int(int)>("st_plain", [](int x) { return x; });
    REQUIRE_FALSE(again);
    CHECK(again.error().code() == Errc::already_registered);

    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto g = co_await test::make_group(3);
        // No registration on the agents: every call below is the first each agent receives.
        for (int from = 0; from < 3; ++from) {
            const std::string to = test::worker_name((from + 1) % 3);
            auto a = co_await call<std::int64_t>(*g[static_cast<std::size_t>(from)], to, "st_plain", std::int64_t{41});
            REQUIRE(a);
            CHECK(*a == 42);
            auto b = co_await call<std::string>(*g[static_cast<std::size_t>(from)], to, "st_inline", std::string("hi"));
            REQUIRE(b);
            CHECK(*b == "hi!");
            auto c = co_await call<std::int64_t>(*g[static_cast<std::size_t>(from)], to, "st_coro", std::int64_t{7});
            REQUIRE(c);
            CHECK(*c == 700 + from);
        }
        co_await test::shutdown_all(g);
    });

    REQUIRE(unregister_startup_handler("st_plain"));
    CHECK(unregister_startup_handler("st_plain").error().code() == Errc::not_found);
    REQUIRE(unregister_startup_handler("st_inline"));
    REQUIRE(unregister_startup_handler("st_coro"));
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        auto gone = co_await call<std::int64_t>(*g[0], "worker1", "st_plain", std::int64_t{1});
        REQUIRE_FALSE(gone);
        CHECK(gone.error().code() == Errc::not_found);
        co_await test::shutdown_all(g);
    });
}

}  // namespace tp_startup_test
