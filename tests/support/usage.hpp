// What this process uses, for tests that bound what a hostile peer can make it hold or burn.
#pragma once

#include <sys/resource.h>

#include <cstddef>
#include <fstream>
#include <string>

namespace tensorplay::test {

/// VmRSS of this process in bytes (0 when /proc cannot tell).
inline std::size_t rss_bytes() {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    return 0;
}

/// CPU seconds (user and system) this process has used, all its threads.
inline double cpu_seconds() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace tensorplay::test
