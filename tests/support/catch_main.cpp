// The runner of every test binary without a main of its own: exit 0 on success, 1 on any failure.
// (Catch2's own main exits with the failure count, and 77 of them would read as a meson SKIP.)
#include "support/catch_runner.hpp"

#include <csignal>

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);  // a peer closing a socket must be an error value, not a dead test
    return tensorplay::test::run_catch_session(argc, argv) == 0 ? 0 : 1;
}
