// Native agent, inbound connections: the accept loop and each connection's handshake, within two
// budgets: sockets held at once (max_inbound_connections) and handshakes at once
// (max_inbound_handshakes), where one more ends the oldest handshake. Warnings a peer can cause at
// will (refusals) are throttled.
#include "rpc/native_agent.hpp"

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"

#include <sys/socket.h>

#include <algorithm>

namespace tensorplay::detail {

namespace {

/// Logs a warning about a refused or ended inbound connection, or a failed accept, at most one a
/// second (a peer causes them at will).
void warn_refused(AgentCore& core, const std::string& what) {
    std::string note;
    if (core.refusals_logged.allow(note)) log(LogLevel::warn, "rpc", what + note);
}

Task<void> accept_inbound(std::shared_ptr<AgentCore> core, TransportStream stream, std::uint64_t ticket) {
    HandshakeAuth auth;
    auth.key = core->auth_key;
    auth.admit = [c = core.get()](const HelloInfo& peer) { return c->admit(peer); };  // (runs within this coroutine)
    // (A named task: its by-value arguments must not be temporaries of the co_await expression.)
    auto accepting = accept_stream(std::move(stream), core->hello(), core->tuning.limits, std::move(auth));
    auto c = co_await std::move(accepting);
    // First, before anything can be closed and its descriptor reused: off the handshake list.
    core->handshaking.erase(ticket);
    if (!c) {
        --core->inbound_open;
        // (The error names the peer's address and what it claimed; it never holds key or proof bytes.)
        if (core->state != AgentCore::State::closed)
            warn_refused(*core, "worker \"" + core->self.name + "\" rejected a connection: " + c.error().to_string());
        co_return;
    }
    if (core->state == AgentCore::State::closed || (*c)->redirected()) {
        // (Redirected: it negotiated only; the peer comes back over the chosen transport.)
        --core->inbound_open;
        (*c)->close();
        co_return;
    }
    core->adopt_connection(std::move(*c), -1);
}

/// Makes room for one more handshake: ends the oldest one in progress when there are
/// max_inbound_handshakes. Its socket is shut down, not closed: the descriptor stays its
/// handshake's (which fails at its next read or write, and then closes it).
void end_oldest_handshake(AgentCore& core) {
    const std::size_t limit = std::max<std::size_t>(core.tuning.max_inbound_handshakes, 1);
    while (core.handshaking.size() >= limit) {
        auto oldest = core.handshaking.begin();
        ::shutdown(oldest->second, SHUT_RDWR);
        core.handshaking.erase(oldest);
        warn_refused(core, "worker \"" + core.self.name + "\" has " + std::to_string(limit) +
                               " inbound connections in their handshake (NativeAgentTuning::max_inbound_handshakes): "
                               "ending the oldest");
    }
}

}  // namespace

Task<void> accept_loop(std::shared_ptr<AgentCore> core, Listener* listener) {
    // Peers are admitted against the roster, which start() reads after listening; a peer that is
    // faster waits in the listen backlog until then (within its handshake timeout).
    while (!core->roster_read && core->state == AgentCore::State::starting) {
        auto ec = co_await core->roster_known.wait();
        (void)ec;  // set() is the signal (also when closing)
    }
    for (;;) {
        if (core->state == AgentCore::State::closed) co_return;
        auto accepting = listener->accept();
        auto stream = co_await std::move(accepting);
        if (core->state == AgentCore::State::closed) co_return;
        if (!stream) {
            if (stream.error().code() == Errc::cancelled) co_return;
            warn_refused(*core, "accept failed on worker \"" + core->self.name + "\": " + stream.error().message());
            asio::steady_timer pause(core->ex, std::chrono::milliseconds(10));
            co_await pause.async_wait(use_nothrow);
            continue;
        }
        if (core->inbound_open >= core->tuning.max_inbound_connections) {
            if (!core->inbound_full_logged)
                log(LogLevel::warn, "rpc", "worker \"" + core->self.name + "\" holds " + std::to_string(core->inbound_open) +
                                               " inbound connections (NativeAgentTuning::max_inbound_connections): closing new ones");
            core->inbound_full_logged = true;
            std::error_code ignored;
            stream->socket.close(ignored);
            continue;
        }
        core->inbound_full_logged = false;
        end_oldest_handshake(*core);
        ++core->inbound_open;
        const std::uint64_t ticket = core->next_handshake++;
        core->handshaking.emplace(ticket, stream->socket.native_handle());
        if (!core->tasks.spawn(accept_inbound(core, std::move(*stream), ticket), "the handshake of an inbound connection")) {
            core->handshaking.erase(ticket);
            --core->inbound_open;  // (closing: the unstarted task closed the stream)
            co_return;
        }
    }
}

}  // namespace tensorplay::detail
