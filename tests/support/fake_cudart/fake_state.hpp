// The fake CUDA runtime's state (TEST DOUBLE): devices as memfd-backed heaps of host memory,
// streams as one worker thread each, events as counters in (possibly shared) memory.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace fake {

constexpr int max_devices = 8;

// An event's completion state: `recorded` is the target of its latest record. As on a GPU, a wait
// (or query) waits for the record that was the latest when it was made, not for whichever record
// of the event completes next: a record re-made on a fast stream must not release waiters of an
// earlier record still queued on a slow one. So each record's completion is kept in a ring slot
// (`done[target % kRing]` = target; a slot is only reused kRing records later). In a memfd page
// for interprocess events, so another process sees it.
struct EventShared {
    static constexpr std::size_t kRing = 480;  // (the page holds 4096 bytes)
    std::atomic<std::uint64_t> recorded{0};
    std::atomic<std::uint64_t> done[kRing] = {};
    /// Whether the record of `target` has completed (target 0: never recorded, complete).
    bool complete(std::uint64_t target) const noexcept { return target == 0 || done[target % kRing].load() >= target; }
};
static_assert(sizeof(EventShared) <= 4096);

struct Op {
    std::function<void()> fn;                 // copy, host function, free, event completion
    std::shared_ptr<EventShared> wait_for;    // a cudaStreamWaitEvent point
    std::uint64_t wait_target = 0;
    int fault = 0;                            // a faulting "kernel"
    bool delayed = false;
};

struct Heap {
    int fd = -1;
    std::uint8_t* base = nullptr;
    std::size_t size = 0;
    std::size_t limit = 0;
    std::size_t used = 0;
    std::map<std::size_t, std::size_t> free;  // offset -> length
    std::map<std::size_t, std::size_t> live;  // offset -> length
    std::set<std::size_t> plain;              // offsets of cudaMalloc blocks (the IPC-exportable ones)
    std::set<std::size_t> shared;             // offsets of blocks from IPC-capable pools (cudaMemPoolExportPointer)
};

// Another process's device memory mapped here by cudaIpcOpenMemHandle.
struct Imported {
    std::size_t size;
    int device;
    void* map;
    std::size_t map_len;
    std::int32_t pid = 0, fd = -1;  ///< the exporter's memfd and where in it (what a second open matches)
    std::uint64_t offset = 0;
    int opens = 1;  ///< a second open of the same memory in this process returns the same pointer, counted
    /// Imported from a pool (cudaMemPoolImportPointer) instead: the mapping is the pool's; freed with
    /// cudaFree or cudaFreeAsync, and reachable only from devices the pool grants access to.
    CUmemPoolHandle_st* pool = nullptr;
};

struct Device {
    Heap heap;
    std::atomic<int> sticky{0};
    CUstream_st* default_stream = nullptr;
    CUmemPoolHandle_st* pool = nullptr;
    std::atomic<bool> context{false};  ///< its primary context exists (some call needed one)
    std::atomic<bool> unavailable{false};  ///< EXCLUSIVE_PROCESS, held by another process (FAKE_CUDA_EXCLUSIVE)
};

struct State {
    std::mutex mutex;                         // heaps, host allocations, stream list
    std::condition_variable progress;         // any event completed, any stream went idle
    Device devices[max_devices];
    std::atomic<int> visible{2};
    std::atomic<int> driver{1};
    std::set<void*> host;
    std::map<const std::uint8_t*, Imported> imported;  // by start
    std::set<CUstream_st*> streams;
    std::atomic<long> host_alloc_calls{0};
    std::atomic<long> wrong_device{0};
    std::atomic<long long> device_copy_bytes{0};
    /// This process was forked after a context existed: as CUDA does, calls fail with
    /// cudaErrorInitializationError (and no stream thread was inherited).
    std::atomic<bool> forked{false};
};

State& state();
/// FAKE_CUDA_MIG=1: the devices are MIG instances of one GPU: one PCI bus id, UUIDs of their own, no
/// peer access between them, and no CUDA IPC from one instance's memory into another.
bool mig();
// Per-thread current device and last error, in pthread keys rather than thread_local: the dynamic
// TLS of a dlopen'ed library crashed LeakSanitizer's tracer (GCC 12, glibc 2.36).
int current_device();
/// Makes `d` current on this thread and creates its primary context (cudaSetDevice, CUDA 12+).
void set_current_device(int d);
/// Whether this thread has a context current (cuCtxGetCurrent): it set a device or made a call
/// that needed one (which binds the current device's primary context, device 0 by default).
bool thread_bound();
/// A call that needs the current device's context: creates it and binds the thread to it.
int use_current_device();
/// A call that needs `device`'s context without making it current (e.g. its memory pool).
void use_device(int device);
cudaError_t last_error();
/// Whether this thread runs a stream's host function now (CUDA calls then fail: not permitted).
bool in_callback();
void set_last_error(cudaError_t e);

/// Records `e` as the thread's last error and returns it.
cudaError_t set_error(cudaError_t e);
/// The sticky error of `device` or cudaSuccess.
cudaError_t sticky(int device);
/// Counts a call that used `device`'s resource while another device was current.
void check_current(int device);
/// The device whose heap holds [p, p+n) as part of one live allocation; -1 if none, -2 when p is
/// in a heap but the range is not inside an allocation.
int device_of(const void* p, std::size_t n);
/// cudaMalloc's allocation (heap_alloc plus the IPC-exportable mark).
cudaError_t plain_alloc(int device, std::size_t n, void** out);
/// The memfd of `device`'s heap (made at first use).
int heap_fd(int device);
/// Forgets the pool import starting at `p` (cudaFree, cudaFreeAsync); false if `p` is not one.
bool release_pool_import(const void* p);
/// Whether [p, p+n) is pool-imported memory that `device` was not granted access to
/// (cudaMemPoolSetAccess on the imported pool): touching it faults, as on a GPU.
bool pool_access_denied(const void* p, int device);
/// Whether this process's handles to other processes' memory are refused (FAKE_CUDA_IPC_DENY=1).
bool ipc_denied();

}  // namespace fake

struct CUstream_st {
    int device = 0;
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<fake::Op> queue;
    bool busy = false;
    bool stop = false;
    std::atomic<long> delay_us{0};
    std::atomic<void*> freed{nullptr};  ///< the block this stream freed last (its next allocation's first choice)
};

struct CUevent_st {
    int device = 0;
    unsigned flags = 0;
    std::shared_ptr<fake::EventShared> shared;
    int fd = -1;  // the memfd of an interprocess event this process created
};

struct CUmemPoolHandle_st {
    int device = 0;
    std::uint64_t release_threshold = 0;
    bool exportable = false;  ///< created with a POSIX file descriptor handle type (IPC-capable)
    // An imported pool (cudaMemPoolImportFromShareableHandle): the exporter's heap memfd mapped here,
    // which devices of this process may access it (bit d: cuda:d; none until granted), and its
    // pointer imports still live.
    bool imported = false;
    std::uint8_t* map = nullptr;
    std::size_t map_len = 0;
    std::uint64_t ino = 0;
    std::uint32_t access = 0;
    int imports = 0;
};
