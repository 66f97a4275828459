/* The control API of the fake CUDA runtime (libfake_cudart.so), a TEST DOUBLE: tests find these
 * functions with dlsym in the library that TP_CUDART names. Never installed. */
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Number of devices cudaGetDeviceCount reports (0: cudaErrorNoDevice). Starts at FAKE_CUDA_DEVICES or 2. */
void fake_cuda_set_visible_devices(int n);
/** 0: behave as a host without a driver (cudaErrorInsufficientDriver, driver version 0). The driver's
 *  version is FAKE_CUDA_DRIVER_VERSION (else 13000), the runtime's the number after the last '-' of the
 *  library's file name (else 13000): a runtime newer than the driver fails cudaGetDeviceCount and
 *  cudaSetDevice with cudaErrorInsufficientDriver, as a 13.x libcudart on a 12.x driver does. */
void fake_cuda_set_driver(int present);
/** Device memory limit of `device` in bytes: allocations past it fail with cudaErrorMemoryAllocation. */
void fake_cuda_set_mem_limit(int device, size_t bytes);
/** Queues a "kernel" on `stream` that faults with `error` (e.g. 700, an illegal address): the
 *  device's context then fails every later call with that sticky error. */
void fake_cuda_fault(void* stream, int error);
/** Test only, impossible on a GPU: forgets the sticky error of `device`. */
void fake_cuda_clear_fault(int device);
/** Sleeps `us` microseconds before each copy or host function that `stream` runs. */
void fake_cuda_set_stream_delay(void* stream, long us);
/** Live device allocations on `device`. */
long fake_cuda_live_allocations(int device);
/** Calls of cudaHostAlloc so far, and live pinned host allocations. */
long fake_cuda_host_alloc_calls(void);
long fake_cuda_live_host_allocations(void);
/** Calls that used a stream, event, pool or memory of one device while another device was current. */
long fake_cuda_wrong_device_calls(void);
/** Devices with a context (bit d: cuda:d), made by any call that needs one: cudaSetDevice, streams,
 *  events, memory, pinned memory (on the current device), pools, cudaMemGetInfo. Device count,
 *  attribute, PCI bus id and version queries make none, as on a GPU. */
long fake_cuda_contexts(void);
/* fork: a child forked after a context existed fails every call that needs one, and device counts,
 * with cudaErrorInitializationError, as CUDA does (and no stream thread is inherited). */
/** The release threshold of `device`'s default memory pool (0 until someone sets it; -2: UINT64_MAX):
 *  the pool other libraries of the process share. */
long fake_cuda_default_pool_threshold(int device);
/* FAKE_CUDA_EXCLUSIVE=<dir>: every device is in EXCLUSIVE_PROCESS compute mode (cudaDevAttrComputeMode
 * says so) among the processes naming that directory: a device's first context holds it until the
 * process exits; in another process every call that needs its context fails with
 * cudaErrorDevicesUnavailable, as on a GPU that a training job holds. */
/* FAKE_CUDA_MIG=1: the devices are MIG instances of one GPU: one PCI bus id, UUIDs of their own
 * (cuDeviceGetUuid_v2; the fake's UUIDs are f0 f1 ... fe <device>), no peer access between them, and
 * no cudaIpcOpenMemHandle of one instance's memory in another. */
/* FAKE_CUDA_IPC_DENY=1 in a process's environment: its cudaIpcOpenMemHandle and cudaIpcOpenEventHandle
 * fail with cudaErrorMapBufferObjectFailed, as in a container without a shared IPC namespace. */
/** 1 unless FAKE_CUDA_NO_IPC_POOL=1 (then cudaDevAttrMemoryPoolSupportedHandleTypes is none and an
 *  IPC-capable cudaMemPoolCreate fails with cudaErrorNotSupported, as on platforms without them). */
int fake_cuda_ipc_pools_supported(void);
/* IPC pools (fake_pool_ipc.cpp): an exported pool's descriptor is its device heap's memfd; an imported
 * pool grants no device access until cudaMemPoolSetAccess (a copy touching it otherwise faults with
 * cudaErrorIllegalAddress); cudaMemPoolExportPointer takes only allocations of IPC-capable pools.
 * FAKE_CUDA_POOL_IPC_DENY=1 in a process's environment: its cudaMemPoolImportFromShareableHandle fails
 * with cudaErrorNotSupported (legacy IPC handles still open). */
/** Bytes of the device-to-device copies (cudaMemcpyAsync) queued in this process so far. */
long long fake_cuda_device_copy_bytes(void);
/** Mappings of other processes' device memory (cudaIpcOpenMemHandle, cudaMemPoolImportPointer) not
 *  closed or freed yet. */
long fake_cuda_live_imports(void);

#ifdef __cplusplus
}
#endif
