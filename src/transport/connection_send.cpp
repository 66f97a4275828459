// Connection, sending: which channel sends a frame's tensors (inline, cma's references, the frames
// a device channel prepared) and the queue the writer takes them from (connection.cpp).
#include <tensorplay/transport/connection.hpp>

#include "transport/channels/basic/basic.hpp"
#include "transport/channels/cma/cma_channel.hpp"
#include "transport/connection_state.hpp"

#include <algorithm>

namespace tensorplay {

Result<void> Connection::send(Frame frame, bool flush) {
    return detail::send_parts(*this, frame.kind, frame.id, frame.name, frame.payload, frame.tensors, frame.targets,
                              flush ? detail::Flush::now : detail::Flush::later);
}

Result<void> detail::ConnectionState::queue_frame(OutFrame out, bool flush) {
    auto& s = *this;
    const bool was_empty = s.queue.empty();
    s.streamed_queued = s.streamed_queued || !out.sources.empty();
    s.queue_bytes += out_size(out);
    s.queue.push_back(std::move(out));
    if (const std::size_t hard = s.limits.max_queued_hard;
        hard != 0 && s.queue_bytes + s.batch_bytes > hard && s.queue.size() + s.batch.size() > 1) [[unlikely]] {
        // (One frame of any size passes: the peer may be reading it.)
        s.close(Error(Errc::connection_lost, std::to_string(s.queue_bytes + s.batch_bytes) + " bytes in " +
                                                 std::to_string(s.queue.size() + s.batch.size()) + " frames are queued for " + s.who() +
                                                 ", which does not read them (over the hard bound of " + std::to_string(hard) +
                                                 " bytes): connection closed",
                      s.peer.name));
        return fail(s.closed_error());
    }
    // A partly written queue (queue_written > 0) is the writer's to finish: the socket is full.
    if (flush && !s.writing && s.queue_written == 0) {
        s.flush_now();
        if (!s.open) return fail(s.closed_error());
    } else if (was_empty) {
        s.wake.complete_later();
    }
    return ok();
}


/// Queues a frame as its channels planned it: tensors with a nonzero ref by reference under the
/// plan's hold (a new one when it names none), which keeps its held tensors and `keep` until the
/// peer's release; the others inline, from their storage or their streamed source (staged ones
/// naming the device they came from).
Result<void> detail::ConnectionState::queue_planned(FrameKind kind, std::uint64_t id, std::string_view name, Bytes& payload,
                                                    std::vector<Tensor>& tensors, std::span<const Device> targets,
                                                    const SendPlan& plan, bool flush) {
    auto& s = *this;
    const bool refs = std::any_of(plan.refs.begin(), plan.refs.end(), [](std::uint64_t r) { return r != 0; });
    detail::FrameParts parts{kind, id, name, payload, tensors, targets, 0, {}, plan.sources};
    if (refs) {
        parts.hold = plan.hold != 0 ? plan.hold : (std::uint64_t{1} << 63) | ++s.device_holds;
        parts.refs = plan.refs;
    }
    Bytes head;
    bool inl = false;
    if (auto h = detail::encode_frame_head(parts, s.limits, head, inl); !h)
        return fail(std::move(h).error().context("sending to " + s.who()));
    const bool streamed = std::any_of(plan.streamed.begin(), plan.streamed.end(), [](const auto& p) { return p != nullptr; });
    detail::OutFrame out{std::move(head), inl ? Bytes{} : std::move(payload), {}, {}};
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (refs && i < plan.refs.size() && plan.refs[i] != 0) continue;
        out.tensors.push_back(std::move(tensors[i]));
        if (streamed) out.sources.push_back(i < plan.streamed.size() ? plan.streamed[i] : nullptr);
    }
    if (refs) {
        s.holds.emplace(parts.hold, detail::ConnectionState::Hold{plan.held, plan.held_bytes, plan.keep});
        s.held_bytes += plan.held_bytes;
    }
    return s.queue_frame(std::move(out), flush);
}

Result<void> detail::send_parts(Connection& c, FrameKind kind, std::uint64_t id, std::string_view name, Bytes& payload,
                                std::vector<Tensor>& tensors, std::span<const Device> targets, const SendPlan& plan,
                                Flush flush) {
    auto& s = ConnectionAccess::state(c);
    if (!s.open) return fail(s.closed_error());
    if (auto c = detail::basic_carries(tensors, plan.refs, plan.streamed); !c) return c;
    const bool now = s.flushes(flush, kind);
    for (const auto& [notice, bytes] : plan.preface) {
        Bytes body = bytes;
        std::vector<Tensor> none;
        if (auto r = send_parts(c, FrameKind::control, 0, notice, body, none, {}, Flush::later); !r) return r;
    }
    ++s.sends;
    return s.queue_planned(kind, id, name, payload, tensors, targets, plan, now);
}

void detail::release_hold(Connection& c, std::uint64_t hold) { ConnectionAccess::state(c).send_release(hold); }

Result<void> detail::send_parts(Connection& c, FrameKind kind, std::uint64_t id, std::string_view name, Bytes& payload,
                                std::vector<Tensor>& tensors, std::span<const Device> targets, Flush pace) {
    auto& s = ConnectionAccess::state(c);
    if (!s.open) return fail(s.closed_error());
    const bool flush = s.flushes(pace, kind);
    if (!tensors.empty())
        if (auto c = detail::basic_carries(tensors, {}); !c) return c;
    ++s.sends;
    if (auto* cma = s.channels.cma(); cma && !tensors.empty()) {
        if (auto plan = cma->plan(s, tensors, targets)) return s.queue_planned(kind, id, name, payload, tensors, targets, *plan, flush);
    }
    const detail::FrameParts parts{kind, id, name, payload, tensors, targets, 0, {}, {}};
    bool inl = false;
    // A flushed frame with nothing ahead of it goes out from here, its head encoded into a reused
    // buffer; only a rest the socket does not take is queued for the writer.
    if (flush && !s.writing && s.queue.empty() && tensors.size() <= detail::kDirectSendTensors) {
        if (auto h = detail::encode_frame_head(parts, s.limits, s.scratch, inl); !h)
            return fail(std::move(h).error().context("sending to " + s.who()));
        return s.send_direct(payload, tensors, inl);
    }
    Bytes head;
    if (auto h = detail::encode_frame_head(parts, s.limits, head, inl); !h)
        return fail(std::move(h).error().context("sending to " + s.who()));
    return s.queue_frame(detail::OutFrame{std::move(head), inl ? Bytes{} : std::move(payload), std::move(tensors), {}}, flush);
}

}  // namespace tensorplay
