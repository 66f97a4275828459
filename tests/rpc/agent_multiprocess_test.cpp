// Native agent across processes: forked workers rendezvous over a TcpStore, echo, and survive a SIGKILLed peer.
#include "rpc/agent_test_util.hpp"
#include "rpc/forked.hpp"

#include <tensorplay/store/collectives.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <asio/io_context.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_agent_multiprocess_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

enum class Scenario { echo, killed_peer };

/// killed_peer: calls rank 0 has pending on rank 1 when rank 1 is killed.
constexpr int kPendingCalls = 5;

struct Fds {
    std::vector<std::array<int, 2>> port_pipes;  // rank 0 tells rank r the store's port
    std::array<int, 2> notify{-1, -1};           // rank 0 tells the parent "calls are pending"
};

Tensor pattern(std::size_t n, int seed) {
    Tensor t = Tensor::cpu(DType::uint8, std::vector<std::int64_t>(1, static_cast<std::int64_t>(n)));
    for (std::size_t i = 0; i < n; ++i) t.data()[i] = static_cast<std::uint8_t>(i * 31 + seed);
    return t;
}

/// The body of one forked worker; returns its exit code (0 = every check held).
Task<int> worker(int rank, int world, Scenario scenario, Fds fds) {
    auto ex = co_await asio::this_coro::executor;
    std::shared_ptr<TcpStoreServer> server;
    std::uint16_t port = 0;
    if (rank == 0) {
        TcpStoreServerOptions so;
        so.host = "127.0.0.1";
        auto s = TcpStoreServer::start(ex, so);
        if (!s) co_return 10;
        server = *s;
        port = server->port();
        for (int r = 1; r < world; ++r)
            if (::write(fds.port_pipes[r][1], &port, sizeof port) != sizeof port) co_return 11;
    } else if (::read(fds.port_pipes[rank][0], &port, sizeof port) != sizeof port) {
        co_return 12;
    }
    auto store = co_await TcpStore::connect(ex, test::local_store(port, 10s));
    if (!store) co_return 13;
    auto agent = co_await detail::NativeAgent::create(test::init_args(*store, rank, world, {}));
    if (!agent) {
        std::fprintf(stderr, "rank %d: %s\n", rank, agent.error().to_string().c_str());
        co_return 14;
    }
    auto& a = *agent;
    if (!a->register_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; })) co_return 15;
    // "never" answers only once the test is over: it counts itself in, then holds the call until
    // rank 0 sets test/done (in killed_peer its worker is SIGKILLed long before).
    std::shared_ptr<Store> st = *store;
    if (!a->register_handler("never", [st](WorkerInfo, Message m) -> Task<Result<Message>> {
            auto entered = co_await st->add("test/entered", 1);
            if (entered && *entered == kPendingCalls) {
                Bytes one = bytes("1");
                (void)co_await st->set("test/all_entered", std::move(one));
            }
            std::vector<std::string> done(1, "test/done");
            (void)co_await st->wait(std::move(done), 20s);
            co_return m;
        }))
        co_return 15;
    if (!co_await barrier(**store, rank, world)) co_return 16;  // every handler is registered

    if (scenario == Scenario::echo) {
        for (int r = 0; r < world; ++r) {
            Message m;
            m.payload = Bytes(64, static_cast<std::uint8_t>(rank));
            m.tensors.push_back(pattern(1 << 20, rank * 7 + r));
            auto reply = co_await a->rpc_async(test::worker_name(r), "echo", m);
            if (!reply) {
                std::fprintf(stderr, "rank %d: %s\n", rank, reply.error().to_string().c_str());
                co_return 20;
            }
            if (reply->payload != m.payload || reply->tensors.size() != 1 ||
                !std::equal(m.tensors[0].bytes().begin(), m.tensors[0].bytes().end(), reply->tensors[0].bytes().begin()))
                co_return 21;
        }
        auto s = co_await a->shutdown(true, 10);
        if (!s) {
            std::fprintf(stderr, "rank %d: %s\n", rank, s.error().to_string().c_str());
            co_return 22;
        }
        co_return 0;
    }

    // killed_peer: rank 1 is killed while rank 0 has calls pending on it; if it is not, it sees
    // test/done (rank 0 finished without it dying) and fails.
    if (rank == 1) {
        std::vector<std::string> done_key(1, "test/done");
        (void)co_await (*store)->wait(std::move(done_key), 20s);
        co_return 30;
    }
    if (rank != 0) {  // bystanders wait until rank 0 is done with them
        std::vector<std::string> done_key(1, "test/done");
        if (!co_await (*store)->wait(std::move(done_key), 15s)) co_return 36;
        if (!co_await (*store)->set("test/ack", bytes("1"))) co_return 38;  // rank 0 keeps the store until here
        (void)co_await a->shutdown(false);
        co_return 0;
    }
    constexpr int n = kPendingCalls;
    std::vector<std::optional<Result<Message>>> pending(n);
    detail::Channel<void(std::error_code, int)> finished(ex, n);
    for (int i = 0; i < n; ++i)
        asio::co_spawn(ex, a->rpc_async("worker1", "never", {}, 30),
                       [&pending, &finished, i](std::exception_ptr, Result<Message> r) {
                           pending[i] = std::move(r);
                           finished.try_send(std::error_code{}, i);
                       });
    {
        std::vector<std::string> entered_key(1, "test/all_entered");  // every call is in worker1's handler
        if (!co_await (*store)->wait(std::move(entered_key), 10s)) co_return 31;
    }
    char k = 'k';
    if (::write(fds.notify[1], &k, 1) != 1) co_return 31;
    auto t0 = Clock::now();
    // (a call that never ends leaves this child to its io_context's 25 s limit: exit 99, a failure)
    for (int i = 0; i < n; ++i) co_await finished.async_receive(asio::use_awaitable);
    auto took = Clock::now() - t0;
    for (auto& p : pending)
        if (*p || p->error().code() != Errc::connection_lost) co_return 33;
    if (took > 1s) co_return 34;
    // The rest of the group still works.
    if (world > 2 && !co_await a->rpc_async("worker2", "echo", {})) co_return 35;
    if (!co_await (*store)->set("test/done", bytes("1"))) co_return 37;
    if (world > 2) {
        std::vector<std::string> ack_key(1, "test/ack");
        if (!co_await (*store)->wait(std::move(ack_key), 15s)) co_return 39;
    }
    (void)co_await a->shutdown(false);
    co_return 0;
}

int child_main(int rank, int world, Scenario scenario, Fds fds) {
    int code = 99;
    {
        asio::io_context ctx(1);
        asio::co_spawn(ctx, worker(rank, world, scenario, fds), [&code](std::exception_ptr e, int c) { code = e ? 98 : c; });
        ctx.run_for(25s);
    }
    return code;
}

struct Children {
    std::vector<pid_t> pids;
    Fds fds;
};

Children spawn(int world, Scenario scenario) {
    Children c;
    c.fds.port_pipes.resize(world);
    for (auto& p : c.fds.port_pipes) REQUIRE(::pipe(p.data()) == 0);
    REQUIRE(::pipe(c.fds.notify.data()) == 0);
    for (int r = 0; r < world; ++r) {
        pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) ::_exit(child_main(r, world, scenario, c.fds));
        c.pids.push_back(pid);
    }
    return c;
}

}  // namespace

TEST_CASE("worker processes echo messages and tensors to each other and shut down gracefully", "[rpc][agent][multiprocess]") {
    auto c = spawn(3, Scenario::echo);
    auto codes = test::reap(c.pids, 30s);
    for (std::size_t r = 0; r < codes.size(); ++r) {
        INFO("rank " << r);
        CHECK(codes[r] == 0);
    }
}

TEST_CASE("calls pending on a SIGKILLed worker fail with connection_lost within a second", "[rpc][agent][multiprocess][fault]") {
    auto c = spawn(3, Scenario::killed_peer);
    pollfd p{c.fds.notify[0], POLLIN, 0};
    int ready = ::poll(&p, 1, 20000);
    char k = 0;
    if (ready == 1 && ::read(c.fds.notify[0], &k, 1) == 1) ::kill(c.pids[1], SIGKILL);
    auto codes = test::reap(c.pids, 30s);
    CHECK(k == 'k');
    CHECK(codes[0] == 0);
    CHECK(codes[1] == -SIGKILL);
    CHECK(codes[2] == 0);
}

}  // namespace tp_agent_multiprocess_test
