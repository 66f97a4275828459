// Tests of Error, Errc and Result.
#include <tensorplay/core/result.hpp>

#include <asio/error.hpp>
#include <catch2/catch.hpp>

#include <set>
#include <sstream>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_error_test {

using namespace tensorplay;

TEST_CASE("an error prints its code, worker and message", "[core]") {
    Error e(Errc::remote_error, "handler failed", "trainer1");
    REQUIRE(e.to_string() == "remote_error: on worker \"trainer1\": handler failed");
    std::ostringstream os;
    os << Error(Errc::timeout, "get key");
    REQUIRE(os.str() == "timeout: get key");
}

TEST_CASE("context is prefixed to the message", "[core]") {
    Error e = Error(Errc::store_error, "key missing").context("joining group as w0");
    REQUIRE(e.message() == "joining group as w0: key missing");
    REQUIRE(e.code() == Errc::store_error);
}

TEST_CASE("asio error codes map to the documented codes and keep the cause", "[core]") {
    REQUIRE(from_error_code(asio::error::operation_aborted, "read").code() == Errc::cancelled);
    REQUIRE(from_error_code(asio::error::eof, "read").code() == Errc::connection_lost);
    REQUIRE(from_error_code(asio::error::connection_reset, "read").code() == Errc::connection_lost);
    REQUIRE(from_error_code(asio::error::broken_pipe, "write").code() == Errc::connection_lost);
    REQUIRE(from_error_code(asio::error::timed_out, "connect").code() == Errc::timeout);
    auto refused = from_error_code(asio::error::connection_refused, "connect");
    REQUIRE(refused.code() == Errc::io_error);
    REQUIRE(refused.cause() == asio::error::connection_refused);
    REQUIRE(refused.message().rfind("connect: ", 0) == 0);
}

TEST_CASE("fail builds an unexpected Result", "[core]") {
    auto f = []() -> Result<int> { return fail(Errc::invalid_argument, "bad rank -1"); };
    auto r = f();
    REQUIRE_FALSE(r);
    REQUIRE(r.error().code() == Errc::invalid_argument);
    REQUIRE(r.error().message() == "bad rank -1");
    Result<void> v = ok();
    REQUIRE(v.has_value());
}

TEST_CASE("every code has a distinct name", "[core]") {
    std::set<std::string_view> names;
    for (int i = 0; i <= static_cast<int>(Errc::internal); ++i) names.insert(to_string(static_cast<Errc>(i)));
    REQUIRE(names.size() == static_cast<std::size_t>(Errc::internal) + 1);
    REQUIRE(names.count("unknown") == 0);
}

}  // namespace tp_error_test
