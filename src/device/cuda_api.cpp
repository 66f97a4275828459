// Loading the CUDA runtime with dlopen, CUDA error values, the device guard.
#include "device/cuda_api.hpp"

#include <tensorplay/core/log.hpp>

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace tensorplay::detail {

namespace {

std::string device_name(int device) { return device < 0 ? std::string() : " on cuda:" + std::to_string(device); }

/// A CUDA version number (12040) as CUDA writes it (12.4).
std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

/// Why `api`'s runtime cannot run on this host's driver; empty when it can, or when there is no
/// driver at all (which no other runtime changes: usable_device_count says so).
std::string driver_mismatch(const CudaApi& api) {
    int driver = 0;
    if (api.cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) return {};
    int n = 0;
    if (api.cudaGetDeviceCount(&n) != cudaErrorInsufficientDriver) return {};
    (void)api.cudaGetLastError();
    int runtime = 0;
    (void)api.cudaRuntimeGetVersion(&runtime);
    return "its runtime " + version_text(runtime) + " needs a newer driver than this host's, which supports CUDA " +
           version_text(driver) + " (cudaErrorInsufficientDriver)";
}

/// The runtimes to try, in order: TP_CUDART's paths (separated by ':'), else the sonames, newest first.
std::vector<std::string> runtime_candidates() {
    std::vector<std::string> out;
    if (const char* env = std::getenv("TP_CUDART"); env != nullptr && *env != '\0') {
        const std::string all(env);
        for (std::size_t at = 0; at <= all.size();) {
            const std::size_t end = std::min(all.find(':', at), all.size());
            if (end > at) out.push_back(all.substr(at, end - at));
            at = end + 1;
        }
        return out;
    }
    return {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};
}

}  // namespace

Result<std::shared_ptr<const CudaApi>> load_cuda_api(const std::string& path) {
    // One table per path: dlopen hands back the same handle anyway, and the table is immutable.
    static std::mutex mutex;
    static auto* loaded = new std::map<std::string, std::shared_ptr<const CudaApi>>;  // never destroyed
    std::lock_guard lock(mutex);
    if (auto it = loaded->find(path); it != loaded->end()) return it->second;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        const char* why = ::dlerror();
        return fail(Errc::not_supported, "no CUDA runtime: cannot load " + path + " (" + (why ? why : "unknown") + ")");
    }
    auto api = std::make_shared<CudaApi>();
    api->path = path;
    api->handle = handle;
#define TP_CUDA_FN(name)                                                                                       \
    api->name = reinterpret_cast<decltype(&::name)>(::dlsym(handle, #name));                                 \
    if (api->name == nullptr)                                                                                 \
        return fail(Errc::not_supported, "the CUDA runtime " + path + " lacks " #name " (a runtime older than 11.2?)");
#include "device/cuda_api_list.inc"
#undef TP_CUDA_FN
    // The driver's own library is loaded already once the runtime ran; it is never closed either.
    void* driver = ::dlsym(handle, "cuCtxGetCurrent") ? handle : ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver != nullptr) {
        api->cuCtxGetCurrent = reinterpret_cast<int (*)(void**)>(::dlsym(driver, "cuCtxGetCurrent"));
        api->cuDeviceTotalMem = reinterpret_cast<int (*)(std::size_t*, int)>(::dlsym(driver, "cuDeviceTotalMem_v2"));
        api->cuDeviceGetUuid = reinterpret_cast<int (*)(unsigned char*, int)>(::dlsym(driver, "cuDeviceGetUuid_v2"));
        api->cuMemGetAddressRange = reinterpret_cast<int (*)(unsigned long long*, std::size_t*, unsigned long long)>(
            ::dlsym(driver, "cuMemGetAddressRange_v2"));
    }
    std::shared_ptr<const CudaApi> result = std::move(api);
    loaded->emplace(path, result);
    return result;
}

const Result<std::shared_ptr<const CudaApi>>& default_cuda_api() {
    // The first runtime that loads and that this host's driver can run: a runtime newer than the
    // driver (a 13.x libcudart on a driver of 12.x) is passed over for the next, saying so.
    static const Result<std::shared_ptr<const CudaApi>> api = []() -> Result<std::shared_ptr<const CudaApi>> {
        const bool from_env = std::getenv("TP_CUDART") != nullptr && *std::getenv("TP_CUDART") != '\0';
        std::string tried;
        for (const auto& name : runtime_candidates()) {
            auto r = load_cuda_api(name);
            const std::string why = r ? driver_mismatch(**r) : r.error().message();
            if (r && why.empty()) {
                if (!tried.empty()) log(LogLevel::info, "cuda", "using the CUDA runtime " + name + " (passed over: " + tried + ")");
                return r;
            }
            tried += tried.empty() ? "" : "; ";
            tried += r ? name + ": " + why : why;
        }
        return fail(Errc::not_supported,
                    std::string(from_env ? "TP_CUDART: " : "") + "no usable CUDA runtime (" + tried + ")");
    }();
    return api;
}

Result<int> usable_device_count(const CudaApi& api) {
    int driver = 0;
    if (api.cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0)
        return fail(Errc::not_supported, "no CUDA driver: the runtime " + api.path +
                                             " loaded but no NVIDIA driver is installed");
    int n = 0;  // left unchanged on failure
    if (auto e = api.cudaGetDeviceCount(&n); e != cudaSuccess) {
        (void)api.cudaGetLastError();  // clear it so that later calls start clean
        if (e == cudaErrorNoDevice) return fail(Errc::not_supported, "no CUDA device is visible to this process");
        return fail(cuda_error(api, "cudaGetDeviceCount", -1, e).context("CUDA is unusable here"));
    }
    if (n <= 0) return fail(Errc::not_supported, "no CUDA device is visible to this process");
    return n;
}

Error cuda_error(const CudaApi& api, std::string_view call, int device, cudaError_t e) {
    const char* name = api.cudaGetErrorName(e);
    const char* text = api.cudaGetErrorString(e);
    return Error(Errc::device_error, std::string(call) + device_name(device) + " failed: " +
                                         (name ? name : "cudaError " + std::to_string(static_cast<int>(e))) + " (" +
                                         (text ? text : "no description") + ")");
}

bool is_sticky(cudaError_t e) noexcept {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
        return true;
    default:
        return false;
    }
}

bool CudaApi::thread_has_context() const noexcept {
    void* ctx = nullptr;
    if (cuCtxGetCurrent == nullptr || cuCtxGetCurrent(&ctx) != 0) return true;
    return ctx != nullptr;
}

DeviceGuard::DeviceGuard(const CudaApi& api, int device) noexcept : api_(api) {
    int current = -1;
    if (api_.cudaGetDevice(&current) == cudaSuccess && current == device) return;  // (the common case: one call)
    // cudaGetDevice reads 0 on a thread that never chose a device: only a thread with a context
    // current really has `current` to go back to.
    const bool had = current >= 0 && api_.thread_has_context();
    status_ = api_.cudaSetDevice(device);
    if (status_ == cudaSuccess && had) previous_ = current;
}

DeviceGuard::~DeviceGuard() {
    if (previous_ >= 0) (void)api_.cudaSetDevice(previous_);
}

}  // namespace tensorplay::detail
