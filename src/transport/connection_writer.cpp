// Connection, sending side: which channel sends a frame's tensors (inline, cma's references, the
// frames a device channel prepared), the queue the writer takes them from, the writer coroutine
// that gathers every queued frame into one write (a gathered sendmsg, or a ByteStream's writes),
// streamed tensors written piece by piece, and direct sends from the sender's own call.
#include <tensorplay/core/log.hpp>
#include <tensorplay/transport/connection.hpp>

#include "core/asio_compat.hpp"
#include "transport/channels/basic/basic.hpp"
#include "transport/channels/cma/cma_channel.hpp"
#include "transport/connection_state.hpp"

#include <asio/this_coro.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <span>
#include <utility>

namespace tensorplay::detail {

namespace {

/// One non-blocking sendmsg of `iov`: the bytes written (0 when the socket is full); other
/// failures set `ec`.
std::size_t sendmsg_now(int fd, iovec* iov, std::size_t count, std::error_code& ec) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    for (;;) {
        // One buffer (a small frame, payload inlined): send(), which spares the kernel copying
        // in a msghdr and an iovec array (about 0.1 us per call here).
        ssize_t n = count == 1 ? ::send(fd, iov[0].iov_base, iov[0].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL)
                               : ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0) return static_cast<std::size_t>(n);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) ec = std::error_code(errno, asio::error::get_system_category());
        return 0;
    }
}

/// One non-blocking sendmsg of as many buffers as one call takes (IOV_MAX). Writing before
/// handing the rest to the event loop saves a submission round trip on the latency path.
std::size_t try_write_now(asio::generic::stream_protocol::socket& sock, const std::vector<asio::const_buffer>& bufs,
                          std::vector<iovec>& iov, std::error_code& ec) {
    iov.clear();
    for (const auto& b : bufs) {
        if (iov.size() == IOV_MAX) break;
        iov.push_back(iovec{const_cast<void*>(b.data()), b.size()});
    }
    return sendmsg_now(sock.native_handle(), iov.data(), iov.size(), ec);
}

/// polled: one write_some of as much of `bufs` as the stream takes.
Result<std::size_t> polled_write_now(ByteStream& c, const std::vector<asio::const_buffer>& bufs, std::vector<iovec>& iov) {
    iov.clear();
    for (const auto& b : bufs)
        if (b.size() > 0) iov.push_back(iovec{const_cast<void*>(b.data()), b.size()});
    return c.write_some(iov);
}

/// Completion condition for async_read/async_write: all of it, and all of the rest in every
/// system call. (Asio's transfer_all caps each call at 64 KiB: a 64 MiB tensor took 1024 passes
/// through the event loop, one epoll_wait each.)
struct TransferRest {
    std::size_t total;
    std::size_t operator()(const std::error_code& ec, std::size_t done) const { return ec ? 0 : total - done; }
};

/// Drops the first `n` bytes of a buffer sequence.
void consume(std::vector<asio::const_buffer>& bufs, std::size_t n) {
    std::size_t i = 0;
    while (i < bufs.size() && n >= bufs[i].size()) {
        n -= bufs[i].size();
        ++i;
    }
    bufs.erase(bufs.begin(), bufs.begin() + static_cast<std::ptrdiff_t>(i));
    if (n > 0 && !bufs.empty()) bufs[0] += n;
}
}  // namespace

bool ConnectionState::polled_write_iov(iovec* v, std::size_t count, std::size_t& written) {
    auto w = v ? polled->write_some(std::span<const iovec>(v, count)) : polled_write_now(*polled, bufs, iov);
    if (!w) {
        close(std::move(w).error().context("writing to " + who()).on_worker(peer.name));
        return false;
    }
    written = *w;
    return true;
}

Task<Result<void>> ConnectionState::polled_write(std::vector<asio::const_buffer>& b) {
    for (;;) {
        auto n = polled_write_now(*polled, b, iov);
        if (!n) co_return fail(std::move(n).error());
        consume(b, *n);
        if (asio::buffer_size(b) == 0) co_return ok();
        if (*n == 0)
            if (auto w = co_await polled->wait_writable(); !w) co_return w;
    }
}

/// Points `bufs` at every byte of `frames`, skipping the first `skip` (already written).
void ConnectionState::gather(std::span<OutFrame> frames, std::size_t skip) {
    bufs.clear();
    for (auto& f : frames) {
        bufs.push_back(asio::buffer(f.head));
        if (!f.payload.empty()) bufs.push_back(asio::buffer(f.payload));
        for (auto& t : f.tensors)
            if (t.nbytes() > 0) bufs.push_back(asio::buffer(t.data(), t.nbytes()));
    }
    if (skip) consume(bufs, skip);
}

/// Writes the queue now with one non-blocking sendmsg; the writer is woken for any rest.
void ConnectionState::flush_now() {
    if (streamed_queued) {  // (its pieces come from their sources: the writer's)
        wake.complete_later();
        return;
    }
    gather(queue, queue_written);
    std::error_code ec;
    const std::size_t total = asio::buffer_size(bufs);
    std::size_t n = 0;
    if (polled) [[unlikely]] {
        if (!polled_write_iov(nullptr, 0, n)) return;
    } else {
        n = try_write_now(socket, bufs, iov, ec);
    }
    ++stats.writes;
    if (ec) {
        close(from_error_code(ec, "writing to " + who()).on_worker(peer.name));
        return;
    }
    if (n == total) {
        stats.frames_sent += queue.size();
        queue.clear();
        queue_bytes = 0;
        queue_written = 0;
        output_written();
        return;
    }
    queue_written += n;
    wake.complete_later();
}

/// Writes a frame (head in `scratch`) with one non-blocking sendmsg; queues what the socket
/// did not take for the writer (taking `payload` and `tensors`). The queue must be empty and
/// no write in progress.
Result<void> ConnectionState::send_direct(Bytes& payload, std::vector<Tensor>& tensors, bool payload_inline) {
    iovec v[2 + kDirectSendTensors];
    std::size_t cnt = 0, total = 0;
    auto add = [&](const void* p, std::size_t n) {
        if (n == 0) return;
        v[cnt++] = iovec{const_cast<void*>(p), n};
        total += n;
    };
    add(scratch.data(), scratch.size());
    if (!payload_inline) add(payload.data(), payload.size());
    for (auto& t : tensors) add(t.data(), t.nbytes());
    std::error_code ec;
    std::size_t written = 0;
    if (polled) [[unlikely]] {
        if (!polled_write_iov(v, cnt, written)) return fail(closed_error());
    } else {
        written = sendmsg_now(socket.native_handle(), v, cnt, ec);
    }
    ++stats.writes;
    if (ec) {
        close(from_error_code(ec, "writing to " + who()).on_worker(peer.name));
        return fail(closed_error());
    }
    if (written == total) {
        ++stats.frames_sent;
        return ok();
    }
    queue.push_back(OutFrame{scratch, payload_inline ? Bytes{} : std::move(payload), std::move(tensors), {}});
    queue_bytes += total;
    queue_written = written;
    wake.complete_later();
    return ok();
}

namespace {

/// Writes every byte of `s.bufs` (the ring's way or the socket's), or the error that closes the
/// connection.
Task<Result<void>> write_all(ConnectionState& s) {
    if (s.polled) {
        auto w = co_await s.polled_write(s.bufs);
        if (!w) co_return fail(std::move(w).error().context("writing to " + s.who()));
        co_return ok();
    }
    std::error_code ec;
    const std::size_t total = asio::buffer_size(s.bufs);
    const std::size_t n = try_write_now(s.socket, s.bufs, s.iov, ec);
    if (!ec && n < total) {
        consume(s.bufs, n);
        auto [aec, m] = co_await asio::async_write(s.socket, s.bufs, TransferRest{total - n}, use_nothrow);
        ec = aec;
    }
    if (ec) co_return fail(from_error_code(ec, "writing to " + s.who()));
    co_return ok();
}

/// Writes `s->batch`, some of whose frames have tensors from sources: the frames before such a
/// tensor in one write, then its pieces one write each as its source yields them, then on. (The
/// first `skip` bytes were written by a flush, which never takes a frame with sources.)
Task<Result<void>> write_streamed(std::shared_ptr<ConnectionState> s, std::size_t skip) {
    std::span<OutFrame> frames(s->batch);
    std::size_t plain = 0;  // frames[0, plain) gathered and not yet written
    auto flush_plain = [&](std::size_t upto) {
        s->gather(frames.subspan(0, upto), skip);
        skip = 0;
        frames = frames.subspan(upto);
    };
    while (!frames.empty()) {
        while (plain < frames.size() && frames[plain].sources.empty()) ++plain;
        flush_plain(plain);
        plain = 0;
        if (frames.empty()) break;
        OutFrame& f = frames[0];
        // s->bufs holds the plain frames before this one: its head and payload join them.
        s->bufs.push_back(asio::buffer(f.head));
        if (!f.payload.empty()) s->bufs.push_back(asio::buffer(f.payload));
        for (std::size_t i = 0; i < f.tensors.size(); ++i) {
            const Tensor& t = f.tensors[i];
            ByteSource* src = i < f.sources.size() ? f.sources[i].get() : nullptr;
            if (!src) {
                if (t.nbytes() > 0) s->bufs.push_back(asio::buffer(t.data(), t.nbytes()));
                continue;
            }
            if (auto w = co_await write_all(*s); !w) co_return w;
            std::size_t left = t.nbytes();
            for (;;) {
                auto piece = co_await src->next();
                if (!piece) co_return fail(std::move(piece).error().context("writing tensor " + std::to_string(i) + " to " + s->who()));
                if (piece->empty()) break;
                if (piece->size() > left)
                    co_return fail(Errc::internal, "the source of tensor " + std::to_string(i) + " gave more than its " +
                                                       std::to_string(t.nbytes()) + " bytes");
                left -= piece->size();
                s->bufs.assign(1, asio::buffer(piece->data(), piece->size()));
                if (auto w = co_await write_all(*s); !w) co_return w;
            }
            if (left > 0)
                co_return fail(Errc::internal, "the source of tensor " + std::to_string(i) + " ended " + std::to_string(left) +
                                                   " bytes short of its " + std::to_string(t.nbytes()));
            s->bufs.clear();
            f.sources[i].reset();  // (its staging goes back now)
        }
        frames = frames.subspan(1);
    }
    co_return co_await write_all(*s);
}

}  // namespace

Task<void> writer_loop(std::shared_ptr<ConnectionState> s) {
    // (close() cancels the group and wakes us: we end by `open`, not by a throw at the next wait)
    co_await asio::this_coro::throw_if_cancelled(false);
    while (s->open) {
        if (s->queue.empty()) {
            co_await s->wake.wait();  // a send, or close() (which also cancels the group)
            continue;
        }
        s->batch.swap(s->queue);
        s->batch_bytes = std::exchange(s->queue_bytes, 0);
        s->writing = true;
        ++s->stats.writes;
        s->stats.frames_sent += s->batch.size();
        if (s->streamed_queued) [[unlikely]] {
            s->streamed_queued = false;
            const std::size_t skip = std::exchange(s->queue_written, 0);
            auto w = co_await write_streamed(s, skip);
            s->writing = false;
            s->batch.clear();
            s->batch_bytes = 0;
            s->output_written();
            if (!w) {
                if (s->open) s->close(std::move(w).error().on_worker(s->peer.name));
                break;
            }
            continue;
        }
        s->gather(s->batch, s->queue_written);
        s->queue_written = 0;
        std::error_code ec;
        if (s->polled) {
            auto w = co_await s->polled_write(s->bufs);
            s->writing = false;
            s->batch.clear();
            s->batch_bytes = 0;
            s->output_written();
            if (!w) {
                if (s->open) s->close(std::move(w).error().context("writing to " + s->who()).on_worker(s->peer.name));
                break;
            }
            continue;
        }
        const std::size_t total = asio::buffer_size(s->bufs);
        const std::size_t n = try_write_now(s->socket, s->bufs, s->iov, ec);
        if (!ec && n < total) {
            consume(s->bufs, n);
            auto [aec, m] = co_await asio::async_write(s->socket, s->bufs, TransferRest{total - n}, use_nothrow);
            ec = aec;
        }
        s->writing = false;
        s->batch.clear();
        s->batch_bytes = 0;
        s->output_written();
        if (ec) {
            if (s->open) s->close(from_error_code(ec, "writing to " + s->who()).on_worker(s->peer.name));
            break;
        }
    }
    s->queue.clear();
    s->queue_bytes = 0;
}

}  // namespace tensorplay::detail

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
        s.channel_stats.cma_held = s.holds.size();
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
