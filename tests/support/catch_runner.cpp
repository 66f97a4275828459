// Catch2's implementation (its single header with CATCH_CONFIG_RUNNER), compiled once for every
// test executable: about 30 s of compile time per executable that built it itself.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_runner.hpp"

namespace tensorplay::test {

int run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }

}  // namespace tensorplay::test
