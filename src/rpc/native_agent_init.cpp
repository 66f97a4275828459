// Native agent, lifecycle: listen, publish and gather addresses, check device maps, connect,
// ready barrier; graceful and local shutdown; registration with the TENSORPIPE backend.
#include "rpc/native_agent.hpp"
#include "rpc/startup_handlers.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/core/wire.hpp>
#include <tensorplay/device/backend.hpp>

#include "core/asio_compat.hpp"
#include "core/asio_compat_internals.hpp"
#include "rpc/native_agent_factory.hpp"
#include "rpc/peer_record.hpp"

#include <tensorplay/rpc/device_map_exchange.hpp>

#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/ip/address.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace tensorplay::detail {

namespace {

constexpr std::string_view kKeyPrefix = "native_agent/";

Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }

}  // namespace

int local_cuda_device_count() {
    auto b = backend_for(Device::cuda(0));
    return b ? (*b)->device_count() : 0;
}

namespace {
/// `t` with its receive budget made when it has none.
NativeAgentTuning with_budget(NativeAgentTuning t) {
    if (!t.limits.budget) t.limits.budget = std::make_shared<ReceiveBudget>(t.receive_budget_bytes);
    return t;
}

/// The options given, or the defaults.
std::shared_ptr<RpcBackendOptions> options_or_default(std::shared_ptr<RpcBackendOptions> o) {
    if (o) return o;
    return std::make_shared<TensorPipeRpcBackendOptions>();
}

/// Runs `t` holding the agent (a task of its group outlives nothing it uses).
Task<void> keeping([[maybe_unused]] std::shared_ptr<AgentCore> keep, Task<void> t) { co_await std::move(t); }

/// The configuration of an agent made with `args` and `t` on `ex`.
AgentConfig make_config(Executor ex, BackendInitArgs& args, NativeAgentTuning t) {
    AgentConfig c;
    c.ex = std::move(ex);
    c.store = std::move(args.store);
    c.options = options_or_default(std::move(args.options));
    c.tp_options = dynamic_cast<const TensorPipeRpcBackendOptions*>(c.options.get());
    c.tuning = with_budget(std::move(t));
    c.self = WorkerInfo{std::move(args.name), args.rank};
    c.world_size = args.world_size;
    return c;
}
}  // namespace

Duration AgentConfig::store_wait_limit() const {
    return tuning.init_timeout > Duration::zero() ? tuning.init_timeout : store->timeout();
}

ConnectionLimits inbound_limits(const NativeAgentTuning& tuning) {
    ConnectionLimits l = tuning.limits;
    l.max_queued_soft = tuning.reply_bounds.soft;
    l.max_queued_hard = tuning.reply_bounds.hard;
    l.max_held_bytes = tuning.reply_bounds.held;
    return l;
}

AgentCore::AgentCore(Executor executor, BackendInitArgs args, NativeAgentTuning t)
    : tasks_(std::in_place, executor),
      config_(make_config(std::move(executor), args, std::move(t))),
      endpoint_(config_.self.name, InboundLimits{config_.tuning.max_inbound_connections, config_.tuning.max_inbound_handshakes},
                inbound_limits(config_.tuning),
                InboundHooks{[this] { return hello(); }, [this](const HelloInfo& peer) { return admit(peer); },
                             [this](std::shared_ptr<Connection> c) { adopt_connection(std::move(c), -1); },
                             [this](Task<void> task, const char* what) {
                                 return tasks_->spawn(keeping(shared_from_this(), std::move(task)), what);
                             }}),
      handlers_(config_.self.name),
      calls_(config_.ex, *tasks_) {}

AgentCore::~AgentCore() {
    // Parked workers wait for a request that can no longer come.
    serving_.abandon();
    tasks_.reset();  // (first: it cancels what still runs, while everything it waits on is here)
}

HelloInfo AgentCore::hello() const {
    HelloInfo h;
    h.name = config_.self.name;
    h.rank = config_.self.id;
    h.transports = endpoint_.offers();
    h.channels = endpoint_.channel_offers();
    return h;
}

Result<void> AgentCore::admit(const HelloInfo& peer) const {
    // (Handlers are told the caller's name from its hello: it must be a member's, and with a key
    // it is proven. The message goes to the peer and to this worker's log.)
    if (!peers_.roster_read()) return fail(Errc::unauthorized, "the group's roster is not known yet");
    const PeerLink* link = peers_.at(peer.rank);
    // A dynamic group admits a joiner under a free rank and name: it becomes a member with the
    // membership update it sends (with a key, it has proven that it holds the group's).
    if (!link && config_.dynamic() && peer.rank >= 0 && peer.rank != config_.self.id && peers_.rank_of(peer.name) < 0) return ok();
    if (!link)
        return fail(Errc::unauthorized, "rank " + std::to_string(peer.rank) + " is not in the group of " +
                                            std::to_string(peers_.size()) + " workers (claimed by \"" + peer.name + "\")");
    const std::string& member = link->info.name;
    if (member != peer.name)
        return fail(Errc::unauthorized, "rank " + std::to_string(peer.rank) + " of the group is worker \"" + member +
                                            "\", not \"" + peer.name + "\"");
    if (peer.rank == config_.self.id)
        return fail(Errc::unauthorized, "rank " + std::to_string(peer.rank) + " (worker \"" + member +
                                            "\") is the worker connected to, not a peer of it");
    return ok();
}

namespace {
/// The group's shared key: options.auth_key, else the file named by options.auth_key_file or
/// TP_RPC_AUTH_KEY_FILE, else TP_RPC_AUTH_KEY; empty: none. Errors name the source, never the key.
Result<Secret> group_auth_key(const TensorPipeRpcBackendOptions* o) {
    if (o && !o->auth_key.empty()) return o->auth_key;
    std::string file = o ? o->auth_key_file : std::string();
    std::string source = "auth_key_file";
    if (file.empty())
        if (const char* f = std::getenv("TP_RPC_AUTH_KEY_FILE"); f && *f) {
            file = f;
            source = "TP_RPC_AUTH_KEY_FILE";
        }
    if (!file.empty()) {
        auto k = read_auth_key_file(file);
        if (!k) return fail(std::move(k).error().context(source));
        return k;
    }
    if (const char* k = std::getenv("TP_RPC_AUTH_KEY"); k && *k) {
        if (std::strlen(k) > kMaxAuthKeyBytes)
            return fail(Errc::invalid_argument, "TP_RPC_AUTH_KEY is longer than " + std::to_string(kMaxAuthKeyBytes) + " bytes");
        return Secret(k);  // (the environment's own copy is the process's; nothing here can wipe it)
    }
    return Secret();
}
}  // namespace

Result<void> AgentCore::listen() {
    auto chans = select_channels(config_.tp_options ? config_.tp_options->channels : std::nullopt);
    if (!chans) return fail(chans.error());
    if (auto l = endpoint_.listen(config_.ex, config_.tp_options ? config_.tp_options->transports : std::nullopt,
                                 config_.tp_options ? config_.tp_options->listen_address : std::string());
        !l)
        return l;
    // CPU channels carry CPU tensors; the device channels (cuda_ipc, cuda_basic) are offered for
    // the cuda device type when this process has cuda devices. Outboxes (cuda_ipc) go on the
    // devices this worker names or maps from.
    std::vector<Device> outbox_devices;
    if (config_.tp_options) {
        for (const Device& d : config_.tp_options->devices)
            if (d.is_cuda()) outbox_devices.push_back(d);
        for (const auto& [to, map] : config_.tp_options->device_maps)
            for (const auto& [from, onto] : map)
                if (from.is_cuda()) outbox_devices.push_back(from);
    }
    const std::size_t box = config_.tuning.outbox_bytes ? config_.tuning.outbox_bytes : default_outbox_bytes();
    auto spawn = [this](Task<void> t) { (void)tasks_->spawn(std::move(t), "a cuda_ipc release"); };
    auto dc = DeviceChannels::create(spawn, outbox_devices, *chans, box);
    if (!dc) return fail(std::move(dc).error().context("setting up the device channels"));
    device_channels_ = std::move(*dc);
    for (auto& c : *chans)
        if (c != "cuda_ipc" && c != "cuda_basic") endpoint_.add_channel_offer(ChannelOffer{c, "cpu", "any"});
    for (const auto& o : device_channels_->offers()) endpoint_.add_channel_offer(o);
    return ok();
}

Task<Result<void>> AgentCore::barrier(std::string name, Duration timeout, bool watch_peers) {
    const std::string base = std::string(kKeyPrefix) + name + "/";
    if (auto r = co_await config_.store->set(base + "arrived/" + std::to_string(config_.self.id), to_bytes("1")); !r) co_return r;
    auto n = co_await config_.store->add(base + "count", 1);
    if (!n) co_return fail(n.error());
    if (*n == config_.world_size)
        if (auto r = co_await config_.store->set(base + "done", to_bytes("1")); !r) co_return r;
    const auto deadline = timeout > Duration::zero() ? Clock::now() + timeout : Clock::time_point::max();
    // Wait in slices so that a worker that died (unreachable, never arrived) ends the wait with its
    // name instead of hanging until the deadline, or forever without one.
    std::string last_missing;
    for (;;) {
        Duration slice = std::chrono::milliseconds(watch_peers ? 200 : 1000);
        if (deadline != Clock::time_point::max()) slice = std::min(slice, std::max(Duration(std::chrono::milliseconds(1)), deadline - Clock::now()));
        std::vector<std::string> done_key(1, base + "done");
        auto w = co_await config_.store->wait(std::move(done_key), slice);
        if (w) co_return ok();
        if (w.error().code() != Errc::timeout) {
            // The store's host (rank 0, usually) may have given up at its own deadline: say whom
            // this worker was still waiting for.
            if (!last_missing.empty())
                co_return fail(std::move(w).error().context("barrier \"" + name + "\": lost the store while worker(s) " +
                                                            last_missing + " had not arrived"));
            co_return w;
        }
        std::vector<WorkerInfo> missing;
        for (auto& wi : peers_.infos()) {  // (a copy: the checks await)
            std::vector<std::string> key(1, base + "arrived/" + std::to_string(wi.id));
            auto c = co_await config_.store->check(std::move(key));
            if (c && !*c) missing.push_back(wi);
        }
        std::string names;
        for (const auto& wi : missing) {
            if (!names.empty()) names += ", ";
            names += "\"" + wi.name + "\"";
        }
        // The store may be gone at this point (its host gave up first): keep the last names found.
        if (!names.empty()) last_missing = names;
        else names = last_missing;
        if (Clock::now() >= deadline) {
            if (names.empty()) names = "(unknown)";
            co_return fail(Errc::timeout, "barrier \"" + name + "\" timed out; worker(s) " + names + " did not arrive");
        }
        if (!watch_peers) continue;
        for (const auto& wi : missing) {
            if (wi.id == config_.self.id || life_.state() == State::closed) continue;
            auto c = co_await ensure_connected(wi.id, std::chrono::milliseconds(500));
            if (!c)
                co_return fail(Errc::connection_lost, "barrier \"" + name + "\": worker \"" + wi.name +
                                                          "\" is unreachable and did not arrive (" + c.error().message() + ")");
        }
    }
}

Result<void> AgentCore::open_endpoint() {
    // Startup handlers go in before anyone can reach this worker.
    for (auto& h : startup_handlers())
        if (auto r = handlers_.add(h.name, std::move(h.coro), std::move(h.blocking)); !r) return r;
    if (auto r = add_membership_handlers(); !r) return r;
    if (auto k = group_auth_key(config_.tp_options); !k) return fail(k.error());
    else endpoint_.set_key(std::move(*k));
    if (auto l = listen(); !l) return l;
    std::string where;
    for (const auto& o : endpoint_.offers()) where += (where.empty() ? "" : ", ") + o.address;
    if (endpoint_.key().empty() && !endpoint_.host().empty()) {
        std::error_code ec;
        if (auto a = asio::ip::make_address(endpoint_.host(), ec); !ec && !a.is_loopback())
            log(LogLevel::warn, "rpc", "worker \"" + config_.self.name + "\" listens on " + endpoint_.host() + ":" + std::to_string(endpoint_.port()) +
                                           " without authentication: anyone who reaches it can call its handlers; set "
                                           "TP_RPC_AUTH_KEY (or TP_RPC_AUTH_KEY_FILE, or the auth_key option) to the same "
                                           "secret on every worker");
    }
    for (std::size_t i = 0; i < endpoint_.listeners(); ++i) tasks_->spawn(accept_when_ready(shared_from_this(), i), "an accept loop");
    const std::string of = config_.dynamic() ? std::string(" of a dynamic group") : " of " + std::to_string(config_.world_size);
    log(LogLevel::info, "rpc", "worker \"" + config_.self.name + "\" (rank " + std::to_string(config_.self.id) + of + ") listening on " + where);
    return ok();
}

Task<Result<void>> AgentCore::start() {
    auto keep = shared_from_this();
    if (!config_.store) co_return fail(Errc::invalid_argument, "the native agent needs a store");
    if (config_.dynamic() && config_.self.id < 0)
        co_return fail(Errc::invalid_argument, "rank " + std::to_string(config_.self.id) + ": a dynamic group's member still needs a rank >= 0");
    if (!config_.dynamic() && (config_.self.id < 0 || config_.self.id >= config_.world_size))
        co_return fail(Errc::invalid_argument, "rank " + std::to_string(config_.self.id) + " is outside [0, " + std::to_string(config_.world_size) + ")");
    if (auto r = open_endpoint(); !r) co_return r;
    if (config_.dynamic()) co_return co_await start_dynamic();

    const Duration wait_limit = config_.store_wait_limit();
    PeerRecord mine{config_.self.name, config_.self.id, endpoint_.offers()};
    const std::string info = std::string(kKeyPrefix) + "info/";
    if (auto r = co_await config_.store->set(info + std::to_string(config_.self.id), encode_record(mine)); !r)
        co_return fail(std::move(r).error().context("publishing the address of worker \"" + config_.self.name + "\""));
    std::vector<std::string> keys;
    for (int r = 0; r < config_.world_size; ++r) keys.push_back(info + std::to_string(r));
    if (auto w = co_await config_.store->wait(keys, wait_limit); !w)
        co_return fail(std::move(w).error().context("waiting for every worker's address"));
    log(LogLevel::debug, "rpc", "worker \"" + config_.self.name + "\": every worker's address is published");
    auto blobs = co_await config_.store->multi_get(keys);
    if (!blobs) co_return fail(std::move(blobs).error().context("reading every worker's address"));

    std::vector<PeerRecord> records;
    for (auto& b : *blobs) {
        auto rec = decode_record(b);
        if (!rec) co_return fail(rec.error());
        records.push_back(std::move(*rec));
    }
    for (int r = 0; r < config_.world_size; ++r) {
        auto& rec = records[r];
        if (rec.rank != r)
            co_return fail(Errc::protocol_error, "the store's record for rank " + std::to_string(r) + " names rank " +
                                                     std::to_string(rec.rank));
        if (auto a = add_member(WorkerInfo{rec.name, r}, std::move(rec.addresses)); !a) co_return a;
    }
    peers_.mark_roster_read();
    // The seed's exchange: every worker's maps checked as a static group, my reverse maps built.
    DeviceMaps my_maps;
    if (config_.tp_options) my_maps = config_.tp_options->device_maps;
    std::vector<Device> my_devices;
    if (config_.tp_options) my_devices = config_.tp_options->devices;
    // Arguments built beforehand: GCC 12 mis-destroys conditional-expression temporaries in co_await.
    auto exchanged = co_await exchange_and_check_all_device_maps(*config_.store, config_.self.name, config_.self.id, config_.world_size,
                                                                 local_cuda_device_count(), my_maps, std::move(my_devices));
    if (!exchanged) co_return fail(exchanged.error());
    membership_.set_devices(exchanged->devices);
    log(LogLevel::debug, "rpc", "worker \"" + config_.self.name + "\": device maps of every worker checked");
    peers_.for_each([&](PeerLink& p) {
        if (auto it = my_maps.find(p.info.name); it != my_maps.end()) p.map = it->second;
        if (auto it = exchanged->reverse_device_maps.find(p.info.name); it != exchanged->reverse_device_maps.end())
            p.reverse = it->second;
    });
    life_.enter(State::running);

    // A peer whose address is published is starting too: a connect that times out or is refused
    // (its loop is slow, its listener's backlog full) is tried again until the startup deadline,
    // with a backoff. A refusal of our key, no common transport or a foreign peer ends it at once.
    const auto connect_deadline = Clock::now() + wait_limit;
    for (int r = 0; r < config_.world_size; ++r) {
        if (r == config_.self.id) continue;
        auto backoff = std::chrono::milliseconds(20);
        for (;;) {
            auto c = co_await ensure_connected(r, config_.tuning.limits.handshake_timeout);
            if (c) break;
            if (c.error().code() != Errc::connection_lost || life_.state() == State::closed || Clock::now() + backoff >= connect_deadline)
                co_return fail(c.error());
            log(LogLevel::debug, "rpc", "worker \"" + config_.self.name + "\": " + c.error().message() + "; trying again");
            asio::steady_timer pause(config_.ex, backoff);
            if (auto [ec] = co_await pause.async_wait(use_nothrow); ec) co_return fail(c.error());
            backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
        }
    }
    log(LogLevel::debug, "rpc", "worker \"" + config_.self.name + "\": connected to every worker; waiting until all are");
    if (auto b = co_await barrier("ready", wait_limit, false); !b)
        co_return fail(std::move(b).error().context("waiting until every worker is connected"));
    log(LogLevel::info, "rpc", "worker \"" + config_.self.name + "\" is ready (" + std::to_string(config_.world_size) + " workers)");
    co_return ok();
}

Task<Result<void>> AgentCore::shutdown(bool graceful, double timeout_sec) {
    auto keep = shared_from_this();
    if (life_.state() == State::closed || life_.state() == State::draining) co_return ok();
    Result<void> result = ok();
    log(LogLevel::info, "rpc", "worker \"" + config_.self.name + "\" shutting down (" + (graceful ? "graceful" : "local") + ")");
    const auto shutdown_deadline = timeout_sec > 0
                                       ? Clock::now() + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout_sec))
                                       : Clock::time_point::max();
    if (graceful && life_.state() == State::running && config_.dynamic()) {
        // A dynamic member leaves under the group token; the others go on.
        result = co_await leave_dynamic(shutdown_deadline);
    } else if (graceful && life_.state() == State::running) {
        life_.enter(State::draining);
        const auto deadline = shutdown_deadline;
        {
            auto draining = calls_.drained(deadline);
            if (!co_await std::move(draining)) {
                std::string to;
                peers_.for_each([this, &to](const PeerLink& p) {
                    if (calls_.in_flight(p.info.id) != 0) to += (to.empty() ? "" : ", ") + ("\"" + p.info.name + "\"");
                });
                result = fail(Errc::timeout, std::to_string(calls_.outstanding()) + " call(s) of worker \"" + config_.self.name +
                                                 "\" were still outstanding when the shutdown timeout passed" +
                                                 (to.empty() ? std::string() : " (awaiting replies from " + to + ")"));
            }
        }
        if (result) {
            log(LogLevel::debug, "rpc", "worker \"" + config_.self.name + "\": its calls have finished; waiting for every worker to stop calling");
            Duration left = deadline == Clock::time_point::max() ? Duration::zero() : deadline - Clock::now();
            if (left < Duration::zero() && deadline != Clock::time_point::max()) left = Duration(1);
            const std::string round = "shutdown/" + std::to_string(life_.next_shutdown_round());
            auto b = co_await barrier(round, left, true);
            if (!b) result = fail(std::move(b).error().context("graceful shutdown of worker \"" + config_.self.name + "\""));
            if (b && device_channels_) {
                // Our outboxes go with the agent: first the peers' copies out of them finish (their
                // releases come back), bounded by what is left of the timeout (else a few seconds).
                Duration grace = std::chrono::seconds(5);
                if (deadline != Clock::time_point::max()) grace = std::max(Duration(std::chrono::milliseconds(1)), deadline - Clock::now());
                if (!co_await device_channels_->quiesce(grace))
                    log(LogLevel::warn, "rpc", "worker \"" + config_.self.name + "\" frees its cuda_ipc outboxes before every peer released "
                                                   "what it sent from them (their copies out may read freed memory)");
            }
            if (b && config_.world_size > 1) {
                // Rank 0 usually hosts the store: it leaves last, once every other worker has read the
                // barrier's result, so that nobody loses the store while still waiting on it.
                const std::string left_key = std::string(kKeyPrefix) + round + "/left";
                if (config_.self.id != 0) {
                    auto n = co_await config_.store->add(left_key, 1);
                    if (n && *n == config_.world_size - 1) (void)co_await config_.store->set(left_key + "/all", to_bytes("1"));
                } else {
                    std::vector<std::string> all(1, left_key + "/all");
                    Duration grace = std::chrono::seconds(5);
                    if (deadline != Clock::time_point::max()) grace = std::max(Duration(std::chrono::milliseconds(1)), deadline - Clock::now());
                    if (auto w = co_await config_.store->wait(std::move(all), grace); !w)
                        log(LogLevel::warn, "rpc", "worker \"" + config_.self.name + "\" leaves before every worker confirmed the shutdown: " +
                                                       w.error().to_string());
                }
            }
        }
    }
    close_local(Error(Errc::shutdown, "the agent of worker \"" + config_.self.name + "\" was shut down", config_.self.name));
    // What is left of the timeout (a local shutdown, or one without a timeout: a few seconds) for
    // the background tasks to end; none of them runs the agent's code after this.
    Duration join_limit = std::chrono::seconds(5);
    if (graceful && timeout_sec > 0) {
        const auto left = shutdown_deadline - Clock::now();
        join_limit = std::max(Duration(std::chrono::milliseconds(100)), std::min(join_limit, left));
    }
    (void)co_await join_tasks(join_limit);
    log(result ? LogLevel::info : LogLevel::warn, "rpc",
        "worker \"" + config_.self.name + "\" is shut down" + (result ? std::string() : ": " + result.error().to_string()));
    co_return result;
}

void AgentCore::close_local(const Error& reason) {
    if (life_.state() == State::closed) return;
    life_.enter(State::closed);
    peers_.wake_roster_waiters();
    membership_.notify_changed();
    peers_.for_each([&](PeerLink& p) {
        calls_.fail(p.info.id, nullptr, reason);
        if (p.conn) p.conn->close(reason);
        p.conn.reset();
        if (p.connecting) p.connecting->set();
    });
    endpoint_.close(reason);  // (stops listening; inbound connections close)
    serving_.close();  // (parked workers wake to exit)
    tasks_->close();
    tasks_->cancel();
    calls_.close();  // (last: it resumes a draining shutdown in place)
}

Task<bool> AgentCore::join_tasks(Duration limit) {
    auto keep = shared_from_this();
    auto joining = [](TaskGroup& g) -> Task<Result<void>> {
        co_await g.join();
        co_return ok();
    };
    auto joined = co_await with_timeout(joining(*tasks_), limit);
    if (joined && tasks_->running() == 0) co_return true;
    log(LogLevel::warn, "rpc", "worker \"" + config_.self.name + "\" is shut down with " + std::to_string(tasks_->running()) +
                                   " background task(s) still running after " +
                                   std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(limit).count()) +
                                   " ms (a handler that does not return, or ignores cancellation)");
    co_return false;
}

NativeAgent::~NativeAgent() {
    auto core = core_;
    if (!core || core->closed_anywhere()) return;
    asio::dispatch(core->config().ex, [core] {
        const std::string& name = core->config().self.name;
        core->close_local(Error(Errc::shutdown, "the agent of worker \"" + name + "\" was destroyed", name));
    });
}

namespace {
/// Why `ex` may run two of the agent's handlers at once (its state is not locked), when it can be
/// told: a thread pool's executor, or an io_context's made for several threads (when its hint can
/// be read: TP_ASIO_INTERNALS). Strands, and executors it does not know, pass.
std::optional<std::string> concurrent_executor(const Executor& ex) {
    if (target_of<asio::strand<asio::io_context::executor_type>>(ex) || target_of<asio::strand<asio::thread_pool::executor_type>>(ex) ||
        target_of<asio::strand<Executor>>(ex))
        return std::nullopt;
    if (target_of<asio::thread_pool::executor_type>(ex)) return "a thread pool's executor";
    if (auto* io = target_of<asio::io_context::executor_type>(ex)) {
        if (const int threads = io_context_threads(io->context()); threads > 1)
            return "the executor of an io_context made for " + std::to_string(threads) + " threads";
    }
    return std::nullopt;
}
}  // namespace

namespace {
Duration seconds_of(double s) { return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s)); }

/// `t` with the connection bounds `o` sets (TensorPipeRpcBackendOptions; their defaults for other
/// options).
NativeAgentTuning bounded_by(NativeAgentTuning t, const RpcBackendOptions* o) {
    const TensorPipeRpcBackendOptions defaults;
    const auto* tp = dynamic_cast<const TensorPipeRpcBackendOptions*>(o);
    const TensorPipeRpcBackendOptions& opts = tp ? *tp : defaults;
    t.limits.max_frame_bytes = opts.max_frame_bytes;
    t.limits.handshake_timeout = seconds_of(opts.handshake_timeout);
    t.limits.frame_timeout = seconds_of(opts.frame_timeout);
    t.limits.idle_timeout = seconds_of(opts.idle_timeout);
    // Keep-alives at a third of the shorter of our idle_timeout and the default one, so that a peer
    // with either (or with none) never finds our live connections idle.
    const double default_idle = TensorPipeRpcBackendOptions().idle_timeout;
    t.limits.keepalive_interval = seconds_of((opts.idle_timeout > 0 ? std::min(opts.idle_timeout, default_idle) : default_idle) / 3);
    t.receive_budget_bytes = opts.receive_budget_bytes;
    t.max_inbound_connections = opts.max_inbound_connections;
    return t;
}
}  // namespace

Task<Result<std::shared_ptr<NativeAgent>>> NativeAgent::create(BackendInitArgs args, NativeAgentTuning tuning) {
    auto ex = co_await asio::this_coro::executor;
    if (auto why = concurrent_executor(ex))
        co_return fail(Errc::invalid_argument, "the RPC agent of worker \"" + args.name +
                                                   "\" needs an executor that runs one thing at a time (a strand, or an event "
                                                   "loop run by one thread), not " + *why + ": run it on asio::make_strand(...)");
    if (args.options)
        if (auto v = args.options->validate(); !v) co_return fail(std::move(v).error().context("the options of worker \"" + args.name + "\""));
    auto name = args.name;
    tuning = bounded_by(std::move(tuning), args.options.get());
    auto core = std::make_shared<AgentCore>(ex, std::move(args), std::move(tuning));
    auto r = co_await core->start();
    if (!r) {
        core->close_local(r.error());
        co_return fail(std::move(r).error().context("starting the RPC agent of worker \"" + name + "\""));
    }
    co_return std::make_shared<NativeAgent>(std::move(core));
}

namespace {
Task<Result<std::shared_ptr<RpcAgent>>> create_for_backend(BackendInitArgs args) {
    auto r = co_await NativeAgent::create(std::move(args));
    if (!r) co_return fail(std::move(r).error());
    co_return std::shared_ptr<RpcAgent>(std::move(*r));
}

[[maybe_unused]] const bool registered = [] {
    set_native_agent_factory(create_for_backend);
    return true;
}();
}  // namespace

Task<void> AgentCore::accept_when_ready(std::shared_ptr<AgentCore> core, std::size_t i) {
    // Peers are admitted against the roster, which start() reads after listening; a peer that is
    // faster waits in the listen backlog until then (within its handshake timeout).
    while (!core->peers_.roster_read() && core->life_.state() == State::starting) {
        auto ec = co_await core->peers_.wait_roster();
        (void)ec;  // set() is the signal (also when closing)
    }
    if (core->life_.state() == State::closed) co_return;
    co_await core->endpoint_.accept_loop(i);
}

}  // namespace tensorplay::detail
