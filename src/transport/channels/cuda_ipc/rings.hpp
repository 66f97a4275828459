// Private: cuda_ipc's rings (docs/protocol.md, "Device channels"). A tensor larger than a ring of
// its outbox goes through one in chunks: the sender copies the first kOutboxRing chunks in before
// the frame goes, the receiver copies each out on the frame's stream and, once that copy ran, says
// "free" for its slot; the sender then copies the chunk kOutboxRing further into that slot and
// says "ready". Both notices are one-way request frames under reserved handler names. A frame with
// such tensors is handed over once every chunk's copy is queued. No stream of ours waits on the
// peer's event: a copy out is queued once the host saw that event complete (a dead peer's event never
// completes, and a stream waiting on it would hold back every later message queued there).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/backend.hpp>
#include <tensorplay/transport/connection.hpp>

#include "transport/channels/cuda_ipc/wire.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

namespace tensorplay::detail {

class Outbox;

/// A frame's copies on one device: the stream they run on, and what they are.
struct DeviceStream {
    DeviceBackend* backend = nullptr;
    tensorplay::Stream stream;
    bool staged = false;     ///< sending: copies to host memory were queued (the frame waits for them)
    int event = -1;          ///< sending: the outbox event the frame's cuda_ipc copies are recorded on
    bool from_peer = false;  ///< receiving: copies out of the peer's outbox were queued
};

/// A ring, by the connection it is used on, the sender's device and where it starts in its outbox.
using RingKey = std::tuple<const Connection*, int, std::uint64_t>;

/// Sending a tensor through a ring: the chunks not yet copied in wait for the peer's "free".
/// Kept by the frame's hold (OutboxHold::sends): it ends with it.
struct RingSend {
    std::shared_ptr<Outbox> box;
    DeviceBackend* backend = nullptr;
    tensorplay::Stream stream;
    int event = 0;  ///< the outbox event recorded after each copy in
    Tensor tensor;
    std::uint64_t offset = 0;
    std::size_t chunk = 0;
    std::uint32_t chunks = 0, queued = 0;
    std::vector<bool> freed;  ///< (the notices may come in any order)

    /// Queues the copy of chunk `k` into its slot (no record).
    [[nodiscard]] Result<void> copy_in(std::uint32_t k);
};

/// A received frame whose ring tensors are not all queued yet: handed over (`deliver`) once they are.
struct PendingFrame {
    Frame frame;
    std::uint64_t hold = 0;  ///< the peer's hold on the frame's tensors (DeviceRefs::hold)
    std::vector<tensorplay::Stream> streams;
    std::vector<DeviceStream> used;
    int rings = 0;  ///< ring tensors with chunks still to queue
    int gates = 0;  ///< 1 while its other copies out wait (on the host) for the peer's events
    std::function<void(Frame&&, std::vector<tensorplay::Stream>&&)> deliver;
};

/// Receiving a tensor through a ring: chunks are copied out as the sender's "ready" arrives.
struct RingLanding {
    std::shared_ptr<PendingFrame> frame;
    DeviceBackend* backend = nullptr;
    tensorplay::Stream stream;
    std::shared_ptr<Storage> memory;  ///< the peer's outbox, opened
    tensorplay::Event event;          ///< the peer's outbox event, opened
    std::uint8_t* dst = nullptr;      ///< the tensor's memory (the frame keeps it)
    int device = 0;                   ///< the sender's device index
    std::uint64_t offset = 0, nbytes = 0;
    std::size_t chunk = 0;
    std::uint32_t ring = 0, chunks = 0, queued = 0;
    std::vector<bool> arrived;
    /// Chunks in the ring (the first `ring`, then each "ready" one) whose copy out waits for `event`
    /// to be seen complete; `pumping`: a coroutine waits for it on the host.
    std::vector<std::uint32_t> waiting;
    bool pumping = false;
    /// Copies out whose "free" is still to be said once they ran (held until the frame is whole).
    std::vector<std::pair<tensorplay::Event, std::uint32_t>> frees;

    /// Queues the copy of chunk `j` out of its slot (`event` seen complete since it was announced)
    /// and, when a later chunk will use the slot, an event after it in `frees`.
    [[nodiscard]] Result<void> copy_out(std::uint32_t j);
};

/// Sends the notice `name` on `conn` (nothing when it is closed).
void send_ring_notice(Connection& conn, std::string_view name, const RingNotice& n);
/// Sends the control frame `name` with `payload` on `conn`, flushed (nothing when it is closed).
void send_control(Connection& conn, std::string_view name, Bytes payload);

/// Waits on the host (the completion thread) until `event`, another process's, is seen complete;
/// Errc::connection_lost once `conn` closes (a dead peer's event never completes), checked every
/// kForeignWaitSlice; the device's error if it failed.
inline constexpr std::chrono::milliseconds kForeignWaitSlice{250};
[[nodiscard]] Task<Result<void>> host_wait(DeviceBackend& b, tensorplay::Event event, std::weak_ptr<Connection> conn);

/// Says "free" for chunk `n.chunk` on `conn` once `copied` (its copy out) is complete.
[[nodiscard]] Task<void> free_after(DeviceBackend& b, tensorplay::Event copied, std::weak_ptr<Connection> conn, RingNotice n);

}  // namespace tensorplay::detail
