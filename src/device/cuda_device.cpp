// CudaDevice: lazy setup of a device's streams and memory pool, its events, its sticky error.
#include "device/cuda_device.hpp"

#include <pthread.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

namespace tensorplay::detail {

namespace {

std::atomic<bool> g_set_up{false};  // a device was set up in this process
std::atomic<bool> g_forked{false};  // this process was forked after one was
std::atomic<int> g_parent{0};       // the pid that set it up

void on_fork_child() noexcept {
    if (g_set_up.load(std::memory_order_relaxed)) g_forked.store(true, std::memory_order_relaxed);
}

}  // namespace

void note_cuda_context() {
    static const bool watching = [] {
        g_parent.store(static_cast<int>(::getpid()));
        return ::pthread_atfork(nullptr, nullptr, on_fork_child) == 0;
    }();
    (void)watching;
    g_set_up.store(true, std::memory_order_relaxed);
}

std::uint32_t CudaDevice::next_serial() noexcept {
    static std::atomic<std::uint32_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

bool cuda_forked() noexcept { return g_forked.load(std::memory_order_relaxed); }

Error forked_error(int device) {
    return Error(Errc::device_error, "cuda:" + std::to_string(device) + " cannot be used in this process: CUDA was set up in process " +
                                         std::to_string(g_parent.load()) +
                                         " before it forked this one, and a forked child cannot use CUDA (start workers with "
                                         "spawn or exec, or fork before using CUDA)");
}

CudaDevice::~CudaDevice() {
    if (!initialised_ || cuda_forked()) return;  // (a forked child's handles are not its own)
    DeviceGuard guard(*api_, index_);
    for (auto e : free_events_) (void)api_->cudaEventDestroy(e);
    for (std::size_t i = 1; i < streams_.size(); ++i) (void)api_->cudaStreamDestroy(streams_[i]);
    // (Memory still out, tensors that outlive the backend, keeps the pool until it is freed.)
    if (pool_ != nullptr) (void)api_->cudaMemPoolDestroy(pool_);
}

Result<void> CudaDevice::ready() {
    if (cuda_forked()) return fail(forked_error(index_));
    if (failed_.load(std::memory_order_acquire)) return fail(*sticky());
    std::lock_guard lock(mutex_);
    if (initialised_) return ok();
    DeviceGuard guard(*api_, index_);
    if (guard.status() != cudaSuccess) return fail(cuda_error(*api_, "cudaSetDevice", index_, guard.status()));
    std::vector<cudaStream_t> streams(1, nullptr);  // id 0: the legacy default stream
    auto undo = [&] {
        for (std::size_t i = 1; i < streams.size(); ++i) (void)api_->cudaStreamDestroy(streams[i]);
    };
    for (int i = 0; i < wanted_; ++i) {
        cudaStream_t s = nullptr;
        if (auto e = api_->cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
            undo();
            return fail(cuda_error(*api_, "cudaStreamCreateWithFlags", index_, e));
        }
        streams.push_back(s);
    }
    // A pool of our own, not the device's default one, which other libraries of the process share
    // (and whose settings are theirs to choose).
    // IPC-capable where the device supports it (cuda_ipc then exports a tensor's own memory: one
    // copy); TP_CUDA_IPC_POOL=0 opts out.
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = index_;
    int handle_types = 0;
    const char* opt = std::getenv("TP_CUDA_IPC_POOL");
    const bool want_ipc = !(opt != nullptr && opt[0] == '0') &&
                          api_->cudaDeviceGetAttribute(&handle_types, cudaDevAttrMemoryPoolSupportedHandleTypes, index_) == cudaSuccess &&
                          (handle_types & cudaMemHandleTypePosixFileDescriptor) != 0;
    if (want_ipc) props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    cudaMemPool_t pool = nullptr;
    auto made = api_->cudaMemPoolCreate(&pool, &props);
    if (made != cudaSuccess && want_ipc) {
        (void)api_->cudaGetLastError();  // (not sticky: try a pool of this process alone)
        props.handleTypes = cudaMemHandleTypeNone;
        made = api_->cudaMemPoolCreate(&pool, &props);
    }
    if (made != cudaSuccess) {
        undo();
        return fail(cuda_error(*api_, "cudaMemPoolCreate", index_, made));
    }
    pool_exportable_ = props.handleTypes == cudaMemHandleTypePosixFileDescriptor;
    // Keep freed memory in the pool instead of returning it at every synchronisation: allocation
    // after free is then a pool hit, not a driver call.
    std::uint64_t keep = UINT64_MAX;
    if (auto e = api_->cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep); e != cudaSuccess) {
        (void)api_->cudaMemPoolDestroy(pool);
        undo();
        return fail(cuda_error(*api_, "cudaMemPoolSetAttribute", index_, e));
    }
    streams_ = std::move(streams);
    seqs_.assign(streams_.size(), 0);
    pool_ = pool;
    initialised_ = true;
    note_cuda_context();
    return ok();
}

std::optional<Error> CudaDevice::sticky() const {
    if (!failed_.load(std::memory_order_acquire)) return std::nullopt;
    std::lock_guard lock(mutex_);
    return sticky_;
}

Error CudaDevice::failure(std::string_view call, cudaError_t e) {
    Error err = cuda_error(*api_, call, index_, e);
    if (!is_sticky(e) && !failed_.load(std::memory_order_acquire)) return err;
    std::lock_guard lock(mutex_);
    if (!sticky_) {
        sticky_ = Error(Errc::device_error, err.message() + "; cuda:" + std::to_string(index_) +
                                                " is unusable from here on (a sticky CUDA error: restart the process)");
        failed_.store(true, std::memory_order_release);
    }
    return *sticky_;
}

std::uint32_t CudaDevice::next_stream() noexcept {
    return 1 + next_.fetch_add(1, std::memory_order_relaxed) % static_cast<std::uint32_t>(wanted_);
}

Result<std::uint64_t> CudaDevice::record(std::uint32_t id, cudaEvent_t event) {
    std::lock_guard lock(record_mutex_);
    if (auto e = api_->cudaEventRecord(event, streams_[id]); e != cudaSuccess) return fail(failure("cudaEventRecord", e));
    return ++seqs_[id];
}

Result<cudaEvent_t> CudaDevice::take_event() {
    {
        std::lock_guard lock(mutex_);
        if (!free_events_.empty()) {
            auto e = free_events_.back();
            free_events_.pop_back();
            return e;
        }
    }
    cudaEvent_t ev = nullptr;
    if (auto e = api_->cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
        return fail(failure("cudaEventCreateWithFlags", e));
    return ev;
}

void CudaDevice::return_event(cudaEvent_t e) noexcept {
    std::lock_guard lock(mutex_);
    if (free_events_.size() < 4096) {
        free_events_.push_back(e);
        return;
    }
    DeviceGuard guard(*api_, index_);
    (void)api_->cudaEventDestroy(e);
}

}  // namespace tensorplay::detail
