// netns_worker: one worker of a two-worker job for netns_fault_test.sh, driven by commands on stdin.
//
// Joins over env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), listening on TP_NETNS_LISTEN.
// Serves "echo" and "slow" (answers after 1 s). Commands, one a line; each prints one line:
//   calls N TIMEOUT HANDLER     N calls one after another to the other worker
//   pending N TIMEOUT HANDLER   N calls at once; prints "started" once they are sent, then the result
//   quit                        shuts down locally and exits 0 (so does the end of stdin)
// A result line: "result ok=K failed=F codes=<code>:<n>,... mean_ms=M first_ms=A max_ms=B".
#include <tensorplay/rpc.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>

#include "core/asio_compat.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace tp = tensorplay;
using Clock = std::chrono::steady_clock;

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

struct Outcome {
    bool ok = false;
    std::string code;
    double ms = 0;
};

tp::Task<Outcome> one_call(std::string to, std::string handler, double timeout) {
    const auto t0 = Clock::now();
    tp::Message m;
    m.payload = tp::bytes("netns call");
    auto r = co_await tp::rpc_async(std::move(to), std::move(handler), std::move(m), timeout);
    Outcome o;
    o.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    o.ok = r && r->payload == tp::bytes("netns call");
    if (!r) o.code = std::string(tp::to_string(r.error().code()));
    else if (!o.ok) o.code = "wrong_reply";
    co_return o;
}

void print_result(const std::vector<Outcome>& all) {
    int ok = 0;
    std::map<std::string, int> codes;
    double sum = 0, first = 1e18, worst = 0;
    for (auto& o : all) {
        if (o.ok) ++ok;
        else codes[o.code]++;
        sum += o.ms;
        first = std::min(first, o.ms);
        worst = std::max(worst, o.ms);
    }
    std::string c;
    for (auto& [k, n] : codes) c += (c.empty() ? "" : ",") + k + ":" + std::to_string(n);
    std::printf("result ok=%d failed=%d codes=%s mean_ms=%.1f first_ms=%.1f max_ms=%.1f\n", ok,
                static_cast<int>(all.size()) - ok, c.empty() ? "-" : c.c_str(), all.empty() ? 0 : sum / double(all.size()),
                all.empty() ? 0 : first, worst);
    std::fflush(stdout);
}

tp::Task<void> run_pending(int n, double timeout, std::string to, std::string handler) {
    auto ex = co_await asio::this_coro::executor;
    std::vector<Outcome> all(static_cast<std::size_t>(n));
    int left = n;
    asio::steady_timer done(ex, std::chrono::hours(1));
    for (int i = 0; i < n; ++i)
        asio::co_spawn(ex, one_call(to, handler, timeout), [&all, &left, &done, i](std::exception_ptr, Outcome o) {
            all[static_cast<std::size_t>(i)] = std::move(o);
            if (--left == 0) done.cancel();
        });
    asio::steady_timer sent(ex, std::chrono::milliseconds(200));  // the requests are on the wire by then
    co_await sent.async_wait(tp::detail::use_nothrow);
    std::printf("started\n");
    std::fflush(stdout);
    if (left > 0) co_await done.async_wait(tp::detail::use_nothrow);
    print_result(all);
}

tp::Task<int> worker() {
    const std::string rank = env("RANK");
    const std::string peer = rank == "0" ? "worker1" : "worker0";
    auto options = std::make_shared<tp::TensorPipeRpcBackendOptions>();
    options->init_method = "env://";
    options->listen_address = env("TP_NETNS_LISTEN");
    options->init_timeout = 30;
    auto echo = tp::register_startup_handler("echo", [](tp::WorkerInfo, tp::Message m) -> tp::Task<tp::Result<tp::Message>> {
        co_return m;
    });
    auto slow = tp::register_startup_handler("slow", [](tp::WorkerInfo, tp::Message m) -> tp::Task<tp::Result<tp::Message>> {
        auto ex = co_await asio::this_coro::executor;
        asio::steady_timer t(ex, std::chrono::seconds(1));
        co_await t.async_wait(tp::detail::use_nothrow);
        co_return m;
    });
    if (!echo || !slow) co_return 1;
    auto agent = co_await tp::init_rpc("worker" + rank, tp::BackendType::tensorpipe(), -1, -1, options);
    if (!agent) {
        std::fprintf(stderr, "rank %s: init_rpc failed: %s\n", rank.c_str(), agent.error().to_string().c_str());
        co_return 1;
    }
    // What each pair negotiated (netns_fault_test.sh: not uds across network namespaces).
    if (auto info = co_await (*agent)->get_debug_info(); info)
        for (const auto& p : info->peers) std::printf("transport %s %s\n", p.worker.c_str(), p.transport.c_str());
    std::printf("ready\n");
    std::fflush(stdout);
    asio::posix::stream_descriptor in(co_await asio::this_coro::executor, ::dup(0));
    std::string buf;
    for (;;) {
        auto [ec, n] = co_await asio::async_read_until(in, asio::dynamic_buffer(buf), '\n', tp::detail::use_nothrow);
        if (ec) break;
        std::istringstream line(buf.substr(0, n));
        buf.erase(0, n);
        std::string cmd, handler;
        int count = 0;
        double timeout = 0;
        line >> cmd >> count >> timeout >> handler;
        if (cmd == "quit") break;
        if (cmd == "calls") {
            std::vector<Outcome> all;
            for (int i = 0; i < count; ++i) {
                std::string to = peer, h = handler;  // (named: no string temporary inside a co_await, GCC 12)
                auto o = co_await one_call(std::move(to), std::move(h), timeout);
                all.push_back(std::move(o));
            }
            print_result(all);
        } else if (cmd == "pending") {
            co_await run_pending(count, timeout, peer, handler);
        } else {
            std::printf("error unknown command \"%s\"\n", cmd.c_str());
            std::fflush(stdout);
        }
    }
    auto down = co_await tp::shutdown(false, 5);
    if (!down) std::fprintf(stderr, "rank %s: shutdown: %s\n", rank.c_str(), down.error().to_string().c_str());
    std::printf("bye\n");
    co_return 0;
}

}  // namespace

int main() {
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
