// The runner of the cuda backend tests: with TP_CUDA_REQUIRE_DEVICE set (the `cuda` suite, against
// the real runtime) it exits 77 (meson: skipped) when this host has no usable CUDA device.
#include <tensorplay/device/device.hpp>

#include "support/catch_runner.hpp"

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
    if (std::getenv("TP_CUDA_REQUIRE_DEVICE") != nullptr && tensorplay::cuda_device_count() == 0) {
        std::puts("no CUDA device here: skipped");
        return 77;
    }
    const int failed = tensorplay::test::run_catch_session(argc, argv);
    return failed == 0 ? 0 : 1;
}
