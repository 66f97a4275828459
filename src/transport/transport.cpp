// The transport registry: names, priorities, selection from `_transports` / `_channels`, and the
// same-host domain descriptor.
#include "transport/transport.hpp"

#include <tensorplay/config.hpp>

#include <tensorplay/core/log.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <mutex>
#include <set>

namespace tensorplay::detail {

// Defined with each transport (tcp_transport.cpp, uds_transport.cpp, shm_transport.cpp).
std::shared_ptr<const Transport> make_uv_transport();
std::shared_ptr<const Transport> make_uds_transport();
std::shared_ptr<const Transport> make_shm_transport();

namespace {
constexpr std::array<std::string_view, 4> kTransports{"shm", "uds", "ibv", "uv"};
// TensorPipe's channels, in torch's priority order (CPU channels first).
constexpr std::array<std::string_view, 8> kChannels{"cma",      "mpt_uv",   "basic",    "xth",
                                                    "cuda_xth", "cuda_ipc", "cuda_gdr", "cuda_basic"};

std::string joined(std::span<const std::string_view> names) {
    std::string s;
    for (auto n : names) s += (s.empty() ? "" : ", ") + std::string(n);
    return s;
}

std::string canonical(std::string_view name) { return name == "tcp" ? std::string("uv") : std::string(name); }

void log_unbuilt_once(const std::string& name, const Error& why) {
    static std::mutex m;
    static std::set<std::string> logged;
    std::lock_guard lock(m);
    if (logged.insert(name).second) log(LogLevel::info, "transport", why.message() + ": left out");
}
}  // namespace

std::span<const std::string_view> known_transports() noexcept { return kTransports; }
std::span<const std::string_view> known_channels() noexcept { return kChannels; }

namespace {
std::string available_channels() {
    std::string s;
    for (auto c : kChannels)
        if (channel_available(c)) s += (s.empty() ? "" : ", ") + std::string(c);
    return s;
}
}  // namespace
bool channel_available(std::string_view name) noexcept {
#if defined(__linux__)
    if (name == "cma") return true;  // (viability is decided per peer at connection setup)
#endif
#if TP_HAS_CUDA
    // The agent's device channels: offered when it has cuda devices (channels/device_channels.cpp).
    if (name == "cuda_ipc" || name == "cuda_basic") return true;
#endif
    return name == "basic";
}

Result<void> check_transport_names(std::span<const std::string> names) {
    for (const auto& n : names) {
        const std::string c = canonical(n);
        if (std::find(kTransports.begin(), kTransports.end(), c) == kTransports.end())
            return fail(Errc::invalid_argument, "_transports names unknown transport \"" + n + "\" (known: " + joined(kTransports) + ")");
    }
    return ok();
}

Result<void> check_channel_names(std::span<const std::string> names) {
    for (const auto& n : names)
        if (std::find(kChannels.begin(), kChannels.end(), n) == kChannels.end())
            return fail(Errc::invalid_argument, "_channels names unknown channel \"" + n + "\" (known: " + joined(kChannels) + ")");
    return ok();
}

Result<std::shared_ptr<const Transport>> transport_named(std::string_view name) {
    const std::string c = canonical(name);
    if (c == "uv") {
        static const auto uv = make_uv_transport();
        return uv;
    }
    if (c == "uds") {
        static const auto uds = make_uds_transport();
        return uds;
    }
    if (c == "shm") {
        static const auto shm = make_shm_transport();
        return shm;
    }
    if (c == "ibv")
        return fail(Errc::not_supported, "transport \"ibv\" (InfiniBand verbs) is not supported by this agent");
    return fail(Errc::invalid_argument, "unknown transport \"" + std::string(name) + "\" (known: " + joined(kTransports) + ")");
}

Result<std::shared_ptr<const Transport>> transport_for(const Address& address) { return transport_named(address.transport()); }

Task<Result<std::unique_ptr<ByteStream>>> Transport::finish(TransportStream&, Duration, bool, std::size_t) const {
    co_return std::unique_ptr<ByteStream>();
}

Task<Result<void>> finish_stream(TransportStream& stream, Duration timeout, bool receive_first, std::size_t buffered) {
    if (stream.polled) co_return ok();
    auto transport = transport_named(stream.transport);
    if (!transport) co_return fail(transport.error());
    auto finishing = (*transport)->finish(stream, timeout, receive_first, buffered);
    auto polled = co_await std::move(finishing);
    if (!polled) co_return fail(std::move(polled).error());
    stream.polled = std::move(*polled);
    co_return ok();
}

Result<std::vector<std::shared_ptr<const Transport>>> select_transports(const std::optional<std::vector<std::string>>& wanted) {
    std::vector<std::string> names;
    if (wanted) {
        if (auto c = check_transport_names(*wanted); !c) return fail(c.error());
        for (const auto& w : *wanted) names.push_back(canonical(w));
    } else {
        for (auto n : kTransports) names.emplace_back(n);
    }
    std::vector<std::shared_ptr<const Transport>> out;
    for (const auto& n : names) {
        if (std::any_of(out.begin(), out.end(), [&](const auto& t) { return t->name() == n; })) continue;
        auto t = transport_named(n);
        if (!t) {
            log_unbuilt_once(n, t.error());
            continue;
        }
        out.push_back(std::move(*t));
    }
    // Without a list, the default priorities order them (a list is its own order).
    if (!wanted)
        std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->priority() > b->priority(); });
    if (out.empty()) {
        std::string asked;
        for (const auto& n : names) asked += (asked.empty() ? "" : ", ") + n;
        return fail(Errc::not_supported, "none of the _transports [" + asked + "] is available in this agent (available: shm, uds, uv)");
    }
    return out;
}

Result<std::vector<std::string>> select_channels(const std::optional<std::vector<std::string>>& wanted) {
    std::vector<std::string> out;
    if (wanted) {
        if (auto c = check_channel_names(*wanted); !c) return fail(c.error());
        for (const auto& w : *wanted)
            if (channel_available(w) && std::find(out.begin(), out.end(), w) == out.end()) out.push_back(w);
        if (out.empty()) {
            std::string asked;
            for (const auto& n : *wanted) asked += (asked.empty() ? "" : ", ") + n;
            return fail(Errc::not_supported, "none of the _channels [" + asked + "] is available in this agent (available: " + available_channels() + ")");
        }
        return out;
    }
    for (auto c : kChannels)
        if (channel_available(c)) out.emplace_back(c);
    return out;
}

std::string same_host_domain() {
    static const std::string domain = [] {
        std::string boot;
        std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
        struct stat st {};
        const std::string netns = ::stat("/proc/self/ns/net", &st) == 0 ? std::to_string(st.st_ino) : std::string("?");
        // Without a boot id (no /proc) the host is unknown: a descriptor nobody else matches.
        if (boot.empty()) boot = "unknown-" + std::to_string(::getpid());
        return boot + "/" + netns + "/" + std::to_string(::geteuid());
    }();
    return domain;
}

}  // namespace tensorplay::detail
