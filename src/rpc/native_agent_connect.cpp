// Native agent, outgoing connections: which published address to negotiate over, and the
// connection that the handshake's negotiation chose.
#include "rpc/native_agent.hpp"

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"

namespace tensorplay::detail {

Task<Result<std::shared_ptr<Connection>>> AgentCore::ensure_connected(int rank, Duration timeout) {
    auto keep = shared_from_this();
    const auto link = peers_.link(rank);  // (held across the awaits below: the member may leave meanwhile)
    if (!link) co_return fail(Errc::invalid_argument, "no worker of rank " + std::to_string(rank) + " in the group of worker \"" + config_.self.name + "\"");
    PeerLink& p = *link;
    for (;;) {
        if (life_.state() == State::closed) co_return fail(Errc::shutdown, "the agent of worker \"" + config_.self.name + "\" is shut down");
        if (p.removed) co_return fail(*p.removed);
        if (membership_.evicted()) co_return fail(*membership_.evicted());
        if (p.conn && p.conn->is_open()) co_return p.conn;
        if (!p.connecting) break;
        auto wait = p.connecting;  // (the connect may end, and a new one begin, while we wait)
        auto ec = co_await wait->wait();
        if (ec) co_return fail(from_error_code(ec, "waiting for the connection to worker \"" + p.info.name + "\""));
        if (!(p.conn && p.conn->is_open()) && p.last_connect_error) co_return fail(*p.last_connect_error);
        // Each turn of this loop must have waited: an event that was set without its connect
        // ending (the member removed, the agent closed) is caught by the checks above, and a set
        // event still in place here ends the wait instead of spinning the event loop.
        if (wait == p.connecting && wait->is_set() && !(p.conn && p.conn->is_open()))
            co_return fail(Errc::connection_lost, "the connection to worker \"" + p.info.name + "\" ended unfinished", p.info.name);
    }
    // Whoever waits on this connect resumes (in place) once it has ended, its outcome recorded.
    struct ConnectEnded {
        PeerLink& p;
        std::shared_ptr<Flag> done = std::make_shared<Flag>();
        ~ConnectEnded() {
            if (p.connecting == done) p.connecting.reset();
            done->set();
        }
    } ended{p};
    p.connecting = ended.done;
    auto limits = config_.tuning.limits;
    if (timeout > Duration::zero() && timeout < limits.handshake_timeout) limits.handshake_timeout = timeout;
    HandshakeAuth auth;
    auth.key = endpoint_.key();
    // The negotiation runs over the peer's lowest-priority address of a transport this worker
    // has (its list is in its priority order: uv, when both have it); the handshake then chooses.
    const TransportOffer* boot = nullptr;
    for (auto it = p.addresses.rbegin(); it != p.addresses.rend() && !boot; ++it)
        for (const auto& t : endpoint_.transports())
            if (t->name() == it->name) boot = &*it;
    Result<Address> address = fail(Errc::not_supported, "no common transport between worker \"" + config_.self.name + "\" (offers " +
                                                            offer_names(endpoint_.offers()) + ") and worker \"" + p.info.name +
                                                            "\" (offers " + offer_names(p.addresses) + ")");
    if (boot) address = Address::parse(boot->address);
    const std::string where = boot ? boot->address : std::string("(no common transport)");
    std::optional<Result<std::shared_ptr<Connection>>> c;
    if (!address) {
        c.emplace(fail(address.error()));
    } else {
        // (A named task: its by-value arguments must not be temporaries of the co_await expression.)
        auto connecting = Connection::connect(std::move(*address), hello(), limits, std::move(auth));
        c.emplace(co_await std::move(connecting));
    }
    if (!*c) {
        // A refusal (or a peer that fails our check of its key) is unauthorized, and no common
        // transport is not_supported: retrying will not help either.
        const Errc code = c->error().code();
        if (code == Errc::unauthorized)
            p.last_connect_error = Error(Errc::unauthorized, "cannot connect to worker \"" + p.info.name + "\": " + c->error().message(),
                                         p.info.name);
        else if (code == Errc::not_supported)
            p.last_connect_error = Error(Errc::not_supported, "cannot connect to worker \"" + p.info.name + "\": " + c->error().message(),
                                         p.info.name);
        else
            p.last_connect_error = Error(code == Errc::protocol_error ? Errc::protocol_error : Errc::connection_lost,
                                         "cannot reach worker \"" + p.info.name + "\" at " + where + ": " + c->error().message(),
                                         p.info.name);
        co_return fail(*p.last_connect_error);
    }
    auto& conn = **c;
    p.last_connect_error.reset();
    if (life_.state() == State::closed) {
        conn->close();
        co_return fail(Errc::shutdown, "the agent of worker \"" + config_.self.name + "\" is shut down");
    }
    if (p.removed) {  // (taken out of the group while the handshake ran)
        conn->close(*p.removed);
        co_return fail(*p.removed);
    }
    if (membership_.evicted()) {  // (we were, while it ran: a connection adopted now would carry calls past check_call)
        conn->close(*membership_.evicted());
        co_return fail(*membership_.evicted());
    }
    if (conn->peer().name != p.info.name || conn->peer().rank != rank) {
        conn->close();
        co_return fail(Errc::protocol_error, "expected worker \"" + p.info.name + "\" (rank " + std::to_string(rank) + ") at " +
                                                 where + ", found \"" + conn->peer().name + "\" (rank " +
                                                 std::to_string(conn->peer().rank) + ")");
    }
    log(LogLevel::debug, "rpc", "worker \"" + config_.self.name + "\" connected to worker \"" + p.info.name + "\" over " +
                                    conn->transport() + " (negotiated at " + where + ")");
    adopt_connection(conn, rank);
    co_return std::move(conn);
}

bool NativeAgent::cut_off_for_test(const std::string& name) {
    const int rank = core_->peers().rank_of(name);
    PeerLink* p = rank < 0 ? nullptr : core_->peers().at(rank);
    if (!p) return false;
    // (Port 1 on the loopback: nothing listens there, a connect is refused at once.)
    for (auto& a : p->addresses) a = TransportOffer{"uv", a.domain, "tcp://127.0.0.1:1"};
    if (p->conn) p->conn->close(Error(Errc::connection_lost, "the network path to worker \"" + name + "\" broke (test)", name));
    return true;
}

}  // namespace tensorplay::detail
