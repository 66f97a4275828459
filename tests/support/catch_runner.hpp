// Runs the Catch2 session for the test executables that have a main of their own (Catch2's
// implementation is compiled once, in catch_runner.cpp, instead of in each of them).
#pragma once

namespace tensorplay::test {

/// Catch::Session().run(argc, argv): the number of failed test cases (capped at 255 by Catch2).
int run_catch_session(int argc, char** argv);

}  // namespace tensorplay::test
