// The logging hook: the library logs through a sink the user can replace.
#pragma once

#include <tensorplay/core/export.hpp>
#include <functional>
#include <string>
#include <string_view>

namespace tensorplay {

enum class LogLevel { trace, debug, info, warn, error, off };

/// Receives every log line at or above the current level. Called from any thread, never
/// concurrently (the library serialises calls); must not call back into set_log_sink.
using LogSink = std::function<void(LogLevel level, std::string_view component, std::string_view message)>;

/// Replaces the sink; an empty function restores the default (stderr). Thread-safe.
TP_API void set_log_sink(LogSink sink);
/// Sets the minimum level. Default: warn, or the value of TP_LOG_LEVEL (trace|debug|info|warn|error|off).
TP_API void set_log_level(LogLevel level);
[[nodiscard]] TP_API LogLevel log_level() noexcept;
[[nodiscard]] TP_API bool log_enabled(LogLevel level) noexcept;
/// Logs one line through the sink if `level` is enabled.
TP_API void log(LogLevel level, std::string_view component, std::string_view message);
[[nodiscard]] TP_API std::string_view to_string(LogLevel level) noexcept;

}  // namespace tensorplay
