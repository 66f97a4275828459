// The replaced global operator new/delete of alloc_probe.hpp (one per test executable that links it).
#include "support/alloc_probe.hpp"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace tensorplay::test::alloc_probe {
namespace {

std::atomic<std::size_t> g_live{0};
std::atomic<std::size_t> g_allocations{0};
thread_local std::size_t t_allocations = 0;
std::atomic<std::size_t> g_fail_above{SIZE_MAX};
char g_watched[64];
std::atomic<std::size_t> g_watched_size{0};
std::atomic<std::size_t> g_freed_holding{0};

void* allocate(std::size_t n, std::size_t align) noexcept {
    if (n > g_fail_above.load(std::memory_order_relaxed)) return nullptr;
    if (n == 0) n = 1;
    void* p = nullptr;
    if (align <= alignof(std::max_align_t)) {
        p = std::malloc(n);
    } else {
        const std::size_t rounded = (n + align - 1) / align * align;  // aligned_alloc wants a multiple
        p = std::aligned_alloc(align, rounded);
    }
    if (p) {
        g_live.fetch_add(malloc_usable_size(p), std::memory_order_relaxed);
        g_allocations.fetch_add(1, std::memory_order_relaxed);
        ++t_allocations;
    }
    return p;
}

void release(void* p) noexcept {
    if (!p) return;
    const std::size_t usable = malloc_usable_size(p);
    if (const std::size_t w = g_watched_size.load(std::memory_order_acquire); w > 0 && ::memmem(p, usable, g_watched, w))
        g_freed_holding.fetch_add(1, std::memory_order_relaxed);
    g_live.fetch_sub(usable, std::memory_order_relaxed);
    std::free(p);
}

void* allocate_or_throw(std::size_t n, std::size_t align) {
    if (void* p = allocate(n, align)) return p;
    throw std::bad_alloc();
}

}  // namespace

std::size_t live_bytes() noexcept { return g_live.load(std::memory_order_relaxed); }
std::size_t allocations() noexcept { return g_allocations.load(std::memory_order_relaxed); }
std::size_t thread_allocations() noexcept { return t_allocations; }

void watch_freed(std::string_view bytes) noexcept {
    const std::size_t n = std::min(bytes.size(), sizeof g_watched);
    std::memcpy(g_watched, bytes.data(), n);
    g_freed_holding.store(0);
    g_watched_size.store(n, std::memory_order_release);
}

std::size_t freed_holding() noexcept { return g_freed_holding.load(); }

FailAbove::FailAbove(std::size_t bytes) noexcept { g_fail_above.store(bytes); }
FailAbove::~FailAbove() { g_fail_above.store(SIZE_MAX); }

std::size_t proc_status_bytes(const char* field) {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    std::size_t kib = 0;
    const std::size_t len = std::strlen(field);
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, field, len) == 0 && line[len] == ':') {
            kib = std::strtoull(line + len + 1, nullptr, 10);
            break;
        }
    }
    std::fclose(f);
    return kib * 1024;
}

}  // namespace tensorplay::test::alloc_probe

namespace probe = tensorplay::test::alloc_probe;

void* operator new(std::size_t n) { return probe::allocate_or_throw(n, 0); }
void* operator new[](std::size_t n) { return probe::allocate_or_throw(n, 0); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return probe::allocate(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return probe::allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return probe::allocate_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return probe::allocate_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return probe::allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return probe::allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { probe::release(p); }
void operator delete[](void* p) noexcept { probe::release(p); }
void operator delete(void* p, std::size_t) noexcept { probe::release(p); }
void operator delete[](void* p, std::size_t) noexcept { probe::release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { probe::release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { probe::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { probe::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { probe::release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { probe::release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { probe::release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { probe::release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { probe::release(p); }
