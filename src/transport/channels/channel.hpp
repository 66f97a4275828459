// Private: the channel seam between a frame and its tensors' bytes (docs/protocol.md, "Channels").
// Per (device type of a tensor on its sender, device type it lands on at the receiver) the
// channel negotiated for that pair decides how its bytes travel: `basic` writes them inline after
// the frame's payload (basic/); the others may leave them where they are and send a reference:
// `cma` (cma/) in the sender's memory, read by the receiver with process_vm_readv; `cuda_ipc`
// (cuda_ipc/) in the sender's device memory, copied by the receiver's device channels. A channel
// that receives by reference is a ReferenceChannel; the connection's reader asks it for each such
// tensor of a frame.
#pragma once

#include <tensorplay/core/task.hpp>
#include <tensorplay/transport/connection.hpp>

#include "transport/channels/channel_kind.hpp"

#include <array>
#include <cstdint>
#include <memory>

namespace tensorplay::detail {

struct ConnectionState;
class CmaChannel;

/// The receiving side of a channel whose tensors come by reference (their bytes are not on the
/// stream). Used on the connection's executor, by its reader (ConnectionState::read_general).
class ReferenceChannel {
public:
    virtual ~ReferenceChannel() = default;
    /// Tensor `i` of `f` (`desc`), sent by reference `ref`: appended to f.tensors (its memory taken
    /// with ConnectionState::take_tensor, which counts it in `held`), or its failure recorded in
    /// f.alloc_error (the frame fails, the connection goes on). An error returned closes the
    /// connection.
    [[nodiscard]] virtual Task<Result<void>> receive(ConnectionState& s, Frame& f, std::size_t i, const TensorDesc& desc,
                                                     std::uint64_t ref, std::size_t& held) = 0;
    /// Every tensor of `f`, whose hold is `hold`, was received.
    virtual void received(ConnectionState& s, Frame& f, std::uint64_t hold) = 0;
};

// ---- The channels' part in the handshake (docs/protocol.md, "Channels") ----
// A channel may have to check a peer before it carries anything for it (cma: this process must be
// able to read the peer's memory). The server offers it only to a peer it can use it with; after an
// answer that chose such a channel the client sends its verdict (a record), and a negative one
// makes both sides fall back to what the server's other offers give. The handshake asks these
// functions and names no channel.

/// Fills this side's channel parameters (identities, probe targets) into its hello before it is sent.
void prepare_channel_offers(HelloInfo& mine);
/// Server: `mine` as offered to `peer`, whose end of the connection's socket is `fd` (`known_pid`:
/// the kernel's word on its process, -1 when unknown): the channels this side cannot use with it left out.
[[nodiscard]] HelloInfo channel_offers_for(HelloInfo mine, const HelloInfo& peer, int fd, int known_pid);
/// Whether the answer chose a channel that the client must check (a verdict record follows the answer).
[[nodiscard]] bool channel_verdict_needed(const Negotiated& n) noexcept;
/// Client: its verdict on such an answer: whether it can use those channels with the server.
[[nodiscard]] bool channel_verdict(const HelloInfo& client, const HelloInfo& server, int fd, int known_pid);
/// Both sides, after a negative verdict: the server's offers without the channels the client checks.
[[nodiscard]] HelloInfo without_checked_channels(HelloInfo server);

/// The channels of one connection, as the sender and the receiver look them up.
class ChannelTable {
public:
    ChannelTable();
    /// From the negotiation's answer, on the client side or the server's; `peer` is the peer's
    /// hello (its cma parameters).
    ChannelTable(const Negotiated& n, bool client, const HelloInfo& peer);
    ChannelTable(ChannelTable&&) noexcept;
    ChannelTable& operator=(ChannelTable&&) noexcept;
    ~ChannelTable();

    /// The channel for a tensor this side sends from `source` to the peer's `target`.
    [[nodiscard]] ChannelKind send_kind(Device source, Device target) const noexcept { return send_[idx(source)][idx(target)]; }
    /// The channel for a tensor the peer sends from its `source` to our `target`.
    [[nodiscard]] ChannelKind receive_kind(Device source, Device target) const noexcept { return recv_[idx(source)][idx(target)]; }
    /// The receiving side of channel `k` for tensors by reference; null when `k` sends none on this
    /// connection (basic, cuda_basic; cma when the pair did not choose it).
    [[nodiscard]] ReferenceChannel* by_reference(ChannelKind k) const noexcept;
    /// Whether a tensor this side sends to `target` goes by cma's reference (cma.hpp's size rule).
    [[nodiscard]] bool cma_takes(const Tensor& t, Device target) const noexcept;
    /// The peer's pid for cma reads (-1: no cma).
    [[nodiscard]] int peer_pid() const noexcept;
    /// cma on this connection, or null.
    [[nodiscard]] CmaChannel* cma() const noexcept { return cma_.get(); }

private:
    static std::size_t idx(Device d) noexcept { return d.type == DeviceType::cpu ? 0 : 1; }
    std::array<std::array<ChannelKind, 2>, 2> send_{}, recv_{};
    std::unique_ptr<CmaChannel> cma_;             ///< with cma
    std::unique_ptr<ReferenceChannel> cuda_ipc_;  ///< a DeviceReferences, with cuda_ipc
};

}  // namespace tensorplay::detail
