// resolve_host: getaddrinfo on a short-lived thread, awaited by polling (see resolve.hpp).
#include "core/resolve.hpp"

#include "core/asio_compat.hpp"

#include <asio/ip/address.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

namespace tensorplay::detail {

namespace {

/// Shared by the lookup thread and the awaiting coroutine; whichever ends last frees it.
struct Lookup {
    std::mutex mutex;
    bool done = false;
    int status = 0;  // getaddrinfo's
    std::vector<asio::ip::tcp::endpoint> endpoints;
};

void run_lookup(const std::shared_ptr<Lookup>& lookup, const std::string& host, std::uint16_t port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    addrinfo* found = nullptr;
    const int status = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
    std::vector<asio::ip::tcp::endpoint> endpoints;
    for (addrinfo* ai = found; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            const auto* sa = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
            endpoints.emplace_back(asio::ip::address_v4(ntohl(sa->sin_addr.s_addr)), port);
        } else if (ai->ai_family == AF_INET6) {
            const auto* sa = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
            asio::ip::address_v6::bytes_type bytes;
            std::copy(std::begin(sa->sin6_addr.s6_addr), std::end(sa->sin6_addr.s6_addr), bytes.begin());
            endpoints.emplace_back(asio::ip::address_v6(bytes, sa->sin6_scope_id), port);
        }
    }
    if (found) ::freeaddrinfo(found);
    std::lock_guard lock(lookup->mutex);
    lookup->status = status;
    lookup->endpoints = std::move(endpoints);
    lookup->done = true;
}

}  // namespace

Task<Result<std::vector<asio::ip::tcp::endpoint>>> resolve_host(std::string host, std::uint16_t port) {
    std::error_code ec;
    if (auto numeric = asio::ip::make_address(host, ec); !ec) {
        std::vector<asio::ip::tcp::endpoint> one;
        one.emplace_back(numeric, port);
        co_return one;
    }
    auto lookup = std::make_shared<Lookup>();
    try {
        std::thread([lookup, host, port] { run_lookup(lookup, host, port); }).detach();
    } catch (const std::system_error& e) {
        co_return fail(Errc::io_error, "resolving \"" + host + "\": cannot start a thread: " + e.what());
    }
    asio::steady_timer poll(co_await asio::this_coro::executor);
    auto interval = std::chrono::microseconds(200);
    for (;;) {
        {
            std::lock_guard lock(lookup->mutex);
            if (lookup->done) break;
        }
        poll.expires_after(interval);
        co_await poll.async_wait(use_nothrow);
        interval = std::min<std::chrono::microseconds>(interval * 2, std::chrono::milliseconds(20));
    }
    std::lock_guard lock(lookup->mutex);
    if (lookup->status != 0)
        co_return fail(Errc::io_error, "resolving \"" + host + "\": " + ::gai_strerror(lookup->status));
    if (lookup->endpoints.empty()) co_return fail(Errc::io_error, "resolving \"" + host + "\": no TCP address");
    co_return std::move(lookup->endpoints);
}

}  // namespace tensorplay::detail
