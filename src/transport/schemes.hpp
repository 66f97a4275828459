// Private: the URL schemes of the transports' addresses, the transport registry's table of them
// (schemes.cpp; transport.cpp has the transports themselves). Address (address.cpp) parses and resolves through it, so that a new
// transport adds a line to the registry, not to a public header.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tensorplay::detail {

/// How the addresses of a scheme are written after its "scheme://".
enum class AddressForm : std::uint8_t {
    host_port,  ///< host:port ([v6 address]:port)
    name,       ///< an abstract Unix socket's name
};

/// A URL scheme and the transport that serves it.
struct SchemeInfo {
    std::string_view scheme;     ///< "tcp"
    std::string_view transport;  ///< "uv"
    AddressForm form;
};

/// `scheme`'s entry; null for a scheme no transport serves.
[[nodiscard]] const SchemeInfo* scheme_info(std::string_view scheme) noexcept;
/// Every scheme, for messages: "tcp://, uds://, shm://".
[[nodiscard]] std::string known_schemes();

}  // namespace tensorplay::detail
