// TcpStore client internals: connection lanes, each with an actor that sends queued requests and reads replies.
#pragma once

#include <tensorplay/store/tcp_store.hpp>

#include "store/c10d_protocol.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tensorplay::detail {

enum class ReplyKind : std::uint8_t { u8, u32, i64, bytes };

/// One queued operation. An optional WAIT goes first (its reply is awaited until `deadline`, then
/// cancelled); `request` is sent after it succeeds (or at once when there is no WAIT) and its
/// replies, of the kinds in `expect`, are collected in order.
struct PendingOp {
    explicit PendingOp(const asio::strand<Executor>& strand) : signal(strand, asio::steady_timer::time_point::max()) {}

    Bytes wait_request;
    std::string wait_keys;  // for the timeout message
    std::optional<Clock::time_point> deadline;
    Bytes request;
    std::vector<ReplyKind> expect;

    std::vector<Bytes> blobs;        // bytes replies, in order
    std::vector<std::int64_t> ints;  // u8 / u32 / i64 replies, in order
    std::optional<Error> error;
    bool done = false;
    bool abandoned = false;  // the caller stopped waiting: not sent if still queued, reply dropped
    asio::steady_timer signal;
};

struct ClientState;

/// One TCP connection to the server. c10d replies carry no ids and a WAIT blocks the replies after
/// it, so a lane holds at most one WAIT at a time: a second concurrent wait gets its own lane.
struct Lane {
    explicit Lane(ClientState& client);

    asio::ip::tcp::socket socket;
    std::deque<std::shared_ptr<PendingOp>> queue;
    asio::steady_timer kick;
    bool connected = false;
    bool dead = false;
    std::size_t waits = 0;  // operations with a WAIT queued or in flight here

    Bytes in;
    std::size_t in_begin = 0;
    Bytes out;

    // WAIT deadline: the watchdog sends CANCEL_WAIT (torch2) or closes the socket (torch113).
    asio::steady_timer wait_timer;
    std::uint64_t wait_generation = 0;
    bool wait_armed = false;
    bool cancel_sent = false;
    bool dropped = false;
};

struct ClientState : std::enable_shared_from_this<ClientState> {
    ClientState(Executor ex, TcpStoreOptions opts);

    asio::strand<Executor> strand;
    TcpStoreOptions options;
    c10d::Dialect dialect;
    std::string where;  // "host:port" for messages
    std::vector<std::shared_ptr<Lane>> lanes;
    std::optional<Error> broken;  // set once: every later operation fails with it
    bool closed = false;

    /// Connects `lane` (retrying until `deadline` when `retry`) and handshakes (torch2).
    Task<Result<void>> open(Lane& lane, Clock::time_point deadline, bool retry);
    /// Queues `op` on a lane without a WAIT (a new lane when there is none) and wakes its actor.
    void submit(const std::shared_ptr<PendingOp>& op);
    /// Adds a lane and starts its actor; `connected` when open() already ran for it.
    std::shared_ptr<Lane> add_lane(std::shared_ptr<Lane> lane, bool connected);
    /// Removes `lane`: fails `inflight` with `e`, moves its unsent operations to another lane.
    void drop_lane(Lane& lane, const Error& e, std::vector<std::shared_ptr<PendingOp>>* inflight);
    /// Marks the client broken with `e` and fails everything queued.
    void shut(Error e);
};

/// Completes `op` (on the strand) and wakes its caller.
void finish(PendingOp& op);
/// Waits (on the strand) until `op` is done, at most `limit` (<= 0: no limit).
Task<Result<void>> await_op(std::shared_ptr<PendingOp> op, Duration limit);

}  // namespace tensorplay::detail
