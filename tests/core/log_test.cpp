// Tests of the logging hook.
#include <tensorplay/core/log.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_log_test {

using namespace tensorplay;

TEST_CASE("the sink receives lines at or above the level", "[core]") {
    std::vector<std::string> lines;
    set_log_sink([&](LogLevel l, std::string_view c, std::string_view m) {
        lines.push_back(std::string(to_string(l)) + " " + std::string(c) + " " + std::string(m));
    });
    set_log_level(LogLevel::info);
    log(LogLevel::debug, "store", "hidden");
    log(LogLevel::info, "store", "shown");
    log(LogLevel::error, "rpc", "bad");
    REQUIRE(lines == std::vector<std::string>{"info store shown", "error rpc bad"});
    REQUIRE(log_enabled(LogLevel::warn));
    REQUIRE_FALSE(log_enabled(LogLevel::debug));
    set_log_level(LogLevel::off);
    log(LogLevel::error, "rpc", "muted");
    REQUIRE(lines.size() == 2);
    set_log_sink({});
    set_log_level(LogLevel::warn);
}

}  // namespace tp_log_test
