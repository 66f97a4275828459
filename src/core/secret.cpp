// Secret's buffer: allocated once per secret, wiped with OPENSSL_cleanse (which the compiler cannot
// remove as a dead store) before it is freed.
#include <tensorplay/core/secret.hpp>

#include <openssl/crypto.h>

#include <cstring>

namespace tensorplay {

struct Secret::Buffer {
    explicit Buffer(std::span<const std::uint8_t> b) : data(new std::uint8_t[b.size()]), size(b.size()) {
        std::memcpy(data.get(), b.data(), b.size());
    }
    ~Buffer() { OPENSSL_cleanse(data.get(), size); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    std::unique_ptr<std::uint8_t[]> data;
    std::size_t size;
};

namespace {
std::span<const std::uint8_t> as_bytes(std::string_view s) noexcept {
    return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}
}  // namespace

Secret::Secret(std::string_view bytes) {
    if (!bytes.empty()) buffer_ = std::make_shared<const Buffer>(as_bytes(bytes));
}

Secret::Secret(const char* bytes) : Secret(bytes ? std::string_view(bytes) : std::string_view()) {}

Secret::Secret(std::string&& bytes) : Secret(std::string_view(bytes)) {
    // (The whole buffer, the short-string one included: capacity() bytes and its terminator.)
    OPENSSL_cleanse(bytes.data(), bytes.capacity());
    bytes.clear();
}

std::size_t Secret::size() const noexcept { return buffer_ ? buffer_->size : 0; }

std::span<const std::uint8_t> Secret::bytes() const noexcept {
    if (!buffer_) return {};
    return {buffer_->data.get(), buffer_->size};
}

}  // namespace tensorplay
