// The Catch2 v2 runner for every test binary: exit 0 on success, 1 on any failure.
// (Catch2's own main exits with the failure count, and 77 of them would read as a meson SKIP.)
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <csignal>

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);  // a peer closing a socket must be an error value, not a dead test
    int failed = Catch::Session().run(argc, argv);
    return failed == 0 ? 0 : 1;
}
