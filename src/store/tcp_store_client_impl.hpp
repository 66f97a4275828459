// TcpStore client internals: connection lanes, each with an actor that sends queued requests and reads replies.
#pragma once

#include <tensorplay/store/tcp_store.hpp>

#include "core/resume_slot.hpp"
#include "store/c10d_protocol.hpp"

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tensorplay::detail {

enum class ReplyKind : std::uint8_t { u8, u32, i64, bytes };

struct PendingOp;
using TimedOps = std::multimap<Clock::time_point, std::weak_ptr<PendingOp>>;

/// The caller's completion handler of one operation, type-erased. complete() posts it to the
/// caller's executor (never runs it inline), which is kept from running out of work meanwhile.
struct OpWaiter {
    virtual ~OpWaiter() = default;
    virtual void complete() = 0;
};

template <class Handler>
struct OpWaiterImpl final : OpWaiter {
    explicit OpWaiterImpl(Handler h)
        : handler(std::move(h)),
          work(asio::prefer(asio::get_associated_executor(handler), asio::execution::outstanding_work.tracked)),
          slot(asio::get_associated_cancellation_slot(handler)) {}
    void complete() override {
        auto ex = work;
        asio::post(ex, [h = std::move(handler), slot = slot]() mutable {
            if (slot.is_connected()) slot.clear();
            std::move(h)();
        });
    }
    Handler handler;
    std::decay_t<decltype(asio::prefer(std::declval<asio::associated_executor_t<Handler>>(),
                                       asio::execution::outstanding_work.tracked))>
        work;
    asio::associated_cancellation_slot_t<Handler> slot;
};

/// One queued operation. An optional WAIT goes first (its reply is awaited until `deadline`, then
/// cancelled); `request` is sent after it succeeds (or at once when there is no WAIT) and its
/// replies, of the kinds in `expect`, are collected in order.
struct PendingOp {
    Bytes wait_request;
    std::string wait_keys;  // for the timeout message
    std::optional<Clock::time_point> deadline;
    Bytes request;
    std::vector<ReplyKind> expect;

    std::vector<Bytes> blobs;        // bytes replies, in order
    std::vector<std::int64_t> ints;  // u8 / u32 / i64 replies, in order
    /// Written on the strand only until `done`: once finished (by its reply, the reaper or a
    /// cancel) its caller may be reading it on another thread, so nothing writes it any more.
    std::optional<Error> error;
    bool done = false;
    bool abandoned = false;  // the caller stopped waiting: not sent if still queued, reply dropped

    std::unique_ptr<OpWaiter> waiter;  // set before the op reaches the strand; taken by finish()
    Duration limit{};                  // the caller's wait limit (<= 0: none)
    TimedOps* timed = nullptr;         // where its deadline is registered (strand), if it is
    TimedOps::iterator timed_pos;
};

struct ClientState;

/// One TCP connection to the server. c10d replies carry no ids and a WAIT blocks the replies after
/// it, so a lane holds at most one WAIT at a time: a second concurrent wait gets its own lane.
struct Lane {
    explicit Lane(ClientState& client);

    asio::ip::tcp::socket socket;
    std::deque<std::shared_ptr<PendingOp>> queue;
    ResumeSlot kick;                       ///< the parked actor; submit() resumes it in place
    asio::any_io_executor parked_work;     ///< while parked: keeps the event loop from running out of work
    bool connected = false;
    bool dead = false;
    std::size_t waits = 0;  // operations with a WAIT queued or in flight here

    Bytes in;  // unread replies in [in_begin, in_end); the size is the capacity
    std::size_t in_begin = 0, in_end = 0;
    Bytes out;

    bool parked = false;  // the actor waits in `kick`

    // WAIT deadline, checked by the client's reaper: at expiry it sends CANCEL_WAIT (torch2) or
    // closes the socket (torch113).
    Clock::time_point wait_deadline{};
    bool wait_armed = false;
    bool cancel_sent = false;
    bool dropped = false;
};

struct ClientState : std::enable_shared_from_this<ClientState> {
    ClientState(Executor ex, TcpStoreOptions opts);

    asio::strand<Executor> strand;
    TcpStoreOptions options;
    c10d::Dialect dialect;  // settled by the first open(); never changes after connect
    bool dialect_settled = false;
    std::string where;  // "host:port" for messages
    std::vector<std::shared_ptr<Lane>> lanes;
    std::optional<Error> broken;  // set once: every later operation fails with it
    bool closed = false;

    // Deadlines of operations and WAITs: one timer for the whole client, armed at the earliest.
    TimedOps timed;
    asio::steady_timer reaper_timer;
    bool reaper_running = false;

    /// On the strand: registers `op`'s deadline (when it has a limit) and queues it.
    void start_op(const std::shared_ptr<PendingOp>& op);
    /// On the strand: makes the reaper wake by `t` at the latest (starting it if needed).
    void arm(Clock::time_point t);
    /// Connects `lane` (retrying until `deadline` when `retry`) and handshakes (torch2). The first
    /// call settles the dialect (TcpStoreDialect::automatic: detected, see tcp_store.hpp).
    Task<Result<void>> open(Lane& lane, Clock::time_point deadline, bool retry);
    /// On a connected lane: the torch2 handshake (VALIDATE, then PING with a nonce), bounded by `limit`.
    Task<Result<void>> handshake(Lane& lane, Duration limit);
    /// On a connected lane: one torch113 GETNUMKEYS, to tell a 1.13/2.0 store from something else.
    Task<Result<void>> probe_legacy(Lane& lane, Duration limit);
    /// Queues `op` on a lane without a WAIT (a new lane when there is none) and wakes its actor.
    void submit(const std::shared_ptr<PendingOp>& op);
    /// Adds a lane and starts its actor; `connected` when open() already ran for it.
    std::shared_ptr<Lane> add_lane(std::shared_ptr<Lane> lane, bool connected);
    /// Removes `lane`: fails `inflight` with `e`, moves its unsent operations to another lane.
    void drop_lane(Lane& lane, const Error& e, std::vector<std::shared_ptr<PendingOp>>* inflight);
    /// Marks the client broken with `e` and fails everything queued.
    void shut(Error e);
};

/// Completes `op` (on the strand) and wakes its caller; later calls do nothing more.
void finish(PendingOp& op);

// Socket helpers of the lanes (tcp_store_client.cpp), shared with the connection setup.
std::string ms_string(Duration d);
Task<Result<void>> connect_once(asio::ip::tcp::socket* socket, asio::ip::tcp::endpoint ep);
/// Sends `data`: one non-blocking send first, the event loop for any rest.
Task<Result<void>> write_all(Lane* lane, const Bytes* data, std::string where);
/// Ensures `n` unread bytes are buffered in the lane's [in_begin, in_end).
Task<Result<void>> fill(Lane* lane, std::size_t n, const std::string* where);

/// Cancels an operation from its caller's cancellation slot: on the strand, the op is abandoned
/// (not sent if still queued, its reply dropped) and its caller completes with Errc::cancelled.
struct OpCancel {
    std::shared_ptr<ClientState> s;
    std::weak_ptr<PendingOp> op;
    void operator()(asio::cancellation_type) {
        asio::dispatch(s->strand, [w = op] {
            auto o = w.lock();
            if (!o || o->done) return;
            o->abandoned = true;
            o->error = Error(Errc::cancelled, "store operation cancelled");
            finish(*o);
        });
    }
};

/// Runs `op` from any executor: hands it to the client's strand and completes (on the caller's
/// executor) when it is done, failed, past `limit` (> 0) or cancelled; the outcome is in `op`.
/// No coroutine or timer of its own: deadlines are kept by the client's reaper.
template <class Token>
auto async_run_op(std::shared_ptr<ClientState> s, std::shared_ptr<PendingOp> op, Duration limit, Token&& token) {
    return asio::async_initiate<Token, void()>(
        [](auto handler, std::shared_ptr<ClientState> s, std::shared_ptr<PendingOp> op, Duration limit) {
            using H = std::decay_t<decltype(handler)>;
            auto slot = asio::get_associated_cancellation_slot(handler);
            op->limit = limit;
            op->waiter = std::make_unique<OpWaiterImpl<H>>(std::move(handler));
            if (slot.is_connected()) slot.template emplace<OpCancel>(OpCancel{s, op});
            auto& strand = s->strand;
            asio::dispatch(strand, [s = std::move(s), op = std::move(op)] { s->start_op(op); });
        },
        token, std::move(s), std::move(op), limit);
}

}  // namespace tensorplay::detail
