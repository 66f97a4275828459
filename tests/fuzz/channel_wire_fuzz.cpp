// Fuzzes the decoders the same-host channels and membership added: the input's first byte picks
// one (cuda_ipc's offer parameters and outbox notice, its ring notices, its export notices, its
// tensor references, cma's offer parameters, the membership update, the member list). Whatever decodes re-encodes to the input (the encodings are
// canonical) or to a value that decodes the same, within the decoders' bounds, and no decoder of
// network bytes allocates much more than it was given.
#include "fuzz_util.hpp"

#include "rpc/membership.hpp"
#include "transport/channels/cma/cma_offer.hpp"
#include "transport/channels/cuda_ipc/wire.hpp"

#include <cstring>
#include <string>
#include <string_view>

using namespace tensorplay;
using namespace tensorplay::detail;

namespace {

std::string_view text(std::span<const std::uint8_t> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

bool same(std::span<const std::uint8_t> in, const Bytes& out) {
    return in.size() == out.size() && (in.empty() || std::memcmp(in.data(), out.data(), in.size()) == 0);
}
bool same(std::span<const std::uint8_t> in, const std::string& out) {
    return in.size() == out.size() && (in.empty() || std::memcmp(in.data(), out.data(), in.size()) == 0);
}

/// A refusal is a protocol error that says what was wrong.
template <class T>
bool refused_well(const Result<T>& r) {
    return r.error().code() == Errc::protocol_error && !r.error().message().empty();
}

void ipc_params(std::span<const std::uint8_t> in) {
    Result<IpcParams> p = fail(Errc::internal, "not decoded");
    {
        fuzz::AllocationBound bound;
        p = decode_ipc_params(text(in));
        TP_FUZZ_CHECK(bound.within(in.size()));
    }
    if (!p) {
        TP_FUZZ_CHECK(refused_well(p));
        return;
    }
    TP_FUZZ_CHECK(p->pid > 0 && p->devices.size() <= 64);
    for (const auto& d : p->devices) {
        TP_FUZZ_CHECK(d.index >= 0 && d.bus_id.size() <= 64 && d.uuid.size() <= 64);
        if (!d.outbox) continue;
        TP_FUZZ_CHECK(d.size > 0 && !d.events.empty() && d.events.size() <= 255 && d.pool_fd >= -1);
        TP_FUZZ_CHECK(d.chunk >= kOutboxAlign && d.ring >= 2 && d.ring <= 64 && d.chunk * d.ring <= d.size);
    }
    TP_FUZZ_CHECK(same(in, encode_ipc_params(*p)));
}

void ring_notice(std::span<const std::uint8_t> in) {
    auto n = decode_ring_notice(in);
    if (!n) {
        TP_FUZZ_CHECK(refused_well(n));
        return;
    }
    TP_FUZZ_CHECK(same(in, encode_ring_notice(*n)));
}

void pool_export(std::span<const std::uint8_t> in) {
    auto e = decode_pool_export(in);
    if (!e) {
        TP_FUZZ_CHECK(refused_well(e));
        return;
    }
    TP_FUZZ_CHECK(e->device >= 0);
    TP_FUZZ_CHECK(same(in, encode_pool_export(*e)));
}

void ipc_ref(std::span<const std::uint8_t> in) {
    std::uint64_t v = 0;
    std::memcpy(&v, in.data(), std::min(in.size(), sizeof v));
    auto r = decode_ipc_ref(v);
    if (!r) {
        TP_FUZZ_CHECK(refused_well(r));
        return;
    }
    const std::uint64_t again = r->pooled ? encode_pool_ref(r->offset, r->event) : encode_ipc_ref(r->offset, r->event, r->chunked);
    TP_FUZZ_CHECK(again == v && again != 0);
}

void cma_params(std::span<const std::uint8_t> in) {
    Result<CmaParams> p = fail(Errc::internal, "not decoded");
    {
        fuzz::AllocationBound bound;
        p = decode_cma_params(text(in));
        TP_FUZZ_CHECK(bound.within(in.size()));
    }
    if (!p) {
        TP_FUZZ_CHECK(refused_well(p));
        return;
    }
    TP_FUZZ_CHECK(p->identity.pid > 0 && p->probe.pid == p->identity.pid && p->lease_table != 0);
    TP_FUZZ_CHECK(same(in, encode_cma_params(*p)));
}

void membership_update(std::span<const std::uint8_t> in) {
    Result<MembershipUpdate> u = fail(Errc::internal, "not decoded");
    {
        fuzz::AllocationBound bound;
        u = decode_membership_update(in);
        TP_FUZZ_CHECK(bound.within(in.size()));
    }
    if (!u) {
        TP_FUZZ_CHECK(refused_well(u));
        return;
    }
    TP_FUZZ_CHECK(u->members.size() <= kMaxGroupMembers);
    // (Device maps are ordered once decoded: the re-encoding decodes to what encodes the same.)
    const Bytes encoded = encode_membership_update(*u);
    TP_FUZZ_CHECK(encoded.size() == in.size());
    auto again = decode_membership_update(encoded);
    TP_FUZZ_CHECK(again && encode_membership_update(*again) == encoded);
}

void member_ranks(std::span<const std::uint8_t> in) {
    Result<std::vector<int>> r = fail(Errc::internal, "not decoded");
    {
        fuzz::AllocationBound bound;
        r = decode_member_ranks(in);
        TP_FUZZ_CHECK(bound.within(in.size()));
    }
    if (!r) {
        TP_FUZZ_CHECK(refused_well(r));
        return;
    }
    TP_FUZZ_CHECK(same(in, encode_member_ranks(*r)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input input(data, size);
    const std::uint8_t which = input.byte();
    const auto in = input.rest();
    switch (which % 7) {
    case 0: ipc_params(in); break;
    case 1: ring_notice(in); break;
    case 2: pool_export(in); break;
    case 3: ipc_ref(in); break;
    case 4: cma_params(in); break;
    case 5: membership_update(in); break;
    default: member_ranks(in); break;
    }
    return 0;
}
