// cuda_bench: one JSON object on stdout. Exits 77 without a CUDA device. With TP_CUDART naming the
// fake runtime (a test double) it only checks that the benchmark works: those are not GPU figures.
//  - wake latency: the time from a stream reaching an event to the awaiting coroutine resuming,
//    p50/p99 over 10,000 waits, beside cudaEventSynchronize on a blocked thread (raw runtime);
//  - 10,000 concurrent waits: threads used, total time from release to the last resume;
//  - 64 MiB allocation and free through the backend (stream-ordered pool) vs cudaMalloc/cudaFree;
//  - the completion thread's CPU (% of one core): during the back-to-back waits of the first part,
//    and while one wait stays pending for a second (a long kernel).
#include <tensorplay/device/backend.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace tensorplay;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kWaits = 10000;
constexpr std::size_t kAlloc = std::size_t{64} << 20;
constexpr int kAllocRounds = 200;

// The few raw runtime functions of the baselines, from the library the backend loads too.
struct Raw {
    int (*stream_create)(void**, unsigned) = nullptr;
    int (*host_func)(void*, void (*)(void*), void*) = nullptr;
    int (*event_create)(void**, unsigned) = nullptr;
    int (*event_record)(void*, void*) = nullptr;
    int (*event_sync)(void*) = nullptr;
    int (*malloc_)(void**, std::size_t) = nullptr;
    int (*free_)(void*) = nullptr;
    bool load() {
        const char* env = std::getenv("TP_CUDART");
        void* h = nullptr;
        for (const char* name : {env, "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"})
            if (name != nullptr && *name != '\0' && (h = ::dlopen(name, RTLD_NOW)) != nullptr) break;
        if (h == nullptr) return false;
        auto get = [h](auto& fn, const char* n) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, n)); return fn != nullptr; };
        return get(stream_create, "cudaStreamCreateWithFlags") && get(host_func, "cudaLaunchHostFunc") &&
               get(event_create, "cudaEventCreateWithFlags") && get(event_record, "cudaEventRecord") &&
               get(event_sync, "cudaEventSynchronize") && get(malloc_, "cudaMalloc") && get(free_, "cudaFree");
    }
};

int thread_count() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/task")) {
        while (auto* e = ::readdir(d)) n += e->d_name[0] != '.';
        ::closedir(d);
    }
    return n;
}

double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

std::pair<double, double> p50_p99(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return {v[v.size() / 2], v[v.size() * 99 / 100]};
}

// Runs on the stream: gives the waiter time to suspend, then stamps the moment the stream gets here.
struct Stamp {
    std::atomic<long long> at{0};
    static void run(void* p) {
        auto* s = static_cast<Stamp*>(p);
        const auto until = Clock::now() + std::chrono::microseconds(50);
        while (Clock::now() < until) {}
        s->at.store(Clock::now().time_since_epoch().count());
    }
    Clock::time_point when() const { return Clock::time_point(Clock::duration(at.load())); }
};

// The Event argument of wait() is made here, outside the caller's co_await expression (GCC 12).
Task<Result<void>> wait_for(DeviceBackend& b, const Event& event) {
    auto waiting = b.wait(event);
    co_return co_await std::move(waiting);
}

/// CPU seconds of this process's thread named `name` (the backend's completion thread), or -1.
double thread_cpu_seconds(const char* name) {
    DIR* d = ::opendir("/proc/self/task");
    if (d == nullptr) return -1;
    double r = -1;
    while (auto* e = ::readdir(d)) {
        char path[300], comm[32] = {};
        std::snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE* f = std::fopen(path, "r");
        if (f == nullptr) continue;
        const bool named = std::fgets(comm, sizeof comm, f) != nullptr && std::string(comm) == std::string(name) + "\n";
        std::fclose(f);
        if (!named) continue;
        // Linux's per-thread CPU clock of a thread id: (~tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED.
        const auto tid = static_cast<clockid_t>(std::atoi(e->d_name));
        timespec ts{};
        if (::clock_gettime((~tid << 3) | 6, &ts) == 0) r = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
    }
    ::closedir(d);
    return r;
}

int fail(const char* what, const std::string& why) {
    std::fprintf(stderr, "cuda_bench: %s: %s\n", what, why.c_str());
    return 1;
}

}  // namespace

int main() {
    if (cuda_device_count() == 0) {
        std::fprintf(stderr, "cuda_bench: no CUDA device here: skipped\n");
        return 77;
    }
    auto made = make_cuda_backend();
    if (!made) return fail("make_cuda_backend", made.error().message());
    DeviceBackend& b = **made;
    Raw raw;
    if (!raw.load()) return fail("raw runtime", "cannot load the runtime's functions");
    auto s = b.acquire_stream(Device::cuda(0));
    if (!s) return fail("acquire_stream", s.error().message());
    void* native = *b.native_stream(*s);

    // 1. wake latency through the backend
    std::vector<double> backend_lat, sync_lat;
    asio::io_context ctx(1);
    bool ok = true;
    double traffic_cpu0 = -1;
    Clock::time_point traffic0{};
    asio::co_spawn(ctx, [&]() -> Task<void> {
        Stamp stamp;
        for (int i = 0; i < kWaits && ok; ++i) {
            stamp.at = 0;
            ok = raw.host_func(native, &Stamp::run, &stamp) == 0;
            auto ev = b.record_event(*s);
            if (!ev) { ok = false; break; }
            auto r = co_await wait_for(b, *ev);
            const auto resumed = Clock::now();
            if (!r) { ok = false; break; }
            backend_lat.push_back(us(resumed - stamp.when()));
            if (i == 0) {  // (the completion thread exists from the first wait on)
                traffic_cpu0 = thread_cpu_seconds("tp-cuda-wait");
                traffic0 = Clock::now();
            }
        }
    }, [](std::exception_ptr) {});
    ctx.run();
    if (!ok) return fail("wake latency", "a wait failed");
    const double traffic_cpu = 100 * (thread_cpu_seconds("tp-cuda-wait") - traffic_cpu0) / (us(Clock::now() - traffic0) / 1e6);

    // ... and its CPU while one wait stays pending for a second
    double pending_cpu = -1;
    {
        auto held = std::make_shared<std::atomic<bool>>(false);
        (void)b.enqueue_host(*s, [held] { while (!held->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
        auto ev = b.record_event(*s);
        if (!ev) return fail("record_event", ev.error().message());
        asio::io_context one(1);
        asio::co_spawn(one, wait_for(b, *ev), [](std::exception_ptr, Result<void>) {});
        one.run_for(std::chrono::milliseconds(100));  // (the wait is parked, its backoff grown)
        const double c0 = thread_cpu_seconds("tp-cuda-wait");
        const auto t0 = Clock::now();
        one.run_for(std::chrono::seconds(1));
        pending_cpu = 100 * (thread_cpu_seconds("tp-cuda-wait") - c0) / (us(Clock::now() - t0) / 1e6);
        held->store(true);
        one.run();
    }

    // ... and cudaEventSynchronize on a blocked thread
    void* raw_stream = nullptr;
    void* raw_event = nullptr;
    if (raw.stream_create(&raw_stream, 1) != 0 || raw.event_create(&raw_event, 2) != 0) return fail("baseline", "setup failed");
    Stamp stamp;
    for (int i = 0; i < kWaits; ++i) {
        stamp.at = 0;
        raw.host_func(raw_stream, &Stamp::run, &stamp);
        raw.event_record(raw_event, raw_stream);
        raw.event_sync(raw_event);
        sync_lat.push_back(us(Clock::now() - stamp.when()));
    }

    // 2. 10,000 concurrent waits
    auto gate = std::make_shared<std::atomic<bool>>(false);
    (void)b.enqueue_host(*s, [gate] { while (!gate->load()) std::this_thread::yield(); });
    std::vector<Event> events;
    for (int i = 0; i < kWaits; ++i) events.push_back(*b.record_event(*s));
    asio::io_context many(1);
    int resumed = 0;
    Clock::time_point last{};
    for (auto& ev : events)
        asio::co_spawn(many, [&b, ev]() -> Task<Result<void>> { co_return co_await wait_for(b, ev); },
                       [&](std::exception_ptr, Result<void>) { ++resumed; last = Clock::now(); });
    const int threads_before = thread_count();
    many.run_for(std::chrono::milliseconds(100));
    const int threads_during = thread_count();
    const auto released = Clock::now();
    gate->store(true);
    many.run();
    const double concurrent_ms = us(last - released) / 1000;

    // 3. 64 MiB allocation and free
    const auto a0 = Clock::now();
    for (int i = 0; i < kAllocRounds; ++i) {
        auto m = b.allocate_on(*s, kAlloc);
        if (!m) return fail("allocate_on", m.error().message());
    }
    const double backend_alloc = us(Clock::now() - a0) / kAllocRounds;
    const auto c0 = Clock::now();
    for (int i = 0; i < kAllocRounds; ++i) {
        void* p = nullptr;
        if (raw.malloc_(&p, kAlloc) != 0) return fail("cudaMalloc", "failed");
        raw.free_(p);
    }
    const double plain_alloc = us(Clock::now() - c0) / kAllocRounds;

    const auto [bp50, bp99] = p50_p99(backend_lat);
    const auto [sp50, sp99] = p50_p99(sync_lat);
    const char* env = std::getenv("TP_CUDART");
    std::printf("{\"runtime\": \"%s\", \"fake_runtime\": %s, \"waits\": %d, "
                "\"wake_us\": {\"backend_p50\": %.2f, \"backend_p99\": %.2f, \"event_sync_p50\": %.2f, \"event_sync_p99\": %.2f, "
                "\"p50_ratio\": %.2f}, "
                "\"concurrent\": {\"waits\": %d, \"resumed\": %d, \"threads_before\": %d, \"threads_during\": %d, \"total_ms\": %.2f}, "
                "\"alloc_64mib_us\": {\"backend_alloc_free\": %.2f, \"cudaMalloc_cudaFree\": %.2f, \"rounds\": %d}, "
                "\"completion_thread_cpu_pct\": {\"back_to_back_waits\": %.1f, \"one_wait_pending_1s\": %.2f}}\n",
                env ? env : "libcudart", env && std::string(env).find("fake") != std::string::npos ? "true" : "false", kWaits,
                bp50, bp99, sp50, sp99, bp50 / sp50, kWaits, resumed, threads_before, threads_during, concurrent_ms,
                backend_alloc, plain_alloc, kAllocRounds, traffic_cpu, pending_cpu);
    return resumed == kWaits ? 0 : 1;
}
