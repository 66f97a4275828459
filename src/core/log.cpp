// The logging hook: level from TP_LOG_LEVEL, a replaceable sink, stderr by default.
#include <tensorplay/core/log.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace tensorplay {
namespace {

LogLevel level_from_env() {
    const char* v = std::getenv("TP_LOG_LEVEL");
    if (!v || !*v) return LogLevel::warn;
    std::string s(v);
    for (auto level : {LogLevel::trace, LogLevel::debug, LogLevel::info, LogLevel::warn, LogLevel::error, LogLevel::off})
        if (s == to_string(level)) return level;
    // Said once, at the first log call, before the sink can be replaced: a typo must not go unseen.
    std::string line = "[tensorplay warn] log: TP_LOG_LEVEL=\"" + s +
                       "\" is not one of trace, debug, info, warn, error, off; using warn\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    return LogLevel::warn;
}

struct LogState {
    std::mutex mutex;
    LogSink sink;
    std::atomic<LogLevel> level{level_from_env()};
};

LogState& state() {
    // Function-local, so safe from static initialisers of other files; never destroyed, so safe
    // from static destructors (the RPC layer logs from one at exit).
    static auto* s = new LogState;
    return *s;
}

void default_sink(LogLevel level, std::string_view component, std::string_view message) {
    std::string line = "[tensorplay ";
    line += to_string(level);
    line += "] ";
    line += component;
    line += ": ";
    line += message;
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace

std::string_view to_string(LogLevel level) noexcept {
    switch (level) {
        case LogLevel::trace: return "trace";
        case LogLevel::debug: return "debug";
        case LogLevel::info: return "info";
        case LogLevel::warn: return "warn";
        case LogLevel::error: return "error";
        case LogLevel::off: return "off";
    }
    return "?";
}

void set_log_sink(LogSink sink) {
    std::lock_guard lock(state().mutex);
    state().sink = std::move(sink);
}

void set_log_level(LogLevel level) { state().level.store(level, std::memory_order_relaxed); }
LogLevel log_level() noexcept { return state().level.load(std::memory_order_relaxed); }

bool log_enabled(LogLevel level) noexcept {
    return level != LogLevel::off && level >= log_level();
}

void log(LogLevel level, std::string_view component, std::string_view message) {
    if (!log_enabled(level)) return;
    auto& s = state();
    std::lock_guard lock(s.mutex);  // serialises sink calls, as documented
    if (s.sink)
        s.sink(level, component, message);
    else
        default_sink(level, component, message);
}

}  // namespace tensorplay
