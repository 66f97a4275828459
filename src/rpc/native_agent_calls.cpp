// Native agent, call path: outgoing calls, their replies and deadlines, connections, the facade.
#include "rpc/native_agent.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/core/wire.hpp>
#include <tensorplay/device/backend.hpp>

#include "core/asio_compat.hpp"
#include "core/recycled.hpp"

#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <cstdio>

namespace tensorplay::detail {

Bytes encode_error(const Error& e) {
    WireWriter w;
    w.u16(static_cast<std::uint16_t>(e.code())).str32(e.worker()).str32(e.message());
    return std::move(w).take();
}

std::ptrdiff_t map_tensor_targets(const DeviceMap* map, const std::vector<Tensor>& tensors, std::vector<Device>& targets) {
    targets.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const Tensor& t = tensors[i];
        if (!t.defined()) return static_cast<std::ptrdiff_t>(i);
        const Device d = t.device();
        if (map) {
            if (auto m = map->find(d); m != map->end()) {
                targets.push_back(m->second);
                continue;
            }
        }
        if (!d.is_cpu()) return static_cast<std::ptrdiff_t>(i);
        targets.push_back(Device::cpu());
    }
    return -1;
}

void log_task_error(std::exception_ptr e) {
    if (e) log(LogLevel::error, "rpc", error_from_exception_ptr(e, "agent task").to_string());
}

Error decode_error(std::span<const std::uint8_t> payload, const std::string& from) {
    WireReader r(payload);
    auto code = r.u16();
    auto worker = r.str32(4096, "worker name");
    auto message = r.str32(1u << 20, "error message");
    if (!r.finish() || code > static_cast<std::uint16_t>(Errc::internal))
        return Error(Errc::protocol_error, "worker \"" + from + "\" sent a malformed error reply", from);
    return Error(static_cast<Errc>(code), std::string(message), worker.empty() ? from : std::string(worker));
}

namespace {

std::string seconds_str(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", s);
    return buf;
}

}  // namespace

/// Receives on one of the agent's connections (outgoing: `rank` >= 0, replies to our calls and
/// requests; inbound: requests only): requests go to serving workers, replies resume their calls.
/// Runs inside the connection's reads (Connection::dispatch_to): a reply resumes its caller in
/// place, and a request its serving worker. A part of the agent (a nested class: it reads the
/// agent's calls and parts directly, on the hot path).
class AgentCore::ConnectionReader final : public FrameSink, public std::enable_shared_from_this<ConnectionReader> {
public:
    ConnectionReader(std::shared_ptr<AgentCore> core, std::shared_ptr<Connection> conn, std::shared_ptr<PeerLink> peer)
        : core_(std::move(core)), conn_(std::move(conn)), peer_(std::move(peer)) {}

    void on_small_frame(const FrameView& f) override {
        if (f.kind == FrameKind::control) return core_->control_frame(conn_, f.name, f.payload);
        if (f.kind == FrameKind::request)
            core_->serve_request(conn_, f.id, f.name, Message{recycled_copy(f.payload), {}}, nullptr);
        else
            reply(f.kind, f.id, f.payload, [&] { return Message{recycled_copy(f.payload), {}}; }, nullptr);
    }

    void on_frame(Frame&& f) override {
        static const DeviceRefs none;
        land(std::move(f), none);
    }

    bool on_device_frame(Frame& f, DeviceRefs& refs) override {
        land(std::move(f), refs);
        return true;
    }

    /// Lands a frame's device tensors (`refs`: those the peer's cuda_ipc carries), then delivers it.
    void land(Frame&& f, const DeviceRefs& refs) {
        if (f.kind == FrameKind::control) return core_->control_frame(conn_, f.name, f.payload);
        std::vector<tensorplay::Stream> streams;
        if (!f.targets.empty()) {
            // (A frame whose tensors come through cuda_ipc rings is handed back once they are queued.)
            auto later = [weak = weak_from_this()](Frame&& f, std::vector<tensorplay::Stream>&& s) {
                if (auto self = weak.lock()) self->deliver(std::move(f), std::move(s));
            };
            const auto landed = core_->land_device_tensors(conn_, f, refs, streams, later);
            if (landed == Landing::later || (landed == Landing::failed && !conn_->is_open())) return;
        }
        deliver(std::move(f), std::move(streams));
    }

    /// A whole frame (its device tensors landed) to its serving worker or waiting call.
    void deliver(Frame&& f, std::vector<tensorplay::Stream>&& streams) {
        Error* alloc_error = f.alloc_error ? &*f.alloc_error : nullptr;
        if (f.kind == FrameKind::request)
            core_->serve_request(conn_, f.id, f.name, Message{std::move(f.payload), std::move(f.tensors), std::move(streams)},
                                 alloc_error);
        else
            reply(f.kind, f.id, f.payload,
                  [&] { return Message{std::move(f.payload), std::move(f.tensors), std::move(streams)}; }, alloc_error);
    }

    /// A connection to a worker waits for replies while calls on it are pending.
    [[nodiscard]] bool awaiting_input() const override { return peer_ && core_->calls_.in_flight(peer_->info.id) != 0; }
    /// Every request is answered (serve_request), by a reply or an error.
    [[nodiscard]] bool answers_requests() const override { return true; }

    void on_closed(const Error& why) override {
        AgentCore& core = *core_;
        if (core.device_channels_) core.device_channels_->forget(conn_.get());
        if (!peer_) core.endpoint_.inbound_closed();
        if (peer_) {
            PeerLink& peer = *peer_;
            if (peer.conn == conn_) peer.conn.reset();
            Errc code = core.life_.state() == State::closed ? Errc::shutdown : Errc::connection_lost;
            if (code == Errc::connection_lost)
                log(LogLevel::info, "rpc", "worker \"" + core.config_.self.name + "\" lost its connection to worker \"" +
                                               peer.info.name + "\": " + why.message());
            core.calls_.fail(peer.info.id, conn_.get(),
                              Error(code, "connection to worker \"" + peer.info.name + "\" lost: " + why.message(), peer.info.name));
            // A dynamic member that may have died: checked, and removed when it does not answer.
            if (code == Errc::connection_lost && why.code() == Errc::connection_lost && core.peers_.at(peer.info.id) == &peer)
                core.suspect(peer.info.id, "its connection was lost (" + why.message() + ")");
        } else if (core.life_.state() != State::closed && why.code() == Errc::connection_lost) {
            const PeerLink* member = core.peers_.at(conn_->peer().rank);
            if (member && member->info.name == conn_->peer().name)
                core.suspect(member->info.id, "its connection was lost (" + why.message() + ")");
        }
        // (shutdown: closed on purpose, e.g. the peer left a dynamic group)
        if (core.life_.state() != State::closed && why.code() != Errc::connection_lost && why.code() != Errc::shutdown)
            log(LogLevel::warn, "rpc", "closing the connection with " + conn_->describe() + ": " + why.to_string());
        conn_->close();
    }

private:
    /// Finishes the call that reply `id` answers (a late reply is dropped): with the remote error,
    /// the refused tensor's error (`alloc_error`), or the message `make` builds.
    template <class MakeMessage>
    void reply(FrameKind kind, std::uint64_t id, std::span<const std::uint8_t> payload, MakeMessage make, Error* alloc_error) {
        if (!peer_) {
            conn_->close(Error(Errc::protocol_error, "a reply arrived on a connection that sent no request"));
            return;
        }
        PeerLink& peer = *peer_;
        PendingCall* pc = core_->calls_.take(peer.info.id, id);
        if (!pc) {
            log(LogLevel::debug, "rpc", "dropping a late reply " + std::to_string(id) + " from worker \"" + peer.info.name + "\"");
            return;
        }
        if (kind == FrameKind::error)
            pc->finish(fail(decode_error(payload, peer.info.name)));
        else if (alloc_error)
            pc->finish(fail(std::move(*alloc_error).context("receiving the reply from worker \"" + peer.info.name + "\"")));
        else
            pc->finish(make());
    }

    std::shared_ptr<AgentCore> core_;
    std::shared_ptr<Connection> conn_;
    std::shared_ptr<PeerLink> peer_;  ///< the worker this connection calls; null for an inbound one
};

void AgentCore::adopt_connection(std::shared_ptr<Connection> conn, int rank) {
    conn->set_allocator([this](const TensorDesc& d) { return allocate(d); });
    if (device_channels_)  // (large staged cuda tensors land chunk by chunk as they are read)
        set_sink_allocator(*conn, [this, c = conn.get()](const TensorDesc& d) { return device_channels_->sink(c, d); });
    auto link = peers_.link(rank);
    if (link) {
        link->conn = conn;
    } else {
        endpoint_.track(conn);  // (made with the reply bounds: inbound_limits)
    }
    auto* c = conn.get();
    dispatch_to(*c, std::make_shared<ConnectionReader>(shared_from_this(), std::move(conn), std::move(link)));
}

Result<Tensor> AgentCore::allocate(const TensorDesc& desc) const {
    if (desc.target.type != DeviceType::cpu) {
        // Bytes on the connection land in host memory: for a device the host cannot address, in
        // the backend's pinned staging memory, which the device channels copy up once the frame is
        // whole (land_device_tensors).
        auto backend = backend_for(desc.target);
        if (!backend)
            return fail(Error(Errc::device_error, "cannot place a tensor on " + desc.target.str() + " on worker \"" + config_.self.name +
                                                      "\": " + backend.error().message(),
                              config_.self.name));
        if (!(*backend)->host_accessible()) {
            if (desc.target.index >= (*backend)->device_count())
                return fail(Error(Errc::device_error, "cannot place a tensor on " + desc.target.str() + " on worker \"" + config_.self.name +
                                                          "\": it has " + std::to_string((*backend)->device_count()) + " cuda device(s)",
                                  config_.self.name));
            auto staging = (*backend)->allocate_host(desc.nbytes, desc.target);
            if (!staging) return fail(Error(Errc::device_error, "cannot stage a tensor for " + desc.target.str() + " on worker \"" +
                                                                    config_.self.name + "\": " + staging.error().message(),
                                            config_.self.name));
            return Tensor::wrap(std::move(*staging), desc.dtype, desc.shape);
        }
    }
    auto t = empty(desc.target, desc.dtype, desc.shape);
    if (!t) return fail(Error(Errc::device_error, "cannot place a tensor on " + desc.target.str() + " on worker \"" + config_.self.name +
                                                      "\": " + t.error().message(),
                              config_.self.name));
    return t;
}

void AgentCore::control_frame(const std::shared_ptr<Connection>& conn, std::string_view name, std::span<const std::uint8_t> payload) {
    Result<void> r = device_channels_ ? device_channels_->notice(conn, name, payload)
                                     : fail(Errc::protocol_error, "control frame \"" + std::string(name) +
                                                                      "\" for a device channel this worker does not have");
    if (!r) conn->close(std::move(r).error().context("a control frame from worker \"" + conn->peer().name + "\""));
}

AgentCore::Landing AgentCore::land_device_tensors(const std::shared_ptr<Connection>& conn, Frame& frame, const DeviceRefs& refs,
                                                  std::vector<tensorplay::Stream>& streams, DeviceChannels::Deliver later) {
    if (!device_channels_) return Landing::now;
    auto r = device_channels_->land(conn, frame, refs, streams, std::move(later));
    if (r) return *r == DeviceChannels::Landed::later ? Landing::later : Landing::now;
    Error e = std::move(r).error().context("receiving tensors from worker \"" + conn->peer().name + "\"");
    if (e.code() == Errc::protocol_error) {
        conn->close(e);
    } else if (!frame.alloc_error) {
        frame.alloc_error = std::move(e);
    }
    frame.tensors.clear();
    return Landing::failed;
}

namespace {

Duration timeout_duration(double secs) {
    return secs > 0 ? std::chrono::duration_cast<Duration>(std::chrono::duration<double>(secs)) : Duration::zero();
}

}  // namespace

int AgentCore::ready_rank(const std::string& to) {
    if ((life_.state() != State::running && life_.state() != State::starting) || membership_.evicted()) return -1;  // (check_call says why)
    const PeerLink* peer = peers_.at(last_called_);
    if (!peer || peer->info.name != to) {  // (a caller usually calls one worker many times)
        const int rank = peers_.rank_of(to);
        if (rank < 0 || rank == config_.self.id) return -1;
        last_called_ = rank;
        peer = peers_.at(rank);
    }
    return peer->conn && peer->conn->is_open() ? last_called_ : -1;
}

Result<int> AgentCore::check_call(const std::string& to) const {
    if (life_.state() == State::closed || life_.state() == State::draining)
        return fail(Errc::shutdown, "rpc to worker \"" + to + "\": the agent of worker \"" + config_.self.name + "\" is shut down");
    if (const auto& evicted = membership_.evicted()) return fail(Error(*evicted).context("rpc to worker \"" + to + "\""));
    const int rank = peers_.rank_of(to);
    if (rank < 0) return fail(Errc::invalid_argument, "unknown worker \"" + to + "\" (the group has: " + peers_.names() + ")");
    return rank;
}

Result<void> AgentCore::send_request(PeerLink& peer, std::uint64_t id, const std::string& handler, Message& message,
                                     PreparedTensors* prepared) {
    // (Flush::paced: a lone call is written at once; calls made while others await their replies
    // on this connection share the writer's gathered write, as their replies will.)
    const Flush flush = Flush::paced;
    std::vector<Device> targets;
    if (auto routed = request_targets(peer, message.tensors, targets); !routed) return routed;
    auto s = prepared ? send_parts(*peer.conn, FrameKind::request, id, handler, message.payload, prepared->tensors, targets,
                                   prepared->parts, flush)
                      : send_parts(*peer.conn, FrameKind::request, id, handler, message.payload, message.tensors, targets, flush);
    if (!s) {
        if (s.error().code() == Errc::invalid_argument) return fail(std::move(s).error());
        return fail(Error(Errc::connection_lost, "rpc to worker \"" + peer.info.name + "\": " + s.error().message(), peer.info.name));
    }
    return ok();
}

Result<void> AgentCore::request_targets(const PeerLink& peer, const std::vector<Tensor>& tensors, std::vector<Device>& targets) const {
    if (const auto i = map_tensor_targets(&peer.map, tensors, targets); i >= 0) {
        const Tensor& t = tensors[static_cast<std::size_t>(i)];
        if (!t.defined()) return fail(Errc::invalid_argument, "tensor " + std::to_string(i) + " of the message is undefined");
        return fail(Errc::device_error, "rpc to worker \"" + peer.info.name + "\": tensor " + std::to_string(i) + " is on " +
                                            t.device().str() + ", which has no device map from worker \"" + config_.self.name +
                                            "\" to worker \"" + peer.info.name + "\" (add one with set_device_map)");
    }
    return ok();
}

Error AgentCore::call_error(const std::string& to, const std::string& handler, double secs, std::error_code wait_ec) const {
    if (!wait_ec)
        // Detected here, not reported by `to`: no worker attribution (to_string would read "on worker ...").
        return Error(Errc::timeout, "rpc to worker \"" + to + "\" (handler \"" + handler + "\") timed out after " + seconds_str(secs));
    return Error(Errc::cancelled, "rpc to worker \"" + to + "\" was cancelled while waiting for its reply");
}

Task<Result<Message>> AgentCore::call_slow(std::string to, std::string handler, Message message, double timeout_sec) {
    auto keep = shared_from_this();
    if (auto current = co_await asio::this_coro::executor; current != config_.ex) {
        // Called from another executor: run on the agent's, as a child coroutine there.
        try {
            auto t = call(std::move(to), std::move(handler), std::move(message), timeout_sec);
            co_return co_await asio::co_spawn(config_.ex, std::move(t), asio::use_awaitable);
        } catch (...) {
            co_return fail(error_from_current_exception("agent"));
        }
    }
    auto rank = check_call(to);
    if (!rank) co_return fail(std::move(rank).error());
    const double secs = timeout_sec < 0 ? config_.options->rpc_timeout : timeout_sec;
    if (*rank == config_.self.id) {  // to self: no socket, but the same handler path
        calls_.add_local();
        auto r = co_await with_timeout(run_handler(config_.self, std::move(handler), std::move(message)), timeout_duration(secs));
        calls_.finished();
        if (!r && r.error().code() == Errc::timeout)
            co_return fail(Error(Errc::timeout, "rpc to worker \"" + to + "\" timed out after " + seconds_str(secs)));
        co_return r;
    }
    // Not connected yet (or the connection was lost): connect, then the usual path with the time
    // that is left.
    const auto started = Clock::now();
    auto c = co_await ensure_connected(*rank, timeout_duration(secs));
    if (!c) co_return fail(std::move(c).error());
    double left = secs;
    if (secs > 0) {
        left = secs - std::chrono::duration<double>(Clock::now() - started).count();
        if (left <= 0) co_return fail(call_error(to, handler, secs, {}));
    }
    co_return co_await call(std::move(to), std::move(handler), std::move(message), left);
}

// The common case: on the agent's executor, to a connected worker. Kept lean (errors are built by
// the functions above, the pending call lives outside the frame): a coroutine frame over about
// 1 KiB is not kept by Asio's per-thread frame cache, and a malloc of that size misses glibc's
// thread cache too.
// (The frame of this coroutine is kept small, under the 1,020 bytes that Asio's per-thread cache of
// coroutine frames recycles: a larger frame goes to malloc on every call. GCC keeps every local and
// every awaited result in the frame, so the cases other than the common one are one awaited call,
// and what needs no suspension is in plain functions.)
Task<Result<Message>> AgentCore::call(std::string to, std::string handler, Message message, double timeout_sec,
                                      PreparedTensors* prepared) {
    const int rank = (co_await asio::this_coro::executor) == config_.ex ? ready_rank(to) : -1;
    if (rank < 0 || (!prepared && has_device_tensors(message.tensors)))
        co_return co_await call_elsewhere(rank, std::move(to), std::move(handler), std::move(message), timeout_sec);
    auto keep = shared_from_this();
    const auto link = peers_.link(rank);  // (held while the call awaits: the member may leave meanwhile)
    const double secs = timeout_sec < 0 ? config_.options->rpc_timeout : timeout_sec;
    PendingCallHandle pc(calls_, rank, calls_.next_id(), calls_.slots());
    const auto sent_at = Clock::now();
    if (begin_call(*link, pc, handler, message, prepared, secs, sent_at) && !pc->signalled) co_await pc->done.wait();
    co_return end_call(pc, rank, to, handler, secs, sent_at);
}

Task<Result<Message>> AgentCore::call_elsewhere(int rank, std::string to, std::string handler, Message message, double timeout_sec) {
    if (rank < 0) return call_slow(std::move(to), std::move(handler), std::move(message), timeout_sec);
    return call_device(std::move(to), std::move(handler), std::move(message), timeout_sec);
}

bool AgentCore::begin_call(PeerLink& peer, PendingCallHandle& pc, const std::string& handler, Message& message,
                           PreparedTensors* prepared, double secs, Clock::time_point sent_at) {
    const Duration d = timeout_duration(secs);
    const auto deadline = d > Duration::zero() ? sent_at + d : Clock::time_point::max();
    const auto out_bytes = message_bytes(message);
    if (auto sent = send_request(peer, pc.id(), handler, message, prepared); !sent) {
        pc->result = fail(std::move(sent).error());
        return false;
    }
    metrics_.peers[static_cast<std::size_t>(peer.info.id)].bytes_sent += out_bytes;
    recycle(message.payload);  // (written, or moved to the writer's queue: the reply may reuse its memory)
    pc->conn = peer.conn.get();
    pc.add(deadline);
    return true;
}

Result<Message> AgentCore::end_call(PendingCallHandle& pc, int rank, const std::string& to, const std::string& handler, double secs,
                                    Clock::time_point sent_at) {
    if (pc->result) {
        metrics_.call_ended(rank, sent_at, *pc->result);
        return std::move(*pc->result);
    }
    // (pc->result stays unset: the handle then unlinks the call, whose late reply is dropped.)
    auto err = call_error(to, handler, secs, pc->done.error());  // (clear unless a wait ended with an error)
    metrics_.call_failed(rank, err.code());
    return fail(std::move(err));
}

// Device tensors: ordered after their streams, staged or put in the outbox (transport/channels/device_channels.cpp),
// then the common path with them. The time this takes is charged to the call's timeout.
Task<Result<Message>> AgentCore::call_device(std::string to, std::string handler, Message message, double timeout_sec) {
    auto keep = shared_from_this();
    const int rank = ready_rank(to);
    const PeerLink* peer = rank >= 0 ? peers_.at(rank) : nullptr;
    if (!peer || !peer->conn) co_return co_await call_slow(std::move(to), std::move(handler), std::move(message), timeout_sec);
    std::vector<Device> targets;
    if (auto routed = request_targets(*peer, message.tensors, targets); !routed) co_return fail(std::move(routed).error());
    const double secs = timeout_sec < 0 ? config_.options->rpc_timeout : timeout_sec;
    const auto started = Clock::now();
    auto conn = peer->conn;
    // (Bounded by the call's timeout: the producer's work may not end for a long time.)
    auto t = with_timeout(device_channels_->prepare(conn, message.tensors, message.streams, std::move(targets)),
                          timeout_duration(secs));
    auto prepared = co_await std::move(t);
    if (!prepared && prepared.error().code() == Errc::timeout) co_return fail(call_error(to, handler, secs, {}));
    if (!prepared)
        co_return fail(Error(Errc::device_error, "rpc to worker \"" + to + "\": " + prepared.error().message(), config_.self.name));
    double left = secs;
    if (secs > 0) {
        left = secs - std::chrono::duration<double>(Clock::now() - started).count();
        if (left <= 0) co_return fail(call_error(to, handler, secs, {}));
    }
    auto result = co_await call(to, std::move(handler), std::move(message), left, &*prepared);
    // Tensors the peer reads in place (cuda_ipc with one copy): the call completes once it let go of
    // them, so that the caller may change them then (within what is left of the timeout).
    if (prepared->released) {
        const double rest_secs = secs > 0 ? std::max(1e-3, secs - std::chrono::duration<double>(Clock::now() - started).count()) : 86400.0;
        const auto rest = timeout_duration(rest_secs);
        if (!co_await DeviceChannels::await_release(*prepared, rest) && result)
            co_return fail(Error(Errc::timeout, "rpc to worker \"" + to + "\": the reply came, but the worker was still reading the "
                                                "request's cuda tensors at the call's timeout", to));
    }
    co_return result;
}

// ---- NativeAgent facade ----

namespace {
/// Runs `t` on the core's executor: in place when already there, else as a child coroutine.
template <class T>
Task<Result<T>> on_core(std::shared_ptr<AgentCore> core, Task<Result<T>> t) {
    auto current = co_await asio::this_coro::executor;
    if (current == core->config().ex) co_return co_await std::move(t);
    try {
        co_return co_await asio::co_spawn(core->config().ex, std::move(t), asio::use_awaitable);
    } catch (...) {
        co_return fail(error_from_current_exception("agent"));
    }
}
}  // namespace

const WorkerInfo& NativeAgent::get_worker_info() const { return core_->config().self; }

Result<WorkerInfo> NativeAgent::get_worker_info(std::string_view name) const {
    return core_->peers().find(name);
}

std::vector<WorkerInfo> NativeAgent::get_worker_infos() const { return core_->peers().infos(); }

const RpcBackendOptions& NativeAgent::get_backend_options() const { return *core_->config().options; }

Result<void> NativeAgent::register_handler(std::string name, RpcHandler handler) {
    return core_->handlers().add(std::move(name), std::move(handler), {});
}

Result<void> NativeAgent::register_blocking_handler(std::string name, BlockingRpcHandler handler) {
    return core_->handlers().add(std::move(name), {}, std::move(handler));
}

Task<Result<void>> NativeAgent::unregister_handler(std::string name) {
    return on_core(core_, core_->handlers().remove(std::move(name)));
}

Task<Result<Message>> NativeAgent::rpc_async(std::string to, std::string handler, Message message, double timeout_sec) {
    return core_->call(std::move(to), std::move(handler), std::move(message), timeout_sec);  // (it hops itself)
}

Task<Result<void>> NativeAgent::shutdown(bool graceful, double timeout_sec) {
    return on_core(core_, core_->shutdown(graceful, timeout_sec));
}

Task<Result<AgentDebugInfo>> NativeAgent::get_debug_info() { return on_core(core_, core_->debug_info()); }

Task<Result<AgentDebugInfo>> AgentCore::debug_info() {
    auto keep = shared_from_this();
    AgentDebugInfo d;
    d.worker = config_.self.name;
    d.rank = config_.self.id;
    d.world_size = config_.world_size;
    d.devices = membership_.devices();
    peers_.for_each([&](const PeerLink& link) {
        const auto r = static_cast<std::size_t>(link.info.id);
        if (link.info.id == config_.self.id || r >= metrics_.peers.size()) return;
        const auto& c = metrics_.peers[r];
        PeerDebugInfo p;
        p.worker = link.info.name;
        p.rank = link.info.id;
        p.connected = link.conn && link.conn->is_open();
        if (p.connected) {
            p.transport = link.conn->transport();
            for (const auto& ch : link.conn->negotiated().channels)
                p.channel += (p.channel.empty() ? "" : ",") + ch.client_device + "->" + ch.server_device + ":" + ch.channel;
        }
        p.calls_in_flight = calls_.in_flight(link.info.id);
        p.calls_done = c.calls_done;
        p.calls_failed = c.calls_failed;
        p.requests_served = c.requests_served;
        p.bytes_sent = c.bytes_sent;
        p.bytes_received = c.bytes_received;
        p.device_map = link.map;
        p.reverse_device_map = link.reverse;
        d.peers.push_back(std::move(p));
    });
    for (std::size_t i = 0; i < metrics_.errors.size(); ++i)
        if (metrics_.errors[i]) d.errors[std::string(to_string(static_cast<Errc>(i)))] = metrics_.errors[i];
    d.requests_running = metrics_.requests_running;
    d.latency_samples = metrics_.latency.count();
    d.latency_p50_us = metrics_.latency.percentile_us(50);
    d.latency_p90_us = metrics_.latency.percentile_us(90);
    d.latency_p99_us = metrics_.latency.percentile_us(99);
    d.latency_max_us = metrics_.latency.max_us();
    co_return d;
}

std::vector<std::string> NativeAgent::listen_urls() const {
    std::vector<std::string> out;
    for (const auto& o : core_->endpoint().offers()) out.push_back(o.address);
    return out;
}

std::string NativeAgent::listen_address() const {
    const Endpoint& e = core_->endpoint();
    if (!e.host().empty() || e.offers().empty()) return e.host() + ":" + std::to_string(e.port());
    return e.offers().front().address;
}

std::size_t NativeAgent::background_tasks() const { return core_->background_tasks(); }

DeviceChannels::Stats NativeAgent::device_stats() const { return core_->device_stats(); }

DeviceChannels::Stats AgentCore::device_stats() const {
    return device_channels_ ? device_channels_->stats() : DeviceChannels::Stats{};
}

std::shared_ptr<Connection> NativeAgent::connection_to(int rank) const {
    const PeerLink* p = core_->peers().at(rank);
    return p ? p->conn : nullptr;
}

}  // namespace tensorplay::detail
