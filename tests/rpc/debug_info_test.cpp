// get_debug_info: the counters a user reads to see what an agent is doing (calls per peer, errors
// by code, bytes, requests running, round-trip percentiles), and their JSON form.
#include "rpc/agent_test_util.hpp"

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_debug_info_test {

using namespace tensorplay;
using namespace std::chrono_literals;

TEST_CASE("get_debug_info counts calls, errors, bytes and latency per peer", "[rpc][agent]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto g = co_await test::make_group(3);
        test::register_echo(g);
        constexpr int kCalls = 20;
        for (int i = 0; i < kCalls; ++i) {
            Message m = test::text_message("0123456789");  // 10 bytes each way
            auto r = co_await g[0]->rpc_async("worker1", "echo", std::move(m));
            REQUIRE(r);
        }
        auto missing = co_await g[0]->rpc_async("worker2", "no_such_handler", {});
        REQUIRE_FALSE(missing);

        auto d = co_await g[0]->get_debug_info();
        REQUIRE(d);
        CHECK(d->worker == "worker0");
        CHECK(d->world_size == 3);
        REQUIRE(d->peers.size() == 2);
        const auto& w1 = d->peers[0];
        CHECK(w1.worker == "worker1");
        CHECK(w1.connected);
        CHECK(w1.calls_in_flight == 0);
        CHECK(w1.calls_done == kCalls);
        CHECK(w1.calls_failed == 0);
        CHECK(w1.bytes_sent == 10 * kCalls);
        CHECK(w1.bytes_received == 10 * kCalls);
        const auto& w2 = d->peers[1];
        CHECK(w2.calls_done == 1);
        CHECK(w2.calls_failed == 1);
        CHECK(d->errors.at("not_found") == 1);
        CHECK(d->latency_samples == kCalls);
        CHECK(d->latency_p50_us > 0);
        CHECK(d->latency_p50_us <= d->latency_p99_us);
        CHECK(d->latency_p99_us <= d->latency_max_us);

        // The callee counts what it served, and the caller's bytes as received.
        auto c = co_await g[1]->get_debug_info();
        REQUIRE(c);
        REQUIRE(c->peers.size() == 2);
        CHECK(c->peers[0].worker == "worker0");
        CHECK(c->peers[0].requests_served == kCalls);
        CHECK(c->peers[0].bytes_received == 10 * kCalls);
        CHECK(c->requests_running == 0);

        const auto json = d->to_json();
        CHECK(json.find("\"worker\":\"worker0\"") != std::string::npos);
        CHECK(json.find("\"not_found\":1") != std::string::npos);
        CHECK(json.find("\"calls_done\":20") != std::string::npos);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("get_debug_info shows a request being served as running", "[rpc][agent]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 2), release(ex, 2), done(ex, 2);
        REQUIRE(g[1]->register_handler("held", test::held_handler(entered, release)));
        asio::co_spawn(ex, g[0]->rpc_async("worker1", "held", test::text_message("x"), 5),
                       [&](std::exception_ptr, Result<Message> r) { done.try_send(std::error_code{}, r ? 1 : 0); });
        co_await entered.async_receive(asio::use_awaitable);
        auto during = co_await g[1]->get_debug_info();
        REQUIRE(during);
        CHECK(during->requests_running == 1);
        auto caller = co_await g[0]->get_debug_info();
        REQUIRE(caller);
        CHECK(caller->peers[0].calls_in_flight == 1);
        release.try_send(std::error_code{}, 0);
        const int ok = co_await done.async_receive(asio::use_awaitable);  // (not inside CHECK: GCC 12)
        CHECK(ok == 1);
        auto after = co_await g[1]->get_debug_info();
        REQUIRE(after);
        CHECK(after->requests_running == 0);
        co_await test::shutdown_all(g);
    });
}

}  // namespace tp_debug_info_test
