// Secret: bytes that must not outlive their use (the group's shared key).
#pragma once

#include <tensorplay/core/export.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace tensorplay {

/// A secret byte string, such as the group's shared key. Copies share one buffer, which is wiped
/// (OPENSSL_cleanse) when the last copy goes; it has no operator<< and no conversion back to a
/// string, so that it does not end up in a log or an error by accident.
class TP_API Secret {
public:
    Secret() noexcept = default;
    /// Copies `bytes` (empty: no secret).
    Secret(std::string_view bytes);
    /// Copies the NUL-terminated `bytes` (null or "": no secret).
    Secret(const char* bytes);
    /// Copies `bytes`; wiping the string stays the caller's business.
    Secret(const std::string& bytes) : Secret(std::string_view(bytes)) {}
    /// Takes `bytes`, then wipes the string's own buffer (its value is left empty).
    Secret(std::string&& bytes);

    [[nodiscard]] bool empty() const noexcept { return size() == 0; }
    [[nodiscard]] std::size_t size() const noexcept;
    /// The bytes, valid while this copy lives.
    [[nodiscard]] std::span<const std::uint8_t> bytes() const noexcept;

private:
    struct Buffer;
    std::shared_ptr<const Buffer> buffer_;
};

}  // namespace tensorplay
