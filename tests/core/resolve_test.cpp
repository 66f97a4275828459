// resolve_host: numeric hosts at once, names through a thread that ends with the lookup.
#include "core/asio_compat.hpp"
#include "core/resolve.hpp"

#include "support/deadline.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <catch2/catch.hpp>

#include <filesystem>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_resolve_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

std::size_t thread_count() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
    return n;
}

/// Waits (the test's deadline bounds it) until the process has `n` threads.
Task<void> until_threads(std::size_t n) {
    asio::steady_timer t(co_await asio::this_coro::executor);
    while (thread_count() != n) {
        t.expires_after(1ms);
        co_await t.async_wait(detail::use_nothrow);
    }
}

}  // namespace

TEST_CASE("a numeric host resolves at once to itself, without a thread", "[core][resolve]") {
    test::run_with_deadline(5s, [&]() -> Task<void> {
        const auto before = thread_count();
        auto v4 = co_await detail::resolve_host("127.0.0.1", 4242);
        REQUIRE(v4);
        REQUIRE(v4->size() == 1);
        CHECK((*v4)[0].address().to_string() == "127.0.0.1");
        CHECK((*v4)[0].port() == 4242);
        auto v6 = co_await detail::resolve_host("::1", 7);
        REQUIRE(v6);
        REQUIRE(v6->size() == 1);
        CHECK((*v6)[0].address().is_v6());
        CHECK(thread_count() == before);
    });
}

TEST_CASE("a name resolves to its addresses, and the lookup's thread is gone afterwards", "[core][resolve]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        const auto before = thread_count();
        auto r = co_await detail::resolve_host("localhost", 9000);
        REQUIRE(r);
        REQUIRE_FALSE(r->empty());
        for (const auto& ep : *r) {
            CHECK(ep.address().is_loopback());
            CHECK(ep.port() == 9000);
        }
        co_await until_threads(before);  // (a resolver thread that stayed would fail the deadline)
        CHECK(thread_count() == before);
    });
}

TEST_CASE("a name that does not resolve is an io_error naming it", "[core][resolve]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto r = co_await detail::resolve_host("no-such-host.invalid", 1);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::io_error);
        CHECK(r.error().message().find("no-such-host.invalid") != std::string::npos);
    });
}

}  // namespace tp_resolve_test
