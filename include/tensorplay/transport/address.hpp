// Address: where a transport listens, as a URL ("tcp://host:port", "uds://name", "shm://name").
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace tensorplay {

/// A listening address of one transport. `tcp://host:port` (IPv6 hosts in brackets) for `uv`;
/// `uds://name` (a Unix socket in the abstract namespace, name without the leading NUL) for `uds`;
/// `shm://name` for `shm` (whose setup runs over such a socket).
struct TP_API Address {
    enum class Kind : std::uint8_t { tcp, uds, shm };
    Kind kind = Kind::tcp;
    std::string host;        ///< tcp: a numeric address or a host name
    std::uint16_t port = 0;  ///< tcp
    std::string name;        ///< uds, shm: the abstract socket's name (1 to 107 bytes)

    /// Parses a URL. Errc::invalid_argument saying what is wrong (unknown scheme, bad port, a
    /// name that is empty or too long for a socket address).
    [[nodiscard]] static Result<Address> parse(std::string_view url);
    /// `tcp://host:port` for a TCP endpoint.
    [[nodiscard]] static Address tcp(std::string host, std::uint16_t port);
    /// `uds://name`.
    [[nodiscard]] static Address uds(std::string name);
    /// The URL (parse(str()) gives the same address).
    [[nodiscard]] std::string str() const;
    /// "host:port" or "uds://name": for messages.
    [[nodiscard]] std::string where() const;
    /// The transport that serves this kind of address: "uv", "uds" or "shm".
    [[nodiscard]] std::string_view transport() const noexcept;

    friend bool operator==(const Address&, const Address&) = default;
};

}  // namespace tensorplay
