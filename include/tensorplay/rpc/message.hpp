// Message: what an RPC carries, payload bytes plus tensors, and the streams its device tensors are on.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/export.hpp>
#include <tensorplay/device/backend.hpp>
#include <tensorplay/device/tensor.hpp>

#include <utility>
#include <vector>

namespace tensorplay {

/// An RPC request or reply: opaque payload bytes and tensors sent alongside (never copied into
/// the payload). Tensors on non-CPU devices move through the device maps.
struct TP_API Message {
    Message() = default;
    /// (A constructor, not aggregate initialisation: `Message{payload, {tensor}}` stays warning-free
    /// with `streams` after them. Explicit: bytes do not turn into a Message unasked.)
    explicit Message(Bytes p, std::vector<Tensor> t = {}, std::vector<Stream> s = {})
        : payload(std::move(p)), tensors(std::move(t)), streams(std::move(s)) {}

    Bytes payload;
    std::vector<Tensor> tensors;
    /// Per device, the stream its tensors are on (at most one entry per device).
    /// Sending: where they are still being produced: the agent's copies wait for the work queued
    /// there so far (a device without an entry: its default stream). Received (a handler's request,
    /// a call's reply): fresh pool streams on which the agent queued their arrival; queue work on
    /// them (a handler: also its reply's work) and nothing needs a host wait. A handler's reply
    /// without an entry for a device is taken to be produced on its request's stream there.
    /// Received device tensors are allocated on these streams, so their memory is reused only after
    /// the work queued there; a tensor used on another stream needs Tensor::record_stream(that
    /// stream) before it is dropped, or its memory may go to the next message while that work runs.
    std::vector<Stream> streams;

    /// The entry of `device` in `streams`, or null.
    [[nodiscard]] const Stream* stream_for(Device device) const noexcept {
        for (const auto& s : streams)
            if (s.device == device) return &s;
        return nullptr;
    }
};

}  // namespace tensorplay
