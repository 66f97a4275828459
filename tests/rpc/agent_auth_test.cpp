// Native agent with peer authentication: keyed groups end to end, every source of the key,
// wrong and missing keys either way round, impostors, a replayed handshake, and the key never
// reaching the log.
#include "rpc/agent_test_util.hpp"

#include <tensorplay/core/log.hpp>

#include "support/raw_wire.hpp"
#include "transport/frame.hpp"

#include <asio/read.hpp>
#include <asio/write.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_agent_auth_test {

using namespace tensorplay;
using namespace std::chrono_literals;
namespace td = tensorplay::detail;

namespace {

constexpr const char* kKey = "k3y-for-the-auth-test-7f1c9e";

/// Captures every log line (at debug and above) while alive.
class LogCapture {
public:
    LogCapture() : level_(log_level()) {
        set_log_level(LogLevel::debug);
        set_log_sink([this](LogLevel level, std::string_view component, std::string_view message) {
            std::lock_guard lock(mutex_);
            lines_.push_back({level, std::string(component) + ": " + std::string(message)});
        });
    }
    ~LogCapture() {
        set_log_sink({});
        set_log_level(level_);
    }
    /// Whether a line at `level` or above contains every one of `parts`.
    bool has(LogLevel level, std::initializer_list<std::string_view> parts) {
        std::lock_guard lock(mutex_);
        for (auto& [l, text] : lines_) {
            if (l < level) continue;
            bool all = true;
            for (auto p : parts) all = all && text.find(p) != std::string::npos;
            if (all) return true;
        }
        return false;
    }
    std::size_t count() {
        std::lock_guard lock(mutex_);
        return lines_.size();
    }

private:
    LogLevel level_;
    std::mutex mutex_;
    std::vector<std::pair<LogLevel, std::string>> lines_;
};

/// Sets an environment variable for the life of the guard.
class EnvGuard {
public:
    EnvGuard(const char* name, const std::string& value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        ::setenv(name, value.c_str(), 1);
    }
    ~EnvGuard() {
        if (old_) ::setenv(name_, old_->c_str(), 1);
        else ::unsetenv(name_);
    }

private:
    const char* name_;
    std::optional<std::string> old_;
};

/// A temporary file holding `content`.
struct TempFile {
    std::string path;
    explicit TempFile(const std::string& content) {
        char p[] = "/tmp/tp_agent_auth_XXXXXX";
        int fd = ::mkstemp(p);
        REQUIRE(fd >= 0);
        REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
        ::close(fd);
        path = p;
    }
    ~TempFile() { std::remove(path.c_str()); }
};

test::Configure with_key(std::string key) {
    return [key](int, TensorPipeRpcBackendOptions& o) { o.auth_key = key; };
}

asio::ip::tcp::endpoint endpoint_of(const std::string& address) {
    auto colon = address.rfind(':');
    return {asio::ip::make_address(address.substr(0, colon)), static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1)))};
}

HelloInfo named(std::string name, int rank) {
    HelloInfo h;
    h.name = std::move(name);
    h.rank = rank;
    return h;
}

/// A connection to the agent at `address`, introducing itself as `name` / `rank` with `key`.
Task<Result<std::shared_ptr<Connection>>> outsider(std::string address, std::string name, int rank, std::string key) {
    const auto ep = endpoint_of(address);
    HandshakeAuth auth;
    auth.key = std::move(key);
    auto connecting = Connection::connect(ep.address().to_string(), ep.port(), named(std::move(name), rank), ConnectionLimits{},
                                          std::move(auth));
    co_return co_await std::move(connecting);
}

/// Calls "echo" both ways between workers 0 and 1.
Task<void> calls_work(test::AgentGroup& g) {
    for (int from = 0; from < 2; ++from) {
        auto r = co_await g[from]->rpc_async(test::worker_name(1 - from), "echo", test::text_message("ping"));
        REQUIRE(r);
        CHECK(r->payload == bytes("ping"));
    }
}

/// Forwards one connection's bytes both ways between `a` and `b`, recording what goes a -> b.
struct Proxy {
    asio::ip::tcp::socket a, b;
    Bytes recorded;
};

Task<void> pump(std::shared_ptr<Proxy> p, bool forward) {
    auto& from = forward ? p->a : p->b;
    auto& to = forward ? p->b : p->a;
    std::uint8_t buf[4096];
    for (;;) {
        auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), td::use_nothrow);
        if (ec) break;
        if (forward) p->recorded.insert(p->recorded.end(), buf, buf + n);
        auto [wec, m] = co_await asio::async_write(to, asio::buffer(buf, n), td::use_nothrow);
        if (wec) break;
    }
    std::error_code ignored;
    to.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
}

Task<td::Hello> read_full_hello(asio::ip::tcp::socket& s) {
    Bytes prefix(td::kHelloPrefixSize);
    auto [ec, n] = co_await asio::async_read(s, asio::buffer(prefix), td::use_nothrow);
    REQUIRE(!ec);
    auto p = td::decode_hello_prefix(prefix);
    REQUIRE(p);
    Bytes body(p->body_len);
    auto [ec2, n2] = co_await asio::async_read(s, asio::buffer(body), td::use_nothrow);
    REQUIRE(!ec2);
    auto h = td::decode_hello_body(body, ConnectionLimits{});
    REQUIRE(h);
    co_return std::move(*h);
}

/// Reads what is left on `s` until the peer closes it.
Task<Bytes> rest_until_closed(asio::ip::tcp::socket& s) {
    Bytes all;
    std::uint8_t buf[4096];
    for (;;) {
        auto [ec, n] = co_await s.async_read_some(asio::buffer(buf), td::use_nothrow);
        all.insert(all.end(), buf, buf + n);
        if (ec) co_return all;
    }
}

}  // namespace

TEST_CASE("a group with a shared key works end to end, and handlers see the proven caller", "[rpc][agent][auth]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        LogCapture logs;
        auto g = co_await test::make_group(3, with_key(kKey));
        for (auto& a : g.agents) {
            auto r = a->register_handler("whoami", [](WorkerInfo caller, Message) -> Task<Result<Message>> {
                co_return test::text_message(caller.name + "/" + std::to_string(caller.id));
            });
            REQUIRE(r);
        }
        for (int from = 0; from < 3; ++from)
            for (int to = 0; to < 3; ++to) {
                if (from == to) continue;
                auto r = co_await g[from]->rpc_async(test::worker_name(to), "whoami", test::text_message(""));
                REQUIRE(r);
                CHECK(r->payload == bytes(test::worker_name(from) + "/" + std::to_string(from)));
            }
        co_await test::shutdown_all(g);
        CHECK(logs.count() > 0);
        CHECK_FALSE(logs.has(LogLevel::trace, {kKey}));
    });
}

TEST_CASE("the key comes from auth_key_file, TP_RPC_AUTH_KEY_FILE or TP_RPC_AUTH_KEY", "[rpc][agent][auth]") {
    const int source = GENERATE(0, 1, 2);
    test::run_with_deadline(20s, [&]() -> Task<void> {
        TempFile file(std::string(kKey) + "\n");
        std::optional<EnvGuard> env;
        test::Configure configure;
        if (source == 0) configure = [&file](int, TensorPipeRpcBackendOptions& o) { o.auth_key_file = file.path; };
        if (source == 1) env.emplace("TP_RPC_AUTH_KEY_FILE", file.path);
        if (source == 2) env.emplace("TP_RPC_AUTH_KEY", kKey);
        auto g = co_await test::make_group(2, configure);
        test::register_echo(g);
        co_await calls_work(g);
        // The key is in use: a client with it is admitted, one without it is not.
        auto good = co_await outsider(g[0]->listen_address(), "worker1", 1, kKey);
        REQUIRE(good);
        auto bad = co_await outsider(g[0]->listen_address(), "worker1", 1, "");
        REQUIRE_FALSE(bad);
        CHECK(bad.error().code() == Errc::unauthorized);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("a key file that cannot be read fails init, naming the file", "[rpc][agent][auth]") {
    test::run_with_deadline(10s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(std::chrono::seconds(5));
        auto args = test::init_args(store, 0, 1, [](int, TensorPipeRpcBackendOptions& o) {
            o.auth_key_file = "/nonexistent/tp-auth-key";
        });
        auto a = co_await td::NativeAgent::create(std::move(args));
        REQUIRE_FALSE(a);
        CHECK(a.error().code() == Errc::invalid_argument);
        CHECK(a.error().message().find("/nonexistent/tp-auth-key") != std::string::npos);
    });
}

TEST_CASE("wrong or missing keys are refused either way round, and the good peers keep being served",
          "[rpc][agent][auth][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        LogCapture logs;
        auto ex = co_await asio::this_coro::executor;
        auto g = co_await test::make_group(2, with_key(kKey));
        test::register_echo(g);
        co_await calls_work(g);
        const std::string at0 = g[0]->listen_address();

        // Clients against the keyed worker0: a wrong key, and none.
        auto wrong = co_await outsider(at0, "worker1", 1, "not-the-key");
        REQUIRE_FALSE(wrong);
        CHECK(wrong.error().code() == Errc::unauthorized);
        CHECK(wrong.error().message().find("do both sides use the same TP_RPC_AUTH_KEY?") != std::string::npos);
        auto none = co_await outsider(at0, "worker1", 1, "");
        REQUIRE_FALSE(none);
        CHECK(none.error().code() == Errc::unauthorized);
        CHECK(none.error().message().find("requires authentication") != std::string::npos);
        co_await calls_work(g);
        CHECK(logs.has(LogLevel::warn, {"rejected a connection", "127.0.0.1", "unauthorized"}));

        // The keyed worker0 as the client: worker1's address now answers with a wrong key, then with none.
        const auto ep1 = endpoint_of(g[1]->listen_address());
        {
            auto gone = co_await g[1]->shutdown(false);
            REQUIRE(gone);
        }
        // (Until worker0 sees its connection to worker1 close, a call would go out on it.)
        for (int i = 0; i < 2000; ++i) {
            auto c = g[0]->connection_to(1);
            if (!c || !c->is_open()) break;
            co_await test::sleep_for(1ms);
        }
        for (const std::string server_key : {"not-the-key", ""}) {
            asio::ip::tcp::acceptor fake(ex);
            fake.open(ep1.protocol());
            fake.set_option(asio::socket_base::reuse_address(true));
            fake.bind(ep1);
            fake.listen();
            std::optional<Error> server_error;
            auto serve_one = [&fake, &server_error, server_key]() -> Task<void> {
                auto [ec, s] = co_await fake.async_accept(td::use_nothrow);
                if (ec) co_return;  // (the test failed and closed the acceptor)
                HandshakeAuth auth;
                auth.key = server_key;
                auto accepting = test::accept_socket(std::move(s), named("worker1", 1), ConnectionLimits{}, std::move(auth));
                auto c = co_await std::move(accepting);
                if (!c) server_error = c.error();
            };
            asio::co_spawn(ex, serve_one, td::log_task_error);
            auto r = co_await g[0]->rpc_async("worker1", "echo", test::text_message("x"), 5);
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::unauthorized);
            CHECK(r.error().message().find("TP_RPC_AUTH_KEY") != std::string::npos);
            for (int i = 0; i < 1000 && !server_error; ++i) co_await test::sleep_for(1ms);
            REQUIRE(server_error);
            CHECK(server_error->code() == Errc::unauthorized);
        }
        CHECK_FALSE(logs.has(LogLevel::trace, {kKey}));
        CHECK_FALSE(logs.has(LogLevel::trace, {"not-the-key"}));
        co_await test::shutdown_all(g, false);
    });
}

TEST_CASE("a group where one worker has no key does not start, and says why", "[rpc][agent][auth][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto store = std::make_shared<HashStore>(std::chrono::seconds(5));
        constexpr int n = 3;
        std::vector<std::optional<Result<test::AgentPtr>>> results(n);
        test::Signal done(ex, n);
        for (int r = 0; r < n; ++r) {
            auto args = test::init_args(store, r, n, [](int rank, TensorPipeRpcBackendOptions& o) {
                if (rank != 2) o.auth_key = kKey;
                o.rpc_timeout = 5;
            });
            asio::co_spawn(ex, td::NativeAgent::create(std::move(args)),
                           [&results, &done, r](std::exception_ptr, Result<test::AgentPtr> a) {
                               results[r] = std::move(a);
                               done.try_send(std::error_code{}, r);
                           });
        }
        for (int i = 0; i < n; ++i) co_await done.async_receive(asio::use_awaitable);
        int unauthorized = 0;
        for (int r = 0; r < n; ++r) {
            REQUIRE(results[r]);
            REQUIRE_FALSE(*results[r]);
            const auto code = results[r]->error().code();
            CHECK((code == Errc::unauthorized || code == Errc::connection_lost || code == Errc::timeout));
            if (code == Errc::unauthorized) {
                ++unauthorized;
                CHECK(results[r]->error().message().find("TP_RPC_AUTH_KEY") != std::string::npos);
            }
        }
        CHECK(unauthorized >= 1);
    });
}

TEST_CASE("a peer claiming another worker's name or rank is refused, with a key or without", "[rpc][agent][auth][fault]") {
    const bool keyed = GENERATE(true, false);
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto g = co_await test::make_group(3, with_key(keyed ? kKey : ""));
        test::register_echo(g);
        const std::string at0 = g[0]->listen_address();
        const std::string key = keyed ? kKey : "";
        struct Claim {
            const char* name;
            int rank;
            const char* why;
        };
        const Claim claims[] = {{"worker2", 1, "rank 1 of the group is worker \"worker1\", not \"worker2\""},
                                {"worker1", 2, "not \"worker1\""},
                                {"worker0", 0, "the worker connected to"},
                                {"intruder", 1, "not \"intruder\""},
                                {"worker1", 7, "rank 7 is not in the group"},
                                {"worker1", -1, "rank -1 is not in the group"}};
        for (const auto& c : claims) {
            auto r = co_await outsider(at0, c.name, c.rank, key);
            INFO("claiming " << c.name << " rank " << c.rank);
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::unauthorized);
            CHECK(r.error().message().find(c.why) != std::string::npos);
        }
        // The true claim is admitted.
        auto ok = co_await outsider(at0, "worker2", 2, key);
        CHECK(ok);
        auto r = co_await g[1]->rpc_async("worker0", "echo", test::text_message("still served"));
        REQUIRE(r);
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("a replayed handshake is refused: the server's nonce is fresh", "[rpc][agent][auth][fault]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        LogCapture logs;
        auto ex = co_await asio::this_coro::executor;
        auto g = co_await test::make_group(2, with_key(kKey));
        test::register_echo(g);
        const auto ep0 = endpoint_of(g[0]->listen_address());

        // A genuine client (worker1's identity, the key) through a recording proxy.
        asio::ip::tcp::acceptor front(ex, {asio::ip::make_address("127.0.0.1"), 0});
        auto proxy = std::make_shared<Proxy>(Proxy{asio::ip::tcp::socket(ex), asio::ip::tcp::socket(ex), {}});
        auto relay = [&front, proxy, ep0]() -> Task<void> {
            auto [ec, s] = co_await front.async_accept(td::use_nothrow);
            REQUIRE(!ec);
            proxy->a = std::move(s);
            auto [cec] = co_await proxy->b.async_connect(ep0, td::use_nothrow);
            REQUIRE(!cec);
            asio::co_spawn(co_await asio::this_coro::executor, pump(proxy, true), td::log_task_error);
            asio::co_spawn(co_await asio::this_coro::executor, pump(proxy, false), td::log_task_error);
        };
        asio::co_spawn(ex, relay, td::log_task_error);
        const std::string via = "127.0.0.1:" + std::to_string(front.local_endpoint().port());
        auto genuine = co_await outsider(via, "worker1", 1, kKey);
        REQUIRE(genuine);
        const Bytes recorded = proxy->recorded;  // its hello and its proof, nothing else
        REQUIRE(recorded.size() > td::kHelloPrefixSize + td::kAuthRecordHeaderSize + 32);

        // The same bytes again, straight to worker0, followed by a request.
        asio::ip::tcp::socket raw(ex);
        auto [cec] = co_await raw.async_connect(ep0, td::use_nothrow);
        REQUIRE(!cec);
        Bytes replay = recorded;
        Frame f;
        f.id = 1;
        f.name = "echo";
        f.payload = bytes("replayed");
        Bytes head;
        bool inl = false;
        REQUIRE(td::encode_frame_head(f, ConnectionLimits{}, head, inl));
        replay.insert(replay.end(), head.begin(), head.end());
        auto [wec, wn] = co_await asio::async_write(raw, asio::buffer(replay), td::use_nothrow);
        REQUIRE(!wec);
        auto theirs = co_await read_full_hello(raw);
        CHECK(theirs.step == td::HelloStep::proof);
        const Bytes rest = co_await rest_until_closed(raw);
        REQUIRE(rest.size() >= td::kAuthRecordHeaderSize);
        auto verdict = td::decode_auth_record(rest);  // one refusal, then the close: no reply frame
        REQUIRE(verdict);
        CHECK(verdict->kind == td::AuthRecordKind::refused);
        CHECK(logs.has(LogLevel::warn, {"rejected a connection", "wrong proof", "127.0.0.1"}));
        CHECK_FALSE(logs.has(LogLevel::trace, {kKey}));
        co_await calls_work(g);
        (*genuine)->close();
        proxy->a.close();
        proxy->b.close();
        co_await test::shutdown_all(g);
    });
}

TEST_CASE("init warns when the agent listens beyond loopback without a key", "[rpc][agent][auth]") {
    const int variant = GENERATE(0, 1, 2);  // any address without a key; with a key; loopback without
    test::run_with_deadline(20s, [&]() -> Task<void> {
        LogCapture logs;
        auto g = co_await test::make_group(1, [variant](int, TensorPipeRpcBackendOptions& o) {
            o.listen_address = variant == 2 ? "127.0.0.1" : "0.0.0.0";
            if (variant == 1) o.auth_key = kKey;
        });
        co_await test::shutdown_all(g);
        CHECK(logs.has(LogLevel::warn, {"without authentication", "TP_RPC_AUTH_KEY"}) == (variant == 0));
        CHECK_FALSE(logs.has(LogLevel::trace, {kKey}));
    });
}

}  // namespace tp_agent_auth_test
