// Private: cuda_ipc's receiving side on one connection (a ReferenceChannel). The connection reads
// no bytes of such a tensor: it hands the frame over with its references and hold (DeviceRefs,
// FrameSink::on_device_frame), and the agent's device channels copy the tensors out of the
// sender's memory and release the hold (transport/device_channels.hpp).
#pragma once

#include "transport/channels/channel.hpp"
#include "transport/connection_state.hpp"

namespace tensorplay::detail {

class DeviceReferences final : public ReferenceChannel {
public:
    Task<Result<void>> receive(ConnectionState& s, Frame& f, std::size_t i, const TensorDesc& desc, std::uint64_t ref,
                               std::size_t&) override {
        s.reading_refs.refs.push_back(DeviceRef{i, desc, ref});
        f.tensors.emplace_back();  // (landed by the device channels)
        co_return ok();
    }
    void received(ConnectionState& s, Frame&, std::uint64_t hold) override { s.reading_refs.hold = hold; }
};

}  // namespace tensorplay::detail
