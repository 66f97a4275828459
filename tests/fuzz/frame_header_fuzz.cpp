// Fuzzes the 24-byte frame header decoder: peek and decode agree, a header that decodes is of a
// known kind (request, response, error, or the connection's own release), and it is re-encoded to
// the same bytes (the flags byte is the metadata decoder's to check, and kept as sent).
#include "transport/frame.hpp"

#include "fuzz_util.hpp"

#include <tensorplay/core/wire.hpp>

#include <array>
#include <cstring>

using namespace tensorplay;
using namespace tensorplay::detail;

namespace {

void check(std::span<const std::uint8_t> in, const ConnectionLimits& limits) {
    auto h = decode_frame_header(in, limits);
    if (in.size() < kFrameHeaderSize) {
        TP_FUZZ_CHECK(!h && h.error().code() == Errc::protocol_error);
        return;
    }
    FrameHeader peeked;
    TP_FUZZ_CHECK(peek_frame_header(in.data(), limits, peeked) == h.has_value());
    if (!h) {
        TP_FUZZ_CHECK(h.error().code() == Errc::protocol_error && !h.error().message().empty());
        return;
    }
    TP_FUZZ_CHECK(h->meta_len <= limits.max_meta_bytes && h->payload_len <= limits.max_payload_bytes);
    TP_FUZZ_CHECK(h->kind == FrameKind::request || h->kind == FrameKind::response || h->kind == FrameKind::error ||
                  h->kind == FrameKind::control);
    std::array<std::uint8_t, kFrameHeaderSize> out{};
    store_le(out.data(), kFrameMarker);
    out[2] = static_cast<std::uint8_t>(h->kind);
    out[3] = in[3];
    store_le(out.data() + 4, h->meta_len);
    store_le(out.data() + 8, h->id);
    store_le(out.data() + 16, h->payload_len);
    TP_FUZZ_CHECK(std::memcmp(out.data(), in.data(), kFrameHeaderSize) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::uint8_t> in(data, size);
    check(in, ConnectionLimits{});
    ConnectionLimits tight;
    tight.max_meta_bytes = 64;
    tight.max_payload_bytes = 4096;
    check(in, tight);
    return 0;
}
