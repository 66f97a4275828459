// Fuzzes the handshake decoders (the 12-byte hello prefix, then the version-3 body it announces,
// offers, authentication and the answer included): what decodes is within the limits and encode_hello writes it
// back byte for byte.
#include "transport/frame.hpp"

#include "fuzz_util.hpp"

using namespace tensorplay;
using namespace tensorplay::detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::uint8_t> in(data, size);
    // The reader always has the whole prefix before it decodes it.
    if (in.size() < kHelloPrefixSize) return 0;
    auto prefix = decode_hello_prefix(in.first(kHelloPrefixSize));
    // The body is decoded whatever the prefix said, as a peer could send any body after a valid
    // prefix; the limits are those of an agent, and a tight variant.
    const auto body = in.subspan(kHelloPrefixSize);
    ConnectionLimits tight;
    tight.max_name_len = 8;
    for (const ConnectionLimits& limits : {ConnectionLimits{}, tight}) {
        Result<Hello> h = fail(Errc::internal, "not decoded");
        {
            fuzz::AllocationBound bound;
            h = decode_hello_body(body, limits);
            TP_FUZZ_CHECK(bound.within(body.size()));
        }
        if (!h) {
            TP_FUZZ_CHECK(h.error().code() == Errc::protocol_error && !h.error().message().empty());
            continue;
        }
        TP_FUZZ_CHECK(h->info.name.size() <= limits.max_name_len);
        TP_FUZZ_CHECK(h->info.transports.size() <= 64 && h->info.channels.size() <= 64);
        TP_FUZZ_CHECK(h->reason.size() <= kMaxRefusalReason);
        const Bytes again = encode_hello(*h, prefix ? prefix->magic : kProtocolMagic, prefix ? prefix->version : 1);
        TP_FUZZ_CHECK(again.size() == kHelloPrefixSize + body.size());
        TP_FUZZ_CHECK(std::equal(body.begin(), body.end(), again.begin() + kHelloPrefixSize));
        if (prefix && prefix->body_len == body.size()) {
            // A whole, valid hello: its prefix comes back too (the flags field is written as 0).
            TP_FUZZ_CHECK(std::equal(in.begin(), in.begin() + 6, again.begin()));
            TP_FUZZ_CHECK(std::equal(in.begin() + 8, in.begin() + 12, again.begin() + 8));
        }
    }
    if (prefix) TP_FUZZ_CHECK(prefix->magic == kProtocolMagic && prefix->body_len <= kMaxHelloBody);
    else TP_FUZZ_CHECK(prefix.error().code() == Errc::protocol_error);
    return 0;
}
