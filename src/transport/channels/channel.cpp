// The channel table of a connection: which channel carries each (source, target) pair's tensors.
#include "transport/channels/channel.hpp"

#include "transport/channels/cma/cma_channel.hpp"
#include "transport/channels/cma/cma_offer.hpp"
#include "transport/channels/cuda_ipc/references.hpp"

namespace tensorplay::detail {

namespace {
ChannelKind kind_named(std::string_view name) {
    if (name == "cma") return ChannelKind::cma;
    if (name == "cuda_ipc") return ChannelKind::cuda_ipc;
    if (name == "cuda_basic") return ChannelKind::cuda_basic;
    return ChannelKind::basic;
}

std::size_t type_index(std::string_view type) { return type == "cpu" ? 0 : 1; }
}  // namespace

ChannelTable::ChannelTable() = default;
ChannelTable::ChannelTable(ChannelTable&&) noexcept = default;
ChannelTable& ChannelTable::operator=(ChannelTable&&) noexcept = default;
ChannelTable::~ChannelTable() = default;

ChannelTable::ChannelTable(const Negotiated& n, bool client, const HelloInfo& peer) {
    bool cma = false;
    for (const auto& c : n.channels) {
        const ChannelKind k = kind_named(c.channel);
        const std::size_t ci = type_index(c.client_device), si = type_index(c.server_device);
        // Client to server: the client sends from its device to the server's; replies go back.
        if (client) {
            send_[ci][si] = k;
            recv_[si][ci] = k;
        } else {
            send_[si][ci] = k;
            recv_[ci][si] = k;
        }
        cma = cma || k == ChannelKind::cma;
        if (k == ChannelKind::cuda_ipc && !cuda_ipc_) cuda_ipc_ = std::make_unique<DeviceReferences>();
    }
    if (!cma) return;
    const ChannelOffer* theirs = find_cma(peer);
    auto p = theirs ? decode_cma_params(theirs->params) : Result<CmaParams>(fail(Errc::protocol_error, "no cma offer"));
    if (p) {
        cma_ = std::make_unique<CmaChannel>(p->identity.pid, p->lease_table);
        return;
    }
    // (The handshake checked both offers before choosing cma: not reached.)
    send_ = {};
    recv_ = {};
    cuda_ipc_.reset();
}

ReferenceChannel* ChannelTable::by_reference(ChannelKind k) const noexcept {
    if (k == ChannelKind::cma) return cma_.get();
    if (k == ChannelKind::cuda_ipc) return cuda_ipc_.get();
    return nullptr;
}

bool ChannelTable::cma_takes(const Tensor& t, Device target) const noexcept {
    return cma_ && t.nbytes() >= kCmaMinBytes && send_kind(t.device(), target) == ChannelKind::cma;
}

int ChannelTable::peer_pid() const noexcept { return cma_ ? cma_->peer_pid() : -1; }

void prepare_channel_offers(HelloInfo& mine) { prepare_cma_offers(mine); }

HelloInfo channel_offers_for(HelloInfo mine, const HelloInfo& peer, int fd, int known_pid) {
    // (cma: offered only when we can read the peer, by identities and a live probe of its memory,
    // and it, as far as identities tell, us; its own probe of us comes as its verdict.)
    if (offers_cma(mine) && !cma_usable(mine, peer, fd, known_pid)) return without_cma(std::move(mine));
    return mine;
}

bool channel_verdict_needed(const Negotiated& n) noexcept { return chose_cma(n); }

bool channel_verdict(const HelloInfo& client, const HelloInfo& server, int fd, int known_pid) {
    return cma_usable(client, server, fd, known_pid);
}

HelloInfo without_checked_channels(HelloInfo server) { return without_cma(std::move(server)); }

}  // namespace tensorplay::detail
