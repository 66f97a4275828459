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
constexpr std::size_t kMinRead = 512;
constexpr std::size_t kShrinkAbove = 1 << 20;

std::string endpoint_string(const asio::ip::tcp::endpoint& ep) {
    auto addr = ep.address();
    std::string host = addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string();
    return host + ":" + std::to_string(ep.port());
}

// Makes room to read towards `need` unread bytes (need <= limits was checked by the parser): compacts,
// and grows only when the buffer is full, doubling but never past `need`. A length that a client
// claims is thus backed by memory only as its bytes arrive (at most twice what arrived).
void reserve_input(StoreConn& c, std::size_t need) {
    const std::size_t unread = c.in_end - c.in_begin;
    const std::size_t min_free = std::min(need > unread ? need - unread : 1, kMinRead);
    if (c.in_begin > 0 && c.in_cap - c.in_end < min_free) {
        std::memmove(c.in.get(), c.in.get() + c.in_begin, unread);
        c.in_begin = 0;
        c.in_end = unread;
    }
    if (c.in_cap - c.in_end < min_free) {
        // need > unread here, so either `need` fits, or doubling leaves at least in_cap free.
        const std::size_t cap = std::max(kInitialReadBuffer, std::min(need, 2 * c.in_cap));
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

// Sends what send_dirty() could not: woken (wake) only when the socket's buffer was full.
// Each partial write counts as progress (close_stalled) and wakes a reader held by back-pressure.
Task<void> run_writer(std::shared_ptr<TcpStoreServer::Impl> server, std::shared_ptr<StoreConn> c) {
    while (!c->closed) {
        if (c->out.empty()) {
            co_await c->wake.wait();
            if (c->wake.error()) server->close(*c);  // cancelled: the server is stopping
            continue;
        }
        std::swap(c->out, c->writing);
        c->written = 0;
        c->writer_busy = true;
        std::error_code failed;
        while (c->written < c->writing.size() && !c->closed) {
            const auto rest = asio::buffer(c->writing.data() + c->written, c->writing.size() - c->written);
            auto [ec, n] = co_await c->socket.async_write_some(rest, detail::use_nothrow);
            if (ec) {
                failed = ec;
                break;
            }
            c->written += n;
            c->progress_at = Clock::now();
            if (c->queued() <= server->options.max_queued_output) c->drained.complete();  // (the reader runs here)
        }
        c->writer_busy = false;
        c->writing.clear();
        c->written = 0;
        if (c->writing.capacity() > kShrinkAbove) Bytes().swap(c->writing);
        if (failed) {
            if (!c->closed) log(LogLevel::debug, "store", "write to " + c->peer + " failed: " + failed.message());
            server->close(*c);
        } else if (c->queued() <= server->options.max_queued_output) {
            c->drained.complete();
        }
    }
    Bytes().swap(c->writing);
}

// Runs every complete request buffered while the connection's output is under max_queued_output
// (so one read cannot queue more than that plus one reply), then sends the replies and the
// wake-ups the batch caused, whatever happened. A request that fails (over a limit, or out of
// memory) leaves no partial reply and sets `why`. Returns the bytes needed before parsing can progress.
std::size_t serve_batch(StoreServerState& server, StoreConn& c, c10d::Request& request, std::string& why) noexcept {
    std::size_t need = 1;
    std::size_t mark = c.out.size();
    try {
        const std::size_t limit = server.options.max_queued_output;
        while (c.in_begin < c.in_end && !c.closed && c.overflow.empty() && c.queued() <= limit) {
            auto r = c10d::parse_request(c.dialect, {c.in.get() + c.in_begin, c.in_end - c.in_begin},
                                         server.limits, request);
            if (r.status == c10d::ParseStatus::incomplete) {
                need = r.size;
                break;
            }
            if (r.status == c10d::ParseStatus::error) {
                why = r.error;
                break;
            }
            mark = c.out.size();
            if (!server.handle(c, request, why)) {
                if (c.out.size() > mark) c.out.resize(mark);
                break;
            }
            c.in_begin += r.size;
        }
        if (!c.out.empty()) c.flush();
    } catch (...) {
        // Out of memory (or a bug): the request fails with its connection, nobody else's does.
        if (c.out.size() > mark) c.out.resize(mark);
        try {
            why = error_from_current_exception("serving a request").to_string();
        } catch (...) {
        }
        server.close(c);
    }
    server.send_dirty();  // this connection's replies and the waiters this batch woke
    return need;
}

Task<void> run_reader(std::shared_ptr<TcpStoreServer::Impl> server, std::shared_ptr<StoreConn> c) {
    c10d::Request request;
    std::size_t need = 1;  // unread bytes required before parsing can progress
    std::string why;
    while (!c->closed) {
        if (c->in_end - c->in_begin < need || c->in_begin == c->in_end) {
            try {
                reserve_input(*c, need);
            } catch (...) {
                server->close(*c);  // first: building the message may fail as well
                try {
                    why = "out of memory buffering a request of " + std::to_string(need) + " bytes";
                } catch (...) {
                }
                break;
            }
            auto [ec, n] = co_await c->socket.async_read_some(asio::buffer(c->in.get() + c->in_end, c->in_cap - c->in_end),
                                                              detail::use_nothrow);
            if (ec || c->closed) {
                if (!c->closed && ec != asio::error::eof && ec != asio::error::operation_aborted)
                    log(LogLevel::debug, "store", "read from " + c->peer + " failed: " + ec.message());
                break;
            }
            c->in_end += n;
            if (!c->heard) {
                c->heard = true;
                server->silent.erase(c->id);
            }
            if (c->in_end - c->in_begin < need) continue;
        }
        if (!c->sniffed) {
            c->in_begin += sniff(*c);
            if (!c->sniffed) {
                need = 5;
                continue;
            }
        }
        need = serve_batch(*server, *c, request, why);
        if (!why.empty() || c->closed) break;
        if (c->in_begin == c->in_end) {
            c->in_begin = c->in_end = 0;
            if (c->in_cap > kShrinkAbove) {
                c->in.reset(new std::uint8_t[kInitialReadBuffer]);
                c->in_cap = kInitialReadBuffer;
            }
        }
        // Back-pressure: a client that does not read its replies stops being read (and served)
        // until the socket has taken enough; close_stalled ends one that never reads.
        while (c->queued() > server->options.max_queued_output && !c->closed) {
            co_await c->drained.wait();
            if (c->drained.error()) server->close(*c);  // cancelled: the server is stopping
        }
    }
    if (!why.empty()) server->warn("closing connection from " + c->peer + ": " + why);
    server->close(*c);
}

// Closes, every quarter of queued_output_timeout (at most each second), the connections whose
// output has been stuck over max_queued_output for that long.
Task<void> run_sweeper(std::shared_ptr<TcpStoreServer::Impl> server) {
    using namespace std::chrono_literals;
    const Duration period = std::clamp<Duration>(server->options.queued_output_timeout / 4, 10ms, 1s);
    while (!server->stopped) {
        server->sweep.expires_after(period);
        co_await server->sweep.async_wait(detail::use_nothrow);
        if (server->stopped) break;
        server->close_stalled(Clock::now());
    }
}

/// Whether a connection just accepted may stay: within max_connections_per_host, and within
/// max_connections, which a connection that has not sent a byte yet makes way for (the oldest).
/// Refusals are logged once per burst.
bool admit_connection(TcpStoreServer::Impl& server, const std::string& host) {
    auto refuse = [&](const std::string& why) {
        if (!server.refusing) log(LogLevel::warn, "store", "refusing connections on " + server.address + ": " + why);
        server.refusing = true;
        return false;
    };
    // The oldest connection that has said nothing (from `from`, when given) makes way: a client
    // sends its first request when it connects, so one that holds a place in silence is the
    // likely attacker.
    auto make_way = [&](const std::string* from, const std::string& full) {
        for (const auto& [id, c] : server.silent) {
            if (from && c->host != *from) continue;
            if (!server.evicting)
                log(LogLevel::warn, "store", "on " + server.address + ", " + full + ": closing the oldest that have sent nothing");
            server.evicting = true;
            server.close(*c);
            return true;
        }
        return false;
    };
    bool made_way = false;
    if (const auto limit = server.options.max_connections_per_host; limit && !host.empty())
        if (auto it = server.per_host.find(host); it != server.per_host.end() && it->second >= limit) {
            const std::string full = std::to_string(it->second) + " are open from " + host + " (max_connections_per_host)";
            if (!make_way(&host, full)) return refuse(full + ", and each has sent requests");
            made_way = true;
        }
    if (const auto limit = server.options.max_connections; limit && server.conns.size() >= limit) {
        const std::string full = std::to_string(limit) + " are open (max_connections)";
        if (!make_way(nullptr, full)) return refuse(full + ", and each has sent requests");
        made_way = true;
    }
    if (!made_way) server.evicting = false;
    server.refusing = false;
    return true;
}

Task<void> run_acceptor(std::shared_ptr<TcpStoreServer::Impl> server, std::size_t index) {
    auto& acceptor = server->acceptors[index];
    asio::steady_timer backoff(server->strand);
    while (!server->stopped) {
        auto [ec, socket] = co_await acceptor.async_accept(detail::use_nothrow);
        if (server->stopped) break;
        if (ec) {
            // Out of descriptors or a transient network error: keep serving, retry shortly.
            server->warn("accept on " + server->address + " failed: " + ec.message());
            backoff.expires_after(std::chrono::milliseconds(50));
            co_await backoff.async_wait(detail::use_nothrow);
            continue;
        }
        std::error_code ignored;
        const auto peer = socket.remote_endpoint(ec);  // an error here: a peer already gone
        const std::string host = ec ? std::string() : peer.address().to_string();
        if (!admit_connection(*server, host)) {
            socket.close(ignored);
            continue;
        }
        socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        socket.non_blocking(true, ignored);  // send_dirty's direct sends must never block the strand
        std::shared_ptr<StoreConn> c;
        try {
            c = std::make_shared<StoreConn>(*server, std::move(socket), server->next_conn_id++,
                                            ec ? std::string() : endpoint_string(peer), host);
            server->conns.insert(c.get());
            server->silent.emplace(c->id, c.get());
            if (!c->host.empty()) ++server->per_host[c->host];
            // The writer first: the reader may run up to its first read before spawn() returns.
            if (!server->spawn(run_writer(server, c), "a store connection's writer") ||
                !server->spawn(run_reader(server, c), "a store connection's reader"))
                server->close(*c);
        } catch (...) {
            // Out of memory: drop this connection, keep accepting.
            if (c) server->close(*c);
            log(LogLevel::warn, "store", error_from_current_exception("accepting a connection").to_string());
        }
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
    server.dirty.push_back(shared_from_this());  // may throw: then not marked dirty
    dirty = true;
}

void StoreServerState::send_dirty() noexcept {
    sending.swap(dirty);  // close() below may edit `dirty`, never `sending`
    for (auto& entry : sending) {
        StoreConn& c = *entry;
        c.dirty = false;
        if (c.closed) continue;
        try {
            if (!c.overflow.empty()) {
                warn("closing connection from " + c.peer + ": " + c.overflow);
                close(c);
                continue;
            }
            if (c.out.empty()) continue;
            if (c.writer_busy) continue;  // after its write, the writer sends `out` too
            std::error_code ec;
            const std::size_t n = c.socket.send(asio::buffer(c.out), 0, ec);
            if (!ec && n == c.out.size()) {
                c.out.clear();
                if (c.out.capacity() > kShrinkAbove) Bytes().swap(c.out);
                continue;
            }
            if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
                log(LogLevel::debug, "store", "write to " + c.peer + " failed: " + ec.message());
                close(c);
                continue;
            }
            if (!ec) c.out.erase(c.out.begin(), c.out.begin() + static_cast<std::ptrdiff_t>(n));
            c.progress_at = Clock::now();  // the writer starts waiting for the socket now
            c.wake.complete();  // the writer (resumed here) sends the rest when the socket can take it
        } catch (...) {
            close(c);  // a log line could not be built: out of memory
        }
    }
    sending.clear();
}

StoreConn::StoreConn(StoreServerState& s, asio::ip::tcp::socket sock, std::uint64_t conn_id, std::string endpoint,
                     std::string from_host)
    : server(s), socket(std::move(sock)), id(conn_id), host(std::move(from_host)), wake(s.slots), drained(s.slots) {
    peer = endpoint.empty() ? "connection " + std::to_string(id) : std::move(endpoint);
}
}  // namespace detail

TcpStoreServer::TcpStoreServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() { stop(); }

Result<std::shared_ptr<TcpStoreServer>> TcpStoreServer::start(Executor executor, TcpStoreServerOptions options) {
    try {
        if (options.max_queued_output_hard < options.max_queued_output)
            return fail(Errc::invalid_argument,
                        "store server options: max_queued_output_hard (" + std::to_string(options.max_queued_output_hard) +
                            ") is below max_queued_output (" + std::to_string(options.max_queued_output) + ")");
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
        // (Not yet shared: the state is touched here, then only on the strand.)
        for (std::size_t i = 0; i < impl->acceptors.size(); ++i) impl->spawn(run_acceptor(impl, i), "a store acceptor");
        if (opts.queued_output_timeout > Duration::zero()) impl->spawn(run_sweeper(impl), "the store's output sweeper");
        log(LogLevel::info, "store", "store server listening on " + impl->address);
        return std::make_shared<TcpStoreServer>(std::move(impl));
    } catch (...) {
        return fail(error_from_current_exception("starting the store server"));
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
