// WireReader/WireWriter out-of-line parts: failure recording and length-checked reads.
#include <tensorplay/core/wire.hpp>

namespace tensorplay {

void WireWriter::patch_u32(std::size_t offset, std::uint32_t v) {
    for (std::size_t i = 0; i < 4 && offset + i < buf_.size(); ++i) buf_[offset + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

bool WireReader::need(std::size_t n, std::string_view what) {
    if (failed()) return false;
    if (n > data_.size() - pos_) {
        set_error(Errc::protocol_error, "truncated input: reading " + std::string(what) + " needs " + std::to_string(n) +
                                            " bytes at offset " + std::to_string(pos_) + ", " +
                                            std::to_string(data_.size() - pos_) + " left");
        return false;
    }
    return true;
}

void WireReader::set_error(Errc code, std::string message) {
    if (!error_) error_.emplace(code, std::move(message));
}

std::span<const std::uint8_t> WireReader::raw(std::size_t n, std::string_view what) {
    if (!need(n, what)) return {};
    auto out = data_.subspan(pos_, n);
    pos_ += n;
    return out;
}

namespace {
std::span<const std::uint8_t> checked_len(WireReader& r, std::uint64_t len, std::size_t max_len, std::string_view what) {
    if (r.failed()) return {};
    if (len > max_len) {
        r.set_error(Errc::protocol_error, std::string(what) + " length " + std::to_string(len) + " exceeds the limit of " +
                                              std::to_string(max_len) + " bytes");
        return {};
    }
    return r.raw(static_cast<std::size_t>(len), what);
}
}  // namespace

std::span<const std::uint8_t> WireReader::bytes64(std::size_t max_len, std::string_view what) {
    auto len = u64();
    return checked_len(*this, len, max_len, what);
}

std::string_view WireReader::str64(std::size_t max_len, std::string_view what) {
    return as_string_view(bytes64(max_len, what));
}

std::span<const std::uint8_t> WireReader::bytes32(std::size_t max_len, std::string_view what) {
    auto len = u32();
    return checked_len(*this, len, max_len, what);
}

std::string_view WireReader::str32(std::size_t max_len, std::string_view what) {
    return as_string_view(bytes32(max_len, what));
}

Result<void> WireReader::status() const {
    if (error_) return fail(*error_);
    return ok();
}

Result<void> WireReader::finish() const {
    if (error_) return fail(*error_);
    if (pos_ != data_.size())
        return fail(Errc::protocol_error, std::to_string(data_.size() - pos_) + " unexpected trailing bytes");
    return ok();
}

}  // namespace tensorplay
