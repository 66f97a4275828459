// The fake CUDA runtime (TEST DOUBLE): events, interprocess event handles over memfd (another
// process maps the same counters through /proc/<pid>/fd/<fd>), and error names.
#include "fake_state.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

using namespace fake;

namespace {

constexpr std::uint32_t event_magic = 0xfa4eca11;

struct EventHandle {
    std::uint32_t magic;
    std::int32_t pid;
    std::int32_t fd;
};

// Counters in a shared page: unmapped when the last event object using them goes.
std::shared_ptr<EventShared> map_shared(int fd) {
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return nullptr;
    return std::shared_ptr<EventShared>(static_cast<EventShared*>(p), [](EventShared* e) { ::munmap(e, 4096); });
}

}  // namespace

// FAKE_CUDA_IPC_DENY=1: this process cannot open other processes' handles (a container without a
// shared IPC namespace, a MIG instance), as cudaErrorMapBufferObjectFailed.
bool fake::ipc_denied() {
    const char* v = std::getenv("FAKE_CUDA_IPC_DENY");
    return v != nullptr && v[0] == '1';
}

extern "C" {

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned flags) {
    if (in_callback()) return set_error(cudaErrorNotPermitted);
    if (auto e = sticky(use_current_device()); e != cudaSuccess) return set_error(e);
    if ((flags & cudaEventInterprocess) != 0 && (flags & cudaEventDisableTiming) == 0) return set_error(cudaErrorInvalidValue);
    auto* out = new CUevent_st;
    out->device = current_device();
    out->flags = flags;
    if ((flags & cudaEventInterprocess) != 0) {
        out->fd = ::memfd_create("fake-cuda-event", MFD_CLOEXEC);
        if (out->fd < 0 || ::ftruncate(out->fd, 4096) != 0 || !(out->shared = map_shared(out->fd))) {
            if (out->fd >= 0) ::close(out->fd);
            delete out;
            return set_error(cudaErrorMemoryAllocation);
        }
        new (out->shared.get()) EventShared;  // zeroed page: counters at 0
    } else {
        out->shared = std::make_shared<EventShared>();
    }
    *ev = out;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    if (in_callback()) return set_error(cudaErrorNotPermitted);
    if (ev == nullptr) return set_error(cudaErrorInvalidResourceHandle);
    if (ev->fd >= 0) ::close(ev->fd);
    delete ev;  // queued records keep the counters alive
    return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t ev) {
    if (ev == nullptr || ev->fd < 0) return set_error(cudaErrorInvalidResourceHandle);
    EventHandle h{event_magic, static_cast<std::int32_t>(::getpid()), ev->fd};
    std::memset(handle, 0, sizeof *handle);
    std::memcpy(handle, &h, sizeof h);
    return cudaSuccess;
}


cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* ev, cudaIpcEventHandle_t handle) {
    if (ipc_denied()) return set_error(cudaErrorMapBufferObjectFailed);
    EventHandle h;
    std::memcpy(&h, &handle, sizeof h);
    if (h.magic != event_magic) return set_error(cudaErrorInvalidValue);
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    const int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return set_error(cudaErrorInvalidValue);
    auto shared = map_shared(fd);
    ::close(fd);
    if (!shared) return set_error(cudaErrorMemoryAllocation);
    auto* out = new CUevent_st;
    out->device = use_current_device();
    out->flags = cudaEventDisableTiming | cudaEventInterprocess;
    out->shared = std::move(shared);
    *ev = out;
    return cudaSuccess;
}

namespace {
constexpr std::uint32_t mem_magic = 0xfa4e3e30;
struct MemHandle {
    std::uint32_t magic;
    std::int32_t pid;
    std::int32_t fd;
    std::int32_t device;
    std::uint64_t offset;
    std::uint64_t size;
};
}  // namespace

// As on a GPU, only cudaMalloc memory can be exported this way (not stream-ordered pool memory).
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    for (int d = 0; d < max_devices; ++d) {
        auto& h = s.devices[d].heap;
        auto* b = static_cast<std::uint8_t*>(p);
        if (h.base == nullptr || b < h.base || b >= h.base + h.size) continue;
        const auto off = static_cast<std::size_t>(b - h.base);
        if (h.plain.count(off) == 0) return set_error(cudaErrorInvalidValue);
        MemHandle m{mem_magic, static_cast<std::int32_t>(::getpid()), h.fd, d, off, h.live.at(off)};
        std::memset(handle, 0, sizeof *handle);
        std::memcpy(handle, &m, sizeof m);
        return cudaSuccess;
    }
    return set_error(cudaErrorInvalidValue);
}

cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned flags) {
    if (auto e = sticky(use_current_device()); e != cudaSuccess) return set_error(e);
    if (flags != cudaIpcMemLazyEnablePeerAccess) return set_error(cudaErrorInvalidValue);  // the only flag there is
    if (ipc_denied()) return set_error(cudaErrorMapBufferObjectFailed);
    MemHandle m;
    std::memcpy(&m, &handle, sizeof m);
    if (m.magic != mem_magic) return set_error(cudaErrorInvalidValue);
    // As on a GPU: memory cannot be opened in the process that exported it.
    if (m.pid == static_cast<std::int32_t>(::getpid())) return set_error(cudaErrorDeviceUninitialized);
    if (mig() && m.device != current_device()) return set_error(cudaErrorInvalidDevice);  // (another MIG instance's)
    {
        // As the runtime does: the same memory opened again in this context is the same mapping.
        std::lock_guard lock(state().mutex);
        for (auto& [at, imp] : state().imported)
            if (imp.pid == m.pid && imp.fd == m.fd && imp.offset == m.offset && imp.device == current_device()) {
                ++imp.opens;
                *p = const_cast<std::uint8_t*>(at);
                return cudaSuccess;
            }
    }
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%d", m.pid, m.fd);
    const int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return set_error(cudaErrorInvalidValue);
    const std::size_t page = 4096, start = m.offset / page * page;
    const std::size_t len = (m.offset + m.size + page - 1) / page * page - start;
    void* map = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
    ::close(fd);
    if (map == MAP_FAILED) return set_error(cudaErrorMemoryAllocation);
    auto* at = static_cast<std::uint8_t*>(map) + (m.offset - start);
    std::lock_guard lock(state().mutex);
    state().imported[at] = Imported{m.size, current_device(), map, len, m.pid, m.fd, m.offset, 1};
    *p = at;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* p) {
    if (in_callback()) return set_error(cudaErrorNotPermitted);
    std::lock_guard lock(state().mutex);
    auto it = state().imported.find(static_cast<std::uint8_t*>(p));
    if (it == state().imported.end() || it->second.pool != nullptr) return set_error(cudaErrorInvalidValue);
    check_current(it->second.device);
    if (--it->second.opens > 0) return cudaSuccess;  // (another open of it still uses the mapping)
    ::munmap(it->second.map, it->second.map_len);
    state().imported.erase(it);
    return cudaSuccess;
}

#define FAKE_ERRORS(X)                                                                        \
    X(cudaSuccess, "no error")                                                                \
    X(cudaErrorInvalidValue, "invalid argument")                                              \
    X(cudaErrorMemoryAllocation, "out of memory")                                             \
    X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version") \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                   \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                       \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                              \
    X(cudaErrorNotReady, "device not ready")                                                  \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                    \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                  \
    X(cudaErrorNotPermitted, "operation not permitted")                                      \
    X(cudaErrorNotSupported, "operation not supported")                                      \
    X(cudaErrorDeviceUninitialized, "invalid device context") \
    X(cudaErrorMapBufferObjectFailed, "mapping of buffer object failed") \
    X(cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable")

const char* cudaGetErrorName(cudaError_t e) {
#define FAKE_NAME(code, text) \
    if (e == code) return #code;
    FAKE_ERRORS(FAKE_NAME)
#undef FAKE_NAME
    return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
#define FAKE_TEXT(code, text) \
    if (e == code) return text;
    FAKE_ERRORS(FAKE_TEXT)
#undef FAKE_TEXT
    return "unknown error";
}

}  // extern "C"
