// Private: the native agent behind the TENSORPIPE backend (framed TCP connections, handlers, calls).
#pragma once

#include <tensorplay/device/device_map.hpp>
#include <tensorplay/rpc/agent.hpp>
#include <tensorplay/rpc/backend_registry.hpp>
#include <tensorplay/rpc/options.hpp>
#include <tensorplay/store/store.hpp>
#include <tensorplay/transport/connection.hpp>

#include "transport/connection_ext.hpp"

#include "core/asio_compat.hpp"
#include "core/flag.hpp"
#include "core/log_throttle.hpp"
#include "rpc/call_table.hpp"
#include "rpc/agent_metrics.hpp"
#include "rpc/group_membership.hpp"
#include "rpc/handler_registry.hpp"
#include "rpc/membership.hpp"
#include "rpc/peer_table.hpp"
#include "rpc/serving_pool.hpp"
#include "core/resume_slot.hpp"
#include "core/task_group.hpp"
#include "transport/device_channels.hpp"
#include "rpc/endpoint.hpp"
#include "transport/transport.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/thread_pool.hpp>

#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace tensorplay::detail {

/// Extra knobs of the native agent that TensorPipeRpcBackendOptions does not carry (tests use them).
struct NativeAgentTuning {
    /// Bounds of every connection; a null limits.budget gets one of receive_budget_bytes. create()
    /// sets max_frame_bytes and the handshake, frame and idle timeouts from the options.
    ConnectionLimits limits;
    /// Bytes all of the agent's connections together may hold for frames still arriving
    /// (ReceiveBudget). create() sets it from the options (receive_budget_bytes).
    std::size_t receive_budget_bytes = std::size_t(16) << 30;
    /// Inbound sockets held at once (handshaking or serving); beyond it, new ones are closed at
    /// once. create() sets it from the options (max_inbound_connections).
    std::size_t max_inbound_connections = 4096;
    /// Inbound sockets in their handshake at once (not yet authenticated and admitted); one more
    /// ends the oldest such handshake. A real peer's handshake takes a round trip or two; a silent
    /// socket holds its place until the handshake timeout, so silent sockets never fill
    /// max_inbound_connections.
    std::size_t max_inbound_handshakes = 64;
    /// Bound on every store wait during init and graceful shutdown (0: the store's timeout).
    Duration init_timeout{0};
    /// Dynamic groups: how long a member's heartbeat may stand still before it is probed (0: the
    /// options' member_timeout). Its heartbeat beats ten times per period (at most once a second),
    /// and a probe waits half of it (at most 5 s) for the answer.
    Duration member_timeout{0};
    /// Bytes of each device's cuda_ipc outbox (0: default_outbox_bytes()).
    std::size_t outbox_bytes = 0;
    /// Replies queued for an inbound connection's peer (a caller that does not read them): over
    /// `soft` bytes its requests are not read until the replies drain; past `hard` bytes in two or
    /// more replies, the connection closes; past `held` bytes of replies' tensors it reads from
    /// our memory (cma) without releasing them, further tensors go inline. 0: none. (The inbound
    /// connections' ConnectionLimits max_queued_soft, max_queued_hard and max_held_bytes.)
    struct ReplyBounds {
        std::size_t soft = 0, hard = 0, held = 0;
    };
    ReplyBounds reply_bounds{std::size_t(64) << 20, std::size_t(1) << 30, std::size_t(256) << 20};
};

/// The limits of the agent's inbound connections: `tuning.limits` with its reply bounds.
[[nodiscard]] ConnectionLimits inbound_limits(const NativeAgentTuning& tuning);

/// What an agent is made with, fixed for its life: whom it serves as, in which group, with which
/// options and bounds.
struct AgentConfig {
    Executor ex;  ///< the agent's strand
    std::shared_ptr<Store> store;
    std::shared_ptr<RpcBackendOptions> options;                ///< never null (the defaults when none were given)
    const TensorPipeRpcBackendOptions* tp_options = nullptr;  ///< `options` as TensorPipe's, or null
    NativeAgentTuning tuning;                                  ///< with its receive budget (limits.budget)
    WorkerInfo self;
    int world_size = 0;  ///< <= 0: a dynamic group's member (DYNAMIC_WORLD_SIZE)

    [[nodiscard]] bool dynamic() const noexcept { return world_size <= 0; }
    /// The bound of the waits of a start, a join, a leave and a removal (tuning.init_timeout, else
    /// the store's timeout).
    [[nodiscard]] Duration store_wait_limit() const;
    /// The member timeout of a dynamic group (tuning, else the options').
    [[nodiscard]] Duration member_timeout() const;
};

/// Where an agent is in its life. Strand-bound, except closed_anywhere(), which any thread may ask.
class AgentLifecycle {
public:
    enum class State { starting, running, draining, closed };

    [[nodiscard]] State state() const noexcept { return state_; }
    /// Enters `s`; closed is the last state (set once, by the agent's close_local).
    void enter(State s) noexcept {
        state_ = s;
        if (s == State::closed) closed_.store(true, std::memory_order_release);
    }
    /// Whether the agent is closed, from any thread: lets ~NativeAgent skip posting to an event
    /// loop that may be gone when the agent was already closed.
    [[nodiscard]] bool closed_anywhere() const noexcept { return closed_.load(std::memory_order_acquire); }
    /// Numbers a graceful shutdown that begins (1, 2, ...): a static group's shutdown barriers are
    /// named by it.
    [[nodiscard]] int next_shutdown_round() noexcept { return ++shutdown_rounds_; }

private:
    State state_ = State::starting;
    std::atomic<bool> closed_{false};
    int shutdown_rounds_ = 0;
};

/// The agent: its state and the coroutines that drive it (native_agent_{init,calls,serve,connect,
/// membership,liveness}.cpp). Strand-bound to its executor (everything but the handler registry,
/// which has a mutex, and what says otherwise). Every coroutine the agent starts in the background
/// is a member of its task group (and holds a shared_ptr to the agent, so the agent outlives it):
/// close_local cancels them, shutdown waits for them. Its parts are made by the constructor's
/// list in the order declared (a part's constructor uses only those above it; callbacks it keeps
/// run later): the task group first, then the configuration, the lifecycle, the group's view, and
/// the parts that reach and serve the group.
class AgentCore : public std::enable_shared_from_this<AgentCore> {
public:
    /// An agent on `ex` (a strand), not started: start() listens and meets the group.
    AgentCore(Executor ex, BackendInitArgs args, NativeAgentTuning tuning);
    ~AgentCore();
    AgentCore(const AgentCore&) = delete;
    AgentCore& operator=(const AgentCore&) = delete;

    // ---- what the NativeAgent facade needs ----
    /// What the agent was made with (any thread: it never changes).
    [[nodiscard]] const AgentConfig& config() const noexcept { return config_; }
    /// Whether close_local has run (any thread).
    [[nodiscard]] bool closed_anywhere() const noexcept { return life_.closed_anywhere(); }
    /// The group's members, this worker included (infos() and find() from any thread).
    [[nodiscard]] const PeerTable& peers() const noexcept { return peers_; }
    /// The handlers (thread-safe).
    [[nodiscard]] HandlerRegistry& handlers() noexcept { return handlers_; }
    /// Listeners and offers (on the agent's executor).
    [[nodiscard]] const Endpoint& endpoint() const noexcept { return endpoint_; }
    /// Background coroutines still running (on the agent's executor).
    [[nodiscard]] std::size_t background_tasks() const { return tasks_->running(); }
    /// What the device channels sent and received (on the agent's executor; none without them).
    [[nodiscard]] DeviceChannels::Stats device_stats() const;

    // ---- native_agent_init.cpp ----
    [[nodiscard]] Task<Result<void>> start();
    [[nodiscard]] Task<Result<void>> shutdown(bool graceful, double timeout_sec);
    /// The counters' snapshot (on the strand).
    [[nodiscard]] Task<Result<AgentDebugInfo>> debug_info();
    /// Closes everything local: pending calls end with `reason`, connections and the listener
    /// close, background tasks are cancelled (and no new one starts).
    void close_local(const Error& reason);

    // ---- native_agent_membership.cpp ----
    /// Waits until the peer table lists exactly `names` (in any order), at most `limit`; false
    /// then. Woken by each membership change.
    [[nodiscard]] Task<bool> until_members(std::vector<std::string> names, Duration limit);

    // ---- native_agent_calls.cpp ----
    /// A call (`prepared`: call_device's tensors, which live in its frame meanwhile).
    [[nodiscard]] Task<Result<Message>> call(std::string to, std::string handler, Message message, double timeout_sec,
                                             PreparedTensors* prepared = nullptr);

private:
    using State = AgentLifecycle::State;

    // ---- native_agent_init.cpp ----
    /// Accepts on the endpoint's listener `i` once the roster is read (inbound peers are admitted
    /// against it), until the agent closes.
    [[nodiscard]] static Task<void> accept_when_ready(std::shared_ptr<AgentCore> core, std::size_t i);
    /// After close_local: waits until every background task has ended, at most `limit`; false
    /// (logged, naming how many still run) when some did not end in time (a handler that ignores
    /// cancellation, a blocking handler still running).
    [[nodiscard]] Task<bool> join_tasks(Duration limit);
    [[nodiscard]] HelloInfo hello() const;
    /// Whether an inbound peer (authenticated, with a key) may connect: its name and rank must be
    /// another worker's of the group. The error says why not (it is sent to the peer).
    [[nodiscard]] Result<void> admit(const HelloInfo& peer) const;
    [[nodiscard]] Result<void> listen();
    /// Handlers, key, listeners and accept loops: what start() opens before it meets the group.
    [[nodiscard]] Result<void> open_endpoint();
    /// A store barrier over the group; `watch_peers`: fail early naming a worker that is unreachable.
    [[nodiscard]] Task<Result<void>> barrier(std::string name, Duration timeout, bool watch_peers);

    // ---- native_agent_membership.cpp (dynamic groups: join, leave, updates) ----
    /// Adds the built-in membership handlers (a static member's answer that it refuses them).
    [[nodiscard]] Result<void> add_membership_handlers();
    /// The built-in handlers' bodies: this worker's device infos; a membership update (checked,
    /// then applied); a static member's refusal.
    [[nodiscard]] static Task<Result<Message>> answer_device_infos(std::shared_ptr<AgentCore> core);
    [[nodiscard]] static Task<Result<Message>> answer_membership(std::shared_ptr<AgentCore> core, WorkerInfo caller, Message m);
    [[nodiscard]] static Task<Result<Message>> refuse_membership(std::shared_ptr<AgentCore> core, WorkerInfo caller);
    /// A dynamic member's start: claims its rank, takes the group token, learns the members,
    /// gathers their device infos, checks them with the seed's dynamic rules, updates everyone
    /// (itself included) and gives the token back.
    [[nodiscard]] Task<Result<void>> start_dynamic();
    /// What start_dynamic does while it holds the token. `unreached`: members that did not take
    /// the update (checked for death once the token is back).
    [[nodiscard]] Task<Result<void>> join_under_token(Clock::time_point deadline, std::vector<int>& unreached);
    /// A dynamic member's graceful leave: takes the token, finishes its calls, tells everyone,
    /// gives the token back. Before close_local.
    [[nodiscard]] Task<Result<void>> leave_dynamic(Clock::time_point deadline);
    /// Whether the sender of `update` may send it (docs/protocol.md, "Who may change the group"):
    /// it holds the group token for that change, a leaver or remover is a member, a joiner holds
    /// its rank's claim, and every member listed is one of ours or, on doubt, one of the store's.
    [[nodiscard]] Task<Result<void>> check_update_sender(WorkerInfo caller, const MembershipUpdate& update);
    /// A dynamic group's gate on requests: a peer that is not a member (a joiner, a removed member)
    /// may call only what joining needs; the error to answer it with otherwise (logged once a name).
    [[nodiscard]] std::optional<Error> refuse_caller(const HelloInfo& peer, std::string_view handler);
    /// Makes the peer table, maps, device list and `membership_` those of `update`'s members (seed
    /// rules), then wakes membership_.changed()'s waiters.
    [[nodiscard]] Result<void> apply_membership(const MembershipUpdate& update);
    /// Adds a member to the peer table (and its counters), listening at `addresses`.
    [[nodiscard]] Result<void> add_member(const WorkerInfo& info, std::vector<TransportOffer> addresses);
    /// This worker's entry in a membership update.
    [[nodiscard]] GroupMember self_member() const;
    /// A call of a built-in handler (its arguments outlive the call) until `deadline`.
    [[nodiscard]] Task<Result<Message>> call_builtin(const std::string& to, const char* handler, const Bytes& payload,
                                                     Clock::time_point deadline);
    /// The same call to every worker of `to` at once; their results in that order.
    [[nodiscard]] Task<std::vector<Result<Message>>> call_each(std::vector<std::string> to, const char* handler, Bytes payload,
                                                             Clock::time_point deadline);
    /// One call of a built-in handler among those call_all makes at once.
    struct BuiltinCall {
        std::string to;
        const char* handler;
        Bytes payload;
    };
    /// Makes every call of `calls` at once, until `deadline`; their results in that order.
    [[nodiscard]] Task<std::vector<Result<Message>>> call_all(std::vector<BuiltinCall> calls, Clock::time_point deadline);
    /// call_all's calls: their results, and how many have yet to end.
    struct Fanout;
    /// One of call_all's calls, its result going to `f->results[i]`.
    [[nodiscard]] static Task<void> fanout_one(std::shared_ptr<AgentCore> core, std::shared_ptr<Fanout> f, std::size_t i,
                                               BuiltinCall call, Clock::time_point deadline);
    /// The group's members as the store lists them (empty before the first join).
    [[nodiscard]] Task<Result<std::vector<int>>> read_member_ranks();
    /// Deletes the store entries of the member of `rank` (its record, rank claim and heartbeat).
    [[nodiscard]] Task<void> forget_member(int rank);

    // ---- native_agent_liveness.cpp (dynamic groups: heartbeats, dead members) ----
    /// Starts the heartbeat of this member and the watch of its two successors by rank.
    void start_liveness();
    /// Beats, checks our rank claim, and watches our successors' heartbeats, until cancelled.
    [[nodiscard]] static Task<void> liveness_loop(std::shared_ptr<AgentCore> core);
    /// Member `rank` may be dead (`why`: its connection was lost, its heartbeat stood still): the
    /// evidence is gathered and, when it confirms, the member is removed from the group under the
    /// token. One check per member at a time (membership_.begin_check).
    void suspect(int rank, std::string why);
    /// The removal of the member of `rank` (named `name`) once the evidence confirms it unreachable:
    /// under the token, every other member is sent the group without it, the store's list is
    /// updated, its entries go.
    [[nodiscard]] static Task<void> remove_if_dead(std::shared_ptr<AgentCore> core, int rank, std::string name, std::string why);
    /// What the evidence says of a suspect (docs/protocol.md, "Removal by evidence").
    struct Evidence {
        bool unreachable = false;  ///< confirmed: removed
        bool answered = false;     ///< it answered this worker's probe
        std::string why;           ///< what confirmed it, or what refuted it
    };
    /// This worker's probe of the suspect and its witnesses' at once, then, when no witness
    /// answered, the suspect's heartbeat in the store.
    [[nodiscard]] Task<Evidence> gather_evidence(int rank, std::string name);
    /// Whether the heartbeat of each member of `ranks` stands still for `timeout` (as this worker
    /// read it: from its watch when it watches that rank, else from now); false for one as soon as
    /// it moves, or when the store cannot be read. All are watched at once.
    [[nodiscard]] Task<std::vector<bool>> beats_stood_still(std::vector<int> ranks, Duration timeout);
    /// When a built-in call to a member made under the group token (a joiner's device-info calls,
    /// a join's or removal's update) gives up: a probe timeout from now (a live member answers in
    /// moments), at most `deadline`. (Not a leave's update: members answer it once their calls to
    /// the leaver have ended.)
    [[nodiscard]] Clock::time_point member_call_deadline(Clock::time_point deadline) const;
    /// Whether member `name` answers a call of a built-in handler within `limit`.
    [[nodiscard]] Task<bool> answers(std::string name, Duration limit);
    /// The witness handler's body: whether this member reaches the member named in `m` (a
    /// dynamic member asks it of another before it removes that one).
    [[nodiscard]] static Task<Result<Message>> answer_witness(std::shared_ptr<AgentCore> core, WorkerInfo caller, Message m);
    /// Takes this worker out of the group it was removed from: its calls fail with `why`, its
    /// connections close, and a graceful shutdown tells nobody (it is no member to leave).
    void evict(Error why);
    /// Who holds this worker's rank claim in the store: its name while it is a member, nothing
    /// once the others removed it, another name once a new worker took the rank.
    [[nodiscard]] Task<Result<std::optional<std::string>>> claim_holder();
    /// Evicts this worker (and says so) when `holder`, claim_holder's answer, is not its name;
    /// true when it did. Asked under the group token before this worker changes the group.
    bool evicted_by(const std::optional<std::string>& holder);

    // ---- native_agent_calls.cpp (calls) ----
    /// Receives on one of the agent's connections (native_agent_calls.cpp): part of the agent, it
    /// hands requests to serving workers and replies to their calls.
    class ConnectionReader;
    /// The rank of `to` when a call can take the common path (agent running, another worker,
    /// connection open), else -1.
    [[nodiscard]] int ready_rank(const std::string& to);
    /// Checks a call (agent running, worker known): the rank it goes to.
    [[nodiscard]] Result<int> check_call(const std::string& to) const;
    /// Every other case of call(): another executor, a call to self, no connection yet.
    [[nodiscard]] Task<Result<Message>> call_slow(std::string to, std::string handler, Message message, double timeout_sec);
    /// call_slow (rank -1) or call_device (device tensors).
    [[nodiscard]] Task<Result<Message>> call_elsewhere(int rank, std::string to, std::string handler, Message message,
                                                       double timeout_sec);
    /// The common path's request: sent on `peer`'s connection and registered with its deadline;
    /// false (the error in pc->result) when it could not be sent.
    bool begin_call(PeerLink& peer, PendingCallHandle& pc, const std::string& handler, Message& message, PreparedTensors* prepared,
                    double secs, Clock::time_point sent_at);
    /// The common path's outcome: the reply, or the error it ended with (counted in the metrics).
    [[nodiscard]] Result<Message> end_call(PendingCallHandle& pc, int rank, const std::string& to, const std::string& handler,
                                           double secs, Clock::time_point sent_at);
    /// Builds the request (tensor targets from the device map) and sends it on `peer`'s connection;
    /// with `prepared`, the device channels' tensors instead of the message's.
    [[nodiscard]] Result<void> send_request(PeerLink& peer, std::uint64_t id, const std::string& handler, Message& message,
                                            PreparedTensors* prepared = nullptr);
    /// A call whose message has device tensors: they are prepared by the device channels (which
    /// may wait for copies to host memory), then the call goes on as call() with them.
    [[nodiscard]] Task<Result<Message>> call_device(std::string to, std::string handler, Message message, double timeout_sec);
    /// Lands a received frame's device tensors (device_channels_->land; `refs`: those by cuda_ipc) into `streams`: now, or
    /// later (the frame was taken, and goes to `later` once its tensors are queued), or failed
    /// (the error is in frame.alloc_error; a protocol error closes `conn`).
    enum class Landing { now, later, failed };
    Landing land_device_tensors(const std::shared_ptr<Connection>& conn, Frame& frame, const DeviceRefs& refs,
                                std::vector<tensorplay::Stream>& streams, DeviceChannels::Deliver later);
    /// A control frame from `conn`'s peer, for the device channels (DeviceChannels::notice); a bad
    /// one, or one for channels this worker lacks, closes `conn`.
    void control_frame(const std::shared_ptr<Connection>& conn, std::string_view name, std::span<const std::uint8_t> payload);
    /// Where each of a request's tensors lands on `peer` (its device map); device_error naming a
    /// tensor on a device the map does not cover.
    [[nodiscard]] Result<void> request_targets(const PeerLink& peer, const std::vector<Tensor>& tensors,
                                               std::vector<Device>& targets) const;
    /// A call that ended without a reply: timed out (`wait_ec` clear) or cancelled.
    [[nodiscard]] Error call_error(const std::string& to, const std::string& handler, double secs, std::error_code wait_ec) const;
    [[nodiscard]] Result<Tensor> allocate(const TensorDesc& desc) const;
    void adopt_connection(std::shared_ptr<Connection> conn, int rank);

    // ---- native_agent_connect.cpp ----
    [[nodiscard]] Task<Result<std::shared_ptr<Connection>>> ensure_connected(int rank, Duration timeout);

    // ---- native_agent_serve.cpp (serving, handlers) ----
    /// Serves request `id` for handler `name` on a parked worker (resumed in place) or a new one;
    /// `error`: it could not be received whole (answered with that error).
    void serve_request(const std::shared_ptr<Connection>& conn, std::uint64_t id, std::string_view name, Message&& message,
                       Error* error);
    /// Serves requests: the one it was started with, then whichever the reader hands it while
    /// parked. The handler runs in this coroutine's frame (one more coroutine per request would
    /// cost a frame and its resumption).
    [[nodiscard]] static Task<void> serve_worker(std::shared_ptr<AgentCore> core, std::shared_ptr<Connection> conn,
                                                 ServeRequest first);
    /// Parks `w` in `serving_` for the next request unless the agent is closing, enough are parked
    /// already, or `w` holds the last reference to the agent. Drops `w`'s reference when it parks.
    [[nodiscard]] bool park(ServeWorker& w);
    [[nodiscard]] Task<Result<Message>> run_handler(WorkerInfo caller, std::string name, Message message);
    /// Starts a found handler: the user's coroutine, or the blocking handler on the pool.
    [[nodiscard]] Task<Result<Message>> start_handler(const HandlerEntry& entry, WorkerInfo caller, Message message);
    /// Ends a call of `entry` (entered with handlers_.enter) and turns a handler's failure (in `r`)
    /// into remote_error.
    void finish_handler(HandlerEntry& entry, Result<Message>& r);
    /// Reply tensors go back through the reverse of the caller's map; fills `targets`.
    [[nodiscard]] Result<void> route_reply_tensors(const HelloInfo& caller, const std::vector<Tensor>& tensors,
                                                   std::vector<Device>& targets) const;
    /// Sends the reply to the worker's request: `r`'s message, or its error; with `prepared`, the
    /// device channels' tensors (for which `targets` was filled).
    void send_reply(Connection& conn, std::uint64_t id, Result<Message>& r, PreparedTensors* prepared = nullptr,
                    std::vector<Device> targets = {});
    /// A reply with device tensors: ordered after the handler's streams (for a device it names
    /// none on, its request's), routed back through the reverse map, staged or put in the
    /// outbox, sent.
    [[nodiscard]] static Task<void> send_device_reply(std::shared_ptr<AgentCore> core, std::shared_ptr<Connection> conn,
                                                      std::uint64_t id, Result<Message> r,
                                                      std::vector<tensorplay::Stream> request_streams);

    /// The accept loops, inbound handshakes, the deadline sweep, the serving workers and the
    /// dynamic group's coroutines. Made first: the parts made after it (calls_, endpoint_) spawn
    /// into it. Destroyed first too: ~AgentCore resets it before any member goes, so that the
    /// tasks it cancels then still find what they wait on (when the event loop is destroyed with
    /// the agent, its tasks' frames go in any order, and the last reference to the agent may go
    /// with any of them). Always engaged until then.
    std::optional<TaskGroup> tasks_;
    const AgentConfig config_;
    /// starting, running, draining, closed (and closed as any thread sees it).
    AgentLifecycle life_;
    /// This worker's view of its group: its devices; a dynamic member's members, removal checks,
    /// leaving, eviction (group_membership.hpp).
    Membership membership_;
    /// The group's members, this worker included (its own link is unused), and whether they are
    /// all known yet: empty until start() has read every worker's address (the accept loops wait
    /// until then; early connections wait in the listen backlog).
    PeerTable peers_;
    /// Listeners, transport and channel offers, the group's key, and inbound connections (endpoint.hpp).
    Endpoint endpoint_;
    HandlerRegistry handlers_;
    /// Serving workers parked between requests (woken to exit by close_local) and the blocking
    /// handlers' threads (serving_pool.hpp).
    ServingPool serving_;
    /// The calls this worker waits on: ids, pending calls, deadlines (one timer), the count that a
    /// graceful shutdown waits to reach zero.
    CallTable calls_;
    AgentMetrics metrics_;  // get_debug_info's counters
    /// Device tensors' staging, outboxes and landing (made by listen()).
    std::unique_ptr<DeviceChannels> device_channels_;
    int last_called_ = -1;  // the rank ready_rank found last (never our own)
};

/// CUDA devices this process's device backend has (0 without one).
[[nodiscard]] int local_cuda_device_count();

/// The native agent: a thin RpcAgent facade over an AgentCore. Thread-safe: members hop to the
/// core's executor when called from elsewhere.
class NativeAgent final : public RpcAgent {
public:
    explicit NativeAgent(std::shared_ptr<AgentCore> core) : core_(std::move(core)) {}
    ~NativeAgent() override;

    /// Creates and starts an agent on the awaiting coroutine's executor (which must be a strand or
    /// single-threaded; one that is known to run things at once is invalid_argument): listens,
    /// publishes its address, checks everyone's device maps, connects to every worker and waits
    /// until every worker has (a ready barrier).
    [[nodiscard]] static Task<Result<std::shared_ptr<NativeAgent>>> create(BackendInitArgs args,
                                                                           NativeAgentTuning tuning = {});

    [[nodiscard]] const WorkerInfo& get_worker_info() const override;
    [[nodiscard]] Result<WorkerInfo> get_worker_info(std::string_view name) const override;
    [[nodiscard]] std::vector<WorkerInfo> get_worker_infos() const override;
    [[nodiscard]] const RpcBackendOptions& get_backend_options() const override;
    [[nodiscard]] Result<void> register_handler(std::string name, RpcHandler handler) override;
    [[nodiscard]] Result<void> register_blocking_handler(std::string name, BlockingRpcHandler handler) override;
    [[nodiscard]] Task<Result<void>> unregister_handler(std::string name) override;
    [[nodiscard]] Task<Result<Message>> rpc_async(std::string to, std::string handler, Message message,
                                                  double timeout_sec = -1.0) override;
    [[nodiscard]] Task<Result<void>> shutdown(bool graceful = true, double timeout_sec = DEFAULT_SHUTDOWN_TIMEOUT) override;
    [[nodiscard]] Task<Result<AgentDebugInfo>> get_debug_info() override;

    /// The address this agent's TCP transport listens on ("host:port"); without one, the first
    /// listener's URL.
    [[nodiscard]] std::string listen_address() const;
    /// Every address this agent listens on, one per transport, highest priority first (URLs).
    [[nodiscard]] std::vector<std::string> listen_urls() const;
    /// Test hook (on the agent's executor): this agent's path to member `name` breaks, as a
    /// network partition between the two would: its connection to it is lost, and its connects to
    /// it are refused from now on. Other workers' paths are untouched. False: no such member.
    bool cut_off_for_test(const std::string& name);
    /// Test hook: the open outgoing connection to `rank`, if any.
    [[nodiscard]] std::shared_ptr<Connection> connection_to(int rank) const;
    /// Test hook (on the agent's executor): waits until get_worker_infos() lists exactly `names`
    /// (in any order), at most `limit`; false then. Woken by each membership change.
    [[nodiscard]] Task<bool> until_members(std::vector<std::string> names, Duration limit);
    /// Test hook (on the agent's executor): how many tensors its device channels sent and received
    /// by cuda_ipc and by staging.
    [[nodiscard]] DeviceChannels::Stats device_stats() const;
    /// Test hook (on the agent's executor): its background coroutines still running.
    [[nodiscard]] std::size_t background_tasks() const;

private:
    std::shared_ptr<AgentCore> core_;
};

/// Fills `targets` with where each tensor goes: through `map` (may be null), else a CPU tensor stays
/// on the CPU. Returns the index of the first tensor that is undefined or on a device `map` does
/// not cover (`targets` then incomplete), or -1 when all are placed.
[[nodiscard]] std::ptrdiff_t map_tensor_targets(const DeviceMap* map, const std::vector<Tensor>& tensors,
                                                std::vector<Device>& targets);

/// Logs an exception that escaped a spawned coroutine (a co_spawn completion handler).
void log_task_error(std::exception_ptr e);

/// Error frame payload: u16 code, str32 worker, str32 message.
[[nodiscard]] Bytes encode_error(const Error& e);
[[nodiscard]] Error decode_error(std::span<const std::uint8_t> payload, const std::string& from);

}  // namespace tensorplay::detail
