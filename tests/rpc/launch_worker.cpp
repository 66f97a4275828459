// launch_worker: one worker of a job started by a launcher (torchrun, srun, a shell), for the launch tests.
//
// Reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and torchrun's, or Slurm's, variables) through env://;
// TP_TEST_INIT_TIMEOUT sets RpcBackendOptions::init_timeout (seconds). Calls "echo" on every other
// worker, then shuts down gracefully. Prints "rank R of W: ok" on stdout, or the error on stderr.
// Exit status: 0 ok, 1 init_rpc failed, 2 a call or the shutdown failed.
#include <tensorplay/rpc.hpp>

#include "../support/worker_main.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tp = tensorplay;

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

tp::Task<int> worker() {
    // (Under srun without a wrapper only Slurm's variables say which task this is.)
    const std::string rank = !env("RANK").empty() ? env("RANK") : env("SLURM_PROCID");
    const std::string name = "worker" + rank;
    auto options = std::make_shared<tp::TensorPipeRpcBackendOptions>();
    options->init_method = "env://";
    options->listen_address = "127.0.0.1";
    if (auto t = env("TP_TEST_INIT_TIMEOUT"); !t.empty()) options->init_timeout = std::atof(t.c_str());
    auto reg = tp::register_startup_handler("echo", [](tp::WorkerInfo, tp::Message m) -> tp::Task<tp::Result<tp::Message>> {
        co_return m;
    });
    if (!reg) {
        std::fprintf(stderr, "rank %s: %s\n", rank.c_str(), reg.error().to_string().c_str());
        co_return 1;
    }
    auto agent = co_await tp::init_rpc(name, tp::BackendType::tensorpipe(), -1, -1, options);
    if (!agent) {
        std::fprintf(stderr, "rank %s: init_rpc failed: %s\n", rank.c_str(), agent.error().to_string().c_str());
        co_return 1;
    }
    const auto world = (*agent)->get_worker_infos();
    int failed = 0;
    for (const auto& peer : world) {
        if (peer.name == name) continue;
        tp::Message m;
        m.payload = tp::bytes("hello from " + name);
        std::string to = peer.name;  // (named: no string temporary inside a co_await, the GCC 12 pitfall)
        std::string handler = "echo";
        tp::Message sent = m;
        auto reply = co_await tp::rpc_async(std::move(to), std::move(handler), std::move(sent));
        if (!reply || reply->payload != m.payload) {
            ++failed;
            std::fprintf(stderr, "rank %s: echo to %s: %s\n", rank.c_str(), peer.name.c_str(),
                         reply ? "reply differs" : reply.error().to_string().c_str());
        }
    }
    auto down = co_await tp::shutdown(true, 30);
    if (!down) {
        std::fprintf(stderr, "rank %s: shutdown failed: %s\n", rank.c_str(), down.error().to_string().c_str());
        co_return 2;
    }
    if (failed) co_return 2;
    std::printf("rank %s of %zu: ok\n", rank.c_str(), world.size());
    co_return 0;
}

}  // namespace

int main() { return tensorplay::test::run_worker(worker); }
