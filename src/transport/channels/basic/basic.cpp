// The basic channel's check of what it can write (basic.hpp).
#include "transport/channels/basic/basic.hpp"

#include <tensorplay/device/backend.hpp>

#include <string>

namespace tensorplay::detail {

Result<void> basic_carries(const std::vector<Tensor>& tensors, std::span<const std::uint64_t> refs,
                           std::span<const std::shared_ptr<ByteSource>> streamed) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (!tensors[i].defined() || (i < refs.size() && refs[i] != 0) || (i < streamed.size() && streamed[i])) continue;
        const Device d = tensors[i].device();
        if (d.type == DeviceType::cpu) continue;
        auto backend = backend_for(d);
        if (backend && (*backend)->host_accessible()) continue;
        return fail(Errc::device_error, "tensor " + std::to_string(i) + " is on " + d.str() +
                                            ", whose memory the host cannot address: a Connection writes host memory "
                                            "only (the RPC agent's device channels stage or copy device tensors)");
    }
    return ok();
}

}  // namespace tensorplay::detail
