// Endpoint: listening on every transport, and the inbound side within two budgets: sockets held at
// once (max_connections) and handshakes at once (max_handshakes), where one more ends the oldest
// handshake. Warnings a peer can cause at will (refusals) are throttled.
#include "rpc/endpoint.hpp"

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"
#include "transport/connection_ext.hpp"

#include <asio/steady_timer.hpp>

#include <sys/socket.h>

#include <algorithm>

namespace tensorplay::detail {

Endpoint::Endpoint(std::string worker, InboundLimits limits, ConnectionLimits connection, InboundHooks hooks)
    : worker_(std::move(worker)), limits_(limits), connection_(std::move(connection)), hooks_(std::move(hooks)) {}

Endpoint::~Endpoint() {
    for (auto& l : listeners_) l->close();
}

Result<void> Endpoint::listen(Executor ex, const std::optional<std::vector<std::string>>& wanted, const std::string& tcp_address) {
    auto chosen = select_transports(wanted);
    if (!chosen) return fail(chosen.error());
    ListenSpec spec;
    spec.tcp_address = tcp_address;
    for (auto& t : *chosen) {
        auto l = t->listen(ex, spec);
        if (!l) return fail(std::move(l).error().context("listening for transport \"" + std::string(t->name()) + "\""));
        const Address& a = (*l)->address();
        if (a.transport() == "uv" && host_.empty()) {
            host_ = a.host;
            port_ = a.port;
        }
        offers_.push_back(TransportOffer{std::string(t->name()), t->domain(), a.str()});
        listeners_.push_back(std::move(*l));
        transports_.push_back(std::move(t));
    }
    return ok();
}

void Endpoint::warn(const std::string& what) {
    std::string note;
    if (refusals_logged_.allow(note)) log(LogLevel::warn, "rpc", what + note);
}

Task<void> Endpoint::handshake(TransportStream stream, std::uint64_t ticket) {
    HandshakeAuth auth;
    auth.key = key_;
    auth.admit = hooks_.admit;  // (runs within this coroutine)
    // (A named task: its by-value arguments must not be temporaries of the co_await expression.)
    auto accepting = accept_stream(std::move(stream), hooks_.hello(), connection_, std::move(auth));
    auto c = co_await std::move(accepting);
    // First, before anything can be closed and its descriptor reused: off the handshake list.
    handshaking_.erase(ticket);
    if (!c) {
        --inbound_open_;
        // (The error names the peer's address and what it claimed; it never holds key or proof bytes.)
        if (!closed_) warn("worker \"" + worker_ + "\" rejected a connection: " + c.error().to_string());
        co_return;
    }
    if (closed_ || (*c)->redirected()) {
        // (Redirected: it negotiated only; the peer comes back over the chosen transport.)
        --inbound_open_;
        (*c)->close();
        co_return;
    }
    hooks_.adopt(std::move(*c));
}

/// Makes room for one more handshake: ends the oldest one in progress when there are
/// max_handshakes. Its socket is shut down, not closed: the descriptor stays its handshake's
/// (which fails at its next read or write, and then closes it).
void Endpoint::end_oldest_handshake() {
    const std::size_t limit = std::max<std::size_t>(limits_.max_handshakes, 1);
    while (handshaking_.size() >= limit) {
        auto oldest = handshaking_.begin();
        ::shutdown(oldest->second, SHUT_RDWR);
        handshaking_.erase(oldest);
        warn("worker \"" + worker_ + "\" has " + std::to_string(limit) +
             " inbound connections in their handshake (NativeAgentTuning::max_inbound_handshakes): ending the oldest");
    }
}

Task<void> Endpoint::accept_loop(std::size_t i) {
    Listener* listener = listeners_.at(i).get();
    for (;;) {
        if (closed_) co_return;
        auto accepting = listener->accept();
        auto stream = co_await std::move(accepting);
        if (closed_) co_return;
        if (!stream) {
            if (stream.error().code() == Errc::cancelled) co_return;
            warn("accept failed on worker \"" + worker_ + "\": " + stream.error().message());
            asio::steady_timer pause(co_await asio::this_coro::executor, std::chrono::milliseconds(10));
            co_await pause.async_wait(use_nothrow);
            continue;
        }
        if (inbound_open_ >= limits_.max_connections) {
            if (!full_logged_)
                log(LogLevel::warn, "rpc", "worker \"" + worker_ + "\" holds " + std::to_string(inbound_open_) +
                                               " inbound connections (NativeAgentTuning::max_inbound_connections): closing new ones");
            full_logged_ = true;
            std::error_code ignored;
            stream->socket.close(ignored);
            continue;
        }
        full_logged_ = false;
        end_oldest_handshake();
        ++inbound_open_;
        const std::uint64_t ticket = next_ticket_++;
        handshaking_.emplace(ticket, stream->socket.native_handle());
        if (!hooks_.spawn(handshake(std::move(*stream), ticket), "the handshake of an inbound connection")) {
            handshaking_.erase(ticket);
            --inbound_open_;  // (closing: the unstarted task closed the stream)
            co_return;
        }
    }
}

void Endpoint::track(const std::shared_ptr<Connection>& c) {
    std::erase_if(inbound_, [](const std::weak_ptr<Connection>& w) { return w.expired(); });
    inbound_.push_back(c);
}

void Endpoint::inbound_closed() noexcept {
    if (inbound_open_ > 0) --inbound_open_;
}

void Endpoint::for_each_inbound(const std::function<void(Connection&)>& fn) {
    const auto now = inbound_;  // (fn may close them: their close handlers then run)
    for (const auto& w : now)
        if (auto c = w.lock()) fn(*c);
}

void Endpoint::close(const std::optional<Error>& why) {
    closed_ = true;
    for (auto& l : listeners_) l->close();
    for_each_inbound([&](Connection& c) { c.close(why); });
    inbound_.clear();
}

}  // namespace tensorplay::detail
