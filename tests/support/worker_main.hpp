// run_worker: the main() of a test's worker process (launch, netns and multihost workers): runs one
// coroutine on a one-thread io_context and returns its exit code, 3 when it threw.
#pragma once

#include <tensorplay/core/task.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <exception>

namespace tensorplay::test {

inline int run_worker(Task<int> (*worker)()) {
    asio::io_context ctx(1);
    int rc = 3;
    asio::co_spawn(ctx, worker(), [&](std::exception_ptr e, int r) {
        rc = e ? 3 : r;
        ctx.stop();
    });
    ctx.run();
    std::fflush(nullptr);
    return rc;
}

}  // namespace tensorplay::test
