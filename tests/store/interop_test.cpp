// Interop with PyTorch 1.13's c10d TCPStore: its client against our server, our client against its server.
// Exits 77 (meson's skip) with a message when /usr/bin/python3 has no torch.
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include "store/store_test_util.hpp"
#include "support/catch_runner.hpp"
#include "support/deadline.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

#ifndef TP_INTEROP_DIR
#error "TP_INTEROP_DIR must name tests/store/interop"
#endif

namespace {

const std::string kPython = "/usr/bin/python3";

TcpStoreOptions legacy_options(std::uint16_t port, TcpStoreDialect dialect = TcpStoreDialect::torch113) {
    TcpStoreOptions o;
    o.port = port;
    o.timeout = 10s;
    o.dialect = dialect;
    return o;
}

Task<void> prepare_for_torch_client(std::uint16_t port) {
    auto ex = co_await asio::this_coro::executor;
    auto c = co_await TcpStore::connect(ex, legacy_options(port));
    REQUIRE(c);
    CO_REQUIRE(co_await (*c)->set("from_cpp", bytes("hello")));
    CO_REQUIRE(co_await (*c)->add("cpp_counter", 7));
}

Task<void> check_after_torch_client(std::uint16_t port) {
    auto ex = co_await asio::this_coro::executor;
    auto c = co_await TcpStore::connect(ex, legacy_options(port));
    REQUIRE(c);
    auto v = co_await (*c)->get("from_py");
    REQUIRE(v);
    const Bytes expected{0x00, 0xff, 'b', 'i', 'n', 'a', 'r', 'y'};
    REQUIRE(*v == expected);
    auto p = co_await (*c)->get("rpc_prefix_0/names/1");  // PrefixStore's key layout
    REQUIRE((p && to_string(*p) == "w1"));
    auto init = co_await (*c)->check(keys("py_done"));
    REQUIRE((init && *init));
}

Task<void> exercise_torch_server(std::uint16_t port, TcpStoreDialect dialect) {
    auto ex = co_await asio::this_coro::executor;
    auto cr = co_await TcpStore::connect(ex, legacy_options(port, dialect));
    REQUIRE(cr);
    auto c = *cr;
    REQUIRE_FALSE(c->has_extended_api());
    auto hi = co_await c->get("from_py");
    REQUIRE((hi && to_string(*hi) == "hi"));
    CO_REQUIRE(co_await c->set("cpp_set", bytes("v1")));
    auto n = co_await c->add("cpp_counter", 12);
    REQUIRE((n && *n == 12));
    n = co_await c->add("cpp_counter", -2);
    REQUIRE((n && *n == 10));
    auto cas = co_await c->compare_set("cas", Bytes{}, bytes("n1"));  // absent, empty expected: stored
    REQUIRE((cas && to_string(*cas) == "n1"));
    cas = co_await c->compare_set("cas", bytes("n1"), bytes("v2"));
    REQUIRE((cas && to_string(*cas) == "v2"));
    cas = co_await c->compare_set("cas", bytes("zz"), bytes("v3"));
    REQUIRE((cas && to_string(*cas) == "v2"));
    cas = co_await c->compare_set("cas-absent", bytes("xx"), bytes("yy"));
    REQUIRE((cas && to_string(*cas) == "xx"));
    auto chk = co_await c->check(keys("cpp_set", "cas"));
    REQUIRE((chk && *chk));
    chk = co_await c->check(keys("cpp_set", "nope"));
    REQUIRE((chk && !*chk));
    // A timed-out wait must not desynchronise the connection (PyTorch 1.13's own client does).
    auto w = co_await c->wait(keys("late"), 200ms);
    REQUIRE_FALSE(w);
    REQUIRE(w.error().code() == Errc::timeout);
    CO_REQUIRE(co_await c->set("late", bytes("L")));
    auto late = co_await c->get("late");
    REQUIRE((late && to_string(*late) == "L"));
    // Concurrent waiters on one client, woken by a set from the same client.
    Spawned<void> waiter(ex, c->wait(keys("go"), 5s));
    co_await pause(50ms);
    REQUIRE_FALSE(waiter.ready());
    CO_REQUIRE(co_await c->set("go", bytes("1")));
    CO_REQUIRE(co_await waiter.join());
    CO_REQUIRE(co_await c->append("cpp_appended", bytes("ab")));
    CO_REQUIRE(co_await c->append("cpp_appended", bytes("cd")));
    CO_REQUIRE(co_await c->multi_set(keys("cpp_multi1", "cpp_multi2"), vals(bytes("m1"), bytes("m2"))));
    auto mg = co_await c->multi_get(keys("cpp_multi2", "cpp_multi1"));
    REQUIRE((mg && mg->size() == 2 && to_string((*mg)[0]) == "m2" && to_string((*mg)[1]) == "m1"));
    auto del = co_await c->delete_key("cas");
    REQUIRE((del && *del));
    del = co_await c->delete_key("cas");
    REQUIRE((del && !*del));
    auto nk = co_await c->num_keys();
    REQUIRE((nk && *nk >= 8));
    CO_REQUIRE(co_await c->ping());
    CO_REQUIRE(co_await c->set("cpp_done", bytes("1")));
}

}  // namespace

TEST_CASE("PyTorch's TCPStore client works against our server", "[interop]") {
    Runtime rt;
    auto server = TcpStoreServer::start(rt.get_executor(), {.host = "127.0.0.1"});
    REQUIRE(server);
    const auto port = (*server)->port();
    run_with_deadline_on(rt.get_executor(), 10s, [port]() -> Task<void> { co_await prepare_for_torch_client(port); });
    const std::string cmd = "timeout 60 " + kPython + " " + TP_INTEROP_DIR + "/torch_client.py 127.0.0.1 " +
                            std::to_string(port);
    const int status = std::system(cmd.c_str());
    REQUIRE(status == 0);
    run_with_deadline_on(rt.get_executor(), 10s, [port]() -> Task<void> { co_await check_after_torch_client(port); });
    (*server)->stop();
}

TEST_CASE("our TcpStore client (torch113 dialect, given or detected) works against PyTorch's server", "[interop]") {
    // automatic: the client tries the torch2 handshake, PyTorch 1.13 drops that connection, and
    // the client reconnects in the 1.13 dialect by itself (as under torchrun's default mode).
    const auto dialect = GENERATE(TcpStoreDialect::torch113, TcpStoreDialect::automatic);
    INFO("dialect " << (dialect == TcpStoreDialect::automatic ? "automatic" : "torch113"));
    const std::string cmd = "timeout 60 " + kPython + " " + TP_INTEROP_DIR + "/torch_server.py";
    FILE* py = ::popen(cmd.c_str(), "r");
    REQUIRE(py);
    char line[256] = {0};
    std::uint16_t port = 0;
    while (std::fgets(line, sizeof line, py)) {
        if (std::string(line).rfind("PORT ", 0) == 0) {
            port = static_cast<std::uint16_t>(std::atoi(line + 5));
            break;
        }
    }
    REQUIRE(port != 0);
    {
        Runtime rt;
        run_with_deadline_on(rt.get_executor(), 20s,
                             [port, dialect]() -> Task<void> { co_await exercise_torch_server(port, dialect); });
    }
    std::string rest;
    while (std::fgets(line, sizeof line, py)) rest += line;
    const int status = ::pclose(py);
    INFO("python said: " << rest);
    REQUIRE(rest.find("VERIFIED") != std::string::npos);
    REQUIRE(status == 0);
}

int main(int argc, char** argv) {
    const std::string probe = kPython + " -c \"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)\" 2>/dev/null";
    if (std::system(probe.c_str()) != 0) {
        std::printf("SKIP: PyTorch is not installed for %s (install python3-torch to run the interop tests)\n",
                    kPython.c_str());
        return 77;
    }
    return tensorplay::test::run_catch_session(argc, argv);
}
