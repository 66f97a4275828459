// Private: the cuda backend's IPC pools: a device's pool and its allocations exported to other
// processes, and another process's pool and allocations imported here (cuda_ipc's one copy).
#pragma once

#include "device/cuda_device.hpp"

#include <cstdint>
#include <memory>

namespace tensorplay::detail {

/// A new POSIX file descriptor for `d`'s pool (ready, IPC-capable).
[[nodiscard]] Result<int> export_cuda_pool(CudaDevice& d);
/// The export data of the allocation starting at `p` in `d`'s pool.
[[nodiscard]] Result<IpcHandle> export_cuda_pointer(CudaDevice& d, void* p);
/// Imports a pool from its descriptor `fd` with `d` current (the descriptor stays the caller's).
[[nodiscard]] Result<std::shared_ptr<ImportedPool>> import_cuda_pool(const std::shared_ptr<CudaDevice>& d, int fd);
/// Maps the allocation `h` names in `pool` for work on `d`'s stream `stream` (granting `d` access
/// to the pool first, once); freed on that stream when the storage goes.
[[nodiscard]] Result<std::shared_ptr<Storage>> import_cuda_pointer(ImportedPool& pool, const std::shared_ptr<CudaDevice>& d,
                                                                   std::uint32_t stream, const IpcHandle& h);

}  // namespace tensorplay::detail
