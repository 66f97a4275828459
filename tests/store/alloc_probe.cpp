// The replaced global operator new/delete of alloc_probe.hpp (one per test executable that links it).
#include "store/alloc_probe.hpp"

#include <malloc.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace tensorplay::test::alloc_probe {
namespace {

std::atomic<std::size_t> g_live{0};
std::atomic<std::size_t> g_fail_above{SIZE_MAX};

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
    if (p) g_live.fetch_add(malloc_usable_size(p), std::memory_order_relaxed);
    return p;
}

void release(void* p) noexcept {
    if (!p) return;
    g_live.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
    std::free(p);
}

void* allocate_or_throw(std::size_t n, std::size_t align) {
    if (void* p = allocate(n, align)) return p;
    throw std::bad_alloc();
}

}  // namespace

std::size_t live_bytes() noexcept { return g_live.load(std::memory_order_relaxed); }

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
