// The test-only sim backend: N fake cuda devices in host memory with ordered streams and events.
#include <tensorplay/device/backend.hpp>

#include "device/backend_impl.hpp"

#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include <cstring>
#include <deque>
#include <string>
#include <thread>

namespace tensorplay::detail {
namespace {

// One queued item: a host function (copy or user work), or a wait on an event.
struct SimOp {
    std::function<void()> fn;
    std::shared_ptr<EventState> wait_for;
    std::shared_ptr<void> keep_alive;
    bool delayed = false;
};

// A stream is a FIFO drained by at most one pool thread at a time (so its work runs in order);
// a wait on an incomplete event parks the drain and the event's completion resumes it, so no
// thread blocks on another stream.
class SimStream : public std::enable_shared_from_this<SimStream> {
public:
    SimStream(asio::thread_pool& pool, std::chrono::microseconds delay) : pool_(pool), delay_(delay) {}

    void push(SimOp op) {
        {
            std::lock_guard lock(mutex_);
            queue_.push_back(std::move(op));
            if (active_) return;
            active_ = true;
        }
        schedule();
    }

private:
    void schedule() {
        asio::post(pool_, [self = shared_from_this()] { self->drain(); });
    }

    void drain() {
        for (;;) {
            SimOp op;
            {
                std::unique_lock lock(mutex_);
                if (queue_.empty()) {
                    active_ = false;
                    return;
                }
                if (auto& ev = queue_.front().wait_for) {
                    if (!ev->ready()) {
                        auto e = ev;
                        lock.unlock();
                        // Stays active: nobody else drains until the event resumes us.
                        e->on_ready([self = shared_from_this()] { self->schedule(); });
                        return;
                    }
                    queue_.pop_front();
                    continue;
                }
                op = std::move(queue_.front());
                queue_.pop_front();
            }
            if (op.delayed && delay_.count() > 0) std::this_thread::sleep_for(delay_);
            if (op.fn) op.fn();
        }
    }

    asio::thread_pool& pool_;
    std::chrono::microseconds delay_;
    std::mutex mutex_;
    std::deque<SimOp> queue_;
    bool active_ = false;
};

class SimBackend final : public DeviceBackend {
public:
    explicit SimBackend(SimBackendOptions o) : options_(o), pool_(2) {
        if (options_.devices < 0) options_.devices = 0;
        if (options_.streams_per_device < 1) options_.streams_per_device = 1;
        const auto per = static_cast<std::size_t>(options_.streams_per_device) + 1;
        streams_.resize(static_cast<std::size_t>(options_.devices) * per);
        for (auto& s : streams_) s = std::make_shared<SimStream>(pool_, options_.op_delay);
        next_.resize(static_cast<std::size_t>(options_.devices));
    }
    ~SimBackend() override { pool_.join(); }

    std::string_view name() const noexcept override { return "sim"; }
    DeviceType type() const noexcept override { return DeviceType::cuda; }
    int device_count() const noexcept override { return options_.devices; }
    bool host_accessible() const noexcept override { return true; }

    Result<std::shared_ptr<Storage>> allocate(Device device, std::size_t nbytes) override {
        auto idx = index_of(device, "allocate");
        if (!idx) return fail(std::move(idx).error());
        auto s = HostStorage::create(Device::cuda(*idx), nbytes);
        if (!s) return fail(Errc::io_error, "sim backend: out of memory allocating " + std::to_string(nbytes) + " bytes");
        return std::shared_ptr<Storage>(std::move(s));
    }

    Result<Stream> default_stream(Device device) override {
        auto idx = index_of(device, "default_stream");
        if (!idx) return fail(std::move(idx).error());
        return Stream{Device::cuda(*idx), 0};
    }

    Result<Stream> acquire_stream(Device device) override {
        auto idx = index_of(device, "acquire_stream");
        if (!idx) return fail(std::move(idx).error());
        std::lock_guard lock(mutex_);
        auto& n = next_[static_cast<std::size_t>(*idx)];
        const auto id = 1 + n % static_cast<std::uint32_t>(options_.streams_per_device);
        ++n;
        return Stream{Device::cuda(*idx), id};
    }

    Result<void> copy_async(Stream stream, std::uint8_t* dst, const std::uint8_t* src, std::size_t n,
                            std::shared_ptr<void> keep_alive) override {
        return push(stream, "copy_async",
                    SimOp{[dst, src, n] { if (n != 0) std::memmove(dst, src, n); }, nullptr, std::move(keep_alive), true});
    }

    Result<void> enqueue_host(Stream stream, std::function<void()> fn) override {
        return push(stream, "enqueue_host", SimOp{std::move(fn), nullptr, nullptr, true});
    }

    Result<tensorplay::Event> record_event(Stream stream) override {
        auto state = std::make_shared<HostEventState>();
        auto r = push(stream, "record_event", SimOp{[state] { state->complete(); }, nullptr, nullptr, false});
        if (!r) return fail(std::move(r).error());
        return EventAccess::make(state);
    }

    Result<void> wait_event(Stream stream, const tensorplay::Event& event) override {
        if (event.ready()) return stream_of(stream, "wait_event").map([](auto&&) {});
        return push(stream, "wait_event", SimOp{nullptr, EventAccess::state(event), nullptr, false});
    }

    Task<Result<void>> wait(tensorplay::Event event) override { return await_event(EventAccess::state(event)); }

    // Host memory: any two sim devices reach each other's.
    Result<bool> can_access_peer(Device device, Device peer) override {
        if (auto idx = index_of(device, "can_access_peer"); !idx) return fail(std::move(idx).error());
        if (auto idx = index_of(peer, "can_access_peer"); !idx) return fail(std::move(idx).error());
        return true;
    }

private:
    Result<int> index_of(Device device, std::string_view what) const {
        if (!device.is_cuda())
            return fail(Errc::device_error, "sim backend: " + std::string(what) + " on " + device.str() +
                                                ", which is not a cuda device");
        const int idx = device.has_index() ? device.index : 0;
        if (idx >= options_.devices)
            return fail(Errc::device_error, "sim backend: " + std::string(what) + " on " + device.str() + ": only " +
                                                std::to_string(options_.devices) + " sim device(s)");
        return idx;
    }

    Result<SimStream*> stream_of(Stream stream, std::string_view what) const {
        auto idx = index_of(stream.device, what);
        if (!idx) return fail(std::move(idx).error());
        if (stream.id > static_cast<std::uint32_t>(options_.streams_per_device))
            return fail(Errc::device_error, "sim backend: " + std::string(what) + ": no stream " +
                                                std::to_string(stream.id) + " on " + stream.device.str());
        const auto per = static_cast<std::size_t>(options_.streams_per_device) + 1;
        return streams_[static_cast<std::size_t>(*idx) * per + stream.id].get();
    }

    Result<void> push(Stream stream, std::string_view what, SimOp op) {
        auto s = stream_of(stream, what);
        if (!s) return fail(std::move(s).error());
        (*s)->push(std::move(op));
        return ok();
    }

    SimBackendOptions options_;
    asio::thread_pool pool_;
    std::vector<std::shared_ptr<SimStream>> streams_;
    std::mutex mutex_;
    std::vector<std::uint32_t> next_;
};

}  // namespace

std::shared_ptr<DeviceBackend> make_sim_backend(SimBackendOptions options) {
    return std::make_shared<SimBackend>(options);
}

}  // namespace tensorplay::detail
