// cma's offer: its parameters, this process's part of the hello, and whether a pair can use it.
#include "transport/channels/cma/cma_offer.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/wire.hpp>

#include "transport/channels/cma/cma_lease.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace tensorplay::detail {

namespace {
constexpr std::uint8_t kCmaParamsVersion = 2;  // 2: the lease table's address
constexpr std::size_t kMaxIdentityField = 128;
}  // namespace

const ChannelOffer* find_cma(const HelloInfo& info) noexcept {
    for (const auto& c : info.channels)
        if (c.name == "cma") return &c;
    return nullptr;
}

std::string encode_cma_params(const CmaParams& p) {
    WireWriter w;
    const auto& id = p.identity;
    w.u8(kCmaParamsVersion).str32(id.boot_id).str32(id.pid_ns).str32(id.user_ns);
    w.u32(id.uid).u32(id.euid).u32(id.gid).u32(id.egid).i32(id.pid).i32(id.ptrace_scope);
    w.u8(id.dumpable ? 1 : 0).u8(id.cap_sys_ptrace ? 1 : 0).u8(id.readers_allowed ? 1 : 0);
    w.i32(p.probe.pid).u64(p.probe.address).raw(p.probe.expected);
    w.u64(p.lease_table);
    const Bytes b = std::move(w).take();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

Result<CmaParams> decode_cma_params(std::string_view bytes) {
    WireReader r({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
    CmaParams p;
    auto& id = p.identity;
    if (const auto v = r.u8(); !r.failed() && v != kCmaParamsVersion)
        return fail(Errc::protocol_error, "cma parameters of unknown version " + std::to_string(v));
    id.boot_id = std::string(r.str32(kMaxIdentityField, "boot id"));
    id.pid_ns = std::string(r.str32(kMaxIdentityField, "pid namespace"));
    id.user_ns = std::string(r.str32(kMaxIdentityField, "user namespace"));
    id.uid = r.u32();
    id.euid = r.u32();
    id.gid = r.u32();
    id.egid = r.u32();
    id.pid = r.i32();
    id.ptrace_scope = r.i32();
    const auto flag = [&](const char* what) {
        const auto v = r.u8();
        if (!r.failed() && v > 1) r.set_error(Errc::protocol_error, std::string("cma parameters: bad ") + what + " flag");
        return v == 1;
    };
    id.dumpable = flag("dumpable");
    id.cap_sys_ptrace = flag("capability");
    id.readers_allowed = flag("readers");
    p.probe.pid = r.i32();
    p.probe.address = r.u64();
    auto e = r.raw(p.probe.expected.size(), "probe bytes");
    if (!r.failed()) std::memcpy(p.probe.expected.data(), e.data(), e.size());
    p.lease_table = r.u64();
    if (auto st = r.finish(); !st) return fail(std::move(st).error().context("decoding cma parameters"));
    if (id.pid <= 0 || p.probe.pid != id.pid)
        return fail(Errc::protocol_error, "cma parameters name pid " + std::to_string(id.pid) + " and probe pid " +
                                              std::to_string(p.probe.pid));
    if (p.lease_table == 0) return fail(Errc::protocol_error, "cma parameters name no lease table");
    return p;
}

std::string cma_domain(const cma::Identity& id) { return "cma:" + id.boot_id + "/" + id.pid_ns + "/" + id.user_ns; }

void prepare_cma_offers(HelloInfo& info) {
    if (!find_cma(info)) return;
    std::optional<Result<cma::Identity>> id;
    for (auto it = info.channels.begin(); it != info.channels.end();) {
        if (it->name != "cma" || !it->params.empty()) {
            ++it;
            continue;
        }
        if (!id) id = cma::local_identity();
        if (!*id) {
            log(LogLevel::debug, "transport", "cma left out of the hello: " + id->error().message());
            it = info.channels.erase(it);
            continue;
        }
        CmaParams p{**id, cma::local_probe_target(), cma::lease_table_address()};
        if (const char* bad = std::getenv("TP_CMA_TEST_BAD_PROBE"); bad && std::strcmp(bad, "1") == 0)
            p.probe.expected[0] ^= 0xff;
        it->domain = cma_domain(p.identity);
        it->params = encode_cma_params(p);
        ++it;
    }
}

bool offers_cma(const HelloInfo& info) noexcept { return find_cma(info) != nullptr; }

HelloInfo without_cma(HelloInfo info) {
    std::erase_if(info.channels, [](const ChannelOffer& c) { return c.name == "cma"; });
    return info;
}

bool chose_cma(const Negotiated& n) noexcept {
    return std::any_of(n.channels.begin(), n.channels.end(), [](const ChannelChoice& c) { return c.channel == "cma"; });
}

bool cma_usable(const HelloInfo& local, const HelloInfo& peer, int fd, int known_pid) {
    const ChannelOffer* mine = find_cma(local);
    const ChannelOffer* theirs = find_cma(peer);
    if (!mine || !theirs) return false;
    const std::string who = "worker \"" + peer.name + "\"";
    auto no = [&](const std::string& why) {
        log(LogLevel::debug, "transport", "cma with " + who + " is not used (basic instead): " + why);
        return false;
    };
    auto me = decode_cma_params(mine->params);
    auto them = decode_cma_params(theirs->params);
    if (!me) return no(me.error().message());
    if (!them) return no(them.error().message());
    if (!cma::peer_process_is(fd, known_pid, them->identity.pid)) {
        // Not the process we talk to (or it cannot be told): reading that pid could hand us
        // another process's memory. A well-behaved peer never gets here.
        log(LogLevel::warn, "transport", "cma with " + who + " is not used (basic instead): its offer names pid " +
                                             std::to_string(them->identity.pid) + ", which is not the process at the other end of the connection" +
                                             (known_pid >= 0 ? " (pid " + std::to_string(known_pid) + ")" : std::string()));
        return false;
    }
    if (auto v = cma::check_viable(me->identity, them->identity); !v) return no(v.error().message());
    if (auto v = cma::check_viable(them->identity, me->identity); !v) return no("it cannot read us: " + v.error().message());
    if (!cma::probe(them->probe)) return no("the live probe of its memory failed (seccomp, an LSM or a wrong probe target)");
    return true;
}

}  // namespace tensorplay::detail
