// Private pieces of the cuda backend: per-device state (streams, pool, sticky error), its events,
// and the process-wide wait engine that resumes coroutines when events complete.
#pragma once

#include "device/backend_impl.hpp"
#include "device/cuda_api.hpp"

#include <asio/async_result.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/execution/context.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/query.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace tensorplay::detail {

/// True in a process forked after a device of its parent was set up: CUDA's state is undefined
/// there (the runtime fails its calls, and the completion thread was not inherited), so every
/// device refuses work with forked_error().
[[nodiscard]] bool cuda_forked() noexcept;
[[nodiscard]] Error forked_error(int device);
/// Notes that this process has a CUDA context (a device set up, pinned memory made): a fork
/// from then on makes cuda_forked() true in the child.
void note_cuda_context();

/// One CUDA device: its streams (0 = the legacy default stream, 1..N non-blocking, created at
/// first use), its stream-ordered memory pool, recycled events, and its sticky error.
class CudaDevice {
public:
    CudaDevice(std::shared_ptr<const CudaApi> api, int index, int streams)
        : api_(std::move(api)), index_(index), wanted_(streams), serial_(next_serial()) {}
    ~CudaDevice();
    CudaDevice(const CudaDevice&) = delete;
    CudaDevice& operator=(const CudaDevice&) = delete;

    [[nodiscard]] const CudaApi& api() const noexcept { return *api_; }
    [[nodiscard]] const std::shared_ptr<const CudaApi>& api_ptr() const noexcept { return api_; }
    [[nodiscard]] int index() const noexcept { return index_; }
    /// Unique to this object in the process (two backends' objects of one device differ): what
    /// keys the wait groups of its streams, whose sequence numbers are this object's own.
    [[nodiscard]] std::uint32_t serial() const noexcept { return serial_; }
    /// Creates the streams and the memory pool (its own, not the device's default) once, with the
    /// device current; the sticky error after.
    [[nodiscard]] Result<void> ready();
    /// Whether ready() has set the device up (its context exists).
    [[nodiscard]] bool set_up() const {
        std::lock_guard lock(mutex_);
        return initialised_;
    }
    /// The error that made this device unusable, if one did.
    [[nodiscard]] std::optional<Error> sticky() const;
    /// The Error for `call` failing with `e`; a sticky `e` is remembered and every later call
    /// gets that first error back.
    [[nodiscard]] Error failure(std::string_view call, cudaError_t e);
    /// Number of pooled streams (ids 1..n).
    [[nodiscard]] std::uint32_t pooled() const noexcept { return static_cast<std::uint32_t>(wanted_); }
    /// The CUDA stream of `id` (0: the legacy default stream); valid after ready().
    [[nodiscard]] cudaStream_t stream(std::uint32_t id) const noexcept { return streams_[id]; }
    [[nodiscard]] cudaMemPool_t pool() const noexcept { return pool_; }
    /// Whether pool() is IPC-capable (POSIX file descriptors): its memory can be exported to other
    /// processes allocation by allocation (cudaMemPoolExportPointer). Valid after ready().
    [[nodiscard]] bool pool_exportable() const noexcept { return pool_exportable_; }
    /// Round robin over the pooled streams.
    [[nodiscard]] std::uint32_t next_stream() noexcept;
    /// Records `event` on stream `id` (device current) and returns its sequence number there: events
    /// of one stream complete in record order, so the wait engine polls only the oldest one.
    [[nodiscard]] Result<std::uint64_t> record(std::uint32_t id, cudaEvent_t event);
    /// An event (timing disabled) from the recycled ones or a new one; the device must be current.
    [[nodiscard]] Result<cudaEvent_t> take_event();
    /// Gives an event back for reuse.
    void return_event(cudaEvent_t e) noexcept;

private:
    std::shared_ptr<const CudaApi> api_;
    int index_;
    int wanted_;
    mutable std::mutex mutex_;
    bool initialised_ = false;
    std::uint32_t serial_;
    static std::uint32_t next_serial() noexcept;
    std::optional<Error> sticky_;
    std::atomic<bool> failed_{false};
    std::vector<cudaStream_t> streams_;
    std::mutex record_mutex_;  // a record and its sequence number go together
    std::vector<std::uint64_t> seqs_;
    cudaMemPool_t pool_ = nullptr;
    bool pool_exportable_ = false;
    std::atomic<std::uint32_t> next_{0};
    std::vector<cudaEvent_t> free_events_;
};

/// An event recorded on a cuda stream (or opened from another process's handle).
class CudaEventState final : public EventState, public std::enable_shared_from_this<CudaEventState> {
public:
    /// `group`: events of one group complete in `seq` order (one stream); `reuse`: returned to the
    /// device for reuse (else destroyed: interprocess events); `again`: recorded again and again
    /// (create_ipc_event / record_again), so its completion is never cached; `imported`: opened from
    /// another process's handle (recorded again there, never here).
    CudaEventState(std::shared_ptr<CudaDevice> device, cudaEvent_t event, std::uint64_t group, std::uint64_t seq, bool reuse,
                   bool again = false, bool imported = false)
        : device_(std::move(device)), event_(event), group_(group), seq_(seq), reuse_(reuse), again_(again), imported_(imported) {}
    ~CudaEventState() override;

    bool ready() const noexcept override;
    void on_ready(std::function<void()> fn) override;
    /// cudaEventQuery, caching completion (cudaSuccess, cudaErrorNotReady or an error).
    [[nodiscard]] cudaError_t query() const noexcept;
    [[nodiscard]] CudaDevice& device() const noexcept { return *device_; }
    [[nodiscard]] cudaEvent_t event() const noexcept { return event_; }
    [[nodiscard]] std::uint64_t group() const noexcept { return group_; }
    [[nodiscard]] std::uint64_t seq() const noexcept { return seq_; }
    /// True for an event of create_ipc_event (record_again may record it) or an imported one.
    [[nodiscard]] bool again() const noexcept { return again_; }
    [[nodiscard]] bool imported() const noexcept { return imported_; }

private:
    std::shared_ptr<CudaDevice> device_;
    cudaEvent_t event_;
    std::uint64_t group_;
    std::uint64_t seq_;
    bool reuse_;
    bool again_;
    bool imported_;
    mutable std::atomic<bool> done_{false};
};

/// One pending wait: completes exactly once, with the event's result, Errc::cancelled, or not at
/// all when its execution context is destroyed first (then it is dropped).
class WaitOp {
public:
    WaitOp(std::shared_ptr<CudaEventState> event, asio::execution_context* context)
        : event(std::move(event)), context(context) {}
    virtual ~WaitOp() = default;
    /// Posts the completion with `r` to the waiter's executor (an op with a `context`: under the
    /// engine's lock, which drop_context takes), or runs it (one without: outside the lock, so
    /// that what it releases, a cudaFreeHost say, blocks no add() meanwhile). Called once, by the
    /// claimer.
    virtual void finish(Result<void> r) = 0;

    std::shared_ptr<CudaEventState> event;
    asio::execution_context* context;
    std::atomic<bool> claimed{false};
    std::multimap<std::uint64_t, std::shared_ptr<WaitOp>>::iterator where{};  // in its group (engine's lock)
};

/// The process-wide completion thread (see cuda_wait.cpp for why this mechanism).
class WaitEngine {
public:
    static WaitEngine& instance();
    /// Starts watching `op` (its event not yet complete).
    void add(std::shared_ptr<WaitOp> op);
    /// Completes `op` with Errc::cancelled unless it completed already.
    void cancel(const std::shared_ptr<WaitOp>& op);
    /// Drops every pending op of `context` without completing it (the context is being destroyed).
    void drop_context(asio::execution_context* context);
    /// Registers the shutdown hook of `context` (once per context).
    static void watch_context(asio::execution_context& context);

private:
    WaitEngine();
    void run();
    struct Impl;
    Impl* impl_;
};

/// Resumes the caller on its executor when `event` completes, with its result; Errc::cancelled
/// when the caller's cancellation slot fires first.
[[nodiscard]] Task<Result<void>> await_cuda_event(std::shared_ptr<CudaEventState> event);

}  // namespace tensorplay::detail
