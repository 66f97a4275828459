// Private: cuda_ipc's receiving side on one connection (a ReferenceChannel). The connection reads
// no bytes of such a tensor: it hands the frame over with each reference in Frame::device_refs and
// the frame's hold in Frame::device_hold, and the agent's device channels copy the tensors out of
// the sender's memory and release the hold (device_channels.hpp).
#pragma once

#include "transport/channels/channel.hpp"

namespace tensorplay::detail {

class DeviceReferences final : public ReferenceChannel {
public:
    Task<Result<void>> receive(ConnectionState&, Frame& f, std::size_t i, const TensorDesc& desc, std::uint64_t ref,
                               std::size_t&) override {
        f.device_refs.push_back(DeviceRef{i, desc, ref});
        f.tensors.emplace_back();  // (landed by the device channels)
        co_return ok();
    }
    void received(ConnectionState&, Frame& f, std::uint64_t hold) override { f.device_hold = hold; }
};

}  // namespace tensorplay::detail
