// Resuming coroutines when CUDA events complete: one completion thread for the process polls
// cudaEventQuery and posts each completion to the waiting coroutine's executor.
//
// Why polling from one shared thread, and not cudaLaunchHostFunc/cudaStreamAddCallback posting
// to the executor:
//  - a host function is never called once the context has a (sticky) error, so a wait on a
//    failed device would hang; cudaEventQuery returns that error, so the wait fails with it;
//  - host functions of one stream run in order and block the stream while they run; waits
//    queued on a helper stream would complete behind unrelated slower events (head-of-line);
//  - CUDA calls are allowed on our thread (they are forbidden inside host functions), so the
//    device guard and error names work there;
//  - events recorded on one stream complete in record order, so each sweep queries only the
//    oldest pending event per stream: thousands of waits cost one thread and a few queries.
// Latency: while waits are pending the thread spins (with sched_yield) for 100 us after any
// activity, then sleeps with back-off from 10 us to 1 ms; a new wait wakes it at once. Waiters
// on an event that has already completed never reach this thread (await_cuda_event checks first).
// Cancellation: the waiter's cancellation slot (e.g. `||` with a timer, or a cancelled co_spawn)
// completes the wait with Errc::cancelled at once; the GPU work is not affected. Destroying the
// execution context with waits pending drops them (their coroutine frames are destroyed, as
// asio does with its own pending operations) through a service registered in that context.
#include "device/cuda_device.hpp"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <unordered_map>

namespace tensorplay::detail {

namespace {

// Shuts the engine's ops of one execution context down before the context is destroyed.
class WaitService final : public asio::execution_context::service {
public:
    static asio::execution_context::id id;
    explicit WaitService(asio::execution_context& ctx) : asio::execution_context::service(ctx), ctx_(ctx) {}
    void shutdown() override { WaitEngine::instance().drop_context(&ctx_); }

private:
    asio::execution_context& ctx_;
};
asio::execution_context::id WaitService::id;

using Clock = std::chrono::steady_clock;
// After a completion the thread spins (yields) for spin_window, since another often follows; but
// spinning takes at most spin_budget of every spin_period (a quarter of a core while traffic flows),
// past which it sleeps between polls as when idle. A sleep lasts a quarter of the time since the last
// completion, within [first_backoff, max_backoff]: a wait pending for a second (a long kernel) costs
// a poll every 4 ms, and a short one is seen late by at most a quarter of its time.
constexpr auto spin_window = std::chrono::microseconds(100);
constexpr auto spin_period = std::chrono::milliseconds(10);
constexpr auto spin_budget = std::chrono::microseconds(2500);
constexpr auto first_backoff = std::chrono::microseconds(10);
constexpr auto max_backoff = std::chrono::milliseconds(4);

}  // namespace

struct WaitEngine::Impl {
    std::mutex mutex;
    std::condition_variable wake;
    // group -> ops ordered by their event's sequence number in that group
    std::unordered_map<std::uint64_t, std::multimap<std::uint64_t, std::shared_ptr<WaitOp>>> groups;
    Clock::time_point last_activity = Clock::now();
    int current_device = -1;  // of the completion thread
};

WaitEngine& WaitEngine::instance() {
    static auto* engine = new WaitEngine;  // never destroyed: its thread runs until the process exits
    return *engine;
}

WaitEngine::WaitEngine() : impl_(new Impl) {
    std::thread([this] {
        ::pthread_setname_np(::pthread_self(), "tp-cuda-wait");  // (named: tools and cuda_bench find it)
        run();
    }).detach();
}

void WaitEngine::watch_context(asio::execution_context& context) { (void)asio::use_service<WaitService>(context); }

void WaitEngine::add(std::shared_ptr<WaitOp> op) {
    {
        std::lock_guard lock(impl_->mutex);
        auto& group = impl_->groups[op->event->group()];
        auto seq = op->event->seq();
        op->where = group.emplace(seq, op);
        impl_->last_activity = Clock::now();
    }
    impl_->wake.notify_one();
}

void WaitEngine::cancel(const std::shared_ptr<WaitOp>& op) {
    std::lock_guard lock(impl_->mutex);
    if (op->claimed.exchange(true)) return;
    auto it = impl_->groups.find(op->event->group());
    if (it != impl_->groups.end()) {
        it->second.erase(op->where);
        if (it->second.empty()) impl_->groups.erase(it);
    }
    // Posting under the lock: drop_context (the context's destruction) waits for it to finish.
    op->finish(fail(Errc::cancelled, "wait for a cuda event on cuda:" + std::to_string(op->event->device().index()) +
                                         " was cancelled (the GPU work is not affected)"));
}

void WaitEngine::drop_context(asio::execution_context* context) {
    std::vector<std::shared_ptr<WaitOp>> dropped;
    {
        std::lock_guard lock(impl_->mutex);
        for (auto g = impl_->groups.begin(); g != impl_->groups.end();) {
            for (auto it = g->second.begin(); it != g->second.end();) {
                if (it->second->context == context && !it->second->claimed.exchange(true)) {
                    dropped.push_back(std::move(it->second));
                    it = g->second.erase(it);
                } else {
                    ++it;
                }
            }
            g = g->second.empty() ? impl_->groups.erase(g) : std::next(g);
        }
    }
    // Destroyed outside the lock: a coroutine frame's destructors may reach the engine again.
    dropped.clear();
}

void WaitEngine::run() {
    auto& s = *impl_;
    std::unique_lock lock(s.mutex);
    auto period_start = Clock::now();
    Clock::duration spun{};
    for (;;) {
        if (s.groups.empty()) {
            s.wake.wait(lock, [&] { return !s.groups.empty(); });
            continue;
        }
        bool progress = false;
        std::vector<std::pair<std::shared_ptr<WaitOp>, Result<void>>> unlocked;  // finished after unlocking
        for (auto g = s.groups.begin(); g != s.groups.end();) {
            auto& ops = g->second;
            while (!ops.empty()) {
                auto& event = *ops.begin()->second->event;
                if (const int dev = event.device().index(); dev != s.current_device) {
                    // The device guard of this thread: queries run with the event's device current.
                    if (event.device().api().cudaSetDevice(dev) == cudaSuccess) s.current_device = dev;
                }
                const cudaError_t e = event.query();
                if (e == cudaErrorNotReady) break;
                Result<void> r = ok();
                if (e != cudaSuccess) r = fail(event.device().failure("cudaEventQuery", e));
                const auto seq = ops.begin()->first;
                while (!ops.empty() && ops.begin()->first == seq) {
                    auto op = std::move(ops.begin()->second);
                    ops.erase(ops.begin());
                    if (op->claimed.exchange(true)) continue;
                    if (op->context == nullptr) unlocked.emplace_back(std::move(op), r);
                    else op->finish(r);
                }
                progress = true;
            }
            g = ops.empty() ? s.groups.erase(g) : std::next(g);
        }
        if (!unlocked.empty()) {
            // Callbacks and the keep-alives they drop (cudaFreeHost, cudaIpcCloseMemHandle, a last
            // event reference) run without the lock: an event loop adding a wait meanwhile goes on.
            lock.unlock();
            for (auto& [op, r] : unlocked) op->finish(std::move(r));
            unlocked.clear();
            lock.lock();
        }
        const auto now = Clock::now();
        if (progress) s.last_activity = now;
        if (s.groups.empty()) continue;
        if (now - period_start >= spin_period) {
            period_start = now;
            spun = {};
        }
        const auto idle = now - s.last_activity;
        if (idle < spin_window && spun < spin_budget) {
            lock.unlock();
            std::this_thread::yield();
            lock.lock();
            spun += Clock::now() - now;
        } else {
            // (add() notifies: a new wait is polled at once.)
            s.wake.wait_for(lock, std::clamp<Clock::duration>(idle / 4, first_backoff, max_backoff));
        }
    }
}

// ---- events ----

CudaEventState::~CudaEventState() {
    if (reuse_) {
        device_->return_event(event_);
    } else {
        DeviceGuard guard(device_->api(), device_->index());
        (void)device_->api().cudaEventDestroy(event_);
    }
}

cudaError_t CudaEventState::query() const noexcept {
    if (done_.load(std::memory_order_acquire)) return cudaSuccess;
    const cudaError_t e = device_->api().cudaEventQuery(event_);
    if (e == cudaSuccess && !again_) done_.store(true, std::memory_order_release);
    return e;
}

bool CudaEventState::ready() const noexcept { return query() == cudaSuccess; }

void CudaEventState::on_ready(std::function<void()> fn) {
    // Generic users (not the backend's wait) get called on the completion thread, also on error.
    struct Callback final : WaitOp {
        Callback(std::shared_ptr<CudaEventState> e, std::function<void()> f) : WaitOp(std::move(e), nullptr), fn(std::move(f)) {}
        void finish(Result<void>) override { fn(); }
        std::function<void()> fn;
    };
    if (ready()) {
        fn();
        return;
    }
    WaitEngine::instance().add(std::make_shared<Callback>(shared_from_this(), std::move(fn)));
}

// ---- the awaitable ----

namespace {

template <class Handler>
class HandlerOp final : public WaitOp, public std::enable_shared_from_this<HandlerOp<Handler>> {
public:
    using WorkExecutor = std::decay_t<decltype(asio::prefer(std::declval<asio::associated_executor_t<Handler>>(),
                                                            asio::execution::outstanding_work.tracked))>;
    HandlerOp(std::shared_ptr<CudaEventState> event, asio::execution_context* ctx, Handler h, WorkExecutor work,
              Result<void>* out)
        : WaitOp(std::move(event), ctx), handler_(std::move(h)), work_(std::move(work)), out_(out) {}

    void finish(Result<void> r) override {
        asio::post(work_, [self = this->shared_from_this(), r = std::move(r)]() mutable {
            asio::get_associated_cancellation_slot(self->handler_).clear();
            *self->out_ = std::move(r);
            auto h = std::move(self->handler_);
            self.reset();
            std::move(h)();
        });
    }
    Handler& handler() noexcept { return handler_; }

private:
    Handler handler_;
    WorkExecutor work_;  // keeps the executor's run() going while the GPU works
    Result<void>* out_;
};

}  // namespace

Task<Result<void>> await_cuda_event(std::shared_ptr<CudaEventState> event) {
    if (!event) co_return ok();
    // (In a forked child the completion thread is not there: the wait would never end.)
    if (cuda_forked()) co_return fail(forked_error(event->device().index()).context("waiting for a CUDA event"));
    const cudaError_t first = event->query();  // already complete: resume at once, no trip through the engine
    if (first == cudaSuccess) co_return ok();
    if (first != cudaErrorNotReady) co_return fail(event->device().failure("cudaEventQuery", first));
    Result<void> result = ok();
    // A named local, as in await_event (GCC 12 destroys temporaries of a co_await expression twice).
    auto initiation = [event, &result](auto handler) {
        using Handler = decltype(handler);
        auto ex = asio::get_associated_executor(handler);
        auto& ctx = asio::query(ex, asio::execution::context);
        WaitEngine::watch_context(ctx);
        auto work = asio::prefer(ex, asio::execution::outstanding_work.tracked);
        auto op = std::make_shared<HandlerOp<Handler>>(event, &ctx, std::move(handler), std::move(work), &result);
        auto slot = asio::get_associated_cancellation_slot(op->handler());
        if (slot.is_connected()) {
            slot.assign([weak = std::weak_ptr<HandlerOp<Handler>>(op)](asio::cancellation_type) {
                if (auto p = weak.lock()) WaitEngine::instance().cancel(p);
            });
        }
        WaitEngine::instance().add(std::move(op));
    };
    co_await asio::async_initiate<const asio::use_awaitable_t<>&, void()>(initiation, asio::use_awaitable);
    co_return result;
}

}  // namespace tensorplay::detail
