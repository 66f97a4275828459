// Bytes: the owned byte buffer used for store values and message payloads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay {

using Bytes = std::vector<std::uint8_t>;

/// Copies a string's characters into Bytes.
[[nodiscard]] inline Bytes bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }

/// Views Bytes as characters (no copy).
[[nodiscard]] inline std::string_view as_string_view(std::span<const std::uint8_t> b) {
    return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// Copies Bytes into a std::string.
[[nodiscard]] inline std::string to_string(std::span<const std::uint8_t> b) {
    return std::string(as_string_view(b));
}

}  // namespace tensorplay
