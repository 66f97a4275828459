// The CUDA runtime as a table of functions loaded with dlopen (the library never links cudart), the
// error formatting every CUDA call goes through, and the scoped device guard. Only built with the
// toolkit's headers (TP_HAS_CUDA).
#pragma once

#include <tensorplay/core/result.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace tensorplay::detail {

/// The runtime functions the cuda backend uses, resolved from one loaded libcudart (or the test
/// double named by TP_CUDART). Every pointer is non-null once loaded.
struct CudaApi {
    std::string path;  ///< what was loaded ("libcudart.so.13", or the TP_CUDART path)
    void* handle = nullptr;
#define TP_CUDA_FN(name) decltype(&::name) name = nullptr;
#include "device/cuda_api_list.inc"
#undef TP_CUDA_FN
    /// Queries of the driver API (libcuda.so.1, or the runtime's library when it has them) that
    /// need no context; null where the driver lacks them. CUresult is an int, 0 success.
    int (*cuCtxGetCurrent)(void** ctx) = nullptr;
    int (*cuDeviceTotalMem)(std::size_t* bytes, int device) = nullptr;
    int (*cuDeviceGetUuid)(unsigned char* uuid16, int device) = nullptr;  ///< (a MIG instance's own, v2)
    /// The allocation holding a device address (its start and size), v2.
    int (*cuMemGetAddressRange)(unsigned long long* base, std::size_t* size, unsigned long long ptr) = nullptr;

    /// Whether the calling thread has a context current (true when the driver cannot say).
    [[nodiscard]] bool thread_has_context() const noexcept;
};

/// Loads the runtime at `path` (a file name for the loader's search, or a path) and resolves every
/// function; the handle is never closed. Errc::not_supported saying what was missing.
[[nodiscard]] Result<std::shared_ptr<const CudaApi>> load_cuda_api(const std::string& path);

/// The process's runtime, loaded once: the first of TP_CUDART's paths (':'-separated) when set,
/// else of libcudart.so.13, .12, .11, that loads and that the driver can run (a runtime newer than
/// the driver is passed over); not_supported, naming each runtime tried and why, when none does.
[[nodiscard]] const Result<std::shared_ptr<const CudaApi>>& default_cuda_api();

/// Why CUDA cannot be used through `api` (no driver, no device), or the device count (> 0).
[[nodiscard]] Result<int> usable_device_count(const CudaApi& api);

/// Errc::device_error naming the call, the device (-1: none) and the CUDA error's name and text:
/// "cudaMallocFromPoolAsync on cuda:0 failed: cudaErrorMemoryAllocation (out of memory)".
[[nodiscard]] Error cuda_error(const CudaApi& api, std::string_view call, int device, cudaError_t e);

/// True for the errors that leave a device's context unusable (an illegal address in a kernel...):
/// every later call on that device fails the same way.
[[nodiscard]] bool is_sticky(cudaError_t e) noexcept;

/// Makes `device` current on this thread for its lifetime and restores the previous one (CUDA
/// calls made on the wrong device would create a context on GPU 0). A thread that had no context
/// current keeps `device`: restoring "device 0" there would create a context on GPU 0.
class DeviceGuard {
public:
    DeviceGuard(const CudaApi& api, int device) noexcept;
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;
    /// cudaSuccess, or the error of cudaSetDevice.
    [[nodiscard]] cudaError_t status() const noexcept { return status_; }

private:
    const CudaApi& api_;
    int previous_ = -1;
    cudaError_t status_ = cudaSuccess;
};

}  // namespace tensorplay::detail
