// The cpu DeviceBackend, host storage and events, the await helper, and the backend registry.
#include <tensorplay/device/backend.hpp>

#include "device/backend_impl.hpp"

#include <tensorplay/config.hpp>

#include "core/flag.hpp"

#include <asio/this_coro.hpp>

#include <sys/mman.h>

#include <cstring>
#include <new>
#include <string>

namespace tensorplay {

namespace detail {

bool HostEventState::ready() const noexcept {
    std::lock_guard lock(mutex_);
    return done_;
}

void HostEventState::on_ready(std::function<void()> fn) {
    {
        std::lock_guard lock(mutex_);
        if (!done_) {
            waiters_.push_back(std::move(fn));
            return;
        }
    }
    fn();
}

void HostEventState::complete() {
    std::vector<std::function<void()>> waiters;
    {
        std::lock_guard lock(mutex_);
        done_ = true;
        waiters.swap(waiters_);
    }
    for (auto& w : waiters) w();
}

namespace {
constexpr std::size_t huge_page = std::size_t{2} << 20;
constexpr std::size_t small_align = 64;

// Freed large mappings are kept (already faulted in) for the next allocation of the same size:
// receiving a stream of equal-sized tensors then neither maps nor faults. Bounded in count and
// bytes so that the resident set stays near the working set.
constexpr std::size_t cache_max_entries = 8;
constexpr std::size_t cache_max_bytes = std::size_t{160} << 20;

struct MappingCache {
    std::mutex mutex;
    std::vector<std::pair<std::uint8_t*, std::size_t>> entries;
    std::size_t bytes = 0;
};

MappingCache& mapping_cache() {
    static auto* c = new MappingCache;  // never destroyed: storages may die during static destruction
    return *c;
}

std::uint8_t* take_cached_mapping(std::size_t len) {
    auto& c = mapping_cache();
    std::lock_guard lock(c.mutex);
    for (auto it = c.entries.begin(); it != c.entries.end(); ++it) {
        if (it->second == len) {
            auto* p = it->first;
            c.bytes -= len;
            c.entries.erase(it);
            return p;
        }
    }
    return nullptr;
}

bool cache_mapping(std::uint8_t* p, std::size_t len) {
    auto& c = mapping_cache();
    std::lock_guard lock(c.mutex);
    if (len > cache_max_bytes) return false;
    // Make room by dropping the oldest entries.
    while (!c.entries.empty() && (c.entries.size() >= cache_max_entries || c.bytes + len > cache_max_bytes)) {
        ::munmap(c.entries.front().first, c.entries.front().second);
        c.bytes -= c.entries.front().second;
        c.entries.erase(c.entries.begin());
    }
    c.entries.emplace_back(p, len);
    c.bytes += len;
    return true;
}
}  // namespace

std::shared_ptr<HostStorage> HostStorage::create(Device device, std::size_t nbytes) {
    if (nbytes < huge_alloc_threshold) {
        auto* p = nbytes == 0 ? nullptr
                              : static_cast<std::uint8_t*>(::operator new(nbytes, std::align_val_t{small_align},
                                                                          std::nothrow));
        if (nbytes != 0 && p == nullptr) return nullptr;
        return std::make_shared<HostStorage>(device, p, nbytes, 0);
    }
    // Round up to whole huge pages and over-map by one so that the start can be 2 MiB aligned;
    // trim the slack so that only the aligned region stays mapped.
    if (nbytes > SIZE_MAX - 2 * huge_page) return nullptr;
    const std::size_t len = (nbytes + huge_page - 1) / huge_page * huge_page;
    if (auto* cached = take_cached_mapping(len)) return std::make_shared<HostStorage>(device, cached, nbytes, len);
    void* raw = ::mmap(nullptr, len + huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    auto base = reinterpret_cast<std::uintptr_t>(raw);
    auto aligned = (base + huge_page - 1) / huge_page * huge_page;
    if (aligned > base) ::munmap(raw, aligned - base);
    const auto tail = base + len + huge_page - (aligned + len);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + len), tail);
    auto* p = reinterpret_cast<std::uint8_t*>(aligned);
#ifdef MADV_HUGEPAGE
    ::madvise(p, len, MADV_HUGEPAGE);  // advisory: failure (THP off) only costs speed
#endif
    return std::make_shared<HostStorage>(device, p, nbytes, len);
}

HostStorage::~HostStorage() {
    if (data_ == nullptr) return;
    if (mapped_ != 0) {
        if (!cache_mapping(data_, mapped_)) ::munmap(data_, mapped_);
    } else {
        ::operator delete(data_, std::align_val_t{small_align});
    }
}

Task<Result<void>> await_event(std::shared_ptr<EventState> state) {
    if (!state || state->ready()) co_return ok();
    // The completion may come from any thread: the signal posts it to this coroutine's executor
    // (which counts the parked wait as outstanding work, so that its run() does not return early).
    RemoteSignal signal(co_await asio::this_coro::executor);
    state->on_ready([n = signal.notifier()] { n.notify(); });
    auto ec = co_await signal.wait();
    if (ec) co_return fail(from_error_code(ec, "waiting for a device event"));
    co_return ok();
}

}  // namespace detail

bool Event::ready() const noexcept { return !state_ || state_->ready(); }

Task<Result<void>> DeviceBackend::synchronize(Stream stream) {
    auto event = record_event(stream);
    if (!event) co_return fail(std::move(event).error());
    // The call's by-value argument must not live in the co_await full-expression: GCC 12 destroys
    // such temporaries twice (ASan: heap-use-after-free of the event's state).
    auto waiting = wait(std::move(*event));
    auto r = co_await std::move(waiting);
    co_return r;
}

Result<std::shared_ptr<Storage>> DeviceBackend::allocate_on(Stream stream, std::size_t nbytes) {
    return allocate(stream.device, nbytes);
}

Result<std::shared_ptr<Storage>> DeviceBackend::allocate_host(std::size_t nbytes, Device) {
    auto s = detail::HostStorage::create(Device::cpu(), nbytes);
    if (!s) return fail(Errc::io_error, std::string(name()) + " backend: out of memory allocating " + std::to_string(nbytes) +
                                            " host bytes");
    return std::shared_ptr<Storage>(std::move(s));
}

namespace {
Failure unsupported(const DeviceBackend& b, std::string_view what) {
    return fail(Errc::not_supported, std::string(b.name()) + " backend: " + std::string(what) + " is not supported");
}
}  // namespace

Result<DeviceProperties> DeviceBackend::properties(Device) { return unsupported(*this, "properties"); }
Result<void*> DeviceBackend::native_stream(Stream) { return unsupported(*this, "native_stream"); }
Result<std::pair<Event, IpcHandle>> DeviceBackend::record_ipc_event(Stream) { return unsupported(*this, "record_ipc_event"); }
Result<Event> DeviceBackend::open_ipc_event(Device, const IpcHandle&) { return unsupported(*this, "open_ipc_event"); }
Result<std::shared_ptr<Storage>> DeviceBackend::allocate_exportable(Device, std::size_t) {
    return unsupported(*this, "allocate_exportable");
}
Result<IpcHandle> DeviceBackend::export_memory(Storage&) { return unsupported(*this, "export_memory"); }
Result<std::shared_ptr<Storage>> DeviceBackend::open_memory(Device, const IpcHandle&, std::size_t) {
    return unsupported(*this, "open_memory");
}
Result<bool> DeviceBackend::can_access_peer(Device device, Device peer) { return device == peer; }
Result<std::pair<Event, IpcHandle>> DeviceBackend::create_ipc_event(Device) { return unsupported(*this, "create_ipc_event"); }
Result<int> DeviceBackend::export_pool(Device) { return unsupported(*this, "export_pool"); }
Result<IpcHandle> DeviceBackend::export_pointer(Storage&) { return unsupported(*this, "export_pointer"); }
Result<std::shared_ptr<ImportedPool>> DeviceBackend::import_pool(Device, int) { return unsupported(*this, "import_pool"); }
Result<std::shared_ptr<Storage>> DeviceBackend::import_pointer(ImportedPool&, Stream, const IpcHandle&) {
    return unsupported(*this, "import_pointer");
}
Result<void> DeviceBackend::record_again(Stream, const Event&) { return unsupported(*this, "record_again"); }

#if !TP_HAS_CUDA
Result<std::shared_ptr<DeviceBackend>> make_cuda_backend(CudaBackendOptions) {
    return fail(Errc::not_supported, "this build of tensorplay has no CUDA support (rebuild with -Dcuda=enabled)");
}
#endif

namespace {

Result<void> check_cpu(Device device, std::string_view what) {
    if (!device.is_cpu())
        return fail(Errc::device_error, "cpu backend: " + std::string(what) + " on " + device.str() +
                                            ", which is not a cpu device");
    return ok();
}

// Host work is synchronous, so every stream is trivially ordered and every event complete.
class CpuBackend final : public DeviceBackend {
public:
    std::string_view name() const noexcept override { return "cpu"; }
    DeviceType type() const noexcept override { return DeviceType::cpu; }
    int device_count() const noexcept override { return 1; }
    bool host_accessible() const noexcept override { return true; }

    Result<std::shared_ptr<Storage>> allocate(Device device, std::size_t nbytes) override {
        if (auto c = check_cpu(device, "allocate"); !c) return fail(std::move(c).error());
        auto s = detail::HostStorage::create(Device::cpu(), nbytes);
        if (!s) return fail(Errc::io_error, "cpu backend: out of memory allocating " + std::to_string(nbytes) + " bytes");
        return std::shared_ptr<Storage>(std::move(s));
    }
    Result<Stream> default_stream(Device device) override {
        if (auto c = check_cpu(device, "default_stream"); !c) return fail(std::move(c).error());
        return Stream{Device::cpu(), 0};
    }
    Result<Stream> acquire_stream(Device device) override { return default_stream(device); }
    Result<void> copy_async(Stream stream, std::uint8_t* dst, const std::uint8_t* src, std::size_t n,
                            std::shared_ptr<void>) override {
        if (auto c = check_cpu(stream.device, "copy_async"); !c) return c;
        if (n != 0) std::memmove(dst, src, n);
        return ok();
    }
    Result<void> enqueue_host(Stream stream, std::function<void()> fn) override {
        if (auto c = check_cpu(stream.device, "enqueue_host"); !c) return c;
        fn();
        return ok();
    }
    Result<Event> record_event(Stream stream) override {
        if (auto c = check_cpu(stream.device, "record_event"); !c) return fail(std::move(c).error());
        return Event{};
    }
    Result<void> wait_event(Stream stream, const Event&) override { return check_cpu(stream.device, "wait_event"); }
    Result<bool> can_access_peer(Device device, Device peer) override {  // one host: every cpu device is the same
        if (auto r = check_cpu(device, "can_access_peer"); !r) return fail(std::move(r).error());
        if (auto r = check_cpu(peer, "can_access_peer"); !r) return fail(std::move(r).error());
        return true;
    }
    Task<Result<void>> wait(Event event) override { return detail::await_event(detail::EventAccess::state(event)); }
};

struct Registry {
    std::mutex mutex;
    std::shared_ptr<DeviceBackend> sim;
    std::shared_ptr<DeviceBackend> cuda;
    std::vector<std::shared_ptr<DeviceBackend>> retired;  // keeps replaced backends (and raw pointers to them) valid
};

Registry& registry() {
    static Registry* r = new Registry;  // never destroyed: backends may be used during static destruction
    return *r;
}

}  // namespace

DeviceBackend& cpu_backend() noexcept {
    static CpuBackend backend;
    return backend;
}

Result<DeviceBackend*> backend_for(Device device) {
    if (device.is_cpu()) return &cpu_backend();
    std::shared_ptr<DeviceBackend> b;
    {
        auto& r = registry();
        std::lock_guard lock(r.mutex);
        b = r.sim ? r.sim : r.cuda;
    }
    if (!b) {
        // The process's cuda backend, made once on first use; why it cannot be is kept as well.
        // Never destroyed, like the registry: its storages may die during static destruction.
        static const auto* process_cuda = new Result<std::shared_ptr<DeviceBackend>>(make_cuda_backend());
        if (!*process_cuda) return fail(Error(process_cuda->error()).context("tensor on " + device.str()));
        b = **process_cuda;
    }
    const int count = b->device_count();
    if (device.index >= count)
        return fail(Errc::device_error, "tensor on " + device.str() + ": the " + std::string(b->name()) +
                                            " backend has only " + std::to_string(count) + " device(s)");
    return b.get();
}

DeviceBackend& install_sim_backend(SimBackendOptions options) {
    auto b = detail::make_sim_backend(options);
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    if (r.sim) r.retired.push_back(std::move(r.sim));
    r.sim = b;
    r.retired.push_back(b);
    return *b;
}

DeviceBackend& install_sim_backend(int n) {
    SimBackendOptions o;
    o.devices = n;
    return install_sim_backend(o);
}

void uninstall_sim_backend() noexcept {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    r.sim.reset();
}

void register_cuda_backend(std::shared_ptr<DeviceBackend> backend) {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    if (r.cuda) r.retired.push_back(std::move(r.cuda));
    r.cuda = std::move(backend);
}

Result<Tensor> empty(Device device, DType dtype, std::vector<std::int64_t> shape) {
    auto nbytes = checked_nbytes(dtype, shape);
    if (!nbytes) return fail(std::move(nbytes).error().context("empty"));
    auto backend = backend_for(device);
    if (!backend) return fail(std::move(backend).error());
    auto storage = (*backend)->allocate(device, *nbytes);
    if (!storage) return fail(std::move(storage).error());
    return Tensor::wrap(std::move(*storage), dtype, std::move(shape));
}

}  // namespace tensorplay
