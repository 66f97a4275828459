// Worker processes as users run them (env:// rendezvous, one program per rank): typed startup
// handlers answer the first calls, every way of shutting down ends the process promptly and
// cleanly, and a stopped worker holds the others' graceful shutdown only until their timeout.
#include "support/processes.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_lifecycle_test {

using namespace std::chrono_literals;

namespace {

std::string worker_program() {
    const char* p = std::getenv("TP_LIFECYCLE_WORKER");
    return p ? p : "tests/rpc/rpc_lifecycle_worker";
}

/// Runs `world` workers with `extra` arguments; returns them ended (or killed at `limit`).
std::vector<tensorplay::test::Child> run_group(int world, std::vector<std::string> extra, std::chrono::milliseconds limit,
                                               int stop_rank = -1, std::vector<std::string> env = {}) {
    const auto port = tensorplay::test::free_port();
    std::vector<tensorplay::test::Child> children;
    for (int r = 0; r < world; ++r) {
        std::vector<std::string> argv{worker_program()};
        argv.insert(argv.end(), extra.begin(), extra.end());
        std::vector<std::string> vars{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                      "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world), "TP_LOG_LEVEL=info"};
        vars.insert(vars.end(), env.begin(), env.end());
        children.push_back(tensorplay::test::spawn(argv, vars));
    }
    if (stop_rank < 0) {
        tensorplay::test::wait_all(children, limit);
        return children;
    }
    // Everyone but the stopped rank must end by itself; then the stopped one is killed.
    std::vector<tensorplay::test::Child> others;
    for (int r = 0; r < world; ++r)
        if (r != stop_rank) others.push_back(children[static_cast<std::size_t>(r)]);
    tensorplay::test::wait_all(others, limit);
    std::vector<tensorplay::test::Child> stopped{children[static_cast<std::size_t>(stop_rank)]};
    tensorplay::test::wait_all(stopped, 0ms);
    for (std::size_t i = 0, j = 0; i < children.size(); ++i)
        children[i] = static_cast<int>(i) == stop_rank ? stopped[0] : others[j++];
    return children;
}

void require_all_ok(const std::vector<tensorplay::test::Child>& children) {
    for (std::size_t r = 0; r < children.size(); ++r) {
        INFO("rank " << r << ": " << children[r].describe());
        CHECK(children[r].exited_ok());
    }
}

}  // namespace

TEST_CASE("after init_rpc, agent->shutdown() ends every worker process promptly and cleanly", "[rpc][process]") {
    auto children = run_group(3, {"--shutdown", "method"}, 60s);
    require_all_ok(children);
    // A healthy group's graceful shutdown is a few round trips, not a fixed wait (it was 10 s).
    for (auto& c : children) CHECK(c.seconds < 8.0);
}

TEST_CASE("after init_rpc_with_store, agent->shutdown() exits without touching the gone event loop", "[rpc][process]") {
    require_all_ok(run_group(3, {"--shutdown", "with_store"}, 60s));
}

TEST_CASE("the free shutdown() ends every worker process cleanly", "[rpc][process]") {
    require_all_ok(run_group(3, {"--shutdown", "free"}, 60s));
}

TEST_CASE("a process that exits with its agent still running does not crash in static destructors", "[rpc][process]") {
    // The agent is abandoned at exit on purpose (the OS takes its memory and sockets): under
    // AddressSanitizer its blocks are leaks by design, so LeakSanitizer is off for these two.
    const char* asan = std::getenv("ASAN_OPTIONS");
    const std::string no_leaks = "ASAN_OPTIONS=" + std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "detect_leaks=0";
    auto children = run_group(2, {"--shutdown", "never"}, 60s, -1, {no_leaks});
    require_all_ok(children);
    for (auto& c : children) CHECK(tensorplay::test::output_of(c).find("still running") != std::string::npos);
}

TEST_CASE("a stopped worker holds the others' graceful shutdown only until their timeout, and is named", "[rpc][process][fault]") {
    // Ranks 0 and 1 shut down with a 3 s timeout while rank 2 is SIGSTOPped: each must fail with
    // a timeout naming worker2 within 3 s (+2 s slack), and rank 0 (the store host) adds no fixed wait.
    auto children = run_group(3, {"--stop-rank", "2", "--timeout", "3"}, 30s, 2);
    for (int r = 0; r < 2; ++r) {
        INFO("rank " << r << ": " << children[static_cast<std::size_t>(r)].describe());
        CHECK(children[static_cast<std::size_t>(r)].exited_ok());
    }
}

}  // namespace tp_lifecycle_test
