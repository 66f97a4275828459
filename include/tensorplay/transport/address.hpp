// Address: where a transport listens, as a URL ("tcp://host:port", "uds://name", "shm://name").
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace tensorplay {

/// A listening address of one transport: a URL whose scheme names the transport that serves it
/// (the transports resolve it; no list of them here). `tcp://host:port` (IPv6 hosts in brackets)
/// for the transport whose wire name is `uv`; `uds://name` (a Unix socket in the abstract
/// namespace, name without the leading NUL) for `uds`; `shm://name` for `shm` (whose setup runs
/// over such a socket).
struct TP_API Address {
    std::string scheme = "tcp";  ///< "tcp", "uds", "shm": which transport serves it
    std::string host;            ///< a host-and-port scheme's (tcp): a numeric address or a host name
    std::uint16_t port = 0;      ///< a host-and-port scheme's
    std::string name;            ///< a named scheme's (uds, shm): the abstract socket's name (1 to 106 bytes)

    /// Parses a URL. Errc::invalid_argument saying what is wrong (a scheme no transport serves, a
    /// bad port, a name that is empty or too long for a socket address).
    [[nodiscard]] static Result<Address> parse(std::string_view url);
    /// `tcp://host:port` for a TCP endpoint.
    [[nodiscard]] static Address tcp(std::string host, std::uint16_t port);
    /// `uds://name`.
    [[nodiscard]] static Address uds(std::string name);
    /// The URL (parse(str()) gives the same address).
    [[nodiscard]] std::string str() const;
    /// "host:port" or "uds://name": for messages.
    [[nodiscard]] std::string where() const;
    /// The transport that serves this scheme ("uv" for tcp, "uds", "shm"); empty for a scheme that
    /// none serves.
    [[nodiscard]] std::string_view transport() const noexcept;

    friend bool operator==(const Address&, const Address&) = default;
};

}  // namespace tensorplay
