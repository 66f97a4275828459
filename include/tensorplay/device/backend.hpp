// DeviceBackend: allocation, streams and events for one device type (cpu, cuda, test-only sim).
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/device.hpp>
#include <tensorplay/device/tensor.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace tensorplay {

namespace detail {
class EventState;
struct EventAccess;
}

/// An ordered queue of work on one device. Work queued on one stream runs in order; work on
/// different streams may overlap unless ordered with events. A plain value; the backend owns
/// the stream itself. `id` 0 is the device's default stream, 1..N the pooled ones.
struct Stream {
    Device device;
    std::uint32_t id = 0;

    friend bool operator==(const Stream&, const Stream&) = default;
};

/// A point in a stream's work. Default-constructed: an event that is already complete.
/// Copies share the same point. Thread-safe.
class TP_API Event {
public:
    Event() = default;
    /// True when the work before the event has finished (always true for a default event).
    [[nodiscard]] bool ready() const noexcept;
    /// Whether both are copies of one point (two default events are equal).
    friend bool operator==(const Event& a, const Event& b) noexcept { return a.state_ == b.state_; }

private:
    friend struct detail::EventAccess;  // the backends that make and wait on events
    explicit Event(std::shared_ptr<detail::EventState> state) noexcept : state_(std::move(state)) {}
    std::shared_ptr<detail::EventState> state_;
};

/// An opaque interprocess handle (of a CUDA event or of device memory), 64 bytes, to send to
/// another process on the same host.
using IpcHandle = std::array<std::uint8_t, 64>;

/// Another process's memory pool made usable here (DeviceBackend::import_pool); released when the
/// last reference goes, once every pointer imported from it was freed.
class TP_API ImportedPool {
public:
    virtual ~ImportedPool() = default;
};

/// What a device reports about itself.
struct DeviceProperties {
    Device device;                 ///< cuda:N
    int compute_major = 0;         ///< compute capability, major
    int compute_minor = 0;         ///< compute capability, minor
    int multiprocessors = 0;       ///< streaming multiprocessor count
    std::size_t total_memory = 0;  ///< bytes of device memory
    std::string pci_bus_id;        ///< "0000:3b:00.0"
    /// The device's UUID, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (a MIG instance's own: instances of
    /// one GPU share its bus id, not this); empty when the driver cannot say.
    std::string uuid;
};

/// Allocation and ordering for one device type. Implementations are thread-safe.
class TP_API DeviceBackend {
public:
    virtual ~DeviceBackend() = default;

    /// "cpu", "sim" or "cuda".
    [[nodiscard]] virtual std::string_view name() const noexcept = 0;
    /// The device type this backend serves.
    [[nodiscard]] virtual DeviceType type() const noexcept = 0;
    /// Number of devices (1 for cpu).
    [[nodiscard]] virtual int device_count() const noexcept = 0;
    /// True when data() of this backend's storage is addressable by the host (cpu, sim).
    [[nodiscard]] virtual bool host_accessible() const noexcept = 0;

    /// Fresh storage of `nbytes` on `device` (contents unspecified). Errc::device_error for a
    /// device this backend does not have; Errc::io_error when memory is exhausted (cpu, sim;
    /// cuda: Errc::device_error naming cudaErrorMemoryAllocation). cuda: as allocate_on(the
    /// device's default stream).
    [[nodiscard]] virtual Result<std::shared_ptr<Storage>> allocate(Device device, std::size_t nbytes) = 0;
    /// Stream-ordered storage: usable on `stream` at once, on other streams after an event of it;
    /// freed on `stream` when the last reference goes, so work of other streams on it must be
    /// ordered before `stream`'s later work (wait_event). cpu and sim: allocate(stream.device).
    [[nodiscard]] virtual Result<std::shared_ptr<Storage>> allocate_on(Stream stream, std::size_t nbytes);
    /// Host storage (Device::cpu()) for staging copies to and from this backend's devices: for
    /// cuda pinned memory from a pool allocated up front; plain host memory otherwise. `near`: the
    /// device it serves (cuda: on a thread without a context, while no device is set up, the pinned
    /// memory is made in that device's context rather than cuda:0's).
    [[nodiscard]] virtual Result<std::shared_ptr<Storage>> allocate_host(std::size_t nbytes, Device near = Device::cpu());
    /// What `device` reports (cuda); Errc::not_supported elsewhere.
    [[nodiscard]] virtual Result<DeviceProperties> properties(Device device);

    /// The device's default stream.
    [[nodiscard]] virtual Result<Stream> default_stream(Device device) = 0;
    /// A stream from the device's pool (round robin), for work that should not queue behind
    /// the default stream.
    [[nodiscard]] virtual Result<Stream> acquire_stream(Device device) = 0;

    /// Queues a copy of `n` bytes from `src` to `dst` (host or device memory of this backend) on
    /// `stream`. `keep_alive` is held until the copy ran (pass the storages); the pointers must
    /// stay valid until then.
    [[nodiscard]] virtual Result<void> copy_async(Stream stream, std::uint8_t* dst, const std::uint8_t* src,
                                                  std::size_t n, std::shared_ptr<void> keep_alive = {}) = 0;
    /// Queues a host function on `stream`; it runs after the work queued before it. cuda: it runs
    /// on a CUDA thread, must not call CUDA, and is not run once the device had an error.
    [[nodiscard]] virtual Result<void> enqueue_host(Stream stream, std::function<void()> fn) = 0;
    /// An event that completes when the work queued on `stream` so far has finished.
    [[nodiscard]] virtual Result<Event> record_event(Stream stream) = 0;
    /// The native handle of `stream` (cuda: its cudaStream_t; the default stream is nullptr);
    /// Errc::not_supported for backends without one.
    [[nodiscard]] virtual Result<void*> native_stream(Stream stream);
    /// record_event, as an event another process can open (cuda: cudaEventInterprocess), with its
    /// handle. Errc::not_supported elsewhere.
    [[nodiscard]] virtual Result<std::pair<Event, IpcHandle>> record_ipc_event(Stream stream);
    /// Opens another process's event handle on `device`: wait_event/wait on it order after that
    /// process's work (ready()/wait(): its latest record, asked anew each time). A wait_event on it
    /// holds the stream until that process's work ran, forever if the process died first; waiting on
    /// the host (wait) leaves the stream free. Errc::not_supported elsewhere.
    [[nodiscard]] virtual Result<Event> open_ipc_event(Device device, const IpcHandle& handle);
    /// Device memory another process on this host can map (cuda: cudaMalloc, not stream-ordered);
    /// freed when the last reference goes. Errc::not_supported elsewhere.
    [[nodiscard]] virtual Result<std::shared_ptr<Storage>> allocate_exportable(Device device, std::size_t nbytes);
    /// The interprocess handle of storage from allocate_exportable (cuda: cudaIpcGetMemHandle).
    /// Errc::invalid_argument for other storage; Errc::not_supported elsewhere.
    [[nodiscard]] virtual Result<IpcHandle> export_memory(Storage& storage);
    /// Maps another process's exported memory (its handle, `nbytes` long) for use on `device`
    /// (peer access enabled lazily); unmapped when the last reference goes. Opening and closing
    /// synchronise the device: open once per peer. cuda: cudaIpcOpenMemHandle / cudaIpcCloseMemHandle.
    [[nodiscard]] virtual Result<std::shared_ptr<Storage>> open_memory(Device device, const IpcHandle& handle, std::size_t nbytes);
    /// A new file descriptor (the caller's to close) for the pool that allocate/allocate_on take
    /// `device`'s memory from, for another process to import_pool once it has it (SCM_RIGHTS,
    /// pidfd_getfd). cuda: cudaMemPoolExportToShareableHandle of an IPC-capable pool; Errc::not_supported
    /// when the device has none (TP_CUDA_IPC_POOL=0, or no driver support) and elsewhere.
    [[nodiscard]] virtual Result<int> export_pool(Device device);
    /// What lets a process that imported the pool map `storage` (from allocate/allocate_on, on a
    /// device with an exported pool). Errc::invalid_argument for other storage; not_supported elsewhere.
    [[nodiscard]] virtual Result<IpcHandle> export_pointer(Storage& storage);
    /// Imports another process's pool from its export_pool descriptor `fd` (not taken over), with
    /// `device` current. Errc::not_supported elsewhere.
    [[nodiscard]] virtual Result<std::shared_ptr<ImportedPool>> import_pool(Device device, int fd);
    /// Maps the allocation `handle` (export_pointer's) names in `pool` for work on `stream`'s device
    /// (access granted on first use); size() is the allocation's own size, as the driver reports it.
    /// Freed on `stream` when the last reference goes: that free must have run before the exporter
    /// frees its memory. Errc::not_supported when the size cannot be known (an old driver).
    [[nodiscard]] virtual Result<std::shared_ptr<Storage>> import_pointer(ImportedPool& pool, Stream stream,
                                                                          const IpcHandle& handle);
    /// Whether work on `device` can read and write memory of `peer`: true for the same device; cuda:
    /// cudaDeviceCanAccessPeer; sim: true for any two of its devices; cpu: the same device only.
    [[nodiscard]] virtual Result<bool> can_access_peer(Device device, Device peer);
    /// An interprocess event that is not recorded yet, with its handle (another process opens it
    /// once with open_ipc_event), to be recorded again and again with record_again. cuda only.
    [[nodiscard]] virtual Result<std::pair<Event, IpcHandle>> create_ipc_event(Device device);
    /// Records `event` (from create_ipc_event) again on `stream`: a wait_event on it made after this
    /// call (here or through another process's opened handle) orders after the work queued on
    /// `stream` so far. Do not use ready()/wait() on such an event. cuda only.
    [[nodiscard]] virtual Result<void> record_again(Stream stream, const Event& event);
    /// Makes work queued on `stream` after this call wait for `event` (from any stream of this
    /// backend). Does not block the caller.
    [[nodiscard]] virtual Result<void> wait_event(Stream stream, const Event& event) = 0;

    /// Resumes the awaiting coroutine (on its own executor) once `event` is complete; never
    /// blocks a thread. cpu, sim: not cancellable. cuda: an already complete event resumes at
    /// once; the awaiting coroutine's cancellation (a `||` timer, a cancelled co_spawn) ends the
    /// wait with Errc::cancelled without affecting the GPU work; a device error fails it with
    /// Errc::device_error; destroying the executor's context with the wait pending drops it.
    [[nodiscard]] virtual Task<Result<void>> wait(Event event) = 0;
    /// Resumes the awaiting coroutine once the work queued on `stream` so far has finished.
    [[nodiscard]] Task<Result<void>> synchronize(Stream stream);
};

/// Options of the test-only sim backend.
struct SimBackendOptions {
    int devices = 2;                          ///< pretends to have cuda:0..devices-1
    int streams_per_device = 4;               ///< size of each device's stream pool
    std::chrono::microseconds op_delay{0};    ///< added before each queued copy/host op (makes missing waits visible)
};

/// Options of the cuda backend.
struct CudaBackendOptions {
    std::string runtime;                           ///< libcudart to load; empty: TP_CUDART, else libcudart.so.13/.12/.11 (the first the driver runs)
    int streams_per_device = 4;                    ///< size of each device's pool of non-blocking streams
    std::size_t staging_bytes = std::size_t{32} << 20;  ///< pinned host memory allocated up front for allocate_host
};

/// A new cuda backend (backend_for makes one with default options on first use, unless one was
/// registered). Errc::not_supported saying why CUDA is unusable here (no runtime, no driver, no
/// device) or in a build without CUDA; Errc::device_error when setting up a device fails.
[[nodiscard]] TP_API Result<std::shared_ptr<DeviceBackend>> make_cuda_backend(CudaBackendOptions options = {});

/// The host backend (always present).
[[nodiscard]] TP_API DeviceBackend& cpu_backend() noexcept;

/// The backend serving `device`: cpu always; for cuda the installed sim backend, else the
/// registered CUDA backend, else the process's cuda backend (made on first use).
/// Errc::not_supported when the build has no CUDA or CUDA is unusable here (the message says
/// why), Errc::device_error when there is no such device.
[[nodiscard]] TP_API Result<DeviceBackend*> backend_for(Device device);

/// Test only: makes `backend_for(cuda:i)` answer a sim backend with `options.devices` devices,
/// replacing any earlier one (which stays alive until process exit, so pointers to it remain
/// valid). Returns the backend. Thread-safe.
TP_API DeviceBackend& install_sim_backend(SimBackendOptions options = {});
/// Shorthand for install_sim_backend({.devices = n}).
TP_API DeviceBackend& install_sim_backend(int n);
/// Test only: removes the sim backend (cuda devices resolve to the real CUDA backend again).
TP_API void uninstall_sim_backend() noexcept;

/// Registers the backend for cuda devices (the CUDA layer calls this); replaces the previous one.
TP_API void register_cuda_backend(std::shared_ptr<DeviceBackend> backend);

/// A new tensor on `device` from its backend. Errors as backend_for / allocate, and
/// Errc::invalid_argument for a negative dimension or a size that overflows.
[[nodiscard]] TP_API Result<Tensor> empty(Device device, DType dtype, std::vector<std::int64_t> shape);

}  // namespace tensorplay
