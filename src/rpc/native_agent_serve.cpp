// Native agent, serving side: requests handed to parked serving coroutines, handlers run and
// their replies sent, handler registration.
#include "rpc/native_agent.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/device/backend.hpp>

#include "core/asio_compat.hpp"
#include "core/recycled.hpp"

#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>

namespace tensorplay::detail {

namespace {

Task<Result<Message>> run_blocking(BlockingRpcHandler fn, WorkerInfo caller, Message message) {
    try {
        co_return fn(caller, std::move(message));
    } catch (...) {
        co_return fail(error_from_current_exception("blocking handler"));
    }
}

}  // namespace

Result<void> AgentCore::route_reply_tensors(const HelloInfo& caller, const std::vector<Tensor>& tensors,
                                            std::vector<Device>& targets) const {
    const std::vector<Device>& devices = membership_.devices();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const Device d = tensors[i].defined() ? tensors[i].device() : Device::cpu();
        if (!d.is_cpu() && std::find(devices.begin(), devices.end(), d) == devices.end())
            return fail(Errc::device_error,
                        "reply tensor " + std::to_string(i) + " is on " + d.str() + ", which is not among the devices of worker \"" +
                            config_.self.name + "\" (set them with `devices`, or map them in a device map)",
                        config_.self.name);
    }
    const DeviceMap* reverse = nullptr;
    if (const PeerLink* p = peers_.at(caller.rank); p && p->info.name == caller.name) reverse = &p->reverse;
    const auto i = map_tensor_targets(reverse, tensors, targets);
    if (i < 0) return ok();
    const Tensor& t = tensors[static_cast<std::size_t>(i)];
    if (!t.defined()) return fail(Errc::invalid_argument, "reply tensor " + std::to_string(i) + " is undefined", config_.self.name);
    return fail(Errc::device_error,
                "reply tensor " + std::to_string(i) + " is on " + t.device().str() + ", which has no device map back to worker \"" +
                    caller.name + "\" (worker \"" + caller.name + "\" maps none of its devices to it)",
                config_.self.name);
}

void AgentCore::send_reply(Connection& conn, std::uint64_t id, Result<Message>& r, PreparedTensors* prepared,
                           std::vector<Device> targets) {
    if (r && !r->tensors.empty() && !prepared) {
        if (auto routed = route_reply_tensors(conn.peer(), r->tensors, targets); !routed) r = fail(std::move(routed).error());
    }
    if (metrics_.requests_running > 0) --metrics_.requests_running;
    if (const auto rank = conn.peer().rank; rank >= 0 && static_cast<std::size_t>(rank) < metrics_.peers.size()) {
        auto& c = metrics_.peers[static_cast<std::size_t>(rank)];
        ++c.requests_served;
        if (r) c.bytes_sent += message_bytes(*r);
    }
    // (Flush::paced: written now unless more requests are buffered already, whose replies then
    // share one write.)
    const Flush flush = Flush::paced;
    Result<void> sent;
    if (r && prepared) {
        sent = send_parts(conn, FrameKind::response, id, {}, r->payload, prepared->tensors, targets, prepared->parts, flush);
    } else if (r) {
        sent = send_parts(conn, FrameKind::response, id, {}, r->payload, r->tensors, targets, flush);
        recycle(r->payload);  // (written, or moved to the writer's queue: the next request may reuse its memory)
    } else {
        Bytes e = encode_error(r.error());
        std::vector<Tensor> none;
        sent = send_parts(conn, FrameKind::error, id, {}, e, none, {}, flush);
    }
    if (!sent) log(LogLevel::debug, "rpc", "could not reply to worker \"" + conn.peer().name + "\": " + sent.error().to_string());
}

Task<void> AgentCore::send_device_reply(std::shared_ptr<AgentCore> core, std::shared_ptr<Connection> conn, std::uint64_t id,
                                        Result<Message> r, std::vector<tensorplay::Stream> request_streams) {
    std::vector<Device> targets;
    std::optional<PreparedTensors> prepared;
    if (auto routed = core->route_reply_tensors(conn->peer(), r->tensors, targets); !routed) {
        r = fail(std::move(routed).error());
    } else {
        for (const auto& s : request_streams)
            if (!r->stream_for(s.device)) r->streams.push_back(s);
        auto t = core->device_channels_->prepare(conn, r->tensors, r->streams, targets);
        auto p = co_await std::move(t);
        if (p) prepared = std::move(*p);
        else r = fail(Error(Errc::device_error, "sending the reply's tensors: " + p.error().message(), core->config_.self.name));
    }
    core->send_reply(*conn, id, r, prepared ? &*prepared : nullptr, std::move(targets));
}

Task<void> AgentCore::serve_worker(std::shared_ptr<AgentCore> core, std::shared_ptr<Connection> conn, ServeRequest first) {
    ServeWorker w;
    w.core = std::move(core);
    w.conn = std::move(conn);
    w.req = std::move(first);
    w.has_request = true;
    for (;;) {
        ServeRequest& req = w.req;
        Result<Message> r;  // (no placeholder error: building one costs an allocation on every call)
        std::vector<tensorplay::Stream> request_streams;  // (empty unless the request had device tensors: no allocation)
        if (req.error) {
            r = fail(std::move(*req.error));
        } else if (!req.entry) {
            r = fail(w.core->handlers_.not_found(req.unknown));
        } else {
            try {
                WorkerInfo caller{w.conn->peer().name, w.conn->peer().rank};
                request_streams = req.message.streams;
                auto t = w.core->start_handler(*req.entry, std::move(caller), std::move(req.message));  // (GCC 12: not inside co_await)
                r = co_await std::move(t);
            } catch (...) {
                r = fail(error_from_current_exception("handler \"" + req.entry->name + "\""));
            }
            w.core->finish_handler(*req.entry, r);
        }
        if (r && has_device_tensors(r->tensors) && w.core->device_channels_) {
            auto t = send_device_reply(w.core, w.conn, req.id, std::move(r), std::move(request_streams));
            co_await std::move(t);
        } else {
            w.core->send_reply(*w.conn, req.id, r);
        }
        w.has_request = false;
        req.entry.reset();
        req.error.reset();
        w.conn.reset();
        if (!w.core->park(w)) break;
        // (Not cancellable: close_local wakes parked workers to exit, and parks no more.)
        co_await w.wake.wait(ResumeSlot::OnCancel::ignore);
        if (w.wake.error() || !w.has_request) break;  // woken to exit (the agent closed)
    }
}

void AgentCore::serve_request(const std::shared_ptr<Connection>& conn, std::uint64_t id, std::string_view name,
                              Message&& message, Error* error) {
    ++metrics_.requests_running;
    if (const auto rank = conn->peer().rank; rank >= 0 && static_cast<std::size_t>(rank) < metrics_.peers.size())
        metrics_.peers[static_cast<std::size_t>(rank)].bytes_received += message_bytes(message);
    auto fill = [&](ServeRequest& req) {
        req.id = id;
        if (error) {
            req.error = std::move(*error);
            return;
        }
        if (config_.dynamic())
            if (auto refused = refuse_caller(conn->peer(), name)) {
                req.error = std::move(*refused);
                return;
            }
        req.entry = handlers_.enter(name);
        if (!req.entry) req.unknown = name;
        req.message = std::move(message);
    };
    ServeWorker* w = serving_.take();
    if (!w) {
        ServeRequest req;
        fill(req);
        if (!tasks_->spawn(serve_worker(shared_from_this(), conn, std::move(req)), "a serving worker"))
            --metrics_.requests_running;  // (closing: nobody will answer it)
        return;
    }
    fill(w->req);
    w->core = shared_from_this();
    w->conn = conn;
    w->has_request = true;
    w->wake.complete();
}

bool AgentCore::park(ServeWorker& w) {
    if (life_.state() == State::closed || w.core.use_count() == 1 || !serving_.park(w)) return false;
    w.core.reset();
    return true;
}

Task<Result<Message>> AgentCore::start_handler(const HandlerEntry& entry, WorkerInfo caller, Message message) {
    if (entry.coro) return entry.coro(std::move(caller), std::move(message));
    const int n = config_.tp_options ? config_.tp_options->num_worker_threads : DEFAULT_NUM_WORKER_THREADS;
    auto& threads = serving_.blocking_threads(static_cast<std::size_t>(n > 0 ? n : 1));
    return asio::co_spawn(threads, run_blocking(entry.blocking, std::move(caller), std::move(message)), asio::use_awaitable);
}

void AgentCore::finish_handler(HandlerEntry& entry, Result<Message>& r) {
    handlers_.leave(entry);
    if (!r) r = fail(Error(Errc::remote_error, "handler \"" + entry.name + "\" failed: " + r.error().to_string(), config_.self.name));
}

Task<Result<Message>> AgentCore::run_handler(WorkerInfo caller, std::string name, Message message) {
    auto h = handlers_.enter(name);
    if (!h) co_return fail(handlers_.not_found(name));
    Result<Message> r;
    try {
        auto t = start_handler(*h, std::move(caller), std::move(message));
        r = co_await std::move(t);
    } catch (...) {
        r = fail(error_from_current_exception("handler \"" + name + "\""));
    }
    finish_handler(*h, r);
    co_return r;
}

}  // namespace tensorplay::detail
