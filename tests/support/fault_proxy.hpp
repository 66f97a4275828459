// FaultProxy: a TCP proxy for fault tests that forwards 127.0.0.1:<port> to a target and injects
// scripted faults per direction (delay, cut after N bytes with FIN or RST, corrupt a byte, stall,
// reset now).
//
// Usage: FaultProxy p("127.0.0.1", server_port); connect to p.port() instead of the server;
// then e.g. p.stall(Direction::to_server), p.cut_after(Direction::to_client, 10, Cut::rst),
// p.corrupt_at(Direction::to_server, 0), p.reset_all(). The proxy runs on its own io_context
// thread; every control call is thread-safe and has taken effect when it returns. Byte offsets
// (cut_after, corrupt_at) count the bytes forwarded in that direction, over all connections,
// from the moment the fault is armed; each such fault fires once and then disarms.
#pragma once

#include <tensorplay/core/task.hpp>

#include "core/asio_compat.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tensorplay::test {

/// Which way bytes travel through the proxy.
enum class Direction { to_server, to_client };
/// How a connection is cut: an orderly FIN, or an RST (SO_LINGER 0).
enum class Cut { fin, rst };

/// One proxied connection: the accepted (client) socket and the one to the target (also the fault
/// relay's, tests/rpc/fault_relay.cpp).
struct ProxiedLink {
    asio::ip::tcp::socket client, server;
    bool dead = false;
    explicit ProxiedLink(asio::io_context& c) : client(c), server(c) {}
    /// Closes both sockets, with RSTs (`rst`) or FINs; once.
    void close(bool rst) {
        if (dead) return;
        dead = true;
        for (auto* s : {&client, &server}) {
            std::error_code ec;
            if (rst) s->set_option(asio::socket_base::linger(true, 0), ec);
            else s->shutdown(asio::ip::tcp::socket::shutdown_both, ec);
            s->close(ec);
        }
    }
};

class FaultProxy {
public:
    /// Listens on 127.0.0.1:0 and forwards each accepted connection to target_host:target_port.
    FaultProxy(std::string target_host, std::uint16_t target_port)
        : target_(asio::ip::make_address(target_host), target_port), acceptor_(ctx_), work_(ctx_.get_executor()) {
        asio::ip::tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
        acceptor_.open(ep.protocol());
        acceptor_.set_option(asio::socket_base::reuse_address(true));
        acceptor_.bind(ep);
        acceptor_.listen();
        port_ = acceptor_.local_endpoint().port();
        asio::co_spawn(ctx_, accept_loop(), asio::detached);
        thread_ = std::thread([this] { ctx_.run(); });
    }
    FaultProxy(const FaultProxy&) = delete;
    FaultProxy& operator=(const FaultProxy&) = delete;
    /// Closes every connection (FIN) and stops the proxy's thread.
    ~FaultProxy() {
        apply([this] {
            stopping_ = true;
            std::error_code ec;
            acceptor_.close(ec);
            for (auto& w : links_)
                if (auto l = w.lock()) l->close(false);
            for (auto& d : dirs_) d.stalled = false;
        });
        work_.reset();
        thread_.join();
    }

    /// The port the proxy listens on (127.0.0.1).
    [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
    /// "127.0.0.1:<port>".
    [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

    /// Delays every chunk forwarded in `d` by `delay` (0: none).
    void delay(Direction d, std::chrono::milliseconds delay) {
        apply([&] { dir(d).delay = delay; });
    }
    /// Forwards `n` more bytes in `d`, then cuts that connection (both sides) with `how`.
    void cut_after(Direction d, std::size_t n, Cut how = Cut::fin) {
        apply([&] {
            dir(d).cut_left = n;
            dir(d).cut_how = how;
        });
    }
    /// XORs `mask` into the byte `offset` bytes further in `d` (offset 0: the next byte forwarded).
    void corrupt_at(Direction d, std::size_t offset, std::uint8_t mask = 0xFF) {
        apply([&] {
            dir(d).corrupt_left = offset;
            dir(d).corrupt_mask = mask;
        });
    }
    /// Stops forwarding in `d`; the sockets stay open and what arrives is held (TCP back-pressure).
    void stall(Direction d) {
        apply([&] { dir(d).stalled = true; });
    }
    /// Forwards again in `d` what was held by stall().
    void resume(Direction d) {
        apply([&] { dir(d).stalled = false; });
    }
    /// Resets (RST) every open connection now, both sides.
    void reset_all() { close_all(Cut::rst); }
    /// Closes every open connection now, both sides, with `how`.
    void close_all(Cut how = Cut::fin) {
        apply([&] {
            for (auto& w : links_)
                if (auto l = w.lock()) l->close(how == Cut::rst);
        });
    }
    /// Connections accepted so far.
    [[nodiscard]] std::size_t accepted() const noexcept { return accepted_.load(); }
    /// Connections cut by a fault so far (cut_after, reset_all, close_all).
    [[nodiscard]] std::size_t cuts() const noexcept { return cuts_.load(); }
    /// Bytes forwarded in `d` so far, over all connections.
    [[nodiscard]] std::size_t forwarded(Direction d) const noexcept { return forwarded_[index(d)].load(); }

private:
    using tcp = asio::ip::tcp;

    struct DirState {
        std::chrono::milliseconds delay{0};
        bool stalled = false;
        std::optional<std::size_t> cut_left;
        Cut cut_how = Cut::fin;
        std::optional<std::size_t> corrupt_left;
        std::uint8_t corrupt_mask = 0xFF;
    };

    using Link = ProxiedLink;

    static std::size_t index(Direction d) { return d == Direction::to_server ? 0 : 1; }
    DirState& dir(Direction d) { return dirs_[index(d)]; }

    // Runs `fn` on the proxy's thread and waits until it has run.
    template <class F>
    void apply(F&& fn) {
        std::promise<void> done;
        asio::post(ctx_, [&] {
            fn();
            done.set_value();
        });
        done.get_future().wait();
    }

    Task<void> accept_loop() {
        for (;;) {
            auto link = std::make_shared<Link>(ctx_);
            auto [ec] = co_await acceptor_.async_accept(link->client, detail::use_nothrow);
            if (ec || stopping_) co_return;
            accepted_++;
            std::erase_if(links_, [](const std::weak_ptr<Link>& w) { return w.expired(); });
            links_.push_back(link);
            asio::co_spawn(ctx_, connect_and_pump(link), asio::detached);
        }
    }

    Task<void> connect_and_pump(std::shared_ptr<Link> link) {
        auto [ec] = co_await link->server.async_connect(target_, detail::use_nothrow);
        if (ec || link->dead) {
            link->close(true);
            co_return;
        }
        std::error_code ignored;
        link->client.set_option(tcp::no_delay(true), ignored);
        link->server.set_option(tcp::no_delay(true), ignored);
        asio::co_spawn(ctx_, pump(link, Direction::to_server), asio::detached);
        asio::co_spawn(ctx_, pump(link, Direction::to_client), asio::detached);
    }

    // Forwards one direction of one link, applying that direction's faults to each chunk.
    Task<void> pump(std::shared_ptr<Link> link, Direction d) {
        auto& from = d == Direction::to_server ? link->client : link->server;
        auto& to = d == Direction::to_server ? link->server : link->client;
        std::array<std::uint8_t, 64 * 1024> buf;
        asio::steady_timer timer(ctx_);
        for (;;) {
            auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), detail::use_nothrow);
            if (link->dead) co_return;
            if (ec) {
                // Pass the peer's ending on: a FIN as a half-close, anything else as a reset.
                if (ec == asio::error::eof) {
                    std::error_code e2;
                    to.shutdown(tcp::socket::shutdown_send, e2);
                } else {
                    link->close(true);
                }
                co_return;
            }
            if (auto delay = dir(d).delay; delay.count() > 0) {
                timer.expires_after(delay);
                (void)co_await timer.async_wait(detail::use_nothrow);
            }
            while (dir(d).stalled && !link->dead) {
                timer.expires_after(std::chrono::milliseconds(1));
                (void)co_await timer.async_wait(detail::use_nothrow);
            }
            if (link->dead) co_return;
            auto& s = dir(d);
            if (s.corrupt_left) {
                if (*s.corrupt_left < n) {
                    buf[*s.corrupt_left] ^= s.corrupt_mask;
                    s.corrupt_left.reset();
                } else {
                    *s.corrupt_left -= n;
                }
            }
            std::size_t pass = n;
            bool cut = false;
            Cut how = Cut::fin;
            if (s.cut_left) {
                if (*s.cut_left <= n) {
                    pass = *s.cut_left;
                    cut = true;
                    how = s.cut_how;
                    s.cut_left.reset();
                } else {
                    *s.cut_left -= n;
                }
            }
            if (pass > 0) {
                auto [wec, w] = co_await asio::async_write(to, asio::buffer(buf.data(), pass), detail::use_nothrow);
                forwarded_[index(d)] += w;
                if (wec) {
                    link->close(true);
                    co_return;
                }
            }
            if (cut) {
                cuts_++;
                link->close(how == Cut::rst);
                co_return;
            }
        }
    }

    asio::io_context ctx_{1};
    tcp::endpoint target_;
    tcp::acceptor acceptor_;
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::uint16_t port_ = 0;
    bool stopping_ = false;
    std::array<DirState, 2> dirs_{};
    std::vector<std::weak_ptr<Link>> links_;
    std::atomic<std::size_t> accepted_{0}, cuts_{0};
    std::array<std::atomic<std::size_t>, 2> forwarded_{};
    std::thread thread_;
};

}  // namespace tensorplay::test
