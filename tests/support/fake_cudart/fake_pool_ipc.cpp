// The fake CUDA runtime (TEST DOUBLE): IPC-capable memory pools. An exported pool is a duplicate of
// its device heap's memfd; another process that got that descriptor (any way a file descriptor
// travels) maps the heap, and an exported pointer names an allocation in it. As on a GPU: only
// pools created with a POSIX file descriptor handle type export; imported pools allocate nothing;
// a device touches imported memory only once cudaMemPoolSetAccess granted it access; an import is
// freed with cudaFree or cudaFreeAsync; the exporter's free of a block overwrites it (0xdd).
#include "fake_state.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

using namespace fake;

namespace {

constexpr std::uint32_t ptr_magic = 0xfa4e9001;

// What cudaMemPoolExportPointer writes into cudaMemPoolPtrExportData's 64 opaque bytes.
struct PtrExport {
    std::uint32_t magic;
    std::int32_t pid;
    std::int32_t device;
    std::int32_t pad;
    std::uint64_t ino;     // the exporter's heap memfd (what an imported pool maps)
    std::uint64_t offset;  // the allocation in it
    std::uint64_t size;
};
static_assert(sizeof(PtrExport) <= sizeof(cudaMemPoolPtrExportData));

std::uint64_t inode_of(int fd) {
    struct stat st{};
    return ::fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

// FAKE_CUDA_NO_IPC_POOL=1: the devices support no IPC pool handle type (as some platforms and
// drivers before 11.3 report).
bool no_ipc_pools() {
    const char* v = std::getenv("FAKE_CUDA_NO_IPC_POOL");
    return v != nullptr && v[0] == '1';
}

// FAKE_CUDA_POOL_IPC_DENY=1: this process's imports of other processes' pools fail with
// cudaErrorNotSupported (its legacy IPC handles still open), as where a driver or container cannot
// import a pool's descriptor.
bool pool_ipc_denied() {
    const char* v = std::getenv("FAKE_CUDA_POOL_IPC_DENY");
    return v != nullptr && v[0] == '1';
}

}  // namespace

bool fake::release_pool_import(const void* p) {
    std::lock_guard lock(state().mutex);
    auto it = state().imported.find(static_cast<const std::uint8_t*>(p));
    if (it == state().imported.end() || it->second.pool == nullptr) return false;
    --it->second.pool->imports;
    state().imported.erase(it);
    return true;
}

bool fake::pool_access_denied(const void* p, int device) {
    std::lock_guard lock(state().mutex);
    auto* b = static_cast<const std::uint8_t*>(p);
    auto it = state().imported.upper_bound(b);
    if (it == state().imported.begin()) return false;
    --it;
    if (b >= it->first + it->second.size || it->second.pool == nullptr) return false;
    return (it->second.pool->access & (1u << device)) == 0;
}

extern "C" {

int fake_cuda_ipc_pools_supported(void) { return no_ipc_pools() ? 0 : 1; }

cudaError_t cudaMemPoolExportToShareableHandle(void* out, cudaMemPool_t pool, cudaMemAllocationHandleType type,
                                               unsigned flags) {
    if (in_callback()) return set_error(cudaErrorNotPermitted);
    if (out == nullptr || pool == nullptr || flags != 0 || type != cudaMemHandleTypePosixFileDescriptor)
        return set_error(cudaErrorInvalidValue);
    if (!pool->exportable || pool->imported) return set_error(cudaErrorInvalidValue);
    use_device(pool->device);
    const int fd = ::fcntl(heap_fd(pool->device), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return set_error(cudaErrorMemoryAllocation);
    *static_cast<int*>(out) = fd;
    return cudaSuccess;
}

cudaError_t cudaMemPoolImportFromShareableHandle(cudaMemPool_t* pool, void* handle, cudaMemAllocationHandleType type,
                                                 unsigned flags) {
    if (in_callback()) return set_error(cudaErrorNotPermitted);
    if (pool == nullptr || flags != 0 || type != cudaMemHandleTypePosixFileDescriptor) return set_error(cudaErrorInvalidValue);
    if (ipc_denied()) return set_error(cudaErrorMapBufferObjectFailed);
    if (pool_ipc_denied()) return set_error(cudaErrorNotSupported);
    (void)use_current_device();
    const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(handle));
    struct stat st{};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) return set_error(cudaErrorInvalidValue);
    void* map = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (map == MAP_FAILED) return set_error(cudaErrorMemoryAllocation);
    auto* p = new CUmemPoolHandle_st;
    p->device = current_device();
    p->imported = true;
    p->map = static_cast<std::uint8_t*>(map);
    p->map_len = static_cast<std::size_t>(st.st_size);
    p->ino = static_cast<std::uint64_t>(st.st_ino);
    *pool = p;
    return cudaSuccess;
}

cudaError_t cudaMemPoolExportPointer(cudaMemPoolPtrExportData* out, void* ptr) {
    if (out == nullptr) return set_error(cudaErrorInvalidValue);
    std::lock_guard lock(state().mutex);
    for (int d = 0; d < max_devices; ++d) {
        auto& h = state().devices[d].heap;
        auto* b = static_cast<std::uint8_t*>(ptr);
        if (h.base == nullptr || b < h.base || b >= h.base + h.size) continue;
        const auto off = static_cast<std::size_t>(b - h.base);
        // Only the start of a live allocation from an IPC-capable pool.
        if (h.shared.count(off) == 0 || h.live.count(off) == 0) return set_error(cudaErrorInvalidValue);
        PtrExport e{ptr_magic, static_cast<std::int32_t>(::getpid()), d, 0, inode_of(h.fd), off, h.live.at(off)};
        std::memset(out, 0, sizeof *out);
        std::memcpy(out, &e, sizeof e);
        return cudaSuccess;
    }
    return set_error(cudaErrorInvalidValue);
}

cudaError_t cudaMemPoolImportPointer(void** out, cudaMemPool_t pool, cudaMemPoolPtrExportData* data) {
    if (out == nullptr || pool == nullptr || data == nullptr || !pool->imported) return set_error(cudaErrorInvalidValue);
    if (auto e = sticky(use_current_device()); e != cudaSuccess) return set_error(e);
    PtrExport e;
    std::memcpy(&e, data, sizeof e);
    if (e.magic != ptr_magic || e.ino != pool->ino || e.offset > pool->map_len || e.size > pool->map_len - e.offset)
        return set_error(cudaErrorInvalidValue);
    if (mig() && e.device != current_device()) return set_error(cudaErrorInvalidDevice);  // (another MIG instance's)
    std::lock_guard lock(state().mutex);
    auto* at = pool->map + e.offset;
    if (state().imported.count(at) != 0) return set_error(cudaErrorInvalidValue);  // (imported already, not freed)
    Imported imp{e.size, current_device(), nullptr, 0, e.pid, -1, e.offset, 1};
    imp.pool = pool;
    state().imported[at] = imp;
    ++pool->imports;
    *out = at;
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const cudaMemAccessDesc* list, size_t count) {
    if (pool == nullptr || (list == nullptr && count > 0)) return set_error(cudaErrorInvalidValue);
    std::lock_guard lock(state().mutex);
    for (std::size_t i = 0; i < count; ++i) {
        const auto& a = list[i];
        if (a.location.type != cudaMemLocationTypeDevice || a.location.id < 0 || a.location.id >= state().visible)
            return set_error(cudaErrorInvalidDevice);
        if (mig() && a.location.id != pool->device) return set_error(cudaErrorInvalidDevice);  // (no peer access)
        const auto bit = 1u << a.location.id;
        pool->access = a.flags == cudaMemAccessFlagsProtReadWrite ? (pool->access | bit) : (pool->access & ~bit);
    }
    return cudaSuccess;
}

cudaError_t cudaMemPoolGetAccess(cudaMemAccessFlags* flags, cudaMemPool_t pool, cudaMemLocation* where) {
    if (flags == nullptr || pool == nullptr || where == nullptr || where->type != cudaMemLocationTypeDevice)
        return set_error(cudaErrorInvalidValue);
    std::lock_guard lock(state().mutex);
    // A pool of this process: its own device; an imported one: what was granted.
    const bool yes = pool->imported ? (pool->access & (1u << where->id)) != 0 : where->id == pool->device;
    *flags = yes ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone;
    return cudaSuccess;
}

// The driver's address-range query (no context needed): the allocation or import holding `p`.
int cuMemGetAddressRange_v2(unsigned long long* base, size_t* size, unsigned long long p) {
    std::lock_guard lock(state().mutex);
    auto* b = reinterpret_cast<const std::uint8_t*>(static_cast<std::uintptr_t>(p));
    if (auto it = state().imported.upper_bound(b); it != state().imported.begin()) {
        --it;
        if (b >= it->first && b < it->first + it->second.size) {
            *base = reinterpret_cast<std::uintptr_t>(it->first);
            *size = it->second.size;
            return 0;
        }
    }
    for (auto& d : state().devices) {
        auto& h = d.heap;
        if (h.base == nullptr || b < h.base || b >= h.base + h.size) continue;
        const auto off = static_cast<std::size_t>(b - h.base);
        auto it = h.live.upper_bound(off);
        if (it == h.live.begin() || (--it)->first + it->second <= off) break;
        *base = reinterpret_cast<std::uintptr_t>(h.base + it->first);
        *size = it->second;
        return 0;
    }
    return 1;  // CUDA_ERROR_INVALID_VALUE
}

}  // extern "C"
