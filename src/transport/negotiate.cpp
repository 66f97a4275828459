// The negotiation's decision (TensorPipe's: the server picks, the client checks).
#include "transport/negotiate.hpp"

#include <algorithm>

namespace tensorplay::detail {

std::string offer_names(const std::vector<TransportOffer>& offers) {
    std::string s;
    for (const auto& o : offers) s += (s.empty() ? "" : ", ") + o.name;
    return s.empty() ? std::string("none") : s;
}

namespace {
std::vector<std::string> device_types(const std::vector<ChannelOffer>& offers) {
    std::vector<std::string> out;
    for (const auto& o : offers)
        if (std::find(out.begin(), out.end(), o.device_type) == out.end()) out.push_back(o.device_type);
    return out;
}

std::string who(const HelloInfo& h) { return "worker \"" + h.name + "\" (rank " + std::to_string(h.rank) + ")"; }
}  // namespace

Result<Negotiated> negotiate(const HelloInfo& server, const HelloInfo& client, std::string_view current) {
    Negotiated n;
    for (const auto& s : server.transports) {
        auto c = std::find_if(client.transports.begin(), client.transports.end(), [&](const auto& o) { return o.name == s.name; });
        if (c == client.transports.end() || c->domain != s.domain) continue;
        if (s.name != current && s.address.empty()) continue;
        n.transport = s.name;
        if (s.name != current) n.address = s.address;
        break;
    }
    if (n.transport.empty()) {
        // (Same names with other domains: another host, network namespace or user.)
        return fail(Errc::not_supported, "no common transport between " + who(client) + " (offers " +
                                             offer_names(client.transports) + ") and " + who(server) + " (offers " +
                                             offer_names(server.transports) +
                                             "; a same-host transport needs the same host, network namespace and user)");
    }
    for (const auto& dc : device_types(client.channels))
        for (const auto& ds : device_types(server.channels))
            for (const auto& s : server.channels) {
                if (s.device_type != ds) continue;
                auto c = std::find_if(client.channels.begin(), client.channels.end(), [&](const auto& o) {
                    return o.name == s.name && o.device_type == dc && o.domain == s.domain;
                });
                if (c == client.channels.end()) continue;
                n.channels.push_back(ChannelChoice{dc, ds, s.name});
                break;
            }
    return n;
}

}  // namespace tensorplay::detail
