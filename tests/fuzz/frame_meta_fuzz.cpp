// Fuzzes the frame metadata decoder (handler name and tensor descriptors): whatever it accepts is
// within the limits, agrees with the allocation-free fast path, and re-encodes to the same bytes;
// nothing it allocates is much larger than the block.
#include "transport/frame.hpp"

#include "fuzz_util.hpp"

#include <tensorplay/core/wire.hpp>

using namespace tensorplay;
using namespace tensorplay::detail;

namespace {

// The layout of docs/protocol.md, written out independently of encode_frame_head (which needs
// real tensors): str32 name, u32 count, per tensor u8 dtype, device source, device target,
// u8 ndim, i64 dims, u64 nbytes; a device is u8 type and u16 index.
Bytes encode_meta(const FrameMeta& m) {
    WireWriter w;
    w.str32(m.name).u32(static_cast<std::uint32_t>(m.tensors.size()));
    for (const auto& t : m.tensors) {
        w.u8(static_cast<std::uint8_t>(t.dtype));
        for (const Device& d : {t.source, t.target})
            w.u8(static_cast<std::uint8_t>(d.type)).u16(static_cast<std::uint16_t>(static_cast<std::int16_t>(d.index)));
        w.u8(static_cast<std::uint8_t>(t.shape.size()));
        for (auto dim : t.shape) w.i64(dim);
        w.u64(t.nbytes);
    }
    return std::move(w).take();
}

void check(std::span<const std::uint8_t> in, const ConnectionLimits& limits) {
    std::string_view small_name;
    const bool small = decode_small_meta(in, limits, small_name);
    Result<FrameMeta> m = fail(Errc::internal, "not decoded");
    {
        fuzz::AllocationBound bound;
        m = decode_frame_meta(in, limits);
        TP_FUZZ_CHECK(bound.within(in.size()));
    }
    if (small) {
        TP_FUZZ_CHECK(m && m->name == small_name && m->tensors.empty());
    }
    if (!m) {
        TP_FUZZ_CHECK(m.error().code() == Errc::protocol_error && !m.error().message().empty());
        return;
    }
    TP_FUZZ_CHECK(m->name.size() <= limits.max_name_len && m->tensors.size() <= limits.max_tensors);
    std::uint64_t total = 0;
    for (const auto& t : m->tensors) {
        TP_FUZZ_CHECK(t.shape.size() <= limits.max_ndim);
        auto need = checked_nbytes(t.dtype, t.shape);
        TP_FUZZ_CHECK(need && *need == t.nbytes);
        total += t.nbytes;
        TP_FUZZ_CHECK(total <= limits.max_tensor_bytes);
        TP_FUZZ_CHECK(t.source.index >= -1 && t.target.index >= -1);
    }
    const Bytes again = encode_meta(*m);
    TP_FUZZ_CHECK(again.size() == in.size() && std::equal(again.begin(), again.end(), in.begin()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::uint8_t> in(data, size);
    check(in, ConnectionLimits{});
    ConnectionLimits tight;
    tight.max_name_len = 16;
    tight.max_tensors = 4;
    tight.max_ndim = 3;
    tight.max_tensor_bytes = 1 << 20;
    check(in, tight);
    return 0;
}
