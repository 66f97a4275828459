// Private: where an agent is reached. One listener per transport (priority order) and the offers
// that its hello and its store record carry; the group's key; and the inbound side: accepting
// within two budgets (sockets held at once, handshakes at once: one more ends the oldest), each
// inbound handshake with the key and the owner's admission check, and the inbound connections
// that passed it. Strand-bound, like the agent that owns it.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/transport/connection.hpp>

#include "core/log_throttle.hpp"
#include "transport/connection_ext.hpp"
#include "transport/transport.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tensorplay::detail {

/// How many inbound sockets an Endpoint holds (see NativeAgentTuning).
struct InboundLimits {
    std::size_t max_connections = 4096;  ///< held at once; beyond it new ones are closed at once
    std::size_t max_handshakes = 64;     ///< in their handshake at once; one more ends the oldest
};

/// What an Endpoint asks of its owner for inbound peers (called on the endpoint's strand).
struct InboundHooks {
    std::function<HelloInfo()> hello;                             ///< our hello, with our offers
    std::function<Result<void>(const HelloInfo& peer)> admit;     ///< may this peer connect?
    std::function<void(std::shared_ptr<Connection>)> adopt;       ///< a connection that passed its handshake
    /// Runs a task of the owner's (each inbound handshake); false when the owner is closing.
    std::function<bool(Task<void>, const char* what)> spawn;
};

class Endpoint {
public:
    /// `worker` names the owner in log lines.
    Endpoint(std::string worker, InboundLimits limits, ConnectionLimits connection, InboundHooks hooks);
    ~Endpoint();
    Endpoint(const Endpoint&) = delete;
    Endpoint& operator=(const Endpoint&) = delete;

    /// Listens on every transport of `wanted` (`_transports`; nullopt: every one built), the TCP
    /// one at `tcp_address` (TensorPipeRpcBackendOptions::listen_address), on `ex`.
    [[nodiscard]] Result<void> listen(Executor ex, const std::optional<std::vector<std::string>>& wanted,
                                      const std::string& tcp_address);
    /// What this worker offers, one address per transport, in priority order.
    [[nodiscard]] const std::vector<TransportOffer>& offers() const noexcept { return offers_; }
    /// The channels this worker offers (its hello carries them beside offers()), in its priority
    /// order; none until add_channel_offer().
    [[nodiscard]] const std::vector<ChannelOffer>& channel_offers() const noexcept { return channel_offers_; }
    /// Offers one more channel (once the owner has made its channels, before any peer connects).
    void add_channel_offer(ChannelOffer offer) { channel_offers_.push_back(std::move(offer)); }
    /// The transports listened on, in the same order.
    [[nodiscard]] const std::vector<std::shared_ptr<const Transport>>& transports() const noexcept { return transports_; }
    /// The TCP listener's host and port (empty, 0 without one).
    [[nodiscard]] const std::string& host() const noexcept { return host_; }
    [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
    [[nodiscard]] std::size_t listeners() const noexcept { return listeners_.size(); }

    /// The group's shared key (empty: none), asked of inbound peers and used for outbound ones.
    /// Never logged.
    void set_key(Secret key) { key_ = std::move(key); }
    [[nodiscard]] const Secret& key() const noexcept { return key_; }

    /// Accepts on listener `i` until close(): each socket within the budgets gets its handshake
    /// (hooks.spawn), and each that passes goes to hooks.adopt.
    [[nodiscard]] Task<void> accept_loop(std::size_t i);
    /// An adopted inbound connection, kept (weakly) for close_inbound and for_each_inbound.
    void track(const std::shared_ptr<Connection>& c);
    /// An adopted inbound connection has closed: room for another.
    void inbound_closed() noexcept;
    /// Calls `fn` with every adopted inbound connection still open.
    void for_each_inbound(const std::function<void(Connection&)>& fn);
    /// Inbound sockets held now (in their handshake or adopted and open).
    [[nodiscard]] std::size_t inbound_open() const noexcept { return inbound_open_; }

    /// Stops listening (accept loops end) and closes the adopted inbound connections with `why`.
    void close(const std::optional<Error>& why);

private:
    Task<void> handshake(TransportStream stream, std::uint64_t ticket);
    void end_oldest_handshake();
    void warn(const std::string& what);

    std::string worker_;
    InboundLimits limits_;
    ConnectionLimits connection_;
    InboundHooks hooks_;
    std::vector<std::unique_ptr<Listener>> listeners_;
    std::vector<std::shared_ptr<const Transport>> transports_;
    std::vector<TransportOffer> offers_;
    std::vector<ChannelOffer> channel_offers_;
    std::string host_;
    std::uint16_t port_ = 0;
    Secret key_;
    bool closed_ = false;
    std::vector<std::weak_ptr<Connection>> inbound_;
    std::size_t inbound_open_ = 0;
    bool full_logged_ = false;
    /// The sockets of inbound connections in their handshake, by when they came (oldest first).
    std::map<std::uint64_t, int> handshaking_;
    std::uint64_t next_ticket_ = 0;
    LogThrottle refusals_logged_;  ///< refused and ended handshakes (a peer causes them at will)
};

}  // namespace tensorplay::detail
