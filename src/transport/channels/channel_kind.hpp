// Private: the channels a connection may carry a tensor's bytes by, one per (device type on the
// sender, device type on the receiver) pair, as the handshake negotiated them (docs/protocol.md,
// "Channels"). One folder per channel beside this header.
#pragma once

#include <cstdint>

namespace tensorplay::detail {

/// basic: the bytes inline after the frame's payload (basic/); cma: left in the sender's memory and
/// read by the receiver with process_vm_readv (cma/); cuda_basic: a device tensor staged through
/// pinned host memory, its bytes inline as basic's (cuda_basic/); cuda_ipc: left in the sender's
/// device memory, copied device to device by the receiver (cuda_ipc/). The device channels are
/// driven by device_channels_impl.hpp (the agent reaches them through transport/device_channels.hpp); the connection carries their references.
enum class ChannelKind : std::uint8_t { basic = 0, cma = 1, cuda_basic = 2, cuda_ipc = 3 };

}  // namespace tensorplay::detail
