// A program outside the tree: built only with `pkg-config --cflags --libs tensorplay-rpc`.
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/config.hpp>

#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <cstdio>

static tensorplay::Task<tensorplay::Result<int>> seven() {
    co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
    co_return 7;
}

int main() {
    tensorplay::Runtime rt;
    auto r = rt.block_on(tensorplay::with_timeout(seven(), std::chrono::seconds(5)));
    std::printf("consumer: %s (tensorplay %s)\n", r ? "ok" : r.error().to_string().c_str(), TP_VERSION);
    return r && *r == 7 ? 0 : 1;
}
