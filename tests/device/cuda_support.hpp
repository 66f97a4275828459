// Helpers of the cuda backend tests: the fake runtime's control API (when TP_CUDART names the
// fake), a stream held back by a host function, thread counting.
#pragma once

#include <tensorplay/device/backend.hpp>

#include <catch2/catch.hpp>

#include <dirent.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

namespace tensorplay::test {

/// The fake runtime's control functions (fake_control.h), found in the library TP_CUDART loaded.
struct FakeCuda {
    bool present = false;
    void (*set_visible_devices)(int) = nullptr;
    void (*set_driver)(int) = nullptr;
    void (*set_mem_limit)(int, std::size_t) = nullptr;
    void (*fault)(void*, int) = nullptr;
    void (*clear_fault)(int) = nullptr;
    void (*set_stream_delay)(void*, long) = nullptr;
    long (*live_allocations)(int) = nullptr;
    long (*host_alloc_calls)() = nullptr;
    long (*default_pool_threshold)(int) = nullptr;
    long (*live_host_allocations)() = nullptr;
    long (*wrong_device_calls)() = nullptr;
    long (*live_imports)() = nullptr;
    long long (*device_copy_bytes)() = nullptr;  ///< bytes of device-to-device copies queued so far
    long (*contexts)() = nullptr;  ///< bit d: cuda:d has a context
    int (*set_device)(int) = nullptr;  // the fake's cudaSetDevice / cudaGetDevice
    int (*get_device)(int*) = nullptr;
};

inline const FakeCuda& fake() {
    static const FakeCuda f = [] {
        FakeCuda r;
        const char* path = std::getenv("TP_CUDART");
        void* h = path ? ::dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
        if (h == nullptr || ::dlsym(h, "fake_cuda_fault") == nullptr) return r;
        auto get = [h](auto& fn, const char* name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name)); };
        get(r.set_visible_devices, "fake_cuda_set_visible_devices");
        get(r.set_driver, "fake_cuda_set_driver");
        get(r.set_mem_limit, "fake_cuda_set_mem_limit");
        get(r.fault, "fake_cuda_fault");
        get(r.clear_fault, "fake_cuda_clear_fault");
        get(r.set_stream_delay, "fake_cuda_set_stream_delay");
        get(r.live_allocations, "fake_cuda_live_allocations");
        get(r.host_alloc_calls, "fake_cuda_host_alloc_calls");
        get(r.default_pool_threshold, "fake_cuda_default_pool_threshold");
        get(r.live_host_allocations, "fake_cuda_live_host_allocations");
        get(r.wrong_device_calls, "fake_cuda_wrong_device_calls");
        get(r.live_imports, "fake_cuda_live_imports");
        get(r.device_copy_bytes, "fake_cuda_device_copy_bytes");
        get(r.contexts, "fake_cuda_contexts");
        get(r.set_device, "cudaSetDevice");
        get(r.get_device, "cudaGetDevice");
        r.present = true;
        return r;
    }();
    return f;
}

/// The process's cuda backend (the test binary's main skips when there is none).
inline DeviceBackend& cuda() {
    auto b = backend_for(Device::cuda(0));
    REQUIRE(b);
    return **b;
}

/// co_await wait_for(b, event): the Event argument of wait() is made here, outside the caller's
/// co_await expression (GCC 12 destroys by-value temporaries of such an expression twice).
inline Task<Result<void>> wait_for(DeviceBackend& b, const Event& event) {
    auto waiting = b.wait(event);
    co_return co_await std::move(waiting);
}

/// Holds `stream` back (a host function spinning until release()), so that work queued after it
/// stays pending as long as a test needs.
class StreamHold {
public:
    StreamHold(DeviceBackend& b, Stream s) : flag_(std::make_shared<std::atomic<bool>>(false)) {
        REQUIRE(b.enqueue_host(s, [f = flag_] { f->wait(false); }));
    }
    ~StreamHold() { release(); }
    StreamHold(const StreamHold&) = delete;
    StreamHold& operator=(const StreamHold&) = delete;
    void release() {
        flag_->store(true);
        flag_->notify_all();
    }

private:
    std::shared_ptr<std::atomic<bool>> flag_;
};

/// Threads of this process now (/proc/self/task).
inline int thread_count() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/task")) {
        while (auto* e = ::readdir(d))
            if (e->d_name[0] != '.') ++n;
        ::closedir(d);
    }
    return n;
}

}  // namespace tensorplay::test
