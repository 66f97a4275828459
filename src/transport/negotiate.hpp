// Private: the negotiation of a handshake (docs/protocol.md, "Negotiation"), as a pure function
// that the server runs to decide and the client runs again to check the answer.
#pragma once

#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"

#include <string_view>

namespace tensorplay::detail {

/// The server's choice for a client on transport `current`: the first transport in the server's
/// order that the client offers with an equal domain and that is `current` or has a server
/// address; per (client device type, server device type) pair, the first channel in the server's
/// order that both offer for those types with equal domains (pairs without one are left out).
/// Errc::not_supported naming both workers and their offers when no transport is common.
[[nodiscard]] Result<Negotiated> negotiate(const HelloInfo& server, const HelloInfo& client, std::string_view current);


}  // namespace tensorplay::detail
