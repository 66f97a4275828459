// A program outside the tree, built from the installed files alone (pkg-config, CMake or meson):
// it includes the umbrella header, and runs a TCP store round trip over 127.0.0.1 in the library.
#include <tensorplay/rpc.hpp>

#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

using namespace tensorplay;

namespace {

Task<Result<std::string>> round_trip(std::uint16_t port) {
    // A coroutine frame of the user's own, scheduled through the library's executor.
    co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
    TcpStoreOptions options;
    options.port = port;
    options.timeout = std::chrono::seconds(5);
    auto store = co_await TcpStore::connect(co_await asio::this_coro::executor, options);
    if (!store) co_return fail(std::move(store).error());
    // GCC 12: no std::string or aggregate temporary inside a co_await expression.
    std::string key = "consumer";
    auto value = bytes("installed");
    auto set = co_await (*store)->set(key, std::move(value));
    if (!set) co_return fail(std::move(set).error());
    auto got = co_await (*store)->get(key);
    if (!got) co_return fail(std::move(got).error());
    co_return std::string(got->begin(), got->end());
}

}  // namespace

int main() {
    Runtime rt;
    TcpStoreServerOptions server_options;
    server_options.host = "127.0.0.1";
    auto server = TcpStoreServer::start(rt.get_executor(), server_options);
    if (!server) {
        std::printf("consumer: %s\n", server.error().to_string().c_str());
        return 1;
    }
    auto r = rt.block_on(with_timeout(round_trip((*server)->port()), std::chrono::seconds(10)));
    (*server)->stop();
    std::printf("consumer: %s (tensorplay %s)\n", r ? r->c_str() : r.error().to_string().c_str(), TP_VERSION);
    return r && *r == "installed" ? 0 : 1;
}
