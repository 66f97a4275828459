// Connection, reading side driving a sink (dispatch_to): small frames are parsed and handed over
// from the socket read's completion; a frame with tensors or a large payload, and every frame of
// a polled stream (ByteStream), goes through a coroutine of the connection's task group.
#include "transport/connection_state.hpp"

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"

#include <asio/post.hpp>
#include <asio/this_coro.hpp>

namespace tensorplay::detail {

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
