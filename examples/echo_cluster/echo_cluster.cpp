// echo_cluster: N workers rendezvous over env://, echo a 64-byte message and a 1 MiB tensor to every
// other worker, check every byte, print latency percentiles and shut down gracefully.
//
//   echo_cluster --world-size 4 [--rounds 20] [--stats] [--transports uv,uds] [--channels cma,basic]
//       spawns 4 local workers (rank 0 hosts the store); --stats: each prints its agent's counters as
//       JSON; --transports: the workers' `_transports` (else ECHO_CLUSTER_TRANSPORTS, else all);
//       --channels: their `_channels` (else ECHO_CLUSTER_CHANNELS, else all)
// Each worker prints the transport and channel it negotiated with every other worker.
//   MASTER_ADDR=.. MASTER_PORT=.. RANK=.. WORLD_SIZE=.. echo_cluster   runs one worker (torchrun, srun)
//
// Exit status 0 only if every worker got every reply intact and shut down cleanly.
#include <tensorplay/rpc.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace tp = tensorplay;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t message_size = 64;
constexpr std::size_t tensor_size = std::size_t{1} << 20;

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

// Deterministic contents, different per caller, callee and round, so a mixed-up reply shows.
std::uint8_t pattern(int from, int to, int round, std::size_t i) {
    return static_cast<std::uint8_t>(from * 31 + to * 17 + round * 7 + static_cast<int>(i % 251));
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

/// "a,b,c" -> {"a", "b", "c"}
std::vector<std::string> split_names(const std::string& list) {
    std::vector<std::string> names;
    for (std::size_t at = 0; at <= list.size();) {
        const auto comma = std::min(list.find(',', at), list.size());
        names.push_back(list.substr(at, comma - at));
        at = comma + 1;
    }
    return names;
}

tp::Task<int> worker(int rank, int world_size, int rounds, bool local, bool stats) {
    const std::string name = "worker" + std::to_string(rank);
    auto options = std::make_shared<tp::TensorPipeRpcBackendOptions>();
    options->init_method = "env://";
    if (local) options->listen_address = "127.0.0.1";
    if (auto list = env("ECHO_CLUSTER_TRANSPORTS"); !list.empty()) options->transports = split_names(list);
    if (auto list = env("ECHO_CLUSTER_CHANNELS"); !list.empty()) options->channels = split_names(list);
    // Registered before init: the agent installs it before it reports ready, so a peer's first
    // call cannot arrive before "echo" exists.
    auto reg = tp::register_startup_handler("echo", [](tp::WorkerInfo, tp::Message m) -> tp::Task<tp::Result<tp::Message>> {
        co_return m;
    });
    if (!reg) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), reg.error().to_string().c_str());
        co_return 1;
    }
    auto agent = co_await tp::init_rpc(name, tp::BackendType::tensorpipe(), rank, world_size, options);
    if (!agent) {
        std::fprintf(stderr, "%s: init_rpc failed: %s\n", name.c_str(), agent.error().to_string().c_str());
        co_return 1;
    }

    // What every pair negotiated (the connections are open once init returns).
    if (auto info = co_await (*agent)->get_debug_info(); info) {
        for (const auto& p : info->peers)
            std::printf("%s -> %s: transport %s, channel %s\n", name.c_str(), p.worker.c_str(),
                        p.transport.empty() ? "(none)" : p.transport.c_str(), p.channel.empty() ? "(none)" : p.channel.c_str());
        std::fflush(stdout);
    } else {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), info.error().to_string().c_str());
    }

    // Tensor contents are made up front: filling 1 MiB inside the loop would stall this worker's
    // only thread, and with it the replies it owes the others, and show up as their latency.
    std::vector<tp::Tensor> tensors(static_cast<std::size_t>(world_size));
    for (int peer = 0; peer < world_size; ++peer) {
        if (peer == rank) continue;
        auto& t = tensors[static_cast<std::size_t>(peer)];
        t = tp::Tensor::cpu(tp::DType::uint8, {static_cast<std::int64_t>(tensor_size)});
        for (std::size_t i = 0; i < tensor_size; ++i) t.data()[i] = pattern(peer, rank, 0, i);
    }

    int failures = 0;
    std::vector<double> small_us, tensor_us;
    for (int round = 0; round < rounds; ++round) {
        for (int peer = 0; peer < world_size; ++peer) {
            if (peer == rank) continue;
            const std::string to = "worker" + std::to_string(peer);
            tp::Message request;
            request.payload.resize(message_size);
            for (std::size_t i = 0; i < message_size; ++i) request.payload[i] = pattern(rank, peer, round, i);
            auto t0 = std::chrono::steady_clock::now();
            auto reply = co_await tp::rpc_async(to, "echo", request);
            small_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            if (!reply || reply->payload != request.payload) {
                ++failures;
                std::fprintf(stderr, "%s: 64-byte echo to %s: %s\n", name.c_str(), to.c_str(),
                             reply ? "reply differs" : reply.error().to_string().c_str());
            }

            const tp::Tensor& tensor = tensors[static_cast<std::size_t>(peer)];
            tensor.data()[0] = static_cast<std::uint8_t>(round);  // differs per round
            tp::Message with_tensor;
            with_tensor.tensors.push_back(tensor);
            t0 = std::chrono::steady_clock::now();
            auto treply = co_await tp::rpc_async(to, "echo", std::move(with_tensor));
            tensor_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            const bool same = treply && treply->tensors.size() == 1 && treply->tensors[0].nbytes() == tensor_size &&
                              std::memcmp(treply->tensors[0].data(), tensor.data(), tensor_size) == 0;
            if (!same) {
                ++failures;
                std::fprintf(stderr, "%s: 1 MiB tensor echo to %s: %s\n", name.c_str(), to.c_str(),
                             treply ? "reply differs" : treply.error().to_string().c_str());
            }
        }
    }
    std::printf("%s: %zu calls; 64 B echo p50 %.1f us p99 %.1f us; 1 MiB tensor echo p50 %.1f us p99 %.1f us; %d failed\n",
                name.c_str(), small_us.size() + tensor_us.size(), percentile(small_us, 50), percentile(small_us, 99),
                percentile(tensor_us, 50), percentile(tensor_us, 99), failures);
    if (stats) {
        auto info = co_await (*agent)->get_debug_info();
        if (info) std::printf("%s stats: %s\n", name.c_str(), info->to_json().c_str());
        else std::fprintf(stderr, "%s: stats: %s\n", name.c_str(), info.error().to_string().c_str());
    }
    std::fflush(stdout);

    auto down = co_await tp::shutdown(true, 60);
    if (!down) {
        std::fprintf(stderr, "%s: shutdown failed: %s\n", name.c_str(), down.error().to_string().c_str());
        co_return 1;
    }
    co_return failures == 0 ? 0 : 1;
}

int run_worker(int rank, int world_size, int rounds, bool local, bool stats) {
    asio::io_context ctx(1);
    int rc = 1;
    asio::co_spawn(ctx, worker(rank, world_size, rounds, local, stats), [&](std::exception_ptr e, int r) {
        rc = e ? 3 : r;
        ctx.stop();  // the worker is done; nothing left in the background matters
    });
    ctx.run();
    return rc;
}

// A port that was free a moment ago (rank 0's store binds it right away).
int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

int spawn_cluster(const char* self, int world_size, int rounds, int timeout_s, bool stats) {
    const int port = free_port();
    if (port <= 0) {
        std::perror("echo_cluster: finding a free port");
        return 1;
    }
    std::vector<pid_t> pids;
    for (int rank = 0; rank < world_size; ++rank) {
        std::fflush(nullptr);
        pid_t pid = ::fork();
        if (pid < 0) {
            std::perror("fork");
            for (pid_t p : pids) ::kill(p, SIGKILL);
            return 1;
        }
        if (pid == 0) {
            ::setenv("MASTER_ADDR", "127.0.0.1", 1);
            ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
            ::setenv("RANK", std::to_string(rank).c_str(), 1);
            ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
            ::setenv("ECHO_CLUSTER_LOCAL", "1", 1);
            const std::string r = std::to_string(rounds);
            ::execl("/proc/self/exe", self, "--rounds", r.c_str(), stats ? "--stats" : static_cast<char*>(nullptr),
                    static_cast<char*>(nullptr));
            std::perror("exec");
            ::_exit(127);
        }
        pids.push_back(pid);
    }
    // Reap with a deadline: a hung worker must not hang the test.
    int ok = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    std::vector<bool> done(pids.size(), false);
    for (std::size_t left = pids.size(); left > 0;) {
        for (std::size_t i = 0; i < pids.size(); ++i) {
            if (done[i]) continue;
            int status = 0;
            if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                done[i] = true;
                --left;
                if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++ok;
                else std::fprintf(stderr, "echo_cluster: worker %zu failed (status %d)\n", i, status);
            }
        }
        if (left > 0 && std::chrono::steady_clock::now() > deadline) {
            std::fprintf(stderr, "echo_cluster: workers still running after %d s; killing them\n", timeout_s);
            for (std::size_t i = 0; i < pids.size(); ++i)
                if (!done[i]) ::kill(pids[i], SIGKILL);
            for (std::size_t i = 0; i < pids.size(); ++i)
                if (!done[i]) ::waitpid(pids[i], nullptr, 0);
            return 1;
        }
        if (left > 0) ::usleep(20000);
    }
    std::printf("echo_cluster: %d/%d workers succeeded\n", ok, world_size);
    return ok == world_size ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    int world_size = 0, rounds = 20, timeout_s = 60;
    bool stats = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 < argc && a == "--world-size") world_size = std::atoi(argv[++i]);
        else if (i + 1 < argc && a == "--rounds") rounds = std::atoi(argv[++i]);
        else if (i + 1 < argc && a == "--timeout") timeout_s = std::atoi(argv[++i]);
        else if (a == "--stats") stats = true;
        else if (i + 1 < argc && a == "--transports") ::setenv("ECHO_CLUSTER_TRANSPORTS", argv[++i], 1);
        else if (i + 1 < argc && a == "--channels") ::setenv("ECHO_CLUSTER_CHANNELS", argv[++i], 1);
        else {
            std::fprintf(stderr, "usage: %s --world-size N [--rounds R] [--timeout S] [--stats] [--transports uv,uds] "
                                 "[--channels cma,basic]\n"
                                 "   or: MASTER_ADDR=.. MASTER_PORT=.. RANK=.. WORLD_SIZE=.. %s\n", argv[0], argv[0]);
            return 2;
        }
    }
    const bool launched = !env("MASTER_ADDR").empty() && !env("MASTER_PORT").empty() && !env("RANK").empty() &&
                          !env("WORLD_SIZE").empty();
    if (launched && world_size == 0)
        return run_worker(std::atoi(env("RANK").c_str()), std::atoi(env("WORLD_SIZE").c_str()), std::max(rounds, 1),
                          env("ECHO_CLUSTER_LOCAL") == "1", stats);
    if (world_size < 1) {
        std::fprintf(stderr, "%s: give --world-size N, or set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE\n", argv[0]);
        return 2;
    }
    return spawn_cluster(argv[0], world_size, std::max(rounds, 1), timeout_s, stats);
}
