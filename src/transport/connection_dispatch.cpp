// Connection, reading side driving a sink (dispatch_to): small frames are parsed where they lie in
// the read buffer (cma's releases taken on the way) and handed over from the socket read's
// completion; a frame with tensors or a large payload, and every frame of a polled stream
// (ByteStream), goes through a coroutine of the connection's task group.
#include "transport/connection_state.hpp"

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"

#include <asio/post.hpp>
#include <asio/this_coro.hpp>

#include <cstring>

namespace tensorplay::detail {

/// The common case without waiting: a whole frame without tensors in the buffer, viewed where
/// it lies (and consumed: the views stay valid until the buffer is next read into or
/// compacted). `more`: read first (the buffer has room for the whole frame); `general`:
/// read_general's path.
ConnectionState::Parse ConnectionState::parse_view(FrameView& f, std::optional<Error>& err) {
    for (;;) {  // (a keep-alive is dropped and the next frame parsed: `continue`)
        // (Looked at here first: a call per frame costs every round trip some 50 instructions.)
        if (rend - rbeg >= kFrameHeaderSize + kReleaseMetaLen &&
            rbuf.data()[rbeg + 2] == static_cast<std::uint8_t>(FrameKind::control) && !take_buffered_releases(err))
            return Parse::bad;
        const std::size_t avail = rend - rbeg;
        std::size_t need = kFrameHeaderSize;
        if (avail >= kFrameHeaderSize) {
            const std::uint8_t* p = rbuf.data() + rbeg;
            FrameHeader h;
            if (!peek_frame_header(p, limits, h)) {
                auto bad = decode_frame_header({p, kFrameHeaderSize}, limits);  // (fails: says why)
                err = broken(std::move(bad).error().context("frame from " + who()).on_worker(peer.name));
                return Parse::bad;
            }
            const std::uint64_t body = std::uint64_t(h.meta_len) + h.payload_len;
            if (body > rbuf.size() - kFrameHeaderSize) return Parse::general;
            need += body;
            if (avail >= need) {
                const std::span<const std::uint8_t> meta{p + kFrameHeaderSize, h.meta_len};
                // Tensors, or malformed metadata: read_general decodes it and says which.
                // (A whole release here has a bad block, and a control frame with an empty name is
                // not a release: read_general says so.)
                if (h.flags != 0 || !decode_small_meta(meta, limits, f.name) || (h.kind == FrameKind::control && f.name.empty()))
                    return Parse::general;
                f.kind = h.kind;
                f.id = h.id;
                f.payload = {p + kFrameHeaderSize + h.meta_len, h.payload_len};
                rbeg += need;
                if (rbeg == rend) rbeg = rend = 0;
                ++stats.frames_received;
                // A keep-alive only shows the peer is there (the read that brought it counts for
                // idle_timeout): dropped here, the next frame parsed instead.
                if (h.kind == FrameKind::control && f.name == kKeepAliveName) [[unlikely]] {
                    ++stats.keepalives_received;
                    continue;
                }
                return Parse::frame;
            }
        }
        if (rbuf.size() - rbeg < need) {  // make room for the whole frame
            std::memmove(rbuf.data(), rbuf.data() + rbeg, avail);
            rend = avail;
            rbeg = 0;
        }
        return Parse::more;
    }
}

bool ConnectionState::take_buffered_releases(std::optional<Error>& err) {
    constexpr std::size_t whole = kFrameHeaderSize + kReleaseMetaLen;
    while (rend - rbeg >= whole && rbuf.data()[rbeg + 2] == static_cast<std::uint8_t>(FrameKind::control)) {
        const std::uint8_t* p = rbuf.data() + rbeg;
        FrameHeader h;
        std::string_view name;
        // Anything but a well-formed release is left to the frame parser, which says what is wrong.
        if (!peek_frame_header(p, limits, h) || h.meta_len != kReleaseMetaLen ||
            !decode_small_meta({p + kFrameHeaderSize, kReleaseMetaLen}, limits, name) || !name.empty())
            return true;
        rbeg += whole;
        if (!take_release(h.id, err)) return false;
    }
    if (rbeg == rend) rbeg = rend = 0;
    return true;
}

bool ConnectionState::take_release(std::uint64_t id, std::optional<Error>& err) {
    auto it = holds.find(id);
    if (it != holds.end()) {
        held_bytes -= it->second.bytes;
        holds.erase(it);
    } else {
        err = broken(Error(Errc::protocol_error,
                           "frame from " + who() + " releases hold " + std::to_string(id) + ", which we do not hold",
                           peer.name));
        return false;
    }
    channel_stats.cma_held = holds.size();
    return true;
}

void ConnectionState::send_release(std::uint64_t hold) {
    if (!open) return;
    ++sends;
    const bool was_empty = queue.empty();
    queue.push_back(OutFrame{encode_release(hold), {}, {}, {}});
    // The writer writes it after this turn, unless a frame flushed meanwhile (a reply) takes it along.
    if (was_empty && !writing) wake.complete_later();
}

/// parse_view, into a Frame.
ConnectionState::Parse ConnectionState::parse_buffered(Frame& f, std::optional<Error>& err) {
    FrameView v;
    const Parse p = parse_view(v, err);
    if (p != Parse::frame) return p;
    f.kind = v.kind;
    f.id = v.id;
    f.name = v.name;
    f.payload.assign(v.payload.begin(), v.payload.end());
    return p;
}

void DispatchReader::operator()(DispatchOp& op, std::error_code ec, std::size_t n) {
    s->reading = false;
    ++s->stats.reads;
    s->sends_at_read = s->sends;
    if (ec) {
        sink->on_closed(s->read_error(ec));
        op.end();  // (releases the sink, as promised, and this reader)
        return;
    }
    s->rend += n;
    dispatch_frames(op);
}

namespace {
/// Spawns `task`, which took `op`, into the connection's task group; a group that is joined
/// already refuses it (its frame, and so `op`, destroyed unstarted): the connection then closes
/// and the sink hears of it.
void spawn_reader(std::shared_ptr<ConnectionState> s, std::shared_ptr<FrameSink> sink, Task<void> task) {
    if (s->tasks.spawn(std::move(task), "connection reader")) return;
    s->close(Error(Errc::shutdown, "connection to " + s->who() + " is shutting down (its background work was joined)"));
    sink->on_closed(s->closed_error());
}

Task<void> dispatch_general(RearmedReadOwner<DispatchReader> owner) {
    // (A close cancels the group: the read fails by it, and on_closed says so; no throw here.)
    co_await asio::this_coro::throw_if_cancelled(false);
    DispatchReader& r = owner.op->reader;
    auto f = co_await r.s->read_general();
    if (!f) {
        r.sink->on_closed(f.error());
        co_return;  // (the owner ends the op)
    }
    r.s->hand_over(*r.sink, std::move(*f));
    dispatch_frames(*owner.release());
}

/// Backpressure: the peer does not read what we queued for it (over limits.max_queued_soft), so we read
/// nothing more of it until the writer has brought the queue under the bound.
Task<void> dispatch_when_drained(RearmedReadOwner<DispatchReader> owner) {
    co_await asio::this_coro::throw_if_cancelled(false);
    DispatchReader& r = owner.op->reader;
    ConnectionState& s = *r.s;
    while (s.open && s.output_over()) co_await s.output_drained.wait();
    if (!s.open) {
        r.sink->on_closed(s.closed_error());
        co_return;  // (the owner ends the op)
    }
    dispatch_frames(*owner.release());
}
}  // namespace

namespace {
/// Hands every whole small frame in the buffer to the reader's sink. What stopped it: `more` (read
/// first), `general` (read_general's frame is next), or `bad` (`err` says why: a bad frame, or the
/// connection is closed).
[[gnu::always_inline]] inline ConnectionState::Parse hand_on_buffered(DispatchReader& r, std::optional<Error>& err) {
    ConnectionState& s = *r.s;
    for (;;) {
        if (!s.open) {
            err = s.closed_error();
            return ConnectionState::Parse::bad;
        }
        FrameView v;
        const ConnectionState::Parse p = s.parse_view(v, err);
        if (p != ConnectionState::Parse::frame) return p;
        r.sink->on_small_frame(v);
    }
}
}  // namespace

void dispatch_frames(DispatchOp& op) {
    DispatchReader& r = op.reader;
    ConnectionState& s = *r.s;
    bool handed_on = false;  // op belongs to a pending read or a coroutine: not ours to end
    try {
        for (;;) {
            std::optional<Error> err;
            const ConnectionState::Parse p = hand_on_buffered(r, err);
            if (p == ConnectionState::Parse::frame) continue;  // (not returned)
            if (p == ConnectionState::Parse::bad) {
                r.sink->on_closed(*err);
                op.end();
                return;
            }
            // Either reads the socket next: not while the peer leaves what we queued unread.
            handed_on = true;
            if (s.output_over()) [[unlikely]] {
                auto keep = r.s;
                auto sink = r.sink;
                spawn_reader(std::move(keep), std::move(sink), dispatch_when_drained(RearmedReadOwner<DispatchReader>(&op)));
                return;
            }
            if (p == ConnectionState::Parse::general) {
                auto keep = r.s;
                auto sink = r.sink;
                spawn_reader(std::move(keep), std::move(sink), dispatch_general(RearmedReadOwner<DispatchReader>(&op)));
                return;
            }
            const bool again = s.recheck(r.sink->awaiting_input());
            s.reading = true;
            op.start(asio::buffer(s.rbuf.data() + s.rend, s.rbuf.size() - s.rend), again);
            return;
        }
    } catch (...) {
        // A sink that throws (out of memory) ends this connection, not the event loop.
        auto e = error_from_current_exception("connection reader").on_worker(s.peer.name);
        s.close(e);
        if (handed_on) return;  // (the close ends the pending read, or the coroutine ends)
        r.sink->on_closed(e);
        op.end();
    }
}

namespace {
/// The polled dispatch reader's life (dispatch_polled_frames). `owner` ends the op when it returns.
Task<void> dispatch_polled(RearmedReadOwner<DispatchReader> owner) {
    co_await asio::this_coro::throw_if_cancelled(false);  // (a close ends it by the failed read)
    DispatchReader& r = owner.op->reader;
    ConnectionState& s = *r.s;  // (the reader holds the state)
    try {
        for (;;) {
            std::optional<Error> err;
            const ConnectionState::Parse p = hand_on_buffered(r, err);
            if (p == ConnectionState::Parse::bad) {
                r.sink->on_closed(*err);
                co_return;
            }
            while (s.open && s.output_over()) co_await s.output_drained.wait();  // (backpressure, as above)
            if (p == ConnectionState::Parse::general) {
                auto f = co_await s.read_general();
                if (!f) {
                    r.sink->on_closed(f.error());
                    co_return;
                }
                s.hand_over(*r.sink, std::move(*f));
                continue;
            }
            // (FrameSink::awaiting_input steers the socket's recheck of a FIN: the rings' end
            // shows by the setup socket instead, so it is not asked.)
            auto k = co_await s.polled_read(s.rbuf.data() + s.rend, s.rbuf.size() - s.rend);
            if (!k) {
                r.sink->on_closed(s.polled_read_error(std::move(k).error()));
                co_return;
            }
            s.rend += *k;
        }
    } catch (...) {
        // A sink that throws (out of memory) ends this connection, not the event loop.
        auto e = error_from_current_exception("connection reader").on_worker(s.peer.name);
        s.close(e);
        r.sink->on_closed(e);
    }
}
}  // namespace

void dispatch_polled_frames(DispatchOp& op) {
    auto keep = op.reader.s;
    auto sink = op.reader.sink;
    spawn_reader(std::move(keep), std::move(sink), dispatch_polled(RearmedReadOwner<DispatchReader>(&op)));
}

}  // namespace tensorplay::detail
