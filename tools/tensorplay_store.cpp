// tensorplay-store: run a standalone c10d-compatible store server, or talk to any c10d store.
#include <tensorplay/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>

#include <charconv>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

using namespace tensorplay;

namespace {

constexpr const char* kUsage =
    "usage: tensorplay-store serve [--host H] [--port P]\n"
    "       tensorplay-store [--addr HOST:PORT] [--dialect auto|torch2|torch113] [--timeout S] COMMAND ARGS\n"
    "commands: set KEY VALUE | get KEY | add KEY N | wait KEY... | check KEY... | delete KEY | num-keys\n"
    "The dialect is detected unless --dialect or TP_STORE_DIALECT (auto|torch2|torch113) says otherwise.\n"
    "Exit status: 0 done; 1 failed, or check found a key missing (it prints false); 2 bad usage.\n";

struct Args {
    std::string command;
    std::vector<std::string> rest;
    std::string host;
    std::uint16_t port = 0;
    std::string addr = "127.0.0.1:29500";
    TcpStoreDialect dialect = TcpStoreDialect::automatic;
    double timeout_s = 30;
};

[[noreturn]] void die(const std::string& msg, int code = 1) {
    std::cerr << "tensorplay-store: " << msg << "\n";
    std::exit(code);
}

template <class T>
T number(const std::string& s, const char* what) {
    T v{};
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size()) die(std::string("invalid ") + what + ": \"" + s + "\"", 2);
    return v;
}

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        std::string s = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) die("option " + s + " needs a value\n" + kUsage, 2);
            return argv[++i];
        };
        if (s == "--host") a.host = value();
        else if (s == "--port") a.port = number<std::uint16_t>(value(), "port");
        else if (s == "--addr") a.addr = value();
        else if (s == "--timeout") a.timeout_s = std::stod(value());
        else if (s == "--dialect") {
            auto d = value();
            if (d == "auto") a.dialect = TcpStoreDialect::automatic;
            else if (d == "torch2") a.dialect = TcpStoreDialect::torch2;
            else if (d == "torch113") a.dialect = TcpStoreDialect::torch113;
            else die("unknown dialect \"" + d + "\" (auto, torch2 or torch113)", 2);
        } else if (s == "-h" || s == "--help") {
            std::cout << kUsage;
            std::exit(0);
        } else if (a.command.empty()) a.command = s;
        else a.rest.push_back(s);
    }
    if (a.command.empty()) die(std::string("no command\n") + kUsage, 2);
    return a;
}

int serve(const Args& a) {
    asio::io_context ctx(1);
    TcpStoreServerOptions o;
    o.host = a.host;
    o.port = a.port;
    auto server = TcpStoreServer::start(ctx.get_executor(), o);
    if (!server) die(server.error().to_string());
    std::cout << "listening on " << (*server)->address() << std::endl;
    asio::signal_set signals(ctx, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code ec, int) {
        if (!ec) (*server)->stop();
    });
    ctx.run();
    return 0;
}

Task<Result<std::string>> run_command(Args a) {
    auto ex = co_await asio::this_coro::executor;
    auto colon = a.addr.rfind(':');
    if (colon == std::string::npos) co_return fail(Errc::invalid_argument, "--addr needs HOST:PORT, got \"" + a.addr + "\"");
    TcpStoreOptions o;
    o.host = a.addr.substr(0, colon);
    if (o.host.size() > 2 && o.host.front() == '[' && o.host.back() == ']') o.host = o.host.substr(1, o.host.size() - 2);
    o.port = number<std::uint16_t>(a.addr.substr(colon + 1), "port");
    o.dialect = a.dialect;
    o.timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(a.timeout_s));
    auto need = [&](std::size_t n, bool at_least = false) {
        if (a.rest.size() < n || (!at_least && a.rest.size() != n))
            die("wrong number of arguments for " + a.command + "\n" + kUsage, 2);
    };
    const auto& c = a.command;
    if (c == "set") need(2);
    else if (c == "get" || c == "delete") need(1);
    else if (c == "add") need(2);
    else if (c == "wait" || c == "check") need(1, true);
    else if (c == "num-keys") need(0);
    else die("unknown command \"" + c + "\"\n" + kUsage, 2);

    auto store = co_await TcpStore::connect(ex, o);
    if (!store) co_return fail(store.error());
    auto& s = **store;
    if (c == "set") {
        auto r = co_await s.set(a.rest[0], bytes(a.rest[1]));
        if (!r) co_return fail(r.error());
        co_return std::string();
    }
    if (c == "get") {
        auto r = co_await s.get(a.rest[0]);
        if (!r) co_return fail(r.error());
        co_return to_string(*r) + "\n";
    }
    if (c == "add") {
        auto r = co_await s.add(a.rest[0], number<std::int64_t>(a.rest[1], "number"));
        if (!r) co_return fail(r.error());
        co_return std::to_string(*r) + "\n";
    }
    if (c == "wait") {
        auto r = co_await s.wait(a.rest, o.timeout);
        if (!r) co_return fail(r.error());
        co_return std::string();
    }
    if (c == "check") {
        auto r = co_await s.check(a.rest);
        if (!r) co_return fail(r.error());
        co_return std::string(*r ? "true\n" : "false\n");
    }
    if (c == "delete") {
        auto r = co_await s.delete_key(a.rest[0]);
        if (!r) co_return fail(r.error());
        co_return std::string(*r ? "true\n" : "false\n");
    }
    auto r = co_await s.num_keys();
    if (!r) co_return fail(r.error());
    co_return std::to_string(*r) + "\n";
}

}  // namespace

int main(int argc, char** argv) {
    Args a = parse(argc, argv);
    if (a.command == "serve") return serve(a);
    asio::io_context ctx(1);
    std::optional<Result<std::string>> result;
    asio::co_spawn(ctx, run_command(a), [&](std::exception_ptr e, Result<std::string> r) {
        if (e) r = fail(Errc::internal, "the command threw");
        result = std::move(r);
        ctx.stop();
    });
    ctx.run();
    if (!result) die("the command did not finish");
    if (!*result) die(result->error().to_string());
    std::fputs((*result)->c_str(), stdout);
    // As test(1): a check that finds a key missing is a failure the shell can branch on.
    if (a.command == "check" && **result == "false\n") return 1;
    return 0;
}
