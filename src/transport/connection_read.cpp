// Connection, reading side, the general path: awaited reads of whole frames (receive), tensor
// bytes read straight into their storage, large payloads (the small frames' parse in place and
// the dispatch to a sink are in connection_dispatch.cpp).
#include "transport/channels/basic/basic.hpp"
#include "transport/connection_state.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>

#include "core/asio_compat.hpp"

#include <asio/post.hpp>
#include <asio/this_coro.hpp>

#include <sched.h>

#include <algorithm>
#include <cstring>

namespace tensorplay::detail {

Task<Result<void>> ConnectionState::fill(std::size_t n) {
    if (rend - rbeg >= n) co_return ok();
    if (rbeg == rend) rbeg = rend = 0;
    if (rbuf.size() - rbeg < n) {
        if (rbuf.size() < n) {
            rbuf.grow(n, rbeg, rend);
        } else {
            std::memmove(rbuf.data(), rbuf.data() + rbeg, rend - rbeg);
            rend -= rbeg;
            rbeg = 0;
        }
    }
    while (rend - rbeg < n) {
        if (!open) co_return fail(closed_error());
        if (polled) {
            auto k = co_await polled_read(rbuf.data() + rend, rbuf.size() - rend);
            if (!k) co_return fail(polled_read_error(std::move(k).error()));
            rend += *k;
            continue;
        }
        // (a read that empties the socket tells the reactor so: no EAGAIN read next time; a unit
        // is unfinished here, so the next read looks again at once: recheck)
        reading = true;
        auto [ec, k] = co_await async_edge_read(socket, asio::buffer(rbuf.data() + rend, rbuf.size() - rend), edge, true,
                                                use_nothrow);
        reading = false;
        ++stats.reads;
        sends_at_read = sends;
        if (ec) {
            if (!open) co_return fail(closed_error());
            if (ec == asio::error::eof && rend - rbeg > 0)
                co_return fail(broken(Error(Errc::connection_lost,
                                            "connection to " + who() + " closed in the middle of a frame (" +
                                                std::to_string(rend - rbeg) + " of " + std::to_string(n) + " bytes)",
                                            peer.name, ec)));
            co_return fail(broken(from_error_code(ec, "reading from " + who()).on_worker(peer.name)));
        }
        rend += k;
    }
    co_return ok();
}

Task<Result<void>> ConnectionState::read_into(std::uint8_t* dst, std::size_t n) {
    std::size_t have = std::min(n, rend - rbeg);
    if (have) std::memcpy(dst, rbuf.data() + rbeg, have);
    rbeg += have;
    dst += have;
    n -= have;
    if (n == 0) co_return ok();
    if (n >= kDirectReadMin) {
        // Edge reads here too: each chunk the kernel holds is read once, with no EAGAIN read
        // between chunks.
        while (n > 0) {
            if (polled) {
                auto got = co_await polled_read(dst, n);
                if (!got) co_return fail(polled_read_error(std::move(got).error()));
                dst += *got;
                n -= *got;
                continue;
            }
            reading = true;
            auto [ec, k] = co_await async_edge_read(socket, asio::buffer(dst, n), edge, true, use_nothrow);
            reading = false;
            ++stats.reads;
            sends_at_read = sends;
            if (ec) {
                if (!open) co_return fail(closed_error());
                co_return fail(broken(Error(Errc::connection_lost,
                                            "connection to " + who() + " lost in the middle of a frame: " + ec.message(),
                                            peer.name, ec)));
            }
            dst += k;
            n -= k;
        }
        co_return ok();
    }
    if (auto r = co_await fill(n); !r) co_return r;
    std::memcpy(dst, rbuf.data() + rbeg, n);
    rbeg += n;
    co_return ok();
}

Task<Result<void>> ConnectionState::skip(std::size_t n) {
    while (n > 0) {
        if (rbeg == rend) {
            if (auto r = co_await fill(1); !r) co_return r;
        }
        std::size_t k = std::min(n, rend - rbeg);
        rbeg += k;
        n -= k;
    }
    co_return ok();
}

Task<Result<void>> ConnectionState::read_sunk(ByteSink& sink, std::size_t n, std::optional<Error>& refused) {
    while (n > 0) {
        auto piece = co_await sink.next();
        if (piece && (piece->empty() || piece->size() > n))
            piece = fail(Errc::internal, "a tensor sink gave " + std::to_string(piece->size()) + " bytes of room for " +
                                             std::to_string(n) + " bytes");
        if (!piece) {
            refused = std::move(piece).error();
            co_return co_await skip(n);
        }
        if (auto r = co_await read_into(piece->data(), piece->size()); !r) co_return r;
        n -= piece->size();
    }
    co_return ok();
}

/// The error of a failed socket read (the connection is closed by it).
Error ConnectionState::read_error(std::error_code ec) {
    if (!open) return closed_error();
    if (ec == asio::error::eof && rend > rbeg)
        return broken(Error(Errc::connection_lost,
                            "connection to " + who() + " closed in the middle of a frame (" + std::to_string(rend - rbeg) +
                                " bytes of it read)",
                            peer.name, ec));
    return broken(from_error_code(ec, "reading from " + who()).on_worker(peer.name));
}

/// Reads one frame; `keep` holds this state for the read. Frames without tensors that fit the
/// buffer are read with one reactor operation per socket read, awaited here, and parsed in
/// place; the general path (tensors, large payloads) is read_general. (This coroutine's frame
/// stays small, under what Asio's per-thread frame cache keeps: a larger one is a malloc.)
Task<Result<Frame>> ConnectionState::read_frame(std::shared_ptr<ConnectionState> keep) {
    (void)keep;
    for (;;) {
        if (!open) co_return fail(closed_error());
        Result<Frame> f;
        std::optional<Error> err;
        const Parse p = parse_buffered(*f, err);
        if (p == Parse::frame) co_return std::move(f);
        if (p == Parse::bad) co_return fail(std::move(*err));
        if (p == Parse::general) break;
        // A receive() waits for the peer: look again after a drained read unless we sent since.
        reading = true;
        auto [ec, k] = co_await async_edge_read(socket, asio::buffer(rbuf.data() + rend, rbuf.size() - rend), edge,
                                                recheck(true), use_nothrow);
        reading = false;
        ++stats.reads;
        sends_at_read = sends;
        if (ec) co_return fail(read_error(ec));
        rend += k;
    }
    co_return co_await read_general();
}

namespace {
/// polled_read yields its core every this many turns at most (when no yield gave the core away).
constexpr unsigned kPollYieldEvery = 8;
/// A sched_yield that took this long ran another task on this core: likely the peer.
constexpr auto kYieldRanOther = std::chrono::microseconds(2);
}  // namespace

Task<Result<std::size_t>> ConnectionState::polled_read(std::uint8_t* dst, std::size_t n) {
    const std::span<std::uint8_t> into(dst, n);
    auto k = polled->read_some(into);
    if (!k || *k > 0) {
        ++stats.reads;
        sends_at_read = sends;
        co_return k;
    }
    reading = true;
    // Look again while the peer may be about to answer, letting every other handler of this event
    // loop run between looks (spinning in place would hold back the very work that answers);
    // then sleep on the doorbell, which the event loop watches.
    const auto until = Clock::now() + poll_spin;
    auto ex = socket.get_executor();
    for (unsigned turn = 1;; ++turn) {
        k = polled->read_some(into);
        if (!k || *k > 0) break;
        const auto now = Clock::now();
        if (poll_spin.count() > 0 && now < until) {
            // Give the core to a peer that shares it: at every turn while yielding runs another
            // task (the peer, most likely), else now and then (a peer on another core answers
            // without it, and the call costs a system call). The event loop runs its other work
            // between turns.
            if (poll_yield_every <= 1 || turn % poll_yield_every == 0) {
                ::sched_yield();
                poll_yield_every = Clock::now() - now > kYieldRanOther ? 1 : kPollYieldEvery;
            }
            co_await asio::post(ex, use_nothrow);
            continue;
        }
        auto w = co_await polled->wait_readable();
        if (!w) {
            k = fail(std::move(w).error());
            break;
        }
    }
    reading = false;
    ++stats.reads;
    sends_at_read = sends;
    co_return k;
}

Error ConnectionState::polled_read_error(Error e) {
    if (!open) return closed_error();
    if (e.code() == Errc::connection_lost && (rend > rbeg || in_frame))
        return broken(Error(Errc::connection_lost,
                            "connection to " + who() + " closed in the middle of a frame (" + std::to_string(rend - rbeg) +
                                " bytes of it buffered): " + e.message(),
                            peer.name));
    return broken(std::move(e).context("reading from " + who()).on_worker(peer.name));
}

Task<Result<Frame>> ConnectionState::polled_read_frame(std::shared_ptr<ConnectionState> keep) {
    (void)keep;
    for (;;) {
        if (!open) co_return fail(closed_error());
        Result<Frame> f;
        std::optional<Error> err;
        const Parse p = parse_buffered(*f, err);
        if (p == Parse::frame) co_return std::move(f);
        if (p == Parse::bad) co_return fail(std::move(*err));
        if (p == Parse::general) break;
        auto k = co_await polled_read(rbuf.data() + rend, rbuf.size() - rend);
        if (!k) co_return fail(polled_read_error(std::move(k).error()));
        rend += *k;
    }
    co_return co_await read_general();
}

namespace {
/// Marks the general path busy with a frame and gives back the receive budget that frame took,
/// whichever way read_general ends.
struct GeneralFrame {
    ConnectionState& s;
    std::size_t held = 0;
    explicit GeneralFrame(ConnectionState& st) : s(st) { s.in_frame = true; }
    GeneralFrame(const GeneralFrame&) = delete;
    GeneralFrame& operator=(const GeneralFrame&) = delete;
    ~GeneralFrame() {
        s.in_frame = false;
        if (held && s.limits.budget) s.limits.budget->give_back(held);
    }
};

}  // namespace

/// Reads a frame with tensors, or one larger than the buffer.
Task<Result<Frame>> ConnectionState::read_general() {
    GeneralFrame guard(*this);
    reading_refs = DeviceRefs{};
    if (rend - rbeg < kFrameHeaderSize)
        if (auto r = co_await fill(kFrameHeaderSize); !r) co_return fail(r.error());
    auto h = decode_frame_header({rbuf.data() + rbeg, kFrameHeaderSize}, limits);
    if (!h) co_return fail(broken(std::move(h).error().context("frame from " + who()).on_worker(peer.name)));
    rbeg += kFrameHeaderSize;
    if (rend - rbeg < h->meta_len)
        if (auto r = co_await fill(h->meta_len); !r) co_return fail(r.error());
    auto meta = decode_frame_meta({rbuf.data() + rbeg, h->meta_len}, limits, h->flags);
    if (!meta) co_return fail(broken(std::move(meta).error().context("frame from " + who()).on_worker(peer.name)));
    rbeg += h->meta_len;
    if (h->kind == FrameKind::control && (meta->name.empty() || !meta->tensors.empty()))
        co_return fail(broken(Error(Errc::protocol_error,
                                    "control frame from " + who() +
                                        (meta->name.empty() ? " has an empty name but is not a release" : " carries tensors"),
                                    peer.name)));
    // A tensor by reference goes to its pair's channel, which must be one that sends by reference
    // (cma, cuda_ipc); one frame holds one such channel's (its hold is that channel's).
    ReferenceChannel* by_ref = nullptr;
    for (std::size_t i = 0; i < meta->remote.size(); ++i) {
        if (meta->remote[i] == 0) continue;
        const auto& d = meta->tensors[i];
        ReferenceChannel* ch = channels.by_reference(channels.receive_kind(d.source, d.target));
        if (!ch)
            co_return fail(broken(Error(Errc::protocol_error,
                                        "frame from " + who() + " sends tensor " + std::to_string(i) + " from " + d.source.str() +
                                            " to " + d.target.str() + " by reference, but that pair chose no channel that does",
                                        peer.name)));
        if (by_ref && ch != by_ref)
            co_return fail(broken(Error(Errc::protocol_error,
                                        "frame from " + who() + " sends tensors by reference over two channels", peer.name)));
        by_ref = ch;
    }
    {
        std::uint64_t total = h->payload_len;  // (each is bounded by its own limit: no overflow)
        for (const auto& d : meta->tensors) total += d.nbytes;
        if (total > limits.max_frame_bytes)
            co_return fail(broken(Error(Errc::protocol_error,
                                        "frame from " + who() + " announces " + std::to_string(total) +
                                            " bytes of payload and tensors, over the limit of " +
                                            std::to_string(limits.max_frame_bytes) + " per frame",
                                        peer.name)));
    }

    Frame f;
    f.kind = h->kind;
    f.id = h->id;
    f.name = std::move(meta->name);
    if (auto r = co_await read_payload(f, h->payload_len, guard.held); !r) co_return fail(r.error());
    f.tensors.reserve(meta->tensors.size());
    f.targets.reserve(meta->tensors.size());
    for (const auto& d : meta->tensors) f.targets.push_back(d.target);
    for (std::size_t i = 0; i < meta->tensors.size(); ++i) {
        const TensorDesc& desc = meta->tensors[i];
        if (const std::uint64_t remote = i < meta->remote.size() ? meta->remote[i] : 0; remote != 0) {
            // Its bytes are not on the stream: its channel receives it.
            if (auto r = co_await by_ref->receive(*this, f, i, desc, remote, guard.held); !r) co_return fail(broken(std::move(r).error()));
            continue;
        }
        // Its bytes follow on the stream: the basic channel receives it.
        if (auto r = co_await basic_receive(*this, f, desc, guard.held); !r) co_return fail(r.error());
    }
    if (by_ref) by_ref->received(*this, f, meta->hold);
    ++stats.frames_received;
    co_return f;
}

Error ConnectionState::budget_error(std::size_t n, const char* what) const {
    const auto& b = *limits.budget;
    return Error(Errc::io_error,
                 std::string("cannot receive ") + what + " of " + std::to_string(n) + " bytes from " + who() +
                     ": the connections' receive budget (" + std::to_string(b.limit()) + " bytes, " +
                     std::to_string(b.used()) + " in use by frames still arriving) is spent; retry later");
}

Result<Tensor> ConnectionState::allocate(const TensorDesc& desc) {
    Result<Tensor> t = allocator ? allocator(desc) : fail(Errc::device_error, "no tensor allocator on this connection");
    if (t && (t->nbytes() != desc.nbytes || (desc.nbytes > 0 && t->data() == nullptr)))
        t = fail(Errc::internal, "the allocator returned a tensor of the wrong size");
    return t;
}

Result<Tensor> ConnectionState::take_tensor(const TensorDesc& desc, std::size_t& held) {
    if (limits.budget && desc.nbytes > 0 && !limits.budget->try_take(desc.nbytes)) return fail(budget_error(desc.nbytes, "a tensor"));
    auto t = allocate(desc);
    if (limits.budget && desc.nbytes > 0) {
        if (t) held += desc.nbytes;
        else limits.budget->give_back(desc.nbytes);
    }
    return t;
}

Task<Result<void>> ConnectionState::read_payload(Frame& f, std::size_t len, std::size_t& held) {
    // What is buffered already, or a small payload, at once; a large one grows with what arrives
    // (doubling from kPayloadStep), so a claimed length alone costs nothing. Each step is zeroed
    // by resize() just before a read overwrites it: bounded by what arrived, never the claim.
    std::size_t got = 0;
    while (got < len) {
        const std::size_t want = std::min(len, std::max({got * 2, got + kPayloadStep, got + (rend - rbeg)}));
        const std::size_t more = want - got;
        if (limits.budget && !limits.budget->try_take(more)) {
            f.alloc_error = budget_error(len, "a payload");
            Bytes().swap(f.payload);
            co_return co_await skip(len - got);
        }
        held += more;
        f.payload.resize(want);
        const std::size_t have = std::min(more, rend - rbeg);
        if (have) std::memcpy(f.payload.data() + got, rbuf.data() + rbeg, have);
        rbeg += have;
        got += have;
        if (got < want) {
            if (auto r = co_await read_into(f.payload.data() + got, want - got); !r) co_return r;
            got = want;
        }
    }
    co_return ok();
}

Result<Hello> ConnectionState::parse_hello_body(std::size_t len) {
    auto h = decode_hello_body({rbuf.data() + rbeg, len}, limits);
    rbeg += len;
    return h;
}

}  // namespace tensorplay::detail

namespace tensorplay::detail {

void ConnectionState::hand_over(FrameSink& sink, Frame&& f) {
    if (!reading_refs.empty()) {
        DeviceRefs refs = std::exchange(reading_refs, DeviceRefs{});
        if (sink.on_device_frame(f, refs)) return;
        reading_refs = std::move(refs);
        refuse_refs(f);
    }
    sink.on_frame(std::move(f));
}

void ConnectionState::refuse_refs(Frame& f) {
    if (reading_refs.empty()) return;
    DeviceRefs refs = std::exchange(reading_refs, DeviceRefs{});
    if (!f.alloc_error)
        f.alloc_error = Error(Errc::device_error, "frame \"" + f.name + "\" from " + who() + " carries " +
                                                      std::to_string(refs.refs.size()) +
                                                      " tensor(s) by a device channel's reference, which this reader does not take");
    if (refs.hold != 0) send_release(refs.hold);
}

}  // namespace tensorplay::detail
