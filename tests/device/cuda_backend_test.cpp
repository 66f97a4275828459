// Tests of the cuda backend: loading, devices, memory, copies, ordering across streams, errors,
// interprocess memory and events.
// Run against the fake runtime (TP_CUDART, the normal suite) and the real one (`cuda` suite, [fake]
// cases excluded).
#include "cuda_support.hpp"
#include "core/asio_compat.hpp"
#include "support/deadline.hpp"
#include "support/processes.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {
std::vector<std::uint8_t> pattern(std::size_t n, int seed) {
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 31 + static_cast<std::size_t>(seed)) & 0xff);
    return v;
}
/// A new cuda backend and a pooled stream of it on cuda:0, on the fake runtime (null when the fake
/// is not the runtime loaded).
std::shared_ptr<DeviceBackend> fake_backend(Stream& stream) {
    auto made = make_cuda_backend();  // (loads the runtime: fake() finds it loaded)
    if (!fake().present) return nullptr;
    REQUIRE(made);
    auto s = (*made)->acquire_stream(Device::cuda(0));
    REQUIRE(s);
    stream = *s;
    return *made;
}

/// Waits for `e`, then notes whether `dst` still differs from `src` (the copy before `e` not done).
Task<Result<void>> wait_then_compare(DeviceBackend& b, const Event& e, const std::vector<std::uint8_t>& dst,
                                     const std::vector<std::uint8_t>& src, bool& differs) {
    auto r = co_await wait_for(b, e);
    differs = dst != src;
    co_return r;
}

/// Two distinct pooled streams of cuda:0.
std::pair<Stream, Stream> two_streams(DeviceBackend& b) {
    auto x = b.acquire_stream(Device::cuda(0));
    auto y = b.acquire_stream(Device::cuda(0));
    REQUIRE(x);
    REQUIRE(y);
    REQUIRE_FALSE(*x == *y);
    return {*x, *y};
}
void sync(DeviceBackend& b, Stream s) {
    run_with_deadline(10s, [&]() -> Task<void> {
        auto r = co_await b.synchronize(s);
        REQUIRE(r);
    });
}
}  // namespace

TEST_CASE("without a CUDA runtime, make_cuda_backend says which library it could not load", "[cuda][load]") {
    CudaBackendOptions o;
    o.runtime = "/nonexistent/libcudart.so.13";
    auto b = make_cuda_backend(o);
    REQUIRE_FALSE(b);
    CHECK(b.error().code() == Errc::not_supported);
    CHECK_THAT(b.error().message(), Catch::Contains("no CUDA runtime") && Catch::Contains("/nonexistent/libcudart.so.13"));
}

// Registered as its own test with TP_CUDART pointing nowhere: the process's default loading.
TEST_CASE("a process without a CUDA runtime sees no devices and refuses cuda tensors", "[.noruntime]") {
    CHECK(cuda_device_count() == 0);
    auto t = empty(Device::cuda(0), DType::float32, {4});
    REQUIRE_FALSE(t);
    CHECK(t.error().code() == Errc::not_supported);
    CHECK_THAT(t.error().message(), Catch::Contains("cuda:0") && Catch::Contains("no CUDA runtime"));
    REQUIRE(empty(Device::cpu(), DType::float32, {4}));
}

// Run by the `cuda_runtime_fallback` and `cuda_runtime_too_new` tests, each in its own process (the
// process's runtime is chosen once): TP_FAKE_CUDART names the fake, copied here as two runtimes,
// 13.0 and 12.4 (the version is in the file name); FAKE_CUDA_DRIVER_VERSION is the host's driver.
TEST_CASE("a runtime newer than the driver is passed over for the next; when none will do, the error says why", "[.runtimes]") {
    const char* fake = std::getenv("TP_FAKE_CUDART");
    const char* driver_env = std::getenv("FAKE_CUDA_DRIVER_VERSION");
    REQUIRE(fake);
    REQUIRE(driver_env);
    const int driver = std::atoi(driver_env);
    char tmpl[] = "/tmp/tp-runtimes-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    const std::filesystem::path dir(tmpl);
    const auto newer = dir / "libfake_cudart-13000.so", older = dir / "libfake_cudart-12040.so";
    std::filesystem::copy_file(fake, newer);
    std::filesystem::copy_file(fake, older);
    REQUIRE(::setenv("TP_CUDART", (newer.string() + ":" + older.string()).c_str(), 1) == 0);
    auto backend = make_cuda_backend();  // (the process's runtime: TP_CUDART's, chosen now)
    if (driver >= 12040) {
        // 13.0 cannot run on this driver: only 12.4 sees the devices.
        REQUIRE(backend);
        CHECK(cuda_device_count() == 2);
        auto t = empty(Device::cuda(1), DType::float32, {4});
        CHECK(t);
    } else {
        REQUIRE_FALSE(backend);
        INFO(backend.error().to_string());
        CHECK(backend.error().code() == Errc::not_supported);
        CHECK_THAT(backend.error().message(),
                   Catch::Contains("libfake_cudart-13000.so: its runtime 13.0 needs a newer driver") &&
                       Catch::Contains("libfake_cudart-12040.so: its runtime 12.4") && Catch::Contains("supports CUDA 11.8"));
        CHECK(cuda_device_count() == 0);
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("no driver and no device are not_supported, saying so", "[cuda][load][fake]") {
    if (!fake().present) return;
    fake().set_driver(0);
    auto no_driver = make_cuda_backend();
    CHECK(cuda_device_count() == 0);
    fake().set_driver(1);
    REQUIRE_FALSE(no_driver);
    CHECK(no_driver.error().code() == Errc::not_supported);
    CHECK_THAT(no_driver.error().message(), Catch::Contains("no CUDA driver"));

    fake().set_visible_devices(0);
    auto no_device = make_cuda_backend();
    CHECK(cuda_device_count() == 0);
    fake().set_visible_devices(2);
    REQUIRE_FALSE(no_device);
    CHECK(no_device.error().code() == Errc::not_supported);
    CHECK_THAT(no_device.error().message(), Catch::Contains("no CUDA device"));
    CHECK(cuda_device_count() == 2);
}

TEST_CASE("the cuda backend reports its devices and refuses ones it does not have", "[cuda]") {
    auto& b = cuda();
    CHECK(b.name() == "cuda");
    CHECK_FALSE(b.host_accessible());
    CHECK(b.device_count() == cuda_device_count());
    auto p = b.properties(Device::cuda(0));
    REQUIRE(p);
    CHECK(p->device == Device::cuda(0));
    CHECK(p->compute_major > 0);
    CHECK(p->total_memory > 0);
    CHECK_FALSE(p->pci_bus_id.empty());
    CHECK(p->uuid.size() == 36);  // (every driver since CUDA 11 has cuDeviceGetUuid_v2)
    if (b.device_count() > 1) CHECK(b.properties(Device::cuda(1))->uuid != p->uuid);
    const Device missing = Device::cuda(b.device_count());
    auto bad = b.allocate(missing, 16);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code() == Errc::device_error);
    CHECK_THAT(bad.error().message(), Catch::Contains(missing.str()));
    auto t = empty(missing, DType::uint8, {4});
    REQUIRE_FALSE(t);
    CHECK(t.error().code() == Errc::device_error);
    auto not_cuda = b.acquire_stream(Device::cpu());
    REQUIRE_FALSE(not_cuda);
    CHECK(not_cuda.error().code() == Errc::device_error);
    auto no_stream = b.record_event(Stream{Device::cuda(0), 999});
    REQUIRE_FALSE(no_stream);
    CHECK(no_stream.error().code() == Errc::device_error);
}

TEST_CASE("pooled streams are distinct non-default streams; the default stream is the legacy one", "[cuda]") {
    auto& b = cuda();
    auto d = b.default_stream(Device::cuda(0));
    auto s1 = b.acquire_stream(Device::cuda(0));
    auto s2 = b.acquire_stream(Device::cuda(0));
    REQUIRE(d);
    REQUIRE(s1);
    REQUIRE(s2);
    CHECK(d->id == 0);
    CHECK(*b.native_stream(*d) == nullptr);
    CHECK(s1->id != 0);
    CHECK_FALSE(*s1 == *s2);
    CHECK(*b.native_stream(*s1) != *b.native_stream(*s2));
}

TEST_CASE("copies run host to device, device to device, across devices and back", "[cuda]") {
    auto& b = cuda();
    const std::size_t n = 3 << 20;
    const auto src = pattern(n, 7);
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    auto d0 = b.allocate_on(*s, n);
    auto d0b = b.allocate_on(*s, n);
    REQUIRE(d0);
    REQUIRE(d0b);
    CHECK((*d0)->device() == Device::cuda(0));
    std::vector<std::uint8_t> back(n, 0);
    REQUIRE(b.copy_async(*s, (*d0)->data(), src.data(), n));
    REQUIRE(b.copy_async(*s, (*d0b)->data(), (*d0)->data(), n, *d0));
    std::shared_ptr<Storage> last = *d0b;
    if (b.device_count() > 1) {
        auto d1 = b.allocate(Device::cuda(1), n);  // ordered on cuda:1's default stream
        REQUIRE(d1);
        sync(b, *b.default_stream(Device::cuda(1)));
        REQUIRE(b.copy_async(*s, (*d1)->data(), (*d0b)->data(), n));
        last = *d1;
    }
    REQUIRE(b.copy_async(*s, back.data(), last->data(), n, last));
    sync(b, *s);
    CHECK(back == src);

    // Through pinned staging memory.
    auto pinned = b.allocate_host(n);
    REQUIRE(pinned);
    CHECK((*pinned)->device() == Device::cpu());
    REQUIRE(b.copy_async(*s, (*pinned)->data(), (*d0)->data(), n));
    sync(b, *s);
    CHECK(std::memcmp((*pinned)->data(), src.data(), n) == 0);
}

TEST_CASE("every call runs with its device current and leaves the caller's device alone", "[cuda][fake]") {
    if (!fake().present) return;
    auto& b = cuda();
    if (b.device_count() < 2) return;
    const long before = fake().wrong_device_calls();
    REQUIRE(fake().set_device(1) == 0);
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    auto m = b.allocate_on(*s, 4096);
    REQUIRE(m);
    std::vector<std::uint8_t> h(4096, 1);
    REQUIRE(b.copy_async(*s, (*m)->data(), h.data(), h.size()));
    auto ev = b.record_event(*s);
    REQUIRE(ev);
    auto s1 = b.acquire_stream(Device::cuda(1));
    REQUIRE(s1);
    REQUIRE(b.wait_event(*s1, *ev));
    m->reset();
    sync(b, *s);
    int current = -1;
    fake().get_device(&current);
    CHECK(current == 1);
    CHECK(fake().wrong_device_calls() == before);
    fake().set_device(0);
}

TEST_CASE("device memory comes from the stream-ordered pool and goes back to it", "[cuda][fake]") {
    if (!fake().present) return;
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    sync(b, *s);
    const long before = fake().live_allocations(0);
    {
        auto m = b.allocate_on(*s, 1 << 20);
        REQUIRE(m);
        CHECK(fake().live_allocations(0) == before + 1);
    }
    sync(b, *s);  // cudaFreeAsync ran on the allocating stream
    CHECK(fake().live_allocations(0) == before);
}

TEST_CASE("pinned staging memory comes from the pool allocated up front", "[cuda][fake]") {
    if (!fake().present) return;
    CudaBackendOptions o;
    o.staging_bytes = 1 << 20;
    auto b = make_cuda_backend(o);
    REQUIRE(b);
    const long calls = fake().host_alloc_calls();
    {
        auto a = (*b)->allocate_host(300 << 10);
        auto c = (*b)->allocate_host(300 << 10);
        REQUIRE(a);
        REQUIRE(c);
        CHECK((*a)->data() != (*c)->data());
        CHECK(fake().host_alloc_calls() == calls);  // no cudaHostAlloc per buffer
        auto big = (*b)->allocate_host(800 << 10);  // past what is left: its own cudaHostAlloc
        REQUIRE(big);
        CHECK(fake().host_alloc_calls() == calls + 1);
    }
    auto again = (*b)->allocate_host(1 << 20);  // the freed blocks merged back into one
    REQUIRE(again);
    CHECK(fake().host_alloc_calls() == calls + 1);
}

TEST_CASE("out of device memory is a device_error naming the call, the device and the CUDA error", "[cuda][fake]") {
    if (!fake().present) return;
    auto& b = cuda();
    fake().set_mem_limit(0, 1 << 20);
    auto r = b.allocate(Device::cuda(0), 2 << 20);
    fake().set_mem_limit(0, std::size_t{4} << 30);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == Errc::device_error);
    CHECK_THAT(r.error().message(), Catch::Contains("cudaMallocFromPoolAsync") && Catch::Contains("cuda:0") &&
                                        Catch::Contains("cudaErrorMemoryAllocation") && Catch::Contains("out of memory"));
    REQUIRE(b.allocate(Device::cuda(0), 2 << 20));  // not sticky: the next allocation works
}

TEST_CASE("a stream waiting on another stream's event sees its copy; without the wait it does not", "[cuda][fake]") {
    if (!fake().present) return;
    auto& b = cuda();
    const std::size_t n = 64 << 10;
    const auto src = pattern(n, 3);
    auto run = [&](bool with_wait) {
        const auto [a, c] = two_streams(b);
        auto mid = b.allocate_on(a, n);
        REQUIRE(mid);
        std::vector<std::uint8_t> zeros(n, 0), out(n, 1);
        REQUIRE(b.copy_async(a, (*mid)->data(), zeros.data(), n));
        sync(b, a);
        fake().set_stream_delay(*b.native_stream(a), 30000);  // a is slow: 30 ms per op
        REQUIRE(b.copy_async(a, (*mid)->data(), src.data(), n));
        auto ev = b.record_event(a);
        REQUIRE(ev);
        if (with_wait) REQUIRE(b.wait_event(c, *ev));
        REQUIRE(b.copy_async(c, out.data(), (*mid)->data(), n));
        sync(b, c);
        const bool saw = out == src;
        sync(b, a);
        fake().set_stream_delay(*b.native_stream(a), 0);
        return saw;
    };
    CHECK(run(true));
    CHECK_FALSE(run(false));  // the delay makes a missing wait visible
}

// Issue 34, item 7. The fake reuses a block for the next allocation of the stream that freed it, as a
// pool does: a read queued on another stream that the free did not wait for sees the next owner's bytes.
TEST_CASE("record_stream: memory read on another stream is reused only after that read; unrecorded, the reader races its next owner",
          "[cuda][fake]") {
    if (!fake().present) return;
    auto& b = cuda();
    const std::size_t n = 64 << 10;
    const auto first = pattern(n, 5), second = pattern(n, 9);
    auto run = [&](bool record) {
        const auto [own, reader] = two_streams(b);
        std::vector<std::uint8_t> out(n, 0);
        const std::uint8_t* old = nullptr;
        {
            auto mem = b.allocate_on(own, n);
            REQUIRE(mem);
            old = (*mem)->data();
            REQUIRE(b.copy_async(own, (*mem)->data(), first.data(), n));
            sync(b, own);
            fake().set_stream_delay(*b.native_stream(reader), 30000);  // the reader is slow: 30 ms per op
            REQUIRE(b.copy_async(reader, out.data(), (*mem)->data(), n));
            if (record) {
                auto t = Tensor::wrap(*mem, DType::uint8, {static_cast<std::int64_t>(n)});
                REQUIRE(t);
                REQUIRE(t->record_stream(reader));
            }
        }  // the last reference goes: freed on `own`
        auto next = b.allocate_on(own, n);
        REQUIRE(next);
        const bool reused = (*next)->data() == old;
        REQUIRE(b.copy_async(own, (*next)->data(), second.data(), n));
        sync(b, own);
        sync(b, reader);
        fake().set_stream_delay(*b.native_stream(reader), 0);
        CHECK(reused == !record);  // (recorded: the block was still held when `next` was made)
        return out == first;
    };
    CHECK(run(true));
    CHECK_FALSE(run(false));  // the delay makes the missing record visible
}

TEST_CASE("record_stream refuses a stream of another device or one that does not exist, and pinned memory", "[cuda]") {
    if (cuda_device_count() < 1) return;
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    auto mem = b.allocate_on(*s, 256);
    REQUIRE(mem);
    CHECK((*mem)->record_stream(*s));  // its own stream: nothing to add
    CHECK((*mem)->record_stream(Stream{Device::cuda(0), 0}));
    auto other = (*mem)->record_stream(Stream{Device::cuda(1), 1});
    REQUIRE_FALSE(other);
    CHECK(other.error().code() == Errc::invalid_argument);
    CHECK_THAT(other.error().message(), Catch::Contains("cuda:1"));
    auto missing = (*mem)->record_stream(Stream{Device::cuda(0), 1000});
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code() == Errc::invalid_argument);
    auto pinned = b.allocate_host(256);
    REQUIRE(pinned);
    auto p = (*pinned)->record_stream(*s);
    REQUIRE_FALSE(p);
    CHECK(p.error().code() == Errc::not_supported);
    CHECK_FALSE(Tensor{}.record_stream(*s));
    auto host = Tensor::cpu(DType::uint8, {4});
    CHECK(host.record_stream(Stream{Device::cpu(), 0}));  // host memory: nothing to order
}

TEST_CASE("a process forked after CUDA was set up refuses CUDA, saying why, and never hangs", "[cuda][fake]") {
    Stream st;
    auto made = fake_backend(st);
    if (!made) return;
    auto& b = *made;
    const auto* s = &st;
    // An event still pending at the fork: the child must not wait for it forever.
    fake().set_stream_delay(*b.native_stream(*s), 300000);
    std::vector<std::uint8_t> h(64, 7);
    auto m = b.allocate_on(*s, h.size());
    REQUIRE(m);
    REQUIRE(b.copy_async(*s, (*m)->data(), h.data(), h.size()));
    auto ev = b.record_event(*s);
    REQUIRE(ev);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int code = 0;
        auto alloc = b.allocate(Device::cuda(0), 16);
        if (alloc || alloc.error().message().find("forked") == std::string::npos) code |= 1;
        Result<void> waited = ok();
        asio::io_context ctx;
        asio::co_spawn(ctx, [&]() -> Task<void> { waited = co_await wait_for(b, *ev); }, asio::detached);
        ctx.run_for(std::chrono::seconds(5));
        if (waited || waited.error().message().find("forked") == std::string::npos) code |= 2;
        ::_exit(code);
    }
    // Its end, awaited (a pidfd) for at most 10 s.
    int status = -1;
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    pollfd pf{pidfd, POLLIN, 0};
    const bool ended = pidfd >= 0 && ::poll(&pf, 1, 10000) == 1;
    if (pidfd >= 0) ::close(pidfd);
    if (!ended) ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    if (!ended) FAIL("the forked child hung");
    INFO("child exit: 1 = its allocation did not say it was forked, 2 = its wait did not");
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    fake().set_stream_delay(*b.native_stream(*s), 0);
    sync(b, *s);  // the parent's CUDA goes on
}

TEST_CASE("the backend allocates from a pool of its own: the device's default pool keeps its settings", "[cuda][fake]") {
    Stream st;
    auto made = fake_backend(st);
    if (!made) return;
    auto& b = *made;
    const auto* s = &st;
    auto m = b.allocate_on(*s, 4096);
    REQUIRE(m);
    m->reset();
    sync(b, *s);
    auto again = b.allocate_on(*s, 4096);  // (from the same pool, after the free)
    REQUIRE(again);
    again->reset();
    sync(b, *s);
    // Other libraries of the process share the default pool: its release threshold is theirs.
    CHECK(fake().default_pool_threshold(0) == 0);  // (before: UINT64_MAX, set by the backend)
}

TEST_CASE("two backends' events on the same stream id of one device are waited for each on its own", "[cuda][fake]") {
    auto made_a = make_cuda_backend();  // (loads the runtime: fake() finds it loaded)
    auto made_b = make_cuda_backend();
    if (!fake().present) return;
    REQUIRE(made_a);
    REQUIRE(made_b);
    auto &a = **made_a, &b = **made_b;
    auto sa = a.acquire_stream(Device::cuda(0));
    auto sb = b.acquire_stream(Device::cuda(0));
    REQUIRE(sa);
    REQUIRE(sb);
    REQUIRE(sa->id == sb->id);  // (each backend counts its own streams: the same id, and the same sequence numbers)
    fake().set_stream_delay(*a.native_stream(*sa), 50000);
    fake().set_stream_delay(*b.native_stream(*sb), 500000);
    std::vector<std::uint8_t> src(64, 9), dst_a(64, 0), dst_b(64, 0);
    auto ma = a.allocate_on(*sa, 64);
    auto mb = b.allocate_on(*sb, 64);
    REQUIRE(ma);
    REQUIRE(mb);
    REQUIRE(a.copy_async(*sa, (*ma)->data(), src.data(), 64));
    REQUIRE(a.copy_async(*sa, dst_a.data(), (*ma)->data(), 64));
    REQUIRE(b.copy_async(*sb, (*mb)->data(), src.data(), 64));
    REQUIRE(b.copy_async(*sb, dst_b.data(), (*mb)->data(), 64));
    auto ea = a.record_event(*sa);
    auto eb = b.record_event(*sb);
    REQUIRE(ea);
    REQUIRE(eb);
    bool b_done_early = false;
    run_with_deadline(10s, [&]() -> Task<void> {
        using namespace detail::awaitable_ops;
        // A's event (first in, done after 50 ms) must not end the wait for B's (500 ms).
        auto wait_a = wait_for(a, *ea);
        auto wait_b = wait_then_compare(b, *eb, dst_b, src, b_done_early);
        auto [ra, rb] = co_await (std::move(wait_a) && std::move(wait_b));
        CHECK(ra);
        CHECK(rb);
    });
    CHECK(dst_a == src);
    CHECK_FALSE(b_done_early);
    fake().set_stream_delay(*a.native_stream(*sa), 0);
    fake().set_stream_delay(*b.native_stream(*sb), 0);
}

TEST_CASE("a sticky error fails every later operation on that device with the same error", "[cuda][fake]") {
    if (!fake().present) return;
    auto made = make_cuda_backend();
    REQUIRE(made);
    auto& b = **made;
    const Device dev = Device::cuda(b.device_count() - 1);
    auto s = b.acquire_stream(dev);
    REQUIRE(s);
    fake().fault(*b.native_stream(*s), 700 /* cudaErrorIllegalAddress */);
    auto ev = b.record_event(*s);
    REQUIRE(ev);
    Result<void> waited = ok();
    run_with_deadline(10s, [&]() -> Task<void> { waited = co_await wait_for(b, *ev); });
    REQUIRE_FALSE(waited);
    CHECK(waited.error().code() == Errc::device_error);
    CHECK_THAT(waited.error().message(), Catch::Contains(dev.str()) && Catch::Contains("cudaErrorIllegalAddress") &&
                                             Catch::Contains("an illegal memory access"));
    auto alloc = b.allocate(dev, 16);
    REQUIRE_FALSE(alloc);
    CHECK(alloc.error() == waited.error());
    std::uint8_t h[4] = {};
    auto copy = b.copy_async(*s, h, h, 4);
    REQUIRE_FALSE(copy);
    CHECK(copy.error() == waited.error());
    auto again = b.record_event(*s);
    REQUIRE_FALSE(again);
    CHECK(again.error() == waited.error());
    if (b.device_count() > 1) CHECK(b.allocate(Device::cuda(0), 16));  // the other device is fine
    fake().clear_fault(dev.index);
}

namespace {
using IpcGet = int (*)(IpcHandle*, void*);
using IpcOpen = int (*)(void**, IpcHandle, unsigned);
using IpcClose = int (*)(void*);
using Malloc = int (*)(void**, std::size_t);
template <class F>
F fake_fn(const char* name) {
    void* h = ::dlopen(std::getenv("TP_CUDART"), RTLD_NOW | RTLD_NOLOAD);
    return h ? reinterpret_cast<F>(::dlsym(h, name)) : nullptr;
}
std::string to_hex(const IpcHandle& h) {
    std::string out;
    for (auto c : h) {
        out += "0123456789abcdef"[c >> 4];
        out += "0123456789abcdef"[c & 15];
    }
    return out;
}
}  // namespace

// The second process of the fake's shared-memory test: maps the parent's "device" memory from the
// handle in TP_TEST_IPC_MEM, reads it and writes it back through the backend's copies.
TEST_CASE("ipc memory child", "[.ipc_mem_child]") {
    const std::string text = std::getenv("TP_TEST_IPC_MEM");
    IpcHandle h{};
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
    void* p = nullptr;
    REQUIRE(fake_fn<IpcOpen>("cudaIpcOpenMemHandle")(&p, h, 1) == 0);
    auto& b = cuda();
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    {
        // As the runtime: a second open in this context is the same mapping, counted; the backend's
        // storages of it each close their own open, and the first stays usable.
        auto again = b.open_memory(Device::cuda(0), h, 4096);
        REQUIRE(again);
        CHECK((*again)->data() == p);
        auto third = b.open_memory(Device::cuda(0), h, 4096);
        REQUIRE(third);
        CHECK((*third)->data() == p);
    }
    CHECK(fake().live_imports() == 1);
    std::vector<std::uint8_t> got(4096), mine = pattern(4096, 2);
    REQUIRE(b.copy_async(*s, got.data(), static_cast<std::uint8_t*>(p), got.size()));
    REQUIRE(b.copy_async(*s, static_cast<std::uint8_t*>(p), mine.data(), mine.size()));
    sync(b, *s);
    CHECK(got == pattern(4096, 1));
    CHECK(fake_fn<IpcClose>("cudaIpcCloseMemHandle")(p) == 0);
}

TEST_CASE("the fake runtime shares device memory between processes through IPC handles", "[cuda][fake][ipc]") {
    if (!fake().present) return;
    auto& b = cuda();
    void* p = nullptr;
    REQUIRE(fake_fn<Malloc>("cudaMalloc")(&p, 4096) == 0);
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    const auto first = pattern(4096, 1);
    REQUIRE(b.copy_async(*s, static_cast<std::uint8_t*>(p), first.data(), first.size()));
    sync(b, *s);
    IpcHandle h{};
    REQUIRE(fake_fn<IpcGet>("cudaIpcGetMemHandle")(&h, p) == 0);
    auto pooled = b.allocate(Device::cuda(0), 4096);
    REQUIRE(pooled);
    IpcHandle no{};
    CHECK(fake_fn<IpcGet>("cudaIpcGetMemHandle")(&no, (*pooled)->data()) != 0);  // as on a GPU: pool memory is not
    char self[4096];
    const auto len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(len > 0);
    self[len] = '\0';
    std::vector<Child> child{spawn({self, "[.ipc_mem_child]"}, {"TP_TEST_IPC_MEM=" + to_hex(h)})};
    wait_all(child, 20s);
    INFO(child[0].describe());
    REQUIRE(child[0].exited_ok());
    std::vector<std::uint8_t> now(4096);
    REQUIRE(b.copy_async(*s, now.data(), static_cast<std::uint8_t*>(p), now.size()));
    sync(b, *s);
    CHECK(now == pattern(4096, 2));  // the child's write
}

namespace {
IpcHandle from_hex(const std::string& text) {
    IpcHandle h{};
    for (std::size_t i = 0; i < h.size() && 2 * i + 1 < text.size(); ++i)
        h[i] = static_cast<std::uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
    return h;
}
// The steps of the two-process tests (their numbers in TP_TEST_IPC_STEPS).
using test::Steps;
void mark_step(Steps& s, const std::string& name) { REQUIRE(s.mark(name)); }
bool await_step(Steps& s, const std::string& name) { return s.await(name); }
constexpr std::size_t ipc_bytes = 256 << 10;
}  // namespace

// The second process of the backend's IPC test: maps the parent's exportable memory and opens its
// event (handles in TP_TEST_IPC_MEM / TP_TEST_IPC_EVENT), then, for each of the parent's records
// ("recorded<i>" in TP_TEST_IPC_DIR), waits on the event and copies the memory out; the copy must
// see what the parent wrote before that record (pattern i).
TEST_CASE("ipc backend child", "[.ipc_backend_child]") {
    Steps steps;
    REQUIRE(std::sscanf(std::getenv("TP_TEST_IPC_STEPS"), "%d,%d", &steps.in, &steps.out) == 2);
    auto& b = cuda();
    const long imports = fake().present ? fake().live_imports() : 0;
    auto mem = b.open_memory(Device::cuda(0), from_hex(std::getenv("TP_TEST_IPC_MEM")), ipc_bytes);
    REQUIRE(mem);
    CHECK((*mem)->device() == Device::cuda(0));
    CHECK((*mem)->size() == ipc_bytes);
    CHECK((*mem)->data() != nullptr);
    if (fake().present) CHECK(fake().live_imports() == imports + 1);
    auto ev = b.open_ipc_event(Device::cuda(0), from_hex(std::getenv("TP_TEST_IPC_EVENT")));
    REQUIRE(ev);
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    auto got = b.allocate_host(ipc_bytes);  // pinned: a copy to pageable memory would block the caller
    REQUIRE(got);
    for (int round = 1; round <= 2; ++round) {
        const auto i = std::to_string(round);
        REQUIRE(await_step(steps, "recorded" + i));
        std::memset((*got)->data(), 0xee, ipc_bytes);
        REQUIRE(b.wait_event(*s, *ev));
        REQUIRE(b.copy_async(*s, (*got)->data(), (*mem)->data(), ipc_bytes));
        mark_step(steps, "queued" + i);  // the parent lets its copy and record run only now
        sync(b, *s);
        CHECK(std::memcmp((*got)->data(), pattern(ipc_bytes, round).data(), ipc_bytes) == 0);
        mark_step(steps, "checked" + i);
    }
    mem->reset();
    if (fake().present) CHECK(fake().live_imports() == imports);  // unmapped with the last reference
}

TEST_CASE("exportable memory and a re-recorded interprocess event order another process's reads", "[cuda][ipc]") {
    auto& b = cuda();
    const Device dev = Device::cuda(0);
    auto mem = b.allocate_exportable(dev, ipc_bytes);
    REQUIRE(mem);
    CHECK((*mem)->device() == dev);
    CHECK((*mem)->size() == ipc_bytes);
    auto s = b.acquire_stream(dev);
    REQUIRE(s);
    auto staged = b.allocate_host(ipc_bytes);
    REQUIRE(staged);
    std::memset((*staged)->data(), 0, ipc_bytes);
    REQUIRE(b.copy_async(*s, (*mem)->data(), (*staged)->data(), ipc_bytes));
    sync(b, *s);
    auto mh = b.export_memory(**mem);
    REQUIRE(mh);
    auto ipc = b.create_ipc_event(dev);
    REQUIRE(ipc);

    int down[2], up[2];  // parent -> child, child -> parent; the parent's ends are not inherited
    REQUIRE(::pipe(down) == 0);
    REQUIRE(::pipe(up) == 0);
    REQUIRE(::fcntl(down[1], F_SETFD, FD_CLOEXEC) == 0);
    REQUIRE(::fcntl(up[0], F_SETFD, FD_CLOEXEC) == 0);
    Steps steps{up[0], down[1], {}};
    char self[4096];
    const auto len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(len > 0);
    self[len] = '\0';
    std::vector<Child> child;
    auto step = [&](const std::string& name) {
        if (await_step(steps, name)) return;
        wait_all(child, 1s);
        FAIL("the child did not reach " << name << ": " << child[0].describe());
    };
    for (int round = 1; round <= 2; ++round) {
        const auto i = std::to_string(round);
        // The stream is held until the child has queued its wait and copy: without the wait, the
        // child would read the previous contents.
        StreamHold hold(b, *s);
        std::memcpy((*staged)->data(), pattern(ipc_bytes, round).data(), ipc_bytes);
        REQUIRE(b.copy_async(*s, (*mem)->data(), (*staged)->data(), ipc_bytes));
        REQUIRE(b.record_again(*s, ipc->first));
        mark_step(steps, "recorded" + i);
        if (round == 1) {
            child.push_back(spawn({self, "[.ipc_backend_child]"},
                                  {"TP_TEST_IPC_MEM=" + to_hex(*mh), "TP_TEST_IPC_EVENT=" + to_hex(ipc->second),
                                   "TP_TEST_IPC_STEPS=" + std::to_string(down[0]) + "," + std::to_string(up[1])}));
            ::close(down[0]);  // (the child's ends: a read of ours ends with EOF once it is gone)
            ::close(up[1]);
        }
        step("queued" + i);
        std::this_thread::sleep_for(50ms);  // the child's copy would have run by now without its wait
        hold.release();
        step("checked" + i);
        sync(b, *s);  // (the staging buffer is rewritten next round)
    }
    wait_all(child, 20s);
    ::close(up[0]);
    ::close(down[1]);
    INFO(child[0].describe());
    REQUIRE(child[0].exited_ok());
}

TEST_CASE("export_memory and record_again refuse what the matching allocate/create did not make", "[cuda][ipc]") {
    auto& b = cuda();
    auto pooled = b.allocate(Device::cuda(0), 4096);
    REQUIRE(pooled);
    auto r = b.export_memory(**pooled);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == Errc::invalid_argument);
    CHECK_THAT(r.error().message(), Catch::Contains("allocate_exportable"));
    auto pinned = b.allocate_host(64);
    REQUIRE(pinned);
    CHECK(b.export_memory(**pinned).error().code() == Errc::invalid_argument);
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    auto plain = b.record_event(*s);
    REQUIRE(plain);
    auto again = b.record_again(*s, *plain);
    REQUIRE_FALSE(again);
    CHECK(again.error().code() == Errc::invalid_argument);
    CHECK_THAT(again.error().message(), Catch::Contains("create_ipc_event"));
    CHECK(b.record_again(*s, Event{}).error().code() == Errc::invalid_argument);
    if (b.device_count() > 1) {
        auto ipc = b.create_ipc_event(Device::cuda(1));
        REQUIRE(ipc);
        CHECK(b.record_again(*s, ipc->first).error().code() == Errc::invalid_argument);  // another device's event
    }
    auto empty_mem = b.allocate_exportable(Device::cuda(0), 0);
    REQUIRE(empty_mem);
    CHECK((*empty_mem)->size() == 0);
    CHECK(b.export_memory(**empty_mem));
    CHECK(b.allocate_exportable(Device::cuda(b.device_count()), 16).error().code() == Errc::device_error);
}

TEST_CASE("opening a garbage memory handle is a device_error naming cudaIpcOpenMemHandle", "[cuda][fake][ipc]") {
    if (!fake().present) return;
    auto& b = cuda();
    IpcHandle garbage;
    garbage.fill(0x5a);
    const long imports = fake().live_imports();
    auto r = b.open_memory(Device::cuda(0), garbage, 4096);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == Errc::device_error);
    CHECK_THAT(r.error().message(), Catch::Contains("cudaIpcOpenMemHandle") && Catch::Contains("cuda:0"));
    CHECK(fake().live_imports() == imports);
    REQUIRE(b.allocate(Device::cuda(0), 16));  // not sticky
}

TEST_CASE("can_access_peer: the same device always, cuda peers as the runtime says", "[cuda][ipc]") {
    auto& b = cuda();
    auto same = b.can_access_peer(Device::cuda(0), Device::cuda(0));
    REQUIRE(same);
    CHECK(*same);
    if (b.device_count() > 1) {
        auto peer = b.can_access_peer(Device::cuda(0), Device::cuda(1));
        REQUIRE(peer);
        if (fake().present) CHECK(*peer);
    }
    auto missing = b.can_access_peer(Device::cuda(0), Device::cuda(b.device_count()));
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code() == Errc::device_error);
    CHECK(b.can_access_peer(Device::cpu(), Device::cuda(0)).error().code() == Errc::device_error);
}

TEST_CASE("the other backends: can_access_peer of their own devices, no device-memory IPC", "[cuda][ipc]") {
    auto& cpu = cpu_backend();
    CHECK(*cpu.can_access_peer(Device::cpu(), Device::cpu()));
    CHECK(cpu.can_access_peer(Device::cpu(), Device::cuda(0)).error().code() == Errc::device_error);
    CHECK(cpu.allocate_exportable(Device::cpu(), 16).error().code() == Errc::not_supported);
    CHECK(cpu.open_memory(Device::cpu(), IpcHandle{}, 16).error().code() == Errc::not_supported);
    CHECK(cpu.create_ipc_event(Device::cpu()).error().code() == Errc::not_supported);
    auto host = cpu.allocate(Device::cpu(), 16);
    REQUIRE(host);
    CHECK(cpu.export_memory(**host).error().code() == Errc::not_supported);
    CHECK(cpu.record_again(*cpu.default_stream(Device::cpu()), Event{}).error().code() == Errc::not_supported);

    auto& sim = install_sim_backend(2);
    auto peer = sim.can_access_peer(Device::cuda(0), Device::cuda(1));
    auto missing = sim.can_access_peer(Device::cuda(0), Device::cuda(2));
    auto exportable = sim.allocate_exportable(Device::cuda(0), 16);
    uninstall_sim_backend();
    REQUIRE(peer);
    CHECK(*peer);
    CHECK(missing.error().code() == Errc::device_error);
    CHECK(exportable.error().code() == Errc::not_supported);
}

namespace {
constexpr std::size_t pool_bytes = 300000;
}  // namespace

// The second process of the pool IPC test: takes the parent's pool descriptor (pidfd_getfd, numbers
// in TP_TEST_POOL), imports the pool and the parent's allocation, and reads it through a copy.
TEST_CASE("ipc pool child", "[.ipc_pool_child]") {
    int pid = 0, fd = 0;
    REQUIRE(std::sscanf(std::getenv("TP_TEST_POOL"), "%d,%d", &pid, &fd) == 2);
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    REQUIRE(pidfd >= 0);
    const int mine = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    REQUIRE(mine >= 0);
    auto& b = cuda();
    const long imports = fake().present ? fake().live_imports() : 0;
    auto pool = b.import_pool(Device::cuda(0), mine);
    ::close(mine);
    ::close(pidfd);
    REQUIRE(pool);
    auto s = b.acquire_stream(Device::cuda(0));
    REQUIRE(s);
    auto mem = b.import_pointer(**pool, *s, from_hex(std::getenv("TP_TEST_POOL_PTR")));
    REQUIRE(mem);
    CHECK((*mem)->size() >= pool_bytes);  // (the allocation's own size, as the driver has it)
    CHECK((*mem)->device() == Device::cuda(0));
    if (fake().present) CHECK(fake().live_imports() == imports + 1);
    auto got = b.allocate_host(pool_bytes);
    REQUIRE(got);
    REQUIRE(b.copy_async(*s, (*got)->data(), (*mem)->data(), pool_bytes));
    mem->reset();  // (freed on the stream, after the copy)
    sync(b, *s);
    CHECK(std::memcmp((*got)->data(), pattern(pool_bytes, 9).data(), pool_bytes) == 0);
    if (fake().present) CHECK(fake().live_imports() == imports);
    IpcHandle garbage;
    garbage.fill(0x5a);
    auto bad = b.import_pointer(**pool, *s, garbage);
    REQUIRE_FALSE(bad);
    CHECK_THAT(bad.error().message(), Catch::Contains("cudaMemPoolImportPointer"));
}

TEST_CASE("pool memory goes to another process allocation by allocation: its pool's descriptor, then each pointer", "[cuda][ipc]") {
    auto& b = cuda();
    const Device dev = Device::cuda(0);
    auto fd = b.export_pool(dev);
    if (!fd && fd.error().code() == Errc::not_supported) {
        WARN("no IPC-capable pool here: " << fd.error().message());
        return;
    }
    REQUIRE(fd);
    auto s = b.acquire_stream(dev);
    REQUIRE(s);
    auto mem = b.allocate_on(*s, pool_bytes);
    REQUIRE(mem);
    const auto bytes = pattern(pool_bytes, 9);
    REQUIRE(b.copy_async(*s, (*mem)->data(), bytes.data(), pool_bytes));
    sync(b, *s);
    auto data = b.export_pointer(**mem);
    REQUIRE(data);
    // Memory that is not the start of an allocation of the pool has nothing to export.
    auto plain = b.allocate_exportable(dev, 64);
    REQUIRE(plain);
    CHECK(b.export_pointer(**plain).error().code() == Errc::invalid_argument);
    auto pinned = b.allocate_host(64);
    REQUIRE(pinned);
    CHECK(b.export_pointer(**pinned).error().code() == Errc::invalid_argument);
    char self[4096];
    const auto len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(len > 0);
    self[len] = '\0';
    std::vector<Child> child{spawn({self, "[.ipc_pool_child]"}, {"TP_TEST_POOL=" + std::to_string(::getpid()) + "," + std::to_string(*fd),
                                                                  "TP_TEST_POOL_PTR=" + to_hex(*data)})};
    wait_all(child, 20s);
    ::close(*fd);
    INFO(child[0].describe());
    REQUIRE(child[0].exited_ok());
}

TEST_CASE("with TP_CUDA_IPC_POOL=0 or no driver support the pool is the process's own", "[cuda][fake][ipc]") {
    (void)cuda();  // (loads the runtime that fake() looks in)
    if (!fake().present) return;
    for (const char* var : {"TP_CUDA_IPC_POOL=0", "FAKE_CUDA_NO_IPC_POOL=1"}) {
        INFO(var);
        char self[4096];
        const auto len = ::readlink("/proc/self/exe", self, sizeof self - 1);
        REQUIRE(len > 0);
        self[len] = '\0';
        std::vector<Child> child{spawn({self, "[.no_ipc_pool_child]"}, {var})};
        wait_all(child, 20s);
        INFO(child[0].describe());
        CHECK(child[0].exited_ok());
    }
}

TEST_CASE("no ipc pool child", "[.no_ipc_pool_child]") {
    auto& b = cuda();
    auto mem = b.allocate(Device::cuda(0), 4096);
    REQUIRE(mem);  // (allocation works: from a pool of this process alone)
    auto fd = b.export_pool(Device::cuda(0));
    REQUIRE_FALSE(fd);
    CHECK(fd.error().code() == Errc::not_supported);
    CHECK(b.export_pointer(**mem).error().code() == Errc::invalid_argument);
}
