// fault_relay: a TCP relay for tests/rpc/multihost_test.sh that injects faults, scripted on stdin,
// into the connections it carries (as tests/support/fault_proxy.hpp does in process, whose fixed
// 127.0.0.1 listener and C++ control interface do not fit a relay in a namespace of its own; it
// shares the proxy's ProxiedLink).
//
//   fault_relay [--transparent] LISTEN=TARGET...     (each host:port)
//
// Listens on every LISTEN and forwards each accepted connection to its TARGET. --transparent sets
// IP_TRANSPARENT on the listeners, so that one may listen on another host's address (the test
// routes that address's traffic into the relay's namespace, where a policy rule delivers it
// locally): the relay then stands in for the TARGET unseen, at the TARGET's own address.
//
// Prints "ready" once listening. Commands, one a line, `TAG COMMAND ARGS...`; each answers
// "TAG result ..." once in effect:
//   TAG delay up|down|both MS    delay each chunk forwarded that way by MS milliseconds (0: none)
//   TAG stall up|down|both       hold what arrives that way (the sockets stay open: TCP back-pressure)
//   TAG resume up|down|both      forward again what was held
//   TAG reset                    reset (RST) every open connection, both sides: "result resets=N"
//   TAG stats                    "result accepted=N up=BYTES down=BYTES resets=N"
//   TAG quit                     (or the end of stdin) closes everything and exits 0
// "up" is from the connecting side to the TARGET, "down" the way back.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include "core/asio_compat.hpp"
#include "../support/fault_proxy.hpp"

#include <netinet/in.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using tcp = asio::ip::tcp;
template <class T>
using Task = asio::awaitable<T, asio::any_io_executor>;
constexpr auto nothrow = tensorplay::detail::use_nothrow;

struct DirState {
    std::chrono::milliseconds delay{0};
    bool stalled = false;
    std::size_t forwarded = 0;
};
std::array<DirState, 2> dirs;  // [0] up, [1] down
std::size_t accepted = 0, resets = 0;

using Link = tensorplay::test::ProxiedLink;
std::vector<std::weak_ptr<Link>> links;

tcp::endpoint parse_endpoint(const std::string& s) {
    const auto colon = s.rfind(':');
    if (colon == std::string::npos) throw std::runtime_error("not host:port: " + s);
    return {asio::ip::make_address(s.substr(0, colon)), static_cast<std::uint16_t>(std::stoi(s.substr(colon + 1)))};
}

Task<void> pump(std::shared_ptr<Link> link, int d) {
    auto& from = d == 0 ? link->client : link->server;
    auto& to = d == 0 ? link->server : link->client;
    std::vector<std::uint8_t> buf(64 * 1024);
    asio::steady_timer timer(from.get_executor());
    for (;;) {
        auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), nothrow);
        if (link->dead) co_return;
        if (ec) {
            // Pass the ending on: a FIN as a half-close, anything else as a reset.
            if (ec == asio::error::eof) {
                std::error_code e2;
                to.shutdown(tcp::socket::shutdown_send, e2);
            } else {
                link->close(true);
            }
            co_return;
        }
        if (auto delay = dirs[d].delay; delay.count() > 0) {
            timer.expires_after(delay);
            (void)co_await timer.async_wait(nothrow);
        }
        while (dirs[d].stalled && !link->dead) {
            timer.expires_after(std::chrono::milliseconds(1));
            (void)co_await timer.async_wait(nothrow);
        }
        if (link->dead) co_return;
        auto [wec, w] = co_await asio::async_write(to, asio::buffer(buf.data(), n), nothrow);
        dirs[d].forwarded += w;
        if (wec) {
            link->close(true);
            co_return;
        }
    }
}

Task<void> connect_and_pump(std::shared_ptr<Link> link, tcp::endpoint target) {
    auto [ec] = co_await link->server.async_connect(target, nothrow);
    if (ec || link->dead) {
        link->close(true);
        co_return;
    }
    std::error_code ignored;
    link->client.set_option(tcp::no_delay(true), ignored);
    link->server.set_option(tcp::no_delay(true), ignored);
    auto ex = link->client.get_executor();
    asio::co_spawn(ex, pump(link, 0), asio::detached);
    asio::co_spawn(ex, pump(link, 1), asio::detached);
}

Task<void> accept_loop(std::shared_ptr<tcp::acceptor> acceptor, tcp::endpoint target, asio::io_context& ctx) {
    for (;;) {
        auto link = std::make_shared<Link>(ctx);
        auto [ec] = co_await acceptor->async_accept(link->client, nothrow);
        if (ec) co_return;
        ++accepted;
        std::erase_if(links, [](const std::weak_ptr<Link>& w) { return w.expired(); });
        links.push_back(link);
        asio::co_spawn(ctx, connect_and_pump(link, target), asio::detached);
    }
}

Task<void> control(asio::io_context& ctx) {
    asio::posix::stream_descriptor in(ctx, ::dup(0));
    std::string input;
    for (;;) {
        auto [ec, n] = co_await asio::async_read_until(in, asio::dynamic_buffer(input), '\n', nothrow);
        if (ec) break;
        const std::string line = input.substr(0, n - 1);
        input.erase(0, n);
        std::istringstream words(line);
        std::string tag, cmd, way;
        long ms = 0;
        words >> tag >> cmd >> way >> ms;
        const int lo = way == "down" ? 1 : 0, hi = way == "up" ? 0 : 1;
        if (cmd == "quit") break;
        std::string answer = "ok";
        if (cmd == "delay") {
            for (int d = lo; d <= hi; ++d) dirs[d].delay = std::chrono::milliseconds(ms);
        } else if (cmd == "stall" || cmd == "resume") {
            for (int d = lo; d <= hi; ++d) dirs[d].stalled = cmd == "stall";
        } else if (cmd == "reset") {
            std::size_t n = 0;
            for (auto& w : links)
                if (auto l = w.lock(); l && !l->dead) {
                    l->close(true);
                    ++n;
                }
            resets += n;
            answer = "resets=" + std::to_string(n);
        } else if (cmd == "stats") {
            answer = "accepted=" + std::to_string(accepted) + " up=" + std::to_string(dirs[0].forwarded) +
                     " down=" + std::to_string(dirs[1].forwarded) + " resets=" + std::to_string(resets);
        } else {
            answer = "error=unknown_command";
        }
        std::printf("%s result %s\n", tag.c_str(), answer.c_str());
        std::fflush(stdout);
    }
    ctx.stop();
}

}  // namespace

int main(int argc, char** argv) {
    asio::io_context ctx(1);
    bool transparent = false;
    try {
        std::vector<std::shared_ptr<tcp::acceptor>> acceptors;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            if (a == "--transparent") {
                transparent = true;
                continue;
            }
            const auto eq = a.find('=');
            if (eq == std::string::npos) throw std::runtime_error("not LISTEN=TARGET: " + a);
            const auto listen = parse_endpoint(a.substr(0, eq));
            const auto target = parse_endpoint(a.substr(eq + 1));
            auto acc = std::make_shared<tcp::acceptor>(ctx);
            acc->open(listen.protocol());
            acc->set_option(asio::socket_base::reuse_address(true));
            if (transparent) {
                int one = 1;
                if (::setsockopt(acc->native_handle(), SOL_IP, IP_TRANSPARENT, &one, sizeof one) != 0)
                    throw std::runtime_error("IP_TRANSPARENT: " + std::string(std::strerror(errno)));
            }
            acc->bind(listen);
            acc->listen();
            asio::co_spawn(ctx, accept_loop(acc, target, ctx), asio::detached);
            acceptors.push_back(std::move(acc));
        }
        if (acceptors.empty()) {
            std::fprintf(stderr, "usage: fault_relay [--transparent] LISTEN=TARGET... (host:port each)\n");
            return 2;
        }
        asio::co_spawn(ctx, control(ctx), asio::detached);
        std::printf("ready\n");
        std::fflush(stdout);
        ctx.run();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fault_relay: %s\n", e.what());
        return 1;
    }
    return 0;
}
