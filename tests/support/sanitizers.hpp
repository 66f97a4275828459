// What a sanitizer adds to memory measurements: tests that bound RSS growth scale the bound by it.
#pragma once

#include <cstddef>

namespace tensorplay::test {

#if defined(__SANITIZE_THREAD__)
#define TP_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TP_TEST_TSAN 1
#endif
#endif

/// ThreadSanitizer shadows every application word it sees with four (and keeps metadata per
/// allocation), so RSS grows about 4x as much per byte touched; 1 otherwise.
#ifdef TP_TEST_TSAN
inline constexpr std::size_t kRssGrowthFactor = 4;
#else
inline constexpr std::size_t kRssGrowthFactor = 1;
#endif

}  // namespace tensorplay::test
