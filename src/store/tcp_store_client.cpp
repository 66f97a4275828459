// TcpStore client connection: connect with retries, handshake, and the actor that owns the socket.
//
// A client has one or more lanes (connections), each with an actor coroutine that does all of its
// socket I/O on the client's strand. Operations queue a PendingOp on a lane without a WAIT; the
// actor writes every queued request up to (and including) the first WAIT in one write, then reads
// the replies in order (c10d replies carry no ids, and a server answers requests sent after a
// WAIT before the WAIT itself, so nothing follows a WAIT on its lane). A WAIT with a deadline queues
// its lane in the client's deadline keeper: on expiry it sends CANCEL_WAIT (torch2; a racing
// STOP_WAITING may arrive before the WAIT_CANCELED reply) or closes the lane (torch113 has no
// cancel: a late STOP_WAITING would desynchronise the stream). An I/O error fails the operations in flight on that lane with
// Errc::connection_lost; its unsent ones move to a new lane, whose single connect attempt failing
// marks the client broken: every later operation then fails at once.
#include "store/tcp_store_client_impl.hpp"
#include "store/owned_tasks.hpp"

#include "core/asio_compat.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>

#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/prefer.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace tensorplay::detail {

std::string ms_string(Duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

Task<Result<void>> connect_once(asio::ip::tcp::socket* socket, asio::ip::tcp::endpoint ep) {
    auto [ec] = co_await socket->async_connect(ep, use_nothrow);
    if (ec) co_return fail(from_error_code(ec, ""));
    co_return ok();
}

// Sends `data`: one non-blocking send first (the usual case: all of it goes at once, with no
// completion posted through the event loop), the event loop for any rest.
Task<Result<void>> write_all(Lane* lane, const Bytes* data, std::string where) {
    std::size_t sent = 0;
    for (;;) {
        const ssize_t n = ::send(lane->socket.native_handle(), data->data(), data->size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0) sent = static_cast<std::size_t>(n);
        if (n >= 0 || errno != EINTR) break;
    }
    if (sent == data->size()) co_return ok();
    auto [ec, n] = co_await asio::async_write(lane->socket, asio::buffer(data->data() + sent, data->size() - sent), use_nothrow);
    (void)n;
    if (ec) co_return fail(from_error_code(ec, "sending to the store at " + where));
    co_return ok();
}

// Ensures `n` unread bytes are buffered in [in_begin, in_end) (the vector's size is its capacity:
// growing it zero-fills, so it only grows).
Task<Result<void>> fill(Lane* lane, std::size_t n, const std::string* where) {
    while (lane->in_end - lane->in_begin < n) {
        if (lane->in_begin > 0) {
            std::memmove(lane->in.data(), lane->in.data() + lane->in_begin, lane->in_end - lane->in_begin);
            lane->in_end -= lane->in_begin;
            lane->in_begin = 0;
        }
        if (lane->in.size() < std::max(n, lane->in_end + 4096)) lane->in.resize(std::max(n, lane->in_end + 16384));
        // A plain read: Asio reads before it waits, so an end of stream (FIN or reset) that came with
        // the last bytes of an unfinished reply is seen at once.
        auto [ec, got] = co_await lane->socket.async_read_some(
            asio::buffer(lane->in.data() + lane->in_end, lane->in.size() - lane->in_end), use_nothrow);
        lane->in_end += got;
        lane->answered = lane->answered || got > 0;
        if (ec) {
            auto e = from_error_code(ec, "reading from the store at " + *where);
            if (!lane->answered && (ec == asio::error::eof || ec == asio::error::connection_reset))
                // (Closed before its first reply: what a full server does.)
                e = Error(Errc::connection_lost,
                          "the store at " + *where + " closed the connection before its first reply: it may be full "
                          "(TcpStoreServerOptions::max_connections or max_connections_per_host), or not a c10d store (" +
                              e.message() + ")",
                          {}, ec);
            if (e.code() == Errc::cancelled) e = Error(Errc::connection_lost, e.message(), {}, ec);
            co_return fail(std::move(e));
        }
    }
    co_return ok();
}

namespace {

constexpr std::size_t kMaxBatchBytes = 1 << 20;
constexpr std::size_t kMaxIdleLanes = 2;


std::uint64_t take_u64(Lane& lane) {
    auto v = c10d::get_u64(lane.in.data() + lane.in_begin);
    lane.in_begin += 8;
    return v;
}

Task<Result<std::uint8_t>> read_u8(Lane* lane, const std::string* where) {
    if (auto r = co_await fill(lane, 1, where); !r) co_return fail(r.error());
    co_return lane->in[lane->in_begin++];
}

Task<Result<void>> read_replies(ClientState* s, Lane* lane, PendingOp* op) {
    for (ReplyKind kind : op->expect) {
        switch (kind) {
            case ReplyKind::u8: {
                auto b = co_await read_u8(lane, &s->where);
                if (!b) co_return fail(b.error());
                op->ints.push_back(*b);
                break;
            }
            case ReplyKind::u32: {
                if (auto r = co_await fill(lane, 4, &s->where); !r) co_return r;
                op->ints.push_back(c10d::get_u32(lane->in.data() + lane->in_begin));
                lane->in_begin += 4;
                break;
            }
            case ReplyKind::i64: {
                if (auto r = co_await fill(lane, 8, &s->where); !r) co_return r;
                op->ints.push_back(static_cast<std::int64_t>(take_u64(*lane)));
                break;
            }
            case ReplyKind::bytes: {
                if (auto r = co_await fill(lane, 8, &s->where); !r) co_return r;
                const std::uint64_t len = take_u64(*lane);
                if (len > s->options.max_value_size)
                    co_return fail(Errc::protocol_error, "the store at " + s->where + " sent a value of " +
                                                             std::to_string(len) + " bytes, over the limit of " +
                                                             std::to_string(s->options.max_value_size));
                if (auto r = co_await fill(lane, static_cast<std::size_t>(len), &s->where); !r) co_return r;
                auto first = lane->in.begin() + static_cast<std::ptrdiff_t>(lane->in_begin);
                op->blobs.emplace_back(first, first + static_cast<std::ptrdiff_t>(len));
                lane->in_begin += static_cast<std::size_t>(len);
                break;
            }
        }
    }
    if (lane->in_begin == lane->in_end) lane->in_begin = lane->in_end = 0;
    co_return ok();
}

Task<void> send_cancel_wait(std::shared_ptr<Lane> lane) {
    static const std::uint8_t cancel = *c10d::encode_type(c10d::Dialect::modern, c10d::Op::cancel_wait);
    auto [wec, n] = co_await asio::async_write(lane->socket, asio::buffer(&cancel, 1), use_nothrow);
    (void)wec;  // a failed write shows up as a failed read in the actor
    (void)n;
}

// On the strand: the WAIT in flight on `lane` passed its deadline (found by the keeper). The lane's
// state changes here, synchronously, so that the actor's reading of the WAIT's reply (which may
// already be on its way) knows whether a WAIT_CANCELED byte follows.
void expire_wait(ClientState& s, const std::shared_ptr<Lane>& lane) {
    if (lane->dead) return;
    if (s.dialect == c10d::Dialect::modern) {
        lane->cancel_sent = true;
        s.spawn(send_cancel_wait(lane), "a store wait's cancel");
    } else {
        lane->dropped = true;
        std::error_code ignored;
        lane->socket.close(ignored);
    }
}

Error wait_timeout_error(const PendingOp& op, Duration waited) {
    return Error(Errc::timeout, "wait timed out after " + ms_string(waited) + " for keys: " + op.wait_keys);
}

enum class WaitOutcome { ready, timed_out, lane_dropped };

// The WAIT of `op` has been sent: awaits its reply, cancelling it at the deadline.
Task<Result<WaitOutcome>> finish_wait(std::shared_ptr<ClientState> s, std::shared_ptr<Lane> lane, PendingOp* op,
                                      Clock::time_point sent) {
    lane->cancel_sent = false;
    lane->dropped = false;
    if (op->deadline) s->deadlines.add(*lane, *op->deadline);
    auto b = co_await read_u8(lane.get(), &s->where);
    s->deadlines.remove(*lane);
    if (!b) {
        if (!lane->dropped || s->closed) co_return fail(b.error());
        if (!op->done) op->error = wait_timeout_error(*op, Clock::now() - sent);
        co_return WaitOutcome::lane_dropped;  // torch113: the lane was closed on purpose
    }
    if (*b == c10d::kStopWaiting) {
        if (lane->cancel_sent) {
            auto c = co_await read_u8(lane.get(), &s->where);
            if (!c) co_return fail(c.error());
            if (*c != c10d::kWaitCanceled)
                co_return fail(Errc::protocol_error, "the store at " + s->where + " answered CANCEL_WAIT with " +
                                                         std::to_string(*c));
        }
        co_return WaitOutcome::ready;
    }
    if (*b == c10d::kWaitCanceled && lane->cancel_sent) {
        if (!op->done) op->error = wait_timeout_error(*op, Clock::now() - sent);
        co_return WaitOutcome::timed_out;
    }
    co_return fail(Errc::protocol_error,
                   "the store at " + s->where + " answered WAIT with " + std::to_string(*b) + " instead of 0");
}

Task<void> run_lane(std::shared_ptr<ClientState> s, std::shared_ptr<Lane> lane) {
    if (!lane->connected) {
        // A lane added after the first connection gets one attempt: if the server is gone, fail now.
        const auto limit = s->options.timeout > Duration::zero() ? std::min<Duration>(s->options.timeout, std::chrono::seconds(10))
                                                                 : std::chrono::seconds(10);
        auto r = co_await s->open(*lane, Clock::now() + limit, false);
        if (!r) {
            Error e(Errc::connection_lost, "lost the connection to the store at " + s->where +
                                               " and could not reconnect: " + r.error().message());
            s->drop_lane(*lane, e, nullptr);
            s->shut(e);
            co_return;
        }
        lane->connected = true;
    }
    auto& batch = lane->batch;
    while (!lane->dead) {
        if (lane->queue.empty()) {
            lane->parked = true;
            lane->parked_work = asio::prefer(s->strand, asio::execution::outstanding_work.tracked);
            co_await lane->kick.wait();
            lane->parked_work = {};
            lane->parked = false;
            if (lane->kick.error() && !lane->dead) {  // cancelled (the client's tasks are ending)
                s->drop_lane(*lane, Error(Errc::shutdown, "the store client's lane was stopped"), nullptr);
                co_return;
            }
            continue;
        }
        batch.clear();
        lane->out.clear();
        while (!lane->queue.empty() && lane->out.size() < kMaxBatchBytes) {
            auto op = std::move(lane->queue.front());
            lane->queue.pop_front();
            if (op->abandoned) {  // the caller gave up before it was sent: never send it
                if (!op->wait_request.empty()) --lane->waits;
                if (!op->done) op->error = Error(Errc::cancelled, "store operation abandoned before it was sent");
                s->finish(*op);
                continue;
            }
            batch.push_back(op);
            if (!op->wait_request.empty()) {
                lane->out.insert(lane->out.end(), op->wait_request.begin(), op->wait_request.end());
                break;
            }
            lane->out.insert(lane->out.end(), op->request.begin(), op->request.end());
        }
        if (batch.empty()) continue;
        const auto sent = Clock::now();
        if (auto w = co_await write_all(lane.get(), &lane->out, s->where); !w) {
            s->drop_lane(*lane, w.error(), &batch);
            co_return;
        }
        std::optional<Error> failure;
        for (auto& op : batch) {
            if (!op->wait_request.empty()) {
                auto outcome = co_await finish_wait(s, lane, op.get(), sent);
                --lane->waits;
                if (!outcome) {
                    failure = std::move(outcome).error();
                    break;
                }
                if (*outcome == WaitOutcome::lane_dropped) {
                    s->finish(*op);
                    s->drop_lane(*lane, *op->error, nullptr);
                    co_return;
                }
                if (*outcome == WaitOutcome::timed_out || op->request.empty()) {
                    s->finish(*op);
                    continue;
                }
                if (auto w = co_await write_all(lane.get(), &op->request, s->where); !w) {
                    failure = std::move(w).error();
                    break;
                }
            }
            if (auto r = co_await read_replies(s.get(), lane.get(), op.get()); !r) {
                failure = std::move(r).error();
                break;
            }
            s->finish(*op);
        }
        if (failure) {
            s->drop_lane(*lane, *failure, &batch);
            co_return;
        }
        batch.clear();
        // Extra lanes exist for concurrent waits; close this one if enough others are idle.
        if (lane->queue.empty() && lane->waits == 0 && s->lanes.size() > 1 && s->lanes.front() != lane) {
            std::size_t idle = 0;
            for (auto& l : s->lanes) idle += (l->queue.empty() && l->waits == 0 && l->connected) ? 1 : 0;
            if (idle > kMaxIdleLanes) {
                s->drop_lane(*lane, Error(Errc::shutdown, "idle lane closed"), nullptr);
                co_return;
            }
        }
    }
}

}  // namespace

Lane::Lane(ClientState& client) : ClientDeadline(Kind::wait), socket(client.strand) {}

namespace {
LifetimeCounters g_client_counts;
}  // namespace

std::size_t client_states_alive() noexcept { return g_client_counts.states.load(std::memory_order_relaxed); }
std::size_t client_tasks_running() noexcept { return g_client_counts.tasks.load(std::memory_order_relaxed); }

ClientState::ClientState(Executor ex, TcpStoreOptions opts)
    : strand(asio::make_strand(std::move(ex))),
      options(std::move(opts)),
      dialect(options.dialect == TcpStoreDialect::torch113 ? c10d::Dialect::legacy : c10d::Dialect::modern),
      where(options.host + ":" + std::to_string(options.port)),
      deadlines(strand, tasks, [this](DeadlineHook& h) { on_deadline(static_cast<ClientDeadline&>(h)); }),
      tasks(strand) {  // (deadlines: `tasks` is bound now, used later)
    g_client_counts.states.fetch_add(1, std::memory_order_relaxed);
}

ClientState::~ClientState() { g_client_counts.states.fetch_sub(1, std::memory_order_relaxed); }

void ClientState::spawn(Task<void> task, const char* what) { tasks.spawn(counted(g_client_counts, std::move(task)), what); }

// From the keeper's sweep (on the strand; never after shut(), which closes the keeper).
void ClientState::on_deadline(ClientDeadline& d) {
    if (d.kind == ClientDeadline::Kind::op) {
        auto& op = static_cast<PendingOp&>(d);
        abandon(op, Error(Errc::timeout, "timed out after " + ms_string(op.limit) + " waiting for the store's reply"));
        return;
    }
    // A lane in the keeper is in `lanes` (drop_lane takes it out of both): find its owner.
    auto& lane = static_cast<Lane&>(d);
    for (auto& l : lanes)
        if (l.get() == &lane) {
            auto keep = l;  // expire_wait may drop the lane
            expire_wait(*this, keep);
            return;
        }
}

void ClientState::start_op(const std::shared_ptr<PendingOp>& op) {
    if (op->done) return;
    // Added and queued in this one handler: see PendingOp on why the strand holds what the keeper does.
    if (op->limit > Duration::zero()) deadlines.add(*op, Clock::now() + op->limit);
    submit(op);
}

void ClientState::abandon(PendingOp& op, Error why) {
    if (op.done) return;
    op.abandoned = true;
    op.error = std::move(why);
    finish(op);
}

void ClientState::finish(PendingOp& op) {
    op.done = true;
    deadlines.remove(op);  // on the strand, before the caller is woken and may let the op go
    op.notifier.notify();
}

std::shared_ptr<Lane> ClientState::add_lane(std::shared_ptr<Lane> lane, bool connected) {
    lane->connected = connected;
    lanes.push_back(lane);
    spawn(run_lane(shared_from_this(), lane), "a store client lane");
    return lane;
}

void ClientState::submit(const std::shared_ptr<PendingOp>& op) {
    if (broken) {
        op->error = *broken;
        finish(*op);
        return;
    }
    std::shared_ptr<Lane> lane;
    for (auto& l : lanes)
        if (!l->dead && l->waits == 0) {
            lane = l;
            break;
        }
    if (!lane) lane = add_lane(std::make_shared<Lane>(*this), false);
    if (!op->wait_request.empty()) ++lane->waits;
    lane->queue.push_back(op);
    if (lane->parked) lane->kick.complete();  // the actor sends it now, before this returns
}

void ClientState::drop_lane(Lane& lane, const Error& e, std::vector<std::shared_ptr<PendingOp>>* inflight) {
    const Error reason = broken ? *broken : e;
    if (inflight)
        for (auto& op : *inflight)
            if (!op->done) {
                op->error = reason;
                finish(*op);
            }
    if (lane.dead) return;
    lane.dead = true;
    std::shared_ptr<Lane> keep;  // the parked actor, resumed below, may hold the last other reference
    for (auto& l : lanes)
        if (l.get() == &lane) keep = l;
    std::erase_if(lanes, [&](const std::shared_ptr<Lane>& l) { return l.get() == &lane; });
    std::error_code ignored;
    lane.socket.close(ignored);
    deadlines.remove(lane);
    // Operations never sent can go on another lane (or fail at once if the client is broken).
    auto unsent = std::move(lane.queue);
    lane.queue.clear();
    lane.waits = 0;
    lane.kick.complete();  // a parked actor sees `dead` and ends
    for (auto& op : unsent)
        if (!op->done) submit(op);
}

void ClientState::shut(Error e) {
    if (!broken) {
        broken = std::move(e);
        if (broken->code() != Errc::shutdown)
            log(LogLevel::warn, "store", "store client for " + where + " failed: " + broken->to_string());
    }
    closed = closed || broken->code() == Errc::shutdown;
    auto all = lanes;
    for (auto& l : all) {
        // Queued and in flight alike fail now: an actor that ends by its cancellation (an
        // exception at its next co_await) would not finish its batch itself.
        std::vector<std::shared_ptr<PendingOp>> inflight(l->queue.begin(), l->queue.end());
        inflight.insert(inflight.end(), l->batch.begin(), l->batch.end());
        l->queue.clear();
        drop_lane(*l, *broken, &inflight);
    }
    deadlines.close();
    tasks.close();
    tasks.cancel();
    release_after_join(strand, shared_from_this(), joining, "the store client");
}

}  // namespace tensorplay::detail
