// The cuda backend's IPC pools (cuda_pool_ipc.hpp).
#include "device/cuda_pool_ipc.hpp"

#include <unistd.h>

#include <cstring>
#include <mutex>

namespace tensorplay::detail {

namespace {

// Another process's pool: destroyed when the last pointer imported from it was freed (each
// holds it) and nobody imports more.
class CudaImportedPool final : public ImportedPool, public std::enable_shared_from_this<CudaImportedPool> {
public:
    CudaImportedPool(std::shared_ptr<const CudaApi> api, int device, cudaMemPool_t pool)
        : api_(std::move(api)), device_(device), pool_(pool) {}
    ~CudaImportedPool() override {
        DeviceGuard guard(*api_, device_);
        (void)api_->cudaMemPoolDestroy(pool_);
    }
    CudaImportedPool(const CudaImportedPool&) = delete;
    CudaImportedPool& operator=(const CudaImportedPool&) = delete;
    [[nodiscard]] cudaMemPool_t pool() const noexcept { return pool_; }

    /// Grants `d` read and write access to the pool once (an imported pool inherits none).
    Result<void> grant(CudaDevice& d) {
        std::lock_guard lock(mutex_);
        const auto bit = std::uint64_t{1} << d.index();
        if ((granted_ & bit) != 0) return ok();
        cudaMemLocation where{};
        where.type = cudaMemLocationTypeDevice;
        where.id = d.index();
        cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
        if (auto e = api_->cudaMemPoolGetAccess(&flags, pool_, &where); e != cudaSuccess)
            return fail(d.failure("cudaMemPoolGetAccess", e));
        if (flags != cudaMemAccessFlagsProtReadWrite) {
            cudaMemAccessDesc desc{};
            desc.location = where;
            desc.flags = cudaMemAccessFlagsProtReadWrite;
            if (auto e = api_->cudaMemPoolSetAccess(pool_, &desc, 1); e != cudaSuccess)
                return fail(d.failure("cudaMemPoolSetAccess", e));
        }
        granted_ |= bit;
        return ok();
    }

private:
    std::shared_ptr<const CudaApi> api_;
    int device_;
    cudaMemPool_t pool_;
    std::mutex mutex_;
    std::uint64_t granted_ = 0;
};

// An allocation of another process's pool, mapped here: freed (stream-ordered) on the stream it
// was imported for.
class ImportedPointer final : public Storage {
public:
    ImportedPointer(std::shared_ptr<CudaDevice> dev, std::uint32_t stream, std::uint8_t* p, std::size_t n,
                    std::shared_ptr<CudaImportedPool> pool)
        : dev_(std::move(dev)), stream_(stream), data_(p), size_(n), pool_(std::move(pool)) {}
    ~ImportedPointer() override {
        DeviceGuard guard(dev_->api(), dev_->index());
        if (auto e = dev_->api().cudaFreeAsync(data_, dev_->stream(stream_)); e != cudaSuccess) (void)dev_->failure("cudaFreeAsync", e);
    }
    ImportedPointer(const ImportedPointer&) = delete;
    ImportedPointer& operator=(const ImportedPointer&) = delete;
    Device device() const noexcept override { return Device::cuda(dev_->index()); }
    std::uint8_t* data() noexcept override { return data_; }
    std::size_t size() const noexcept override { return size_; }

private:
    std::shared_ptr<CudaDevice> dev_;
    std::uint32_t stream_;
    std::uint8_t* data_;
    std::size_t size_;
    std::shared_ptr<CudaImportedPool> pool_;  // (outlives its pointers)
};

}  // namespace

Result<int> export_cuda_pool(CudaDevice& d) {
    if (!d.pool_exportable())
        return fail(Errc::not_supported, "cuda:" + std::to_string(d.index()) + "'s memory pool is not IPC-capable");
    DeviceGuard guard(d.api(), d.index());
    int fd = -1;
    if (auto e = d.api().cudaMemPoolExportToShareableHandle(&fd, d.pool(), cudaMemHandleTypePosixFileDescriptor, 0); e != cudaSuccess)
        return fail(d.failure("cudaMemPoolExportToShareableHandle", e));
    return fd;
}

Result<IpcHandle> export_cuda_pointer(CudaDevice& d, void* p) {
    DeviceGuard guard(d.api(), d.index());
    cudaMemPoolPtrExportData data{};
    if (auto e = d.api().cudaMemPoolExportPointer(&data, p); e != cudaSuccess) return fail(d.failure("cudaMemPoolExportPointer", e));
    IpcHandle out;
    static_assert(sizeof data == sizeof out);
    std::memcpy(out.data(), &data, sizeof data);
    return out;
}

Result<std::shared_ptr<ImportedPool>> import_cuda_pool(const std::shared_ptr<CudaDevice>& d, int fd) {
    DeviceGuard guard(d->api(), d->index());
    cudaMemPool_t pool = nullptr;
    void* handle = reinterpret_cast<void*>(static_cast<std::intptr_t>(fd));
    if (auto e = d->api().cudaMemPoolImportFromShareableHandle(&pool, handle, cudaMemHandleTypePosixFileDescriptor, 0); e != cudaSuccess)
        return fail(d->failure("cudaMemPoolImportFromShareableHandle", e));
    return std::shared_ptr<ImportedPool>(std::make_shared<CudaImportedPool>(d->api_ptr(), d->index(), pool));
}

Result<std::shared_ptr<Storage>> import_cuda_pointer(ImportedPool& pool, const std::shared_ptr<CudaDevice>& d, std::uint32_t stream,
                                                     const IpcHandle& h) {
    auto* imported = dynamic_cast<CudaImportedPool*>(&pool);
    if (imported == nullptr) return fail(Errc::invalid_argument, "cuda backend: import_pointer from a pool another backend imported");
    auto& api = d->api();
    if (api.cuMemGetAddressRange == nullptr)
        return fail(Errc::not_supported, "the CUDA driver lacks cuMemGetAddressRange_v2: an imported allocation's size cannot be checked");
    if (auto g = imported->grant(*d); !g) return fail(std::move(g).error());
    DeviceGuard guard(api, d->index());
    cudaMemPoolPtrExportData data;
    std::memcpy(&data, h.data(), sizeof data);
    void* p = nullptr;
    if (auto e = api.cudaMemPoolImportPointer(&p, imported->pool(), &data); e != cudaSuccess)
        return fail(d->failure("cudaMemPoolImportPointer", e));
    unsigned long long base = 0;
    std::size_t size = 0;
    if (api.cuMemGetAddressRange(&base, &size, reinterpret_cast<std::uintptr_t>(p)) != 0 || base != reinterpret_cast<std::uintptr_t>(p)) {
        (void)api.cudaFree(p);
        return fail(Errc::device_error, "cuda:" + std::to_string(d->index()) + ": cuMemGetAddressRange of an imported allocation failed");
    }
    return std::shared_ptr<Storage>(std::make_shared<ImportedPointer>(d, stream, static_cast<std::uint8_t*>(p), size,
                                                                      imported->shared_from_this()));
}

}  // namespace tensorplay::detail
