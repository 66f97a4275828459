// TcpStoreServer: listening, per-connection reader/writer coroutines and the dialect sniffer.
#include <tensorplay/store/tcp_store.hpp>

#include "core/asio_compat.hpp"
#include "store/tcp_store_server_impl.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>

#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/ip/v6_only.hpp>
#include <asio/post.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <cstring>

namespace tensorplay {

using detail::StoreConn;
using detail::StoreServerState;
namespace c10d = detail::c10d;

struct TcpStoreServer::Impl : StoreServerState {
    using StoreServerState::StoreServerState;
};

namespace {

constexpr std::size_t kInitialReadBuffer = 4096;
constexpr std::size_t kShrinkAbove = 1 << 20;
constexpr std::size_t kOutHighWater = 8 << 20;

std::string endpoint_string(const asio::ip::tcp::endpoint& ep) {
    auto addr = ep.address();
    std::string host = addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string();
    return host + ":" + std::to_string(ep.port());
}

void log_spawn_error(std::exception_ptr e, std::string_view what) {
    if (!e) return;
    log(LogLevel::error, "store", detail::error_from_exception_ptr(e, what).to_string());
}

// Makes room for `need` unread bytes (need <= limits was checked by the parser) and compacts.
void reserve_input(StoreConn& c, std::size_t need) {
    const std::size_t unread = c.in_end - c.in_begin;
    if (c.in_begin > 0 && (c.in_cap - c.in_end < std::max<std::size_t>(need > unread ? need - unread : 0, 512))) {
        std::memmove(c.in.get(), c.in.get() + c.in_begin, unread);
        c.in_begin = 0;
        c.in_end = unread;
    }
    if (need > c.in_cap || (c.in_cap - c.in_end) < 512) {
        std::size_t cap = std::max({need, c.in_cap * 2, kInitialReadBuffer});
        auto bigger = std::unique_ptr<std::uint8_t[]>(new std::uint8_t[cap]);
        if (unread > 0) std::memcpy(bigger.get(), c.in.get() + c.in_begin, unread);  // c.in may be null
        c.in = std::move(bigger);
        c.in_cap = cap;
        c.in_begin = 0;
        c.in_end = unread;
    }
}

// Decides the dialect from the first bytes: 00 CE F7 85 3C is PyTorch 2.x's VALIDATE; anything
// else is a PyTorch 1.13 query (whose SET would carry a key length no client sends). Returns the
// bytes consumed, 0 when more bytes are needed.
std::size_t sniff(StoreConn& c) {
    const std::uint8_t* p = c.in.get() + c.in_begin;
    const std::size_t n = c.in_end - c.in_begin;
    if (n == 0) return 0;
    if (p[0] != 0) {
        c.sniffed = true;
        c.dialect = c10d::Dialect::legacy;
        return 0;
    }
    if (n < 5) return 0;
    c.sniffed = true;
    if (c10d::get_u32(p + 1) == c10d::kValidationMagic) {
        c.dialect = c10d::Dialect::modern;
        return 5;
    }
    c.dialect = c10d::Dialect::legacy;
    return 0;
}

// Sends what send_dirty() could not: woken (wake.cancel) only when the socket's buffer was full.
Task<void> run_writer(std::shared_ptr<TcpStoreServer::Impl> server, std::shared_ptr<StoreConn> c) {
    while (!c->closed) {
        if (c->out.empty()) {
            c->wake.expires_at(asio::steady_timer::time_point::max());
            co_await c->wake.async_wait(detail::use_nothrow);
            continue;
        }
        std::swap(c->out, c->writing);
        c->writer_busy = true;
        auto [ec, n] = co_await asio::async_write(c->socket, asio::buffer(c->writing), detail::use_nothrow);
        (void)n;
        c->writer_busy = false;
        c->writing.clear();
        c->drained.cancel();
        if (ec) {
            if (!c->closed) log(LogLevel::debug, "store", "write to " + c->peer + " failed: " + ec.message());
            server->close(*c);
        }
    }
    if (c->writing.capacity() > kShrinkAbove) Bytes().swap(c->writing);
}

Task<void> run_reader(std::shared_ptr<TcpStoreServer::Impl> server, std::shared_ptr<StoreConn> c) {
    c10d::Request request;
    std::size_t need = 1;  // unread bytes required before parsing can progress
    std::string why;
    while (!c->closed) {
        if (c->in_end - c->in_begin < need || c->in_begin == c->in_end) {
            reserve_input(*c, need);
            // (a read that empties the socket tells the reactor so: no EAGAIN read before the next wait)
            auto [ec, n] = co_await detail::async_edge_read(
                c->socket, asio::buffer(c->in.get() + c->in_end, c->in_cap - c->in_end), c->edge, detail::use_nothrow);
            if (ec || c->closed) {
                if (!c->closed && ec != asio::error::eof && ec != asio::error::operation_aborted)
                    log(LogLevel::debug, "store", "read from " + c->peer + " failed: " + ec.message());
                break;
            }
            c->in_end += n;
            if (c->in_end - c->in_begin < need) continue;
        }
        if (!c->sniffed) {
            c->in_begin += sniff(*c);
            if (!c->sniffed) {
                need = 5;
                continue;
            }
        }
        // Run every complete request buffered, then hand all replies to the writer at once.
        need = 1;
        while (c->in_begin < c->in_end && !c->closed) {
            auto r = c10d::parse_request(c->dialect, {c->in.get() + c->in_begin, c->in_end - c->in_begin},
                                         server->limits, request);
            if (r.status == c10d::ParseStatus::incomplete) {
                need = r.size;
                break;
            }
            if (r.status == c10d::ParseStatus::error) {
                why = r.error;
                break;
            }
            if (!server->handle(*c, request, why)) break;
            c->in_begin += r.size;
        }
        if (!c->out.empty()) c->flush();
        server->send_dirty();  // this connection's replies and the waiters this batch woke
        if (!why.empty()) {
            log(LogLevel::warn, "store", "closing connection from " + c->peer + ": " + why);
            break;
        }
        if (c->in_begin == c->in_end) {
            c->in_begin = c->in_end = 0;
            if (c->in_cap > kShrinkAbove) {
                c->in.reset(new std::uint8_t[kInitialReadBuffer]);
                c->in_cap = kInitialReadBuffer;
            }
        }
        // Back-pressure: a client that does not read its replies stops being read.
        while (c->out.size() + c->writing.size() > kOutHighWater && !c->closed) {
            c->drained.expires_at(asio::steady_timer::time_point::max());
            co_await c->drained.async_wait(detail::use_nothrow);
        }
    }
    server->close(*c);
}

Task<void> run_acceptor(std::shared_ptr<TcpStoreServer::Impl> server, std::size_t index) {
    auto& acceptor = server->acceptors[index];
    asio::steady_timer backoff(server->strand);
    while (!server->stopped) {
        auto [ec, socket] = co_await acceptor.async_accept(detail::use_nothrow);
        if (server->stopped) break;
        if (ec) {
            // Out of descriptors or a transient network error: keep serving, retry shortly.
            log(LogLevel::warn, "store", "accept on " + server->address + " failed: " + ec.message());
            backoff.expires_after(std::chrono::milliseconds(50));
            co_await backoff.async_wait(detail::use_nothrow);
            continue;
        }
        std::error_code ignored;
        socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        socket.non_blocking(true, ignored);  // send_dirty's direct sends must never block the strand
        auto c = std::make_shared<StoreConn>(*server, std::move(socket), server->next_conn_id++);
        server->conns.insert(c.get());
        asio::co_spawn(server->strand, run_reader(server, c),
                       [](std::exception_ptr e) { log_spawn_error(e, "store connection reader"); });
        asio::co_spawn(server->strand, run_writer(server, c),
                       [](std::exception_ptr e) { log_spawn_error(e, "store connection writer"); });
    }
}

Result<void> open_acceptor(asio::ip::tcp::acceptor& a, const asio::ip::tcp::endpoint& ep, int backlog,
                           bool dual_stack) {
    std::error_code ec;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec && dual_stack) a.set_option(asio::ip::v6_only(false), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(backlog, ec);
    if (ec) {
        std::error_code ignored;
        a.close(ignored);
        return fail(from_error_code(ec, "listening on " + endpoint_string(ep)));
    }
    return ok();
}

}  // namespace

namespace detail {
void StoreConn::flush() {
    if (dirty || closed) return;
    dirty = true;
    server.dirty.push_back(this);
}

void StoreServerState::send_dirty() {
    // Every connection listed is alive: entries are added and removed within one strand handler.
    for (std::size_t i = 0; i < dirty.size(); ++i) {
        StoreConn& c = *dirty[i];
        c.dirty = false;
        if (c.closed || c.out.empty()) continue;
        if (c.writer_busy) {
            c.wake.cancel();  // after its write, the writer sends `out` too
            continue;
        }
        std::error_code ec;
        const std::size_t n = c.socket.send(asio::buffer(c.out), 0, ec);
        if (!ec && n == c.out.size()) {
            c.out.clear();
            continue;
        }
        if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
            log(LogLevel::debug, "store", "write to " + c.peer + " failed: " + ec.message());
            close(c);
            continue;
        }
        if (!ec) c.out.erase(c.out.begin(), c.out.begin() + static_cast<std::ptrdiff_t>(n));
        c.wake.cancel();  // the writer sends the rest when the socket can take it
    }
    dirty.clear();
}

StoreConn::StoreConn(StoreServerState& s, asio::ip::tcp::socket sock, std::uint64_t conn_id)
    : server(s), socket(std::move(sock)), id(conn_id), wake(s.strand), drained(s.strand) {
    std::error_code ec;
    auto ep = socket.remote_endpoint(ec);
    peer = ec ? "connection " + std::to_string(id) : endpoint_string(ep);
}
}  // namespace detail

TcpStoreServer::TcpStoreServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() { stop(); }

Result<std::shared_ptr<TcpStoreServer>> TcpStoreServer::start(Executor executor, TcpStoreServerOptions options) {
    try {
        auto impl = std::make_shared<Impl>(std::move(executor), std::move(options));
        const auto& opts = impl->options;
        impl->acceptors.emplace_back(impl->strand);
        auto& acceptor = impl->acceptors.back();
        if (opts.host.empty()) {
            // IPv6 dual-stack first (serves IPv4 too), then IPv4 only, as c10d does.
            auto r = open_acceptor(acceptor, {asio::ip::tcp::v6(), opts.port}, opts.backlog, true);
            if (!r) {
                auto r4 = open_acceptor(acceptor, {asio::ip::tcp::v4(), opts.port}, opts.backlog, false);
                if (!r4) return fail(std::move(r4).error().context("starting the store server"));
            }
        } else {
            asio::ip::tcp::resolver resolver(impl->strand);
            std::error_code ec;
            auto found = resolver.resolve(opts.host, std::to_string(opts.port),
                                          asio::ip::resolver_base::passive, ec);
            if (ec || found.empty())
                return fail(Errc::invalid_argument, "store server host \"" + opts.host + "\" does not resolve" +
                                                        (ec ? ": " + ec.message() : std::string()));
            Result<void> r = fail(Errc::io_error, "no address");
            for (const auto& entry : found) {
                r = open_acceptor(acceptor, entry.endpoint(), opts.backlog, false);
                if (r) break;
            }
            if (!r) return fail(std::move(r).error().context("starting the store server"));
        }
        std::error_code ec;
        auto local = acceptor.local_endpoint(ec);
        if (ec) return fail(from_error_code(ec, "reading the store server's bound address"));
        impl->port = local.port();
        impl->address = endpoint_string(local);
        for (std::size_t i = 0; i < impl->acceptors.size(); ++i)
            asio::co_spawn(impl->strand, run_acceptor(impl, i),
                           [](std::exception_ptr e) { log_spawn_error(e, "store acceptor"); });
        log(LogLevel::info, "store", "store server listening on " + impl->address);
        return std::make_shared<TcpStoreServer>(std::move(impl));
    } catch (...) {
        return fail(detail::error_from_current_exception("starting the store server"));
    }
}

std::uint16_t TcpStoreServer::port() const noexcept { return impl_->port; }

std::string TcpStoreServer::address() const { return impl_->address; }

void TcpStoreServer::stop() {
    if (!impl_) return;
    asio::dispatch(impl_->strand, [impl = impl_] { impl->stop_all(); });
}

namespace {
// Named coroutines (not capturing lambdas) so that the state they read outlives them for sure.
Task<std::size_t> count_keys(std::shared_ptr<TcpStoreServer::Impl> impl) { co_return impl->data.size(); }
Task<std::size_t> count_connections(std::shared_ptr<TcpStoreServer::Impl> impl) { co_return impl->conns.size(); }
}  // namespace

Task<std::size_t> TcpStoreServer::num_keys() const {
    auto impl = impl_;
    auto [e, n] = co_await asio::co_spawn(impl->strand, count_keys(impl), detail::use_nothrow);
    co_return e ? 0 : n;
}

Task<std::size_t> TcpStoreServer::num_connections() const {
    auto impl = impl_;
    auto [e, n] = co_await asio::co_spawn(impl->strand, count_connections(impl), detail::use_nothrow);
    co_return e ? 0 : n;
}

}  // namespace tensorplay
