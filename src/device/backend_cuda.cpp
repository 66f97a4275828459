// The cuda DeviceBackend: stream-ordered device memory, pinned staging memory, pooled
// non-blocking streams, events, interprocess memory and events, and waits that resume coroutines
// (cuda_wait.cpp).
#include <tensorplay/device/backend.hpp>

#include "core/first_fit.hpp"
#include "device/cuda_device.hpp"
#include "device/cuda_pool_ipc.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace tensorplay::detail {
namespace {

// Device memory from the device's pool, freed (stream-ordered) on the stream it was allocated on,
// after the work of every stream recorded with record_stream.
class CudaStorage final : public Storage {
public:
    CudaStorage(std::shared_ptr<CudaDevice> dev, std::uint32_t stream, std::uint8_t* p, std::size_t n)
        : dev_(std::move(dev)), stream_(stream), data_(p), size_(n) {}
    ~CudaStorage() override {
        if (data_ == nullptr) return;
        DeviceGuard guard(dev_->api(), dev_->index());
        cudaStream_t own = dev_->stream(stream_);
        for (std::uint32_t id : recorded_) order_after(id, own);
        if (auto e = dev_->api().cudaFreeAsync(data_, own); e != cudaSuccess) (void)dev_->failure("cudaFreeAsync", e);
    }
    Result<void> record_stream(const tensorplay::Stream& s) override {
        if (s.device != device())
            return fail(Errc::invalid_argument, "record_stream: a stream of " + s.device.str() + " for memory on " + device().str());
        if (s.id > dev_->pooled()) return fail(Errc::invalid_argument, "record_stream: " + s.device.str() + " has no stream " + std::to_string(s.id));
        std::lock_guard lock(mutex_);
        if (s.id != stream_ && std::find(recorded_.begin(), recorded_.end(), s.id) == recorded_.end()) recorded_.push_back(s.id);
        return ok();
    }
    CudaStorage(const CudaStorage&) = delete;
    CudaStorage& operator=(const CudaStorage&) = delete;
    Device device() const noexcept override { return Device::cuda(dev_->index()); }
    std::uint8_t* data() noexcept override { return data_; }
    std::size_t size() const noexcept override { return size_; }
    CudaDevice& cuda_device() const noexcept { return *dev_; }

private:
    // Makes `own` (where the free goes) wait for the work queued on stream `id` so far. The event goes
    // back for reuse at once: a wait orders after the record that was the latest when it was made.
    void order_after(std::uint32_t id, cudaStream_t own) {
        auto& api = dev_->api();
        auto ev = dev_->take_event();
        cudaError_t e = ev ? api.cudaEventRecord(*ev, dev_->stream(id)) : cudaErrorUnknown;
        if (e == cudaSuccess) e = api.cudaStreamWaitEvent(own, *ev, 0);
        if (ev) dev_->return_event(*ev);
        if (e == cudaSuccess) return;
        // (Ordering failed, the device is most likely lost: wait on the host rather than free early.)
        if (ev) (void)dev_->failure("ordering a free after a recorded stream", e);
        (void)api.cudaStreamSynchronize(dev_->stream(id));
    }

    std::shared_ptr<CudaDevice> dev_;
    std::uint32_t stream_;
    std::uint8_t* data_;
    std::size_t size_;
    std::mutex mutex_;                     // record_stream from several threads
    std::vector<std::uint32_t> recorded_;  // stream ids other than stream_ (few: a linear search)
};

// Device memory outside the pool, which this process lets go of itself: from cudaMalloc
// (exportable: only such memory has an interprocess handle; cudaFree) or another process's,
// mapped by cudaIpcOpenMemHandle (imported; cudaIpcCloseMemHandle).
class IpcStorage final : public Storage {
public:
    enum class Kind { exportable, imported };
    IpcStorage(std::shared_ptr<CudaDevice> dev, std::uint8_t* p, std::size_t n, Kind kind)
        : dev_(std::move(dev)), data_(p), size_(n), kind_(kind) {}
    ~IpcStorage() override {
        DeviceGuard guard(dev_->api(), dev_->index());
        const bool own = kind_ == Kind::exportable;
        if (auto e = own ? dev_->api().cudaFree(data_) : dev_->api().cudaIpcCloseMemHandle(data_); e != cudaSuccess)
            (void)dev_->failure(own ? "cudaFree" : "cudaIpcCloseMemHandle", e);
    }
    IpcStorage(const IpcStorage&) = delete;
    IpcStorage& operator=(const IpcStorage&) = delete;
    Device device() const noexcept override { return Device::cuda(dev_->index()); }
    std::uint8_t* data() noexcept override { return data_; }
    std::size_t size() const noexcept override { return size_; }
    CudaDevice& cuda_device() const noexcept { return *dev_; }
    Kind kind() const noexcept { return kind_; }

private:
    std::shared_ptr<CudaDevice> dev_;
    std::uint8_t* data_;
    std::size_t size_;
    Kind kind_;
};

// Pinned host memory: one cudaHostAlloc up front, handed out first-fit in 256-byte units (a
// cudaFreeHost per staging buffer would synchronise the device). When it is exhausted a buffer
// gets its own cudaHostAlloc (slow path).
class PinnedArena : public std::enable_shared_from_this<PinnedArena> {
public:
    static constexpr std::size_t unit = 256;
    PinnedArena(std::shared_ptr<const CudaApi> api, std::uint8_t* base, std::size_t size)
        : api_(std::move(api)), base_(base), size_(size), ranges_(size, unit) {}
    ~PinnedArena() {
        if (base_ != nullptr) (void)api_->cudaFreeHost(base_);
    }
    PinnedArena(const PinnedArena&) = delete;
    PinnedArena& operator=(const PinnedArena&) = delete;
    const CudaApi& api() const noexcept { return *api_; }

    std::uint8_t* take(std::size_t n) {
        auto off = ranges_.take(n);
        return off ? base_ + *off : nullptr;
    }
    void give(std::uint8_t* p, std::size_t n) { ranges_.give(static_cast<std::size_t>(p - base_), n); }

private:
    std::shared_ptr<const CudaApi> api_;
    std::uint8_t* base_;
    std::size_t size_;
    FirstFit ranges_;
};

class PinnedStorage final : public Storage {
public:
    PinnedStorage(std::shared_ptr<PinnedArena> arena, std::uint8_t* p, std::size_t n, bool own)
        : arena_(std::move(arena)), data_(p), size_(n), own_(own) {}
    ~PinnedStorage() override {
        if (data_ == nullptr) return;
        if (own_) (void)arena_->api().cudaFreeHost(data_);
        else arena_->give(data_, size_);
    }
    PinnedStorage(const PinnedStorage&) = delete;
    PinnedStorage& operator=(const PinnedStorage&) = delete;
    Device device() const noexcept override { return Device::cpu(); }
    std::uint8_t* data() noexcept override { return data_; }
    std::size_t size() const noexcept override { return size_; }
    Result<void> record_stream(const tensorplay::Stream&) override {
        // (Given back to the arena when the last reference goes, in no stream's order.)
        return fail(Errc::not_supported, "record_stream on pinned staging memory: hold a reference until the work on it ran");
    }

private:
    std::shared_ptr<PinnedArena> arena_;
    std::uint8_t* data_;
    std::size_t size_;
    bool own_;
};

std::atomic<std::uint64_t> foreign_groups{std::uint64_t{1} << 62};  // groups of events opened from handles

class CudaBackend final : public DeviceBackend {
public:
    CudaBackend(std::shared_ptr<const CudaApi> api, int count, CudaBackendOptions o) : api_(std::move(api)), options_(std::move(o)) {
        for (int i = 0; i < count; ++i) devices_.push_back(std::make_shared<CudaDevice>(api_, i, options_.streams_per_device));
    }

    // The pinned staging pool, made at the first staging buffer (a backend that never stages
    // allocates no pinned memory), under the thread's own context when it has one, else under the
    // first device this process set up, else under the device it serves (`near`): cudaHostAlloc
    // needs a context, and none is created on a device nobody asked for.
    Result<std::shared_ptr<PinnedArena>> staging(Device near) {
        std::lock_guard lock(arena_mutex_);
        if (arena_) return arena_;
        std::uint8_t* base = nullptr;
        if (options_.staging_bytes != 0) {
            auto p = host_alloc(options_.staging_bytes, near);
            if (!p) return fail(std::move(p).error().context("the staging pool"));
            base = *p;
        }
        arena_ = std::make_shared<PinnedArena>(api_, base, options_.staging_bytes);
        return arena_;
    }

    std::string_view name() const noexcept override { return "cuda"; }
    DeviceType type() const noexcept override { return DeviceType::cuda; }
    int device_count() const noexcept override { return static_cast<int>(devices_.size()); }
    bool host_accessible() const noexcept override { return false; }

    Result<std::shared_ptr<Storage>> allocate(Device device, std::size_t nbytes) override {
        return allocate_on(Stream{device, 0}, nbytes);
    }

    Result<std::shared_ptr<Storage>> allocate_on(Stream stream, std::size_t nbytes) override {
        auto dev = stream_device(stream, "allocate");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        if (nbytes == 0) return std::shared_ptr<Storage>(std::make_shared<CudaStorage>(*dev, stream.id, nullptr, 0));
        DeviceGuard guard(d.api(), d.index());
        void* p = nullptr;
        if (auto e = d.api().cudaMallocFromPoolAsync(&p, nbytes, d.pool(), d.stream(stream.id)); e != cudaSuccess)
            return fail(Error(d.failure("cudaMallocFromPoolAsync", e)).context("allocating " + std::to_string(nbytes) + " bytes"));
        return std::shared_ptr<Storage>(std::make_shared<CudaStorage>(*dev, stream.id, static_cast<std::uint8_t*>(p), nbytes));
    }

    Result<std::shared_ptr<Storage>> allocate_host(std::size_t nbytes, Device near) override {
        auto arena = staging(near);
        if (!arena) return fail(std::move(arena).error());
        if (auto* p = (*arena)->take(nbytes == 0 ? 1 : nbytes))
            return std::shared_ptr<Storage>(std::make_shared<PinnedStorage>(*arena, p, nbytes, false));
        auto p = host_alloc(nbytes, near);
        if (!p) return fail(std::move(p).error().context("staging pool exhausted"));
        return std::shared_ptr<Storage>(std::make_shared<PinnedStorage>(*arena, *p, nbytes, true));
    }

    // Attribute and bus id queries need no context: reading a device's properties sets nothing up
    // on it (an agent reads every device's bus id to offer cuda_ipc).
    Result<DeviceProperties> properties(Device device) override {
        auto dev = device_at(device, "properties");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        DeviceProperties p;
        p.device = Device::cuda(d.index());
        struct Attr { cudaDeviceAttr attr; int* out; };
        for (auto [attr, out] : {Attr{cudaDevAttrComputeCapabilityMajor, &p.compute_major},
                                 Attr{cudaDevAttrComputeCapabilityMinor, &p.compute_minor},
                                 Attr{cudaDevAttrMultiProcessorCount, &p.multiprocessors}}) {
            if (auto e = d.api().cudaDeviceGetAttribute(out, attr, d.index()); e != cudaSuccess)
                return fail(d.failure("cudaDeviceGetAttribute", e));
        }
        char bus[32] = {};
        if (auto e = d.api().cudaDeviceGetPCIBusId(bus, sizeof bus, d.index()); e != cudaSuccess)
            return fail(d.failure("cudaDeviceGetPCIBusId", e));
        p.pci_bus_id = bus;
        if (unsigned char u[16]; d.api().cuDeviceGetUuid != nullptr && d.api().cuDeviceGetUuid(u, d.index()) == 0) {
            char text[40];
            std::snprintf(text, sizeof text, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
                          u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
            p.uuid = text;
        }
        if (d.api().cuDeviceTotalMem != nullptr && d.api().cuDeviceTotalMem(&p.total_memory, d.index()) == 0) return p;
        // (No driver entry point: the runtime's query needs the device's context.)
        if (auto r = d.ready(); !r) return fail(std::move(r).error());
        DeviceGuard guard(d.api(), d.index());
        std::size_t free = 0;
        if (auto e = d.api().cudaMemGetInfo(&free, &p.total_memory); e != cudaSuccess) return fail(d.failure("cudaMemGetInfo", e));
        return p;
    }

    Result<Stream> default_stream(Device device) override {
        auto dev = device_of(device, "default_stream");
        if (!dev) return fail(std::move(dev).error());
        return Stream{Device::cuda((*dev)->index()), 0};
    }

    Result<Stream> acquire_stream(Device device) override {
        auto dev = device_of(device, "acquire_stream");
        if (!dev) return fail(std::move(dev).error());
        return Stream{Device::cuda((*dev)->index()), (*dev)->next_stream()};
    }

    Result<void*> native_stream(Stream stream) override {
        auto dev = stream_device(stream, "native_stream");
        if (!dev) return fail(std::move(dev).error());
        return static_cast<void*>((*dev)->stream(stream.id));
    }

    Result<void> copy_async(Stream stream, std::uint8_t* dst, const std::uint8_t* src, std::size_t n,
                            std::shared_ptr<void> keep_alive) override {
        auto dev = stream_device(stream, "copy_async");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        if (n == 0) return ok();
        DeviceGuard guard(d.api(), d.index());
        // cudaMemcpyDefault: the direction follows from the pointers (unified addressing).
        if (auto e = d.api().cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, d.stream(stream.id)); e != cudaSuccess)
            return fail(d.failure("cudaMemcpyAsync", e));
        if (keep_alive) return hold_until_done(*dev, stream.id, std::move(keep_alive));
        return ok();
    }

    Result<void> enqueue_host(Stream stream, std::function<void()> fn) override {
        auto dev = stream_device(stream, "enqueue_host");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        DeviceGuard guard(d.api(), d.index());
        auto* boxed = new std::function<void()>(std::move(fn));
        // Runs on a CUDA thread: it must not call CUDA (documented for enqueue_host's users).
        auto run = [](void* p) {
            std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(p));
            (*f)();
        };
        if (auto e = d.api().cudaLaunchHostFunc(d.stream(stream.id), run, boxed); e != cudaSuccess) {
            delete boxed;
            return fail(d.failure("cudaLaunchHostFunc", e));
        }
        return ok();
    }

    Result<Event> record_event(Stream stream) override {
        auto dev = stream_device(stream, "record_event");
        if (!dev) return fail(std::move(dev).error());
        DeviceGuard guard((*dev)->api(), (*dev)->index());
        auto state = record_pooled(*dev, stream.id);
        if (!state) return fail(std::move(state).error());
        return EventAccess::make(std::move(*state));
    }

    Result<std::pair<Event, IpcHandle>> record_ipc_event(Stream stream) override {
        auto dev = stream_device(stream, "record_ipc_event");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        DeviceGuard guard(d.api(), d.index());
        auto ev = new_interprocess_event(d);
        if (!ev) return fail(std::move(ev).error());
        auto seq = d.record(stream.id, *ev);
        if (!seq) {
            (void)d.api().cudaEventDestroy(*ev);
            return fail(std::move(seq).error());
        }
        auto state = std::make_shared<CudaEventState>(*dev, *ev, group_of(d, stream.id), *seq, false);
        auto h = handle_of(d, *ev);
        if (!h) return fail(std::move(h).error());
        return std::pair<Event, IpcHandle>(EventAccess::make(std::move(state)), *h);
    }

    Result<Event> open_ipc_event(Device device, const IpcHandle& handle) override {
        auto dev = device_of(device, "open_ipc_event");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        DeviceGuard guard(d.api(), d.index());
        cudaIpcEventHandle_t h;
        std::memcpy(&h, handle.data(), sizeof h);
        cudaEvent_t ev = nullptr;
        if (auto e = d.api().cudaIpcOpenEventHandle(&ev, h); e != cudaSuccess) return fail(d.failure("cudaIpcOpenEventHandle", e));
        // Never cached as complete: the other process records it again and again, and each
        // ready()/wait() asks about its latest record.
        return EventAccess::make(std::make_shared<CudaEventState>(*dev, ev, foreign_groups.fetch_add(1), 0, false, true, true));
    }

    Result<std::shared_ptr<Storage>> allocate_exportable(Device device, std::size_t nbytes) override {
        auto dev = device_of(device, "allocate_exportable");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        DeviceGuard guard(d.api(), d.index());
        void* p = nullptr;  // at least one byte: a null pointer has no handle
        if (auto e = d.api().cudaMalloc(&p, nbytes == 0 ? 1 : nbytes); e != cudaSuccess)
            return fail(Error(d.failure("cudaMalloc", e)).context("allocating " + std::to_string(nbytes) + " exportable bytes"));
        return std::shared_ptr<Storage>(std::make_shared<IpcStorage>(*dev, static_cast<std::uint8_t*>(p), nbytes, IpcStorage::Kind::exportable));
    }

    Result<IpcHandle> export_memory(Storage& storage) override {
        auto* st = dynamic_cast<IpcStorage*>(&storage);
        if (st == nullptr || st->kind() != IpcStorage::Kind::exportable)
            return fail(Errc::invalid_argument, "cuda backend: export_memory of " + storage.device().str() +
                                                    " storage that was not allocated with allocate_exportable");
        auto& d = st->cuda_device();
        if (auto s = d.sticky()) return fail(*s);
        DeviceGuard guard(d.api(), d.index());
        cudaIpcMemHandle_t h;
        if (auto e = d.api().cudaIpcGetMemHandle(&h, st->data()); e != cudaSuccess) return fail(d.failure("cudaIpcGetMemHandle", e));
        IpcHandle out;
        static_assert(sizeof h == sizeof out);
        std::memcpy(out.data(), &h, sizeof h);
        return out;
    }

    Result<std::shared_ptr<Storage>> open_memory(Device device, const IpcHandle& handle, std::size_t nbytes) override {
        auto dev = device_of(device, "open_memory");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        DeviceGuard guard(d.api(), d.index());
        cudaIpcMemHandle_t h;
        std::memcpy(&h, handle.data(), sizeof h);
        void* p = nullptr;
        if (auto e = d.api().cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess)
            return fail(d.failure("cudaIpcOpenMemHandle", e));
        return std::shared_ptr<Storage>(std::make_shared<IpcStorage>(*dev, static_cast<std::uint8_t*>(p), nbytes, IpcStorage::Kind::imported));
    }

    Result<bool> can_access_peer(Device device, Device peer) override {  // (a query: no context)
        auto dev = device_at(device, "can_access_peer");
        if (!dev) return fail(std::move(dev).error());
        auto other = device_at(peer, "can_access_peer");
        if (!other) return fail(std::move(other).error());
        auto& d = **dev;
        if (d.index() == (*other)->index()) return true;
        int can = 0;
        if (auto e = d.api().cudaDeviceCanAccessPeer(&can, d.index(), (*other)->index()); e != cudaSuccess)
            return fail(d.failure("cudaDeviceCanAccessPeer", e).context("peer cuda:" + std::to_string((*other)->index())));
        return can != 0;
    }

    Result<int> export_pool(Device device) override {
        auto dev = device_of(device, "export_pool");
        if (!dev) return fail(std::move(dev).error());
        return export_cuda_pool(**dev);
    }

    Result<IpcHandle> export_pointer(Storage& storage) override {
        auto* st = dynamic_cast<CudaStorage*>(&storage);
        if (st == nullptr || st->data() == nullptr || !st->cuda_device().pool_exportable())
            return fail(Errc::invalid_argument, "cuda backend: export_pointer of " + storage.device().str() +
                                                    " storage that is not from an IPC-capable pool of this backend");
        if (auto s = st->cuda_device().sticky()) return fail(*s);
        return export_cuda_pointer(st->cuda_device(), st->data());
    }

    Result<std::shared_ptr<ImportedPool>> import_pool(Device device, int fd) override {
        auto dev = device_of(device, "import_pool");
        if (!dev) return fail(std::move(dev).error());
        return import_cuda_pool(*dev, fd);
    }

    Result<std::shared_ptr<Storage>> import_pointer(ImportedPool& pool, Stream stream, const IpcHandle& handle) override {
        auto dev = stream_device(stream, "import_pointer");
        if (!dev) return fail(std::move(dev).error());
        return import_cuda_pointer(pool, *dev, stream.id, handle);
    }

    Result<std::pair<Event, IpcHandle>> create_ipc_event(Device device) override {
        auto dev = device_of(device, "create_ipc_event");
        if (!dev) return fail(std::move(dev).error());
        auto& d = **dev;
        DeviceGuard guard(d.api(), d.index());
        auto ev = new_interprocess_event(d);
        if (!ev) return fail(std::move(ev).error());
        // Its own group: the records of such an event do not follow one stream's order.
        auto state = std::make_shared<CudaEventState>(*dev, *ev, foreign_groups.fetch_add(1), 0, false, true);
        auto h = handle_of(d, *ev);
        if (!h) return fail(std::move(h).error());
        return std::pair<Event, IpcHandle>(EventAccess::make(std::move(state)), *h);
    }

    Result<void> record_again(Stream stream, const Event& event) override {
        auto dev = stream_device(stream, "record_again");
        if (!dev) return fail(std::move(dev).error());
        auto* st = dynamic_cast<CudaEventState*>(EventAccess::state(event).get());
        if (st == nullptr || !st->again() || st->imported())
            return fail(Errc::invalid_argument, "cuda backend: record_again on " + stream.device.str() +
                                                    " of an event that does not come from create_ipc_event");
        auto& d = **dev;
        if (st->device().index() != d.index())
            return fail(Errc::invalid_argument, "cuda backend: record_again on " + stream.device.str() + " of an event of cuda:" +
                                                    std::to_string(st->device().index()) + " (record it on a stream of its device)");
        DeviceGuard guard(d.api(), d.index());
        if (auto seq = d.record(stream.id, st->event()); !seq) return fail(std::move(seq).error());
        return ok();
    }

    Result<void> wait_event(Stream stream, const Event& event) override {
        auto dev = stream_device(stream, "wait_event");
        if (!dev) return fail(std::move(dev).error());
        if (!EventAccess::state(event)) return ok();
        auto* st = dynamic_cast<CudaEventState*>(EventAccess::state(event).get());
        if (st == nullptr)
            return fail(Errc::invalid_argument, "cuda backend: wait_event on " + stream.device.str() + " with an event of another backend");
        if (auto s = st->device().sticky()) return fail(*s);
        auto& d = **dev;
        DeviceGuard guard(d.api(), d.index());
        if (auto e = d.api().cudaStreamWaitEvent(d.stream(stream.id), st->event(), 0); e != cudaSuccess)
            return fail(d.failure("cudaStreamWaitEvent", e));
        return ok();
    }

    Task<Result<void>> wait(Event event) override {
        auto st = std::dynamic_pointer_cast<CudaEventState>(EventAccess::state(event));
        if (EventAccess::state(event) && !st) return fallback_wait(EventAccess::state(event));
        return await_cuda_event(std::move(st));
    }

private:
    // `n` pinned bytes (portable: every context sees them). cudaHostAlloc needs a context: the
    // thread's own when it has one, else the first device set up, else cuda:0.
    Result<std::uint8_t*> host_alloc(std::size_t n, Device near) {
        if (cuda_forked()) return fail(forked_error(0).context("allocating pinned memory"));
        int dev = -1;
        if (api_->cuCtxGetCurrent == nullptr || !api_->thread_has_context()) {
            // A device already set up (no new context), else the one the memory serves, else cuda:0.
            dev = near.is_cuda() && near.index >= 0 && near.index < device_count() ? near.index : 0;
            for (const auto& d : devices_)
                if (d->set_up()) {
                    dev = d->index();
                    break;
                }
        }
        std::optional<DeviceGuard> guard;
        if (dev >= 0) guard.emplace(*api_, dev);
        void* p = nullptr;
        if (auto e = api_->cudaHostAlloc(&p, n, cudaHostAllocPortable); e != cudaSuccess)
            return fail(cuda_error(*api_, "cudaHostAlloc", dev, e).context("allocating " + std::to_string(n) + " pinned bytes"));
        note_cuda_context();
        return static_cast<std::uint8_t*>(p);
    }

    static Task<Result<void>> fallback_wait(std::shared_ptr<EventState> state) { return await_event(std::move(state)); }

    // (By the device object, not its index: a second backend's streams of the same device count
    // their own sequence numbers, and must not share a group with ours.)
    static std::uint64_t group_of(const CudaDevice& d, std::uint32_t id) {
        return (static_cast<std::uint64_t>(d.serial()) << 32) | id;
    }

    // keep_alive is released once the stream has passed the copy, by the completion thread (an
    // event it polls), not by a host function on the stream: the last reference to device memory
    // frees it (cudaFreeAsync), and CUDA calls are not permitted in host functions.
    Result<void> hold_until_done(const std::shared_ptr<CudaDevice>& dev, std::uint32_t id, std::shared_ptr<void> keep_alive) {
        auto state = record_pooled(dev, id);
        if (!state) return fail(std::move(state).error());  // the copy is queued; the caller must keep the buffers alive
        (*state)->on_ready([keep = std::move(keep_alive)]() mutable { keep.reset(); });
        return ok();
    }

    // A new interprocess event of `d` (current; timing disabled, as interprocess events must be).
    static Result<cudaEvent_t> new_interprocess_event(CudaDevice& d) {
        cudaEvent_t ev = nullptr;
        if (auto e = d.api().cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess); e != cudaSuccess)
            return fail(d.failure("cudaEventCreateWithFlags(cudaEventInterprocess)", e));
        return ev;
    }

    // The handle another process opens `ev` (an interprocess event of `d`) with.
    static Result<IpcHandle> handle_of(CudaDevice& d, cudaEvent_t ev) {
        cudaIpcEventHandle_t h;
        if (auto e = d.api().cudaIpcGetEventHandle(&h, ev); e != cudaSuccess) return fail(d.failure("cudaIpcGetEventHandle", e));
        IpcHandle out;
        static_assert(sizeof h == sizeof out);
        std::memcpy(out.data(), &h, sizeof h);
        return out;
    }

    // A recycled event recorded on stream `id` of `dev` (current).
    static Result<std::shared_ptr<CudaEventState>> record_pooled(const std::shared_ptr<CudaDevice>& dev, std::uint32_t id) {
        CudaDevice& d = *dev;
        auto ev = d.take_event();
        if (!ev) return fail(std::move(ev).error());
        auto seq = d.record(id, *ev);
        if (!seq) {
            d.return_event(*ev);
            return fail(std::move(seq).error());
        }
        return std::make_shared<CudaEventState>(dev, *ev, group_of(d, id), *seq, true);
    }

    // `device`'s object, set up (its context, streams and pool) on first use.
    Result<std::shared_ptr<CudaDevice>> device_of(Device device, std::string_view what) {
        auto d = device_at(device, what);
        if (!d) return d;
        if (auto r = (*d)->ready(); !r) return fail(std::move(r).error());
        return d;
    }

    // `device`'s object, as it is (nothing set up).
    Result<std::shared_ptr<CudaDevice>> device_at(Device device, std::string_view what) {
        if (!device.is_cuda())
            return fail(Errc::device_error, "cuda backend: " + std::string(what) + " on " + device.str() + ", which is not a cuda device");
        const int idx = device.has_index() ? device.index : 0;
        if (idx >= static_cast<int>(devices_.size()))
            return fail(Errc::device_error, "cuda backend: " + std::string(what) + " on " + device.str() + ": this process sees only " +
                                                std::to_string(devices_.size()) + " CUDA device(s)");
        return devices_[static_cast<std::size_t>(idx)];
    }

    Result<std::shared_ptr<CudaDevice>> stream_device(Stream stream, std::string_view what) {
        auto dev = device_of(stream.device, what);
        if (!dev) return dev;
        if (stream.id > (*dev)->pooled())
            return fail(Errc::device_error, "cuda backend: " + std::string(what) + ": no stream " + std::to_string(stream.id) + " on " +
                                                stream.device.str() + " (it has " + std::to_string((*dev)->pooled()) + " pooled streams)");
        return dev;
    }

    std::shared_ptr<const CudaApi> api_;
    CudaBackendOptions options_;
    std::vector<std::shared_ptr<CudaDevice>> devices_;
    std::mutex arena_mutex_;
    std::shared_ptr<PinnedArena> arena_;  ///< made by staging()
};

}  // namespace
}  // namespace tensorplay::detail

namespace tensorplay {

Result<std::shared_ptr<DeviceBackend>> make_cuda_backend(CudaBackendOptions options) {
    auto api = options.runtime.empty() ? detail::default_cuda_api() : detail::load_cuda_api(options.runtime);
    if (!api) return fail(api.error());
    auto count = detail::usable_device_count(**api);
    if (!count) return fail(std::move(count).error());
    if (options.streams_per_device < 1) options.streams_per_device = 1;
    auto b = std::make_shared<detail::CudaBackend>(*api, *count, std::move(options));
    return std::shared_ptr<DeviceBackend>(std::move(b));
}

}  // namespace tensorplay
