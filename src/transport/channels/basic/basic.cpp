// The basic channel: the check of what it can write, and the receive of an inline tensor (basic.hpp).
#include "transport/channels/basic/basic.hpp"

#include <tensorplay/device/backend.hpp>

#include "transport/connection_state.hpp"

#include <memory>
#include <optional>
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

Task<Result<void>> basic_receive(ConnectionState& s, Frame& f, const TensorDesc& desc, std::size_t& held) {
    // Once one part of the frame is refused, the rest is read and dropped: the frame is answered
    // with that error.
    if (f.alloc_error) {
        auto r = co_await s.skip(desc.nbytes);
        co_return r;
    }
    bool taken = false;
    if (s.limits.budget && desc.nbytes > 0) {
        if (!s.limits.budget->try_take(desc.nbytes)) {
            f.alloc_error = s.budget_error(desc.nbytes, "a tensor");
            auto r = co_await s.skip(desc.nbytes);
            co_return r;
        }
        taken = true;
    }
    auto sink = s.sink_allocator ? s.sink_allocator(desc) : Result<std::shared_ptr<ByteSink>>(nullptr);
    if (sink && *sink) {
        // Its bytes go to the sink as they are read; the tensor is what it makes of them.
        std::optional<Error> refused;
        auto r = co_await s.read_sunk(**sink, desc.nbytes, refused);
        if (taken) s.limits.budget->give_back(desc.nbytes);  // (the sink's memory is its own)
        if (!r) co_return r;
        Result<Tensor> t = refused ? Result<Tensor>(fail(std::move(*refused))) : (*sink)->finish();
        if (t && t->nbytes() != desc.nbytes) t = fail(Errc::internal, "a tensor sink made a tensor of the wrong size");
        if (!t) f.alloc_error = std::move(t).error();
        else f.tensors.push_back(std::move(*t));
        co_return ok();
    }
    Result<Tensor> t = sink ? s.allocate(desc) : fail(std::move(sink).error());
    if (taken) {
        if (t) held += desc.nbytes;
        else s.limits.budget->give_back(desc.nbytes);
    }
    if (!t) {
        f.alloc_error = std::move(t).error();
        auto r = co_await s.skip(desc.nbytes);
        co_return r;
    }
    auto r = co_await s.read_into(t->data(), desc.nbytes);
    if (!r) co_return r;
    f.tensors.push_back(std::move(*t));
    co_return ok();
}

}  // namespace tensorplay::detail
