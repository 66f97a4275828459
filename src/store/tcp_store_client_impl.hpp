// TcpStore client internals: connection lanes, each with an actor that sends queued requests and reads replies.
#pragma once

#include <tensorplay/store/tcp_store.hpp>

#include "core/deadline_queue.hpp"
#include "core/flag.hpp"
#include "core/resume_slot.hpp"
#include "core/task_group.hpp"
#include "store/c10d_protocol.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/strand.hpp>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tensorplay::detail {

enum class ReplyKind : std::uint8_t { u8, u32, i64, bytes };

/// What the client's deadline keeper holds: an operation's reply limit or a lane's WAIT deadline.
struct ClientDeadline : DeadlineHook {
    enum class Kind : std::uint8_t { op, wait };
    explicit ClientDeadline(Kind k) : kind(k) {}
    Kind kind;
};

/// One queued operation. An optional WAIT goes first (its reply is awaited until `deadline`, then
/// cancelled); `request` is sent after it succeeds (or at once when there is no WAIT) and its
/// replies, of the kinds in `expect`, are collected in order.
///
/// Its caller's reply limit is a DeadlineHook in the client's keeper (strand-bound). The caller
/// may drop its reference on its own thread at any time after its wait ended (cancelled: at once),
/// so the op must never be in the keeper without the strand holding it too: start_op queues it on
/// a lane (or finishes it) in the same strand handler that adds it, every way an op leaves the
/// strand's lanes goes through finish(), and finish() takes it out of the keeper (on the strand).
struct PendingOp : ClientDeadline {
    PendingOp() : ClientDeadline(Kind::op) {}

    Bytes wait_request;
    std::string wait_keys;  // for the timeout message
    std::optional<Clock::time_point> deadline;
    Bytes request;
    std::vector<ReplyKind> expect;

    std::vector<Bytes> blobs;        // bytes replies, in order
    std::vector<std::int64_t> ints;  // u8 / u32 / i64 replies, in order
    /// Written on the strand only until `done`: once finished (by its reply, its deadline or a
    /// cancel) its caller may be reading it on another thread, so nothing writes it any more.
    std::optional<Error> error;
    bool done = false;
    bool abandoned = false;  // the caller stopped waiting: not sent if still queued, reply dropped

    RemoteSignal::Notifier notifier;  ///< the caller's wait (on its own executor); set before the strand sees it
    Duration limit{};                 ///< the caller's wait limit (<= 0: none)
};

struct ClientState;

/// One TCP connection to the server. c10d replies carry no ids and a WAIT blocks the replies after
/// it, so a lane holds at most one WAIT at a time: a second concurrent wait gets its own lane.
/// The lane itself is the hook of its WAIT's deadline in the client's keeper (queued while the
/// WAIT's reply is awaited; at expiry it sends CANCEL_WAIT (torch2) or closes the socket
/// (torch113)); drop_lane takes it out, so a lane out of `lanes` is never in the keeper.
struct Lane : ClientDeadline {
    explicit Lane(ClientState& client);

    asio::ip::tcp::socket socket;
    std::deque<std::shared_ptr<PendingOp>> queue;
    std::vector<std::shared_ptr<PendingOp>> batch;  ///< sent, replies awaited (shut() fails them)
    ResumeSlot kick;                    ///< the parked actor; submit() resumes it in place
    asio::any_io_executor parked_work;  ///< while parked: keeps the event loop from running out of work
    bool connected = false;
    bool dead = false;
    bool answered = false;  // the store has sent a byte on this lane
    std::size_t waits = 0;  // operations with a WAIT queued or in flight here

    Bytes in;  // unread replies in [in_begin, in_end); the size is the capacity
    std::size_t in_begin = 0, in_end = 0;
    Bytes out;

    bool parked = false;  // the actor waits in `kick`

    bool cancel_sent = false;  // the WAIT in flight passed its deadline: CANCEL_WAIT sent (torch2)
    bool dropped = false;      // ... the socket was closed on purpose (torch113)
};

/// The client. Strand-bound (every member below is touched on `strand` only, but for what never
/// changes after connect: options, dialect, where).
///
/// Background coroutines (each lane's actor, a CANCEL_WAIT's write, the deadline keeper's sweep)
/// are members of `tasks`. shut() (close(), or the connection lost for good) fails every operation,
/// closes the sockets and the keeper, cancels the tasks and starts the join: one coroutine that
/// holds the state until every task has ended, then lets it go on the strand. So a closed client
/// is freed once its tasks are done, whoever held it last, and none of its coroutines outlives it.
struct ClientState : std::enable_shared_from_this<ClientState> {
    ClientState(Executor ex, TcpStoreOptions opts);
    ~ClientState();

    asio::strand<Executor> strand;
    TcpStoreOptions options;
    c10d::Dialect dialect;  // settled by the first open(); never changes after connect
    bool dialect_settled = false;
    std::string where;  // "host:port" for messages
    std::vector<std::shared_ptr<Lane>> lanes;
    std::optional<Error> broken;  // set once: every later operation fails with it
    bool closed = false;
    bool joining = false;  // the join of `tasks` was started (by shut)

    /// Operations' reply limits and lanes' WAIT deadlines: one timer for the whole client.
    DeadlineKeeper deadlines;
    /// Declared last: destroyed first, while what its tasks wait on still exists.
    TaskGroup tasks;

    /// On the strand: registers `op`'s deadline (when it has a limit) and queues it.
    void start_op(const std::shared_ptr<PendingOp>& op);
    /// On the strand: completes `op` (takes it out of the keeper, wakes its caller); later calls
    /// do nothing more.
    void finish(PendingOp& op);
    /// On the strand: the caller stopped waiting for `op`: not sent if still queued, reply dropped.
    void abandon(PendingOp& op, Error why);
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
    /// Marks the client broken with `e`, fails everything queued or in flight, ends the tasks.
    void shut(Error e);
    /// Starts `task` in `tasks`, counted by client_tasks_running().
    void spawn(Task<void> task, const char* what);

private:
    void on_deadline(ClientDeadline& d);
};

/// Test hooks: client states alive in this process, and their lane actors and CANCEL_WAIT
/// writes running now (the deadline sweeps are not counted: a state is freed only after them).
[[nodiscard]] std::size_t client_states_alive() noexcept;
[[nodiscard]] std::size_t client_tasks_running() noexcept;

// Socket helpers of the lanes (tcp_store_client.cpp), shared with the connection setup.
std::string ms_string(Duration d);
Task<Result<void>> connect_once(asio::ip::tcp::socket* socket, asio::ip::tcp::endpoint ep);
/// Sends `data`: one non-blocking send first, the event loop for any rest.
Task<Result<void>> write_all(Lane* lane, const Bytes* data, std::string where);
/// Ensures `n` unread bytes are buffered in the lane's [in_begin, in_end).
Task<Result<void>> fill(Lane* lane, std::size_t n, const std::string* where);

}  // namespace tensorplay::detail
