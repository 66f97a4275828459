// A fake CUDA runtime (TEST DOUBLE, never installed): the subset of the runtime API that the cuda
// backend loads, on host memory, so that the backend's own code runs in every CI run. Streams run
// their queues in order on one worker thread each; events are points in those queues; device
// memory is tagged host memory in a memfd heap per device. See fake_control.h for injection.
#include "fake_state.hpp"
#include "fake_control.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace fake {

namespace {
void on_fork_child() {
    for (auto& d : state().devices)
        if (d.context.load()) state().forked.store(true);
}
}  // namespace

State& state() {
    static State* s = [] {
        auto* st = new State;  // never destroyed: stream threads may outlive static destruction
        if (const char* n = std::getenv("FAKE_CUDA_DEVICES")) st->visible = std::atoi(n);
        for (int i = 0; i < max_devices; ++i) st->devices[i].heap.limit = std::size_t{4} << 30;
        ::pthread_atfork(nullptr, nullptr, on_fork_child);
        return st;
    }();
    return *s;
}

namespace {
struct Keys {
    pthread_key_t device, error, callback;
    Keys() {
        pthread_key_create(&device, nullptr);
        pthread_key_create(&error, nullptr);
        pthread_key_create(&callback, nullptr);
    }
};
const Keys& keys() {
    static const Keys k;
    return k;
}
}  // namespace

// The device key holds 1 + the current device, 0 while the thread has no context current (its
// current device then reads 0, as cudaGetDevice answers on a fresh thread).
int current_device() {
    const auto v = reinterpret_cast<std::intptr_t>(pthread_getspecific(keys().device));
    return v == 0 ? 0 : static_cast<int>(v - 1);
}
bool thread_bound() { return pthread_getspecific(keys().device) != nullptr; }
// FAKE_CUDA_EXCLUSIVE=<dir>: every device is in EXCLUSIVE_PROCESS compute mode among the processes
// naming that directory: the first to make a context on a device holds it (an flock on a file per
// device there) until it exits; another process's context on it fails with
// cudaErrorDevicesUnavailable, and so does every call that needs one.
bool mig() {
    const char* v = std::getenv("FAKE_CUDA_MIG");
    return v != nullptr && v[0] == '1';
}

const char* exclusive_dir() {
    const char* d = std::getenv("FAKE_CUDA_EXCLUSIVE");
    return d != nullptr && *d != '\0' ? d : nullptr;
}

void use_device(int device) {
    if (device < 0 || device >= max_devices) return;
    auto& d = state().devices[device];
    if (d.context.load() || d.unavailable.load()) return;
    if (const char* dir = exclusive_dir()) {
        std::lock_guard lock(state().mutex);
        if (d.context.load() || d.unavailable.load()) return;
        char path[512];
        std::snprintf(path, sizeof path, "%s/fake-cuda-device-%d.lock", dir, device);
        const int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // (held by the process until it exits)
            if (fd >= 0) ::close(fd);
            d.unavailable.store(true);
            return;
        }
    }
    d.context.store(true);
}
void set_current_device(int d) {
    use_device(d);
    pthread_setspecific(keys().device, reinterpret_cast<void*>(static_cast<std::intptr_t>(d) + 1));
}
int use_current_device() {
    const int d = current_device();
    set_current_device(d);
    return d;
}
cudaError_t last_error() { return static_cast<cudaError_t>(reinterpret_cast<std::intptr_t>(pthread_getspecific(keys().error))); }
void set_last_error(cudaError_t e) { pthread_setspecific(keys().error, reinterpret_cast<void*>(static_cast<std::intptr_t>(e))); }

bool in_callback() { return pthread_getspecific(keys().callback) != nullptr; }
void set_in_callback(bool on) { pthread_setspecific(keys().callback, on ? reinterpret_cast<void*>(1) : nullptr); }

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) set_last_error(e);
    return e;
}

cudaError_t sticky(int device) {
    if (device < 0 || device >= max_devices) return cudaSuccess;
    if (state().devices[device].unavailable.load()) return cudaErrorDevicesUnavailable;
    return static_cast<cudaError_t>(state().devices[device].sticky.load());
}

void check_current(int device) {
    if (device != current_device()) ++state().wrong_device;
}

namespace {

constexpr std::size_t align = 512;

Heap& heap_locked(int device) {
    auto& h = state().devices[device].heap;
    if (h.base == nullptr) {
        h.size = std::size_t{64} << 30;  // virtual only: MAP_NORESERVE, pages appear when touched
        h.fd = ::memfd_create("fake-cuda-device", MFD_CLOEXEC);
        if (h.fd < 0 || ::ftruncate(h.fd, static_cast<off_t>(h.size)) != 0) std::abort();
        void* p = ::mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, h.fd, 0);
        if (p == MAP_FAILED) std::abort();
        h.base = static_cast<std::uint8_t*>(p);
        h.free[0] = h.size;
    }
    return h;
}

}  // namespace

int heap_fd(int device) {
    std::lock_guard lock(state().mutex);
    return heap_locked(device).fd;
}

namespace {

// `prefer`: a block this allocation takes first when it is free and large enough (a stream's pool
// allocation reuses what that stream freed last, as a real pool does).
cudaError_t heap_alloc(int device, std::size_t n, void** out, const void* prefer = nullptr) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    auto& h = heap_locked(device);
    const std::size_t len = (std::max<std::size_t>(n, 1) + align - 1) / align * align;
    if (h.used + len > h.limit) return cudaErrorMemoryAllocation;
    if (prefer != nullptr && prefer >= h.base && prefer < h.base + h.size) {
        const auto off = static_cast<std::size_t>(static_cast<const std::uint8_t*>(prefer) - h.base);
        auto it = h.free.upper_bound(off);
        if (it != h.free.begin() && (--it)->first + it->second >= off + len) {
            const auto start = it->first, total = it->second;
            h.free.erase(it);
            if (off > start) h.free[start] = off - start;
            if (start + total > off + len) h.free[off + len] = start + total - (off + len);
            h.live[off] = len;
            h.used += len;
            *out = h.base + off;
            return cudaSuccess;
        }
    }
    for (auto it = h.free.begin(); it != h.free.end(); ++it) {
        if (it->second < len) continue;
        const auto off = it->first, rest = it->second - len;
        h.free.erase(it);
        if (rest) h.free[off + len] = rest;
        h.live[off] = len;
        h.used += len;
        *out = h.base + off;
        return cudaSuccess;
    }
    return cudaErrorMemoryAllocation;
}

// Returns false for a pointer that is not the start of a live allocation. cudaMalloc'd
// (IPC-exportable) memory is overwritten (0xdd): another process's copy out of it that the exporter
// did not wait for reads garbage, as it may on a GPU, where the freed memory goes back to the device.
bool heap_free(void* p) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    for (auto& d : s.devices) {
        auto& h = d.heap;
        if (h.base == nullptr || p < h.base || p >= h.base + h.size) continue;
        const auto off = static_cast<std::size_t>(static_cast<std::uint8_t*>(p) - h.base);
        auto it = h.live.find(off);
        if (it == h.live.end()) return false;
        std::size_t len = it->second;
        if (h.plain.count(off) || h.shared.count(off)) std::memset(h.base + off, 0xdd, len);
        h.live.erase(it);
        h.plain.erase(off);
        h.shared.erase(off);
        h.used -= len;
        std::size_t start = off;
        auto next = h.free.lower_bound(off);
        if (next != h.free.end() && off + len == next->first) {
            len += next->second;
            next = h.free.erase(next);
        }
        if (next != h.free.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == start) {
                prev->second += len;
                return true;
            }
        }
        h.free[start] = len;
        return true;
    }
    return false;
}

void worker(CUstream_st* s) {
    auto& st = state();
    for (;;) {
        Op op;
        {
            std::lock_guard lock(s->mutex);
            s->busy = false;
        }
        {
            std::lock_guard g(st.mutex);  // (wait_idle holds it while it checks; never both locks here)
        }
        st.progress.notify_all();
        {
            std::unique_lock lock(s->mutex);
            s->cv.wait(lock, [&] { return !s->queue.empty() || s->stop; });
            if (s->queue.empty()) break;
            op = std::move(s->queue.front());
            s->queue.pop_front();
            s->busy = true;
        }
        if (sticky(s->device) != cudaSuccess) continue;  // a faulted context runs nothing more
        if (op.wait_for) {
            std::unique_lock lock(st.mutex);
            while (!op.wait_for->complete(op.wait_target) && sticky(s->device) == cudaSuccess)
                st.progress.wait_for(lock, std::chrono::milliseconds(1));  // (another process may complete it)
            continue;
        }
        if (op.fault != 0) {
            st.devices[s->device].sticky = op.fault;
            continue;
        }
        if (op.delayed && s->delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(s->delay_us.load()));
        if (op.fn) {
            // As on a GPU, a host function (and whatever it destroys) must not call CUDA.
            set_in_callback(true);
            op.fn();
            set_in_callback(false);
        }
    }
    std::lock_guard lock(st.mutex);
    st.streams.erase(s);
    delete s;
}

CUstream_st* new_stream(int device) {
    auto* s = new CUstream_st;
    s->device = device;
    {
        std::lock_guard lock(state().mutex);
        state().streams.insert(s);
    }
    std::thread(worker, s).detach();
    return s;
}

}  // namespace

cudaError_t plain_alloc(int device, std::size_t n, void** out) {
    if (auto e = heap_alloc(device, n, out); e != cudaSuccess) return e;
    std::lock_guard lock(state().mutex);
    auto& h = state().devices[device].heap;
    h.plain.insert(static_cast<std::size_t>(static_cast<std::uint8_t*>(*out) - h.base));
    return cudaSuccess;
}

int device_of(const void* p, std::size_t n) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    auto* b = static_cast<const std::uint8_t*>(p);
    if (auto it = s.imported.upper_bound(b); it != s.imported.begin()) {
        --it;
        if (b >= it->first && b < it->first + it->second.size)
            return b + n <= it->first + it->second.size ? it->second.device : -2;
    }
    for (int d = 0; d < max_devices; ++d) {
        auto& h = s.devices[d].heap;
        auto* b = static_cast<const std::uint8_t*>(p);
        if (h.base == nullptr || b < h.base || b >= h.base + h.size) continue;
        const auto off = static_cast<std::size_t>(b - h.base);
        auto it = h.live.upper_bound(off);
        if (it == h.live.begin()) return -2;
        --it;
        return off + n <= it->first + it->second ? d : -2;
    }
    return -1;
}

// The stream a handle names: nullptr and the legacy/per-thread handles are the current device's
// default stream.
CUstream_st* resolve(cudaStream_t s) {
    if (s != nullptr && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
    auto& d = state().devices[use_current_device()];
    std::lock_guard lock(state().mutex);
    if (d.default_stream == nullptr) {
        auto* st = new CUstream_st;
        st->device = current_device();
        state().streams.insert(st);
        std::thread(worker, st).detach();
        d.default_stream = st;
    }
    return d.default_stream;
}

void push(CUstream_st* s, Op op) {
    {
        std::lock_guard lock(s->mutex);
        s->queue.push_back(std::move(op));
    }
    s->cv.notify_one();
}

void wait_idle(CUstream_st* s) {
    auto& st = state();
    std::unique_lock lock(st.mutex);
    for (;;) {
        {
            std::lock_guard g(s->mutex);
            if (s->queue.empty() && !s->busy) return;
        }
        st.progress.wait_for(lock, std::chrono::milliseconds(1));
    }
}

void complete_event(const std::shared_ptr<EventShared>& e, std::uint64_t target) {
    auto& st = state();
    {
        std::lock_guard lock(st.mutex);
        auto& slot = e->done[target % EventShared::kRing];
        auto c = slot.load();
        while (c < target && !slot.compare_exchange_weak(c, target)) {}
    }
    st.progress.notify_all();
}

}  // namespace fake

using namespace fake;

#define FAKE_CHECK_DEVICE(dev)                                          \
    do {                                                                \
        if (in_callback()) return set_error(cudaErrorNotPermitted);     \
        if (state().forked) return set_error(cudaErrorInitializationError); \
        if (auto e_ = sticky(dev); e_ != cudaSuccess) return set_error(e_); \
    } while (0)

namespace {

/// This copy's runtime version: the number after the last '-' of its file name
/// (libfake_cudart-12040.so: 12.4), else 13000. Tests copy the library to model several runtimes.
int runtime_version() {
    static const int v = [] {
        Dl_info info{};
        if (::dladdr(reinterpret_cast<void*>(&runtime_version), &info) == 0 || info.dli_fname == nullptr) return 13000;
        const std::string_view f(info.dli_fname);
        const auto dash = f.rfind('-'), dot = f.rfind(".so");
        if (dash == std::string_view::npos || dot == std::string_view::npos || dot <= dash + 1) return 13000;
        int n = 0;
        for (char c : f.substr(dash + 1, dot - dash - 1)) {
            if (c < '0' || c > '9') return 13000;
            n = n * 10 + (c - '0');
        }
        return n;
    }();
    return v;
}

/// What the host's driver supports: FAKE_CUDA_DRIVER_VERSION (one driver per host), else 13000; 0
/// without a driver.
int driver_version() {
    if (!state().driver) return 0;
    const char* v = std::getenv("FAKE_CUDA_DRIVER_VERSION");
    return v != nullptr && *v != '\0' ? std::atoi(v) : 13000;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
    if (!state().driver) return set_error(cudaErrorInsufficientDriver);
    if (driver_version() < runtime_version()) return set_error(cudaErrorInsufficientDriver);
    if (state().forked) return set_error(cudaErrorInitializationError);
    if (state().visible <= 0) return set_error(cudaErrorNoDevice);
    *count = std::min(state().visible.load(), max_devices);
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
    *v = driver_version();
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = runtime_version();
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = current_device();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (!state().driver || driver_version() < runtime_version()) return set_error(cudaErrorInsufficientDriver);
    if (state().forked) return set_error(cudaErrorInitializationError);
    if (d < 0 || d >= std::min(state().visible.load(), max_devices)) return set_error(cudaErrorInvalidDevice);
    set_current_device(d);
    if (state().devices[d].unavailable.load()) return set_error(cudaErrorDevicesUnavailable);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    auto e = last_error();
    set_last_error(cudaSuccess);
    if (auto s = sticky(current_device()); s != cudaSuccess) return s;
    return e;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (device < 0 || device >= state().visible) return set_error(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrComputeMode: *value = exclusive_dir() ? cudaComputeModeExclusiveProcess : cudaComputeModeDefault; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    case cudaDevAttrMemoryPoolSupportedHandleTypes:
        *value = fake_cuda_ipc_pools_supported() ? cudaMemHandleTypePosixFileDescriptor : cudaMemHandleTypeNone;
        break;
    default: *value = 0;
    }
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
    if (device < 0 || device >= state().visible) return set_error(cudaErrorInvalidDevice);
    std::snprintf(bus, static_cast<std::size_t>(len), "0000:%02x:00.0", mig() ? 0x10 : 0x10 + device);
    return cudaSuccess;
}
// As on a GPU, a device does not "peer" with itself (the backend answers that case itself).
cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
    const int n = std::min(state().visible.load(), max_devices);
    if (device < 0 || device >= n || peer < 0 || peer >= n) return set_error(cudaErrorInvalidDevice);
    *can = device != peer && !mig() ? 1 : 0;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
    FAKE_CHECK_DEVICE(use_current_device());
    std::lock_guard lock(state().mutex);
    auto& h = state().devices[current_device()].heap;
    *total = h.limit;
    *free = h.limit > h.used ? h.limit - h.used : 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
    if (device < 0 || device >= state().visible) return set_error(cudaErrorInvalidDevice);
    use_device(device);
    std::lock_guard lock(state().mutex);
    auto& d = state().devices[device];
    if (d.pool == nullptr) d.pool = new CUmemPoolHandle_st{device};
    *pool = d.pool;
    return cudaSuccess;
}
cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
    if (pool == nullptr || props == nullptr || props->location.type != cudaMemLocationTypeDevice)
        return set_error(cudaErrorInvalidValue);
    const int device = props->location.id;
    if (device < 0 || device >= state().visible) return set_error(cudaErrorInvalidDevice);
    if (props->handleTypes != cudaMemHandleTypeNone &&
        (props->handleTypes != cudaMemHandleTypePosixFileDescriptor || !fake_cuda_ipc_pools_supported()))
        return set_error(cudaErrorNotSupported);
    use_device(device);
    *pool = new CUmemPoolHandle_st{device};
    (*pool)->exportable = props->handleTypes == cudaMemHandleTypePosixFileDescriptor;
    return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
    if (pool == nullptr) return set_error(cudaErrorInvalidValue);
    std::lock_guard lock(state().mutex);
    if (state().devices[pool->device].pool == pool) return set_error(cudaErrorInvalidValue);  // (the default one)
    if (pool->imported) {
        if (pool->imports > 0) return set_error(cudaErrorInvalidValue);  // (pointers of it not freed yet)
        ::munmap(pool->map, pool->map_len);
    }
    delete pool;  // (the fake's memory is the device's heap: what is still out stays valid)
    return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
    if (pool == nullptr || value == nullptr) return set_error(cudaErrorInvalidValue);
    if (attr == cudaMemPoolAttrReleaseThreshold) pool->release_threshold = *static_cast<std::uint64_t*>(value);
    return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t pool, cudaStream_t stream) {
    auto* s = resolve(stream);
    check_current(s->device);
    if (pool == nullptr || pool->imported || pool->device != s->device) return set_error(cudaErrorInvalidValue);
    FAKE_CHECK_DEVICE(s->device);
    if (auto e = heap_alloc(s->device, n, p, s->freed.load()); e != cudaSuccess) return set_error(e);
    if (pool->exportable) {
        std::lock_guard lock(state().mutex);
        auto& h = state().devices[s->device].heap;
        h.shared.insert(static_cast<std::size_t>(static_cast<std::uint8_t*>(*p) - h.base));
    }
    return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
    auto* s = resolve(stream);
    check_current(s->device);
    FAKE_CHECK_DEVICE(s->device);
    if (device_of(p, 0) < 0) return set_error(cudaErrorInvalidValue);
    bool idle = false;
    {
        std::lock_guard lock(s->mutex);  // (never with state().mutex: wait_idle takes them the other way)
        idle = s->queue.empty() && !s->busy;
    }
    // Once the stream reaches the free, the block is reusable, and the stream's next allocation takes
    // it first (a pool reuses memory freed in stream order): work of another stream still reading it
    // then races with its next owner unless the free waited for that stream (record_stream).
    if (idle) {
        // An idle stream has passed everything before the free: the block is reusable at once.
        if (heap_free(p)) s->freed = p;
        else (void)release_pool_import(p);
        return cudaSuccess;
    }
    push(s, Op{[p, s] {
                   if (heap_free(p)) s->freed = p;
                   else (void)release_pool_import(p);
               },
               nullptr, 0, 0, false});
    return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) {
    FAKE_CHECK_DEVICE(use_current_device());
    return set_error(plain_alloc(current_device(), n, p));
}
cudaError_t cudaDeviceSynchronize(void) {
    (void)use_current_device();
    std::vector<CUstream_st*> mine;
    {
        std::lock_guard lock(state().mutex);
        for (auto* s : state().streams)
            if (s->device == current_device()) mine.push_back(s);
    }
    for (auto* s : mine) wait_idle(s);  // (streams are not destroyed during a test's synchronize)
    FAKE_CHECK_DEVICE(current_device());
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    if (in_callback()) return set_error(cudaErrorNotPermitted);
    if (p == nullptr) return cudaSuccess;
    if (const int d = device_of(p, 0); d >= 0) check_current(d);
    // As on a GPU: cudaFree waits for all work of the device first.
    if (auto e = cudaDeviceSynchronize(); e != cudaSuccess) return e;
    return heap_free(p) || release_pool_import(p) ? cudaSuccess : set_error(cudaErrorInvalidValue);
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) {
    ++state().host_alloc_calls;
    FAKE_CHECK_DEVICE(use_current_device());  // (pinned memory belongs to a context)
    *p = std::aligned_alloc(4096, (std::max<std::size_t>(n, 1) + 4095) / 4096 * 4096);
    if (*p == nullptr) return set_error(cudaErrorMemoryAllocation);
    std::lock_guard lock(state().mutex);
    state().host.insert(*p);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
    if (in_callback()) return set_error(cudaErrorNotPermitted);
    {
        std::lock_guard lock(state().mutex);
        if (state().host.erase(p) == 0) return set_error(cudaErrorInvalidValue);
    }
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    FAKE_CHECK_DEVICE(use_current_device());
    *s = new_stream(current_device());
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
    check_current(s->device);
    {
        std::lock_guard lock(s->mutex);
        s->stop = true;  // the worker finishes the queue, then frees the stream
    }
    s->cv.notify_one();
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    auto* s = resolve(stream);
    check_current(s->device);
    FAKE_CHECK_DEVICE(s->device);
    wait_idle(s);
    FAKE_CHECK_DEVICE(s->device);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
    auto* s = resolve(stream);
    check_current(s->device);
    FAKE_CHECK_DEVICE(s->device);
    const int dd = device_of(dst, n), sd = device_of(src, n);
    if (dd == -2 || sd == -2) return set_error(cudaErrorInvalidValue);  // past the end of an allocation
    const bool to_dev = dd >= 0, from_dev = sd >= 0;
    const bool fits = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice && to_dev && !from_dev) ||
                      (kind == cudaMemcpyDeviceToHost && !to_dev && from_dev) ||
                      (kind == cudaMemcpyDeviceToDevice && to_dev && from_dev) ||
                      (kind == cudaMemcpyHostToHost && !to_dev && !from_dev);
    if (!fits) return set_error(cudaErrorInvalidMemcpyDirection);
    if (pool_access_denied(dst, s->device) || pool_access_denied(src, s->device)) {
        // Imported pool memory that this device was not granted: the copy faults, as on a GPU.
        push(s, Op{nullptr, nullptr, 0, cudaErrorIllegalAddress, false});
        return cudaSuccess;
    }
    if (to_dev && from_dev) state().device_copy_bytes += static_cast<long long>(n);
    push(s, Op{[dst, src, n] { std::memmove(dst, src, n); }, nullptr, 0, 0, true});
    return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user) {
    auto* s = resolve(stream);
    check_current(s->device);
    FAKE_CHECK_DEVICE(s->device);
    push(s, Op{[fn, user] { fn(user); }, nullptr, 0, 0, true});
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned flags);  // fake_ipc.cpp (interprocess events)
cudaError_t cudaEventDestroy(cudaEvent_t ev);                             // fake_ipc.cpp

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream) {
    if (ev == nullptr) return set_error(cudaErrorInvalidResourceHandle);
    auto* s = resolve(stream);
    check_current(s->device);
    if (ev->device != s->device) return set_error(cudaErrorInvalidResourceHandle);
    FAKE_CHECK_DEVICE(s->device);
    const auto target = ev->shared->recorded.fetch_add(1) + 1;
    push(s, Op{[shared = ev->shared, target] { complete_event(shared, target); }, nullptr, 0, 0, false});
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
    if (ev == nullptr) return set_error(cudaErrorInvalidResourceHandle);
    FAKE_CHECK_DEVICE(ev->device);
    return ev->shared->complete(ev->shared->recorded.load()) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    if (ev == nullptr) return set_error(cudaErrorInvalidResourceHandle);
    auto& st = state();
    const auto target = ev->shared->recorded.load();
    std::unique_lock lock(st.mutex);
    while (!ev->shared->complete(target) && sticky(ev->device) == cudaSuccess)
        st.progress.wait_for(lock, std::chrono::milliseconds(1));
    lock.unlock();
    FAKE_CHECK_DEVICE(ev->device);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t ev, unsigned) {
    if (ev == nullptr) return set_error(cudaErrorInvalidResourceHandle);
    auto* s = resolve(stream);
    check_current(s->device);
    FAKE_CHECK_DEVICE(s->device);
    const auto target = ev->shared->recorded.load();
    if (target != 0) push(s, Op{nullptr, ev->shared, target, 0, false});
    return cudaSuccess;
}

// ---- control API (fake_control.h) ----

void fake_cuda_set_visible_devices(int n) { state().visible = n; }
void fake_cuda_set_driver(int present) { state().driver = present; }
void fake_cuda_set_mem_limit(int device, size_t bytes) {
    std::lock_guard lock(state().mutex);
    state().devices[device].heap.limit = bytes;
}
void fake_cuda_fault(void* stream, int error) {
    auto* s = resolve(static_cast<cudaStream_t>(stream));
    push(s, Op{nullptr, nullptr, 0, error, false});
}
void fake_cuda_clear_fault(int device) {
    state().devices[device].sticky = 0;
    state().progress.notify_all();
}
void fake_cuda_set_stream_delay(void* stream, long us) { resolve(static_cast<cudaStream_t>(stream))->delay_us = us; }
long fake_cuda_default_pool_threshold(int device) {
    if (device < 0 || device >= max_devices) return -1;
    std::lock_guard lock(state().mutex);
    const auto* pool = state().devices[device].pool;
    if (pool == nullptr) return 0;
    return pool->release_threshold == UINT64_MAX ? -2 : static_cast<long>(pool->release_threshold);
}
long fake_cuda_live_allocations(int device) {
    std::lock_guard lock(state().mutex);
    return static_cast<long>(state().devices[device].heap.live.size());
}
long fake_cuda_host_alloc_calls(void) { return state().host_alloc_calls; }
long fake_cuda_live_host_allocations(void) {
    std::lock_guard lock(state().mutex);
    return static_cast<long>(state().host.size());
}
long fake_cuda_wrong_device_calls(void) { return state().wrong_device; }
long fake_cuda_contexts(void) {
    long mask = 0;
    for (int d = 0; d < max_devices; ++d)
        if (state().devices[d].context.load()) mask |= 1L << d;
    return mask;
}

// Two entry points of the driver API (libcuda), which the backend looks up beside the runtime's:
// no context needed for either. CUresult is an int; 0 is CUDA_SUCCESS.
int cuCtxGetCurrent(void** ctx) {
    *ctx = thread_bound() ? &state().devices[current_device()] : nullptr;
    return 0;
}
int cuDeviceGetUuid_v2(unsigned char* uuid, int device) {
    if (device < 0 || device >= std::min(state().visible.load(), max_devices)) return 101;  // CUDA_ERROR_INVALID_DEVICE
    for (int i = 0; i < 16; ++i) uuid[i] = static_cast<unsigned char>(0xf0 + i);
    uuid[15] = static_cast<unsigned char>(device);  // (the same on every process of the host, as on a GPU)
    return 0;
}
int cuDeviceTotalMem_v2(size_t* bytes, int device) {
    if (device < 0 || device >= std::min(state().visible.load(), max_devices)) return 101;  // CUDA_ERROR_INVALID_DEVICE
    std::lock_guard lock(state().mutex);
    *bytes = state().devices[device].heap.limit;
    return 0;
}
long long fake_cuda_device_copy_bytes(void) { return state().device_copy_bytes.load(); }
long fake_cuda_live_imports(void) {
    std::lock_guard lock(state().mutex);
    return static_cast<long>(state().imported.size());
}

}  // extern "C"
