// A smoke program: starts a runtime, races a task against a deadline, prints what happened.
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/core/timeout.hpp>

#include <asio/steady_timer.hpp>
#include <asio/redirect_error.hpp>

#include <cstdio>

using namespace tensorplay;
using namespace std::chrono_literals;

static Task<Result<int>> answer_after(Duration d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    std::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return fail(from_error_code(ec, "answer_after"));
    co_return 42;
}

int main() {
    Runtime rt;
    auto fast = rt.block_on(with_timeout(answer_after(1ms), 1s));
    auto slow = rt.block_on(with_timeout(answer_after(10s), 20ms));
    std::printf("fast: %s\nslow: %s\n", fast ? std::to_string(*fast).c_str() : fast.error().to_string().c_str(),
                slow ? "unexpected value" : slow.error().to_string().c_str());
    return (fast && *fast == 42 && !slow && slow.error().code() == Errc::timeout) ? 0 : 1;
}
