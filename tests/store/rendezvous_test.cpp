// Tests of rendezvous: URL and environment errors (table), file:// across ranks, tcp:// and env:// with real servers.
#include <tensorplay/store/rendezvous.hpp>

#include <tensorplay/core/log.hpp>
#include <tensorplay/store/collectives.hpp>
#include <tensorplay/store/hash_store.hpp>
#include <tensorplay/store/prefix_store.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include "store/launcher_env.hpp"
#include "store/store_test_util.hpp"
#include "support/deadline.hpp"

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include <unistd.h>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_rendezvous_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

const char* const kVars[] = {"MASTER_ADDR",  "MASTER_PORT",  "RANK",          "WORLD_SIZE",         "TORCHELASTIC_USE_AGENT_STORE",
                             "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                             "SLURM_JOB_ID"};

// Sets the rendezvous variables for one test (unset unless given) and restores them afterwards.
class EnvScope {
public:
    explicit EnvScope(const std::map<std::string, std::string>& values) {
        for (const char* name : kVars) {
            const char* old = std::getenv(name);
            saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
            ::unsetenv(name);
        }
        for (const auto& [k, v] : values) ::setenv(k.c_str(), v.c_str(), 1);
    }
    ~EnvScope() {
        for (const auto& [k, v] : saved_) {
            if (v)
                ::setenv(k.c_str(), v->c_str(), 1);
            else
                ::unsetenv(k.c_str());
        }
    }

private:
    std::map<std::string, std::optional<std::string>> saved_;
};

std::string temp_file(const std::string& name) {
    auto p = std::filesystem::temp_directory_path() /
             ("tp_rendezvous_test." + std::to_string(::getpid()) + "." + name);
    std::filesystem::remove(p);
    return p.string();
}

struct BadCase {
    std::string url;
    int rank, world;
    std::map<std::string, std::string> env;
    std::string says;
};

const std::map<std::string, std::string> kGoodEnv{
    {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}};

std::map<std::string, std::string> env_without(std::string name) {
    auto e = kGoodEnv;
    e.erase(name);
    return e;
}

std::map<std::string, std::string> env_with(std::string name, std::string value) {
    auto e = kGoodEnv;
    e[name] = value;
    return e;
}

// One rank of a file:// or tcp:// group: rendezvous, then gather every rank's name.
// `from_url`: pass -1 for both, so that they come from the URL's query.
Task<Result<std::vector<Bytes>>> rank_joins(std::string url, int rank, int world, bool from_url = false) {
    auto rv = co_await rendezvous(url, from_url ? -1 : rank, from_url ? -1 : world, 5s);
    if (!rv) co_return fail(rv.error());
    if (rv->rank != rank || rv->world_size != world) co_return fail(Errc::internal, "rank/world_size not reported");
    co_return co_await all_gather(*rv->store, rank, world, bytes("rank" + std::to_string(rank)));
}

// A port that was free a moment ago (bound and closed at once; a tiny race with other programs
// is accepted in the two tests that need a fixed port).
std::uint16_t free_port(Executor ex) {
    asio::ip::tcp::acceptor a(ex, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    auto port = a.local_endpoint().port();
    a.close();
    return port;
}

std::vector<Bytes> names(int world) {
    std::vector<Bytes> out;
    for (int r = 0; r < world; ++r) out.push_back(bytes("rank" + std::to_string(r)));
    return out;
}

}  // namespace

TEST_CASE("rendezvous refuses bad URLs and environments naming the culprit", "[store]") {
    const std::vector<BadCase> cases{
        {"nonsense", 0, 1, {}, "not a URL"},
        {"udp://h:1", 0, 1, {}, "unknown scheme \"udp://\""},
        {"tcp://host", 0, 1, {}, "a port is required"},
        {"tcp://host:abc", 0, 1, {}, "port \"abc\""},
        {"tcp://host:70000", 0, 1, {}, "0..65535"},
        {"tcp://:5", 0, 1, {}, "the host is empty"},
        {"tcp://[::1:5", 0, 1, {}, "unterminated ["},
        {"tcp://::1:5", 0, 1, {}, "must be in brackets"},
        {"tcp://h:5", -1, 2, {}, "rank is not set"},
        {"tcp://h:5", -2, -1, {}, "a dynamic group's member still needs a rank >= 0"},
        {"tcp://h:5?rank=x", -1, 2, {}, "rank=\"x\" is not an integer"},
        {"tcp://h:5?rank", -1, 2, {}, "\"rank\" is not name=value"},
        {"tcp://h:5", 2, 2, {}, "rank 2 is outside the world [0, 2)"},
        {"tcp://h:5?rank=3&world_size=3", -1, -1, {}, "rank 3 is outside the world [0, 3)"},
        {"tcp://h:5", 0, 0, {}, "world_size must be at least 1"},
        {"tcp://h:0", 1, 2, {}, "port 0 is only for the rank that hosts"},
        {"file://", 0, 1, {}, "no path after file://"},
        {"env://", -1, -1, env_without("MASTER_ADDR"), "environment variable MASTER_ADDR expected, but not set"},
        {"env://", -1, -1, env_without("MASTER_PORT"), "environment variable MASTER_PORT expected, but not set"},
        {"env://", -1, -1, env_without("RANK"), "environment variable RANK expected, but not set"},
        {"env://", -1, -1, env_with("MASTER_PORT", "http"), "MASTER_PORT must be an integer, got \"http\""},
        {"env://", -1, -1, env_with("MASTER_PORT", "99999"), "MASTER_PORT must be in 0..65535"},
        {"env://", -1, -1, env_with("WORLD_SIZE", "two"), "WORLD_SIZE must be an integer, got \"two\""},
        {"env://", -1, -1, env_with("RANK", "5"), "rank 5 is outside the world [0, 2)"},
        {"env://", -1, -1, env_with("RANK", "1x"), "RANK must be an integer"},
        {"env://", -1, -1, env_with("TORCHELASTIC_USE_AGENT_STORE", "True"),
         "environment variable TORCHELASTIC_RESTART_COUNT expected, but not set"},
        {"env://host:1", -1, -1, kGoodEnv, "env:// takes no address"},
        {"env://", -1, -1, env_without("RANK"), "(nor Slurm's SLURM_PROCID)"},
        // Slurm's variables stand in for torch's unset ones, and say so when they are wrong.
        {"env://", -1, -1, {{"MASTER_PORT", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[3-1]"}},
         "the Slurm host list \"n[3-1]\" has the range \"3-1\", which runs backwards"},
        {"env://", -1, -1, {{"MASTER_ADDR", "h"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "12a"}},
         "SLURM_JOB_ID \"12a\" is not a job number"},
        {"env://", -1, -1, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}},
         "SLURM_PROCID must be an integer, got \"x\" (for RANK)"},
        {"env://", -1, -1, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}},
         "rank 2 is outside the world [0, 2)"},
    };
    for (const auto& c : cases) {
        EnvScope env(c.env);
        INFO("init_method " << c.url << " rank " << c.rank << " world " << c.world);
        run_with_deadline(5s, [&c]() -> Task<void> {
            auto start = Clock::now();
            auto r = co_await rendezvous(c.url, c.rank, c.world, 5s);
            REQUIRE_FALSE(r);
            REQUIRE(r.error().code() == Errc::invalid_argument);
            INFO(r.error().message());
            REQUIRE(r.error().message().find(c.says) != std::string::npos);
            REQUIRE(Clock::now() - start < 1s);  // refused before any connection attempt
        });
    }
}

TEST_CASE("file:// rendezvous gives every rank one shared store", "[store]") {
    auto path = temp_file("group");
    run_with_deadline(10s, [path]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        constexpr int kWorld = 4;
        std::vector<std::unique_ptr<Spawned<std::vector<Bytes>>>> ranks;
        for (int r = 0; r < kWorld; ++r) {
            // half the ranks give rank and world_size in the URL instead of the arguments
            auto url = "file://" + path + (r % 2 ? "?rank=" + std::to_string(r) + "&world_size=4" : "");
            ranks.push_back(std::make_unique<Spawned<std::vector<Bytes>>>(
                ex, rank_joins(url, r, kWorld, r % 2 == 1)));
        }
        for (auto& r : ranks) {
            auto v = co_await r->join();
            CO_REQUIRE(v);
            REQUIRE(*v == names(kWorld));
        }
    });
    std::filesystem::remove(path);
}

TEST_CASE("tcp:// rendezvous: rank 0 hosts on an ephemeral port, the others join it", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        constexpr int kWorld = 3;
        auto host = co_await rendezvous("tcp://127.0.0.1:0", 0, kWorld, 5s);
        CO_REQUIRE(host);
        REQUIRE(host->server);
        const auto port = std::to_string(host->server->port());
        Spawned<std::vector<Bytes>> r0(ex, all_gather(*host->store, 0, kWorld, bytes("rank0")));
        std::vector<std::unique_ptr<Spawned<std::vector<Bytes>>>> others;
        for (int r = 1; r < kWorld; ++r)
            others.push_back(std::make_unique<Spawned<std::vector<Bytes>>>(
                ex, rank_joins("tcp://127.0.0.1:" + port, r, kWorld)));
        auto v0 = co_await r0.join();
        CO_REQUIRE(v0);
        REQUIRE(*v0 == names(kWorld));
        for (auto& o : others) {
            auto v = co_await o->join();
            CO_REQUIRE(v);
            REQUIRE(*v == names(kWorld));
        }
    });
}

TEST_CASE("the store rank 0 hosts takes the limits it is given", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        TcpStoreServerOptions hosted;
        hosted.max_value_size = 1024;
        auto host = co_await rendezvous("tcp://127.0.0.1:0", 0, 1, 5s, hosted);
        CO_REQUIRE(host);
        REQUIRE(host->server);
        const Bytes fits(1024, 1);
        auto small = co_await host->store->set("fits", fits);
        CO_REQUIRE(small);
        const Bytes over(1025, 1);
        (void)co_await host->store->set("over", over);  // (SET has no reply: the server closes the connection that sent it)
        const std::vector<std::string> keys(1, "over");
        auto stored = co_await host->store->check(keys);  // the connection is gone, or the key is not there
        REQUIRE_FALSE((stored && *stored));
    });
}

TEST_CASE("tcp:// rendezvous on a fixed port: rank 0 waits for the world to connect", "[store]") {
    run_with_deadline(15s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto port = free_port(ex);
        const auto url = "tcp://127.0.0.1:" + std::to_string(port);
        Spawned<Rendezvous> r0(ex, rendezvous(url, 0, 2, 5s));
        co_await pause(50ms);
        if (r0.ready()) {
            auto early = co_await r0.join();
            FAIL("rank 0 returned before rank 1 joined: " << (early ? std::string("ok") : early.error().to_string()));
        }
        auto r1 = co_await rendezvous(url, 1, 2, 5s);
        CO_REQUIRE(r1);
        REQUIRE_FALSE(r1->server);
        auto host = co_await r0.join();
        CO_REQUIRE(host);
        REQUIRE(host->server);
        CO_REQUIRE(co_await r1->store->set("hello", bytes("from 1")));
        auto v = co_await host->store->get("hello");
        REQUIRE((v && *v == bytes("from 1")));
    });
}

TEST_CASE("env:// rendezvous reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        for (bool from_env : {true, false}) {
            auto server = TcpStoreServer::start(ex, {.host = "127.0.0.1"});
            CO_REQUIRE(server);
            const auto port = std::to_string((*server)->port());
            TcpStoreOptions o;
            o.port = (*server)->port();
            auto zero = co_await TcpStore::connect(ex, o);  // rank 0 of the world, joining by hand
            CO_REQUIRE(zero);
            Spawned<void> rank0(ex, join_world(**zero, 0, 2, 5s));
            {
                // from_env: everything from the environment; else the arguments win over it
                EnvScope env({{"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", port},
                              {"RANK", from_env ? "1" : "0"},
                              {"WORLD_SIZE", from_env ? "2" : "5"}});
                auto rv = co_await rendezvous("env://", from_env ? -1 : 1, from_env ? -1 : 2, 5s);
                CO_REQUIRE(rv);
                REQUIRE(rv->rank == 1);
                REQUIRE(rv->world_size == 2);
                REQUIRE_FALSE(rv->server);  // rank 1 never hosts
                CO_REQUIRE(co_await rv->store->set("via-env", bytes("x")));
            }
            CO_REQUIRE(co_await rank0.join());
            auto v = co_await (*zero)->get("via-env");
            REQUIRE((v && *v == bytes("x")));
        }
    });
}

TEST_CASE("env:// rank 0 hosts the store itself", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        EnvScope env({{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "0"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}});
        auto rv = co_await rendezvous("env://", -1, -1, 5s);
        CO_REQUIRE(rv);
        REQUIRE(rv->server);
        REQUIRE(rv->server->port() != 0);
        auto g = co_await all_gather(*rv->store, 0, 1, bytes("me"));
        CO_REQUIRE(g);
    });
}

TEST_CASE("env:// without WORLD_SIZE starts a dynamic member: rank 0 hosts, the others connect, nobody waits for a world", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        std::shared_ptr<Store> zero_store;
        std::shared_ptr<TcpStoreServer> server;
        {
            EnvScope env({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "0"}, {"RANK", "0"}});
            auto rv = co_await rendezvous("env://", -1, -1, 5s);
            CO_REQUIRE(rv);
            REQUIRE(rv->world_size == -1);
            REQUIRE(rv->server);
            server = rv->server;
            zero_store = rv->store;
        }
        // Rank 3 of no world: it connects and returns at once (no other rank joins a world).
        EnvScope env({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(server->port())}, {"RANK", "3"}});
        auto rv = co_await rendezvous("env://", -1, -1, 5s);
        CO_REQUIRE(rv);
        REQUIRE(rv->rank == 3);
        REQUIRE(rv->world_size == -1);
        REQUIRE_FALSE(rv->server);
        CO_REQUIRE(co_await rv->store->set("dynamic", bytes("yes")));
        auto v = co_await zero_store->get("dynamic");
        REQUIRE((v && *v == bytes("yes")));
    });
}

TEST_CASE("env:// with the agent store connects as a client under /worker/attempt_N", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = TcpStoreServer::start(ex, {.host = "127.0.0.1"});  // the launcher's store
        CO_REQUIRE(server);
        const auto port = std::to_string((*server)->port());
        {
            EnvScope env({{"MASTER_ADDR", "127.0.0.1"},
                          {"MASTER_PORT", port},
                          {"RANK", "0"},
                          {"WORLD_SIZE", "2"},
                          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                          {"TORCHELASTIC_RESTART_COUNT", "3"}});
            Spawned<Rendezvous> rank1(ex, rendezvous("env://", 1, -1, 5s));
            auto rv = co_await rendezvous("env://", -1, -1, 5s);
            CO_REQUIRE(rv);
            REQUIRE_FALSE(rv->server);  // rank 0 too is only a client
            auto rv1 = co_await rank1.join();
            CO_REQUIRE(rv1);
            REQUIRE_FALSE(rv1->server);
            auto prefixed = std::dynamic_pointer_cast<PrefixStore>(rv->store);
            REQUIRE(prefixed);
            REQUIRE(prefixed->prefix() == "/worker/attempt_3");
            CO_REQUIRE(co_await rv->store->set("k", bytes("v")));
        }
        TcpStoreOptions o;
        o.port = (*server)->port();
        auto raw = co_await TcpStore::connect(ex, o);
        CO_REQUIRE(raw);
        auto v = co_await (*raw)->get("/worker/attempt_3/k");
        REQUIRE((v && *v == bytes("v")));
    });
}

TEST_CASE("tcp:// rendezvous with no server times out naming the URL", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto port = free_port(ex);
        const auto url = "tcp://127.0.0.1:" + std::to_string(port);
        auto r = co_await rendezvous(url, 1, 2, 300ms);
        REQUIRE_FALSE(r);
        INFO(r.error().to_string());
        REQUIRE(r.error().message().find(url) != std::string::npos);
    });
}

namespace {

// Captures the library's log lines for one test (and restores stderr and the level afterwards).
class LogCapture {
public:
    LogCapture() : old_(log_level()) {
        set_log_level(LogLevel::info);
        set_log_sink([this](LogLevel, std::string_view component, std::string_view message) {
            std::lock_guard lock(mutex_);
            lines_.push_back(std::string(component) + ": " + std::string(message));
        });
    }
    ~LogCapture() {
        set_log_sink({});
        set_log_level(old_);
    }
    std::string all() {
        std::lock_guard lock(mutex_);
        std::string out;
        for (auto& l : lines_) out += l + "\n";
        return out;
    }

private:
    LogLevel old_;
    std::mutex mutex_;
    std::vector<std::string> lines_;
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a rank that never joins: the others log progress and fail at the timeout naming it alone", "[store]") {
    LogCapture logs;
    run_with_deadline(15s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto url = "tcp://127.0.0.1:" + std::to_string(free_port(ex));
        const auto start = Clock::now();
        Spawned<Rendezvous> r0(ex, rendezvous(url, 0, 3, 3500ms));
        co_await pause(100ms);  // rank 1 starts later: its own deadline is after rank 0's
        auto r1 = co_await rendezvous(url, 1, 3, 3500ms);
        auto h = co_await r0.join();
        REQUIRE(Clock::now() - start < 8s);
        REQUIRE_FALSE(h);
        REQUIRE_FALSE(r1);
        INFO(h.error().to_string() << "\n" << r1.error().to_string());
        REQUIRE(h.error().code() == Errc::timeout);
        REQUIRE(r1.error().code() == Errc::timeout);
        for (const auto* e : {&h.error(), &r1.error()}) {
            REQUIRE(has(e->message(), "waiting for workers: 2/3 joined; missing: rank 2"));
            REQUIRE(has(e->message(), url));
        }
        REQUIRE(has(r1.error().message(), "rank 0 timed out"));  // told by rank 0, not lost with its store
    });
    const auto text = logs.all();
    INFO(text);
    REQUIRE(has(text, "rank 0: waiting for workers: 2/3 joined; missing: rank 2 ("));
    REQUIRE(has(text, "rank 1: waiting for workers: 2/3 joined; missing: rank 2 ("));
    REQUIRE(has(text, "rank 0 hosts the store on port"));
    REQUIRE_FALSE(has(text, "missing: rank 0"));
    REQUIRE_FALSE(has(text, "missing: rank 1"));
}

TEST_CASE("world sizes that disagree fail every rank at once, naming who was told what", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto url = "tcp://127.0.0.1:" + std::to_string(free_port(ex));
        const auto start = Clock::now();
        Spawned<Rendezvous> r0(ex, rendezvous(url, 0, 2, 8s));
        Spawned<Rendezvous> r1(ex, rendezvous(url, 1, 3, 8s));
        Spawned<Rendezvous> r2(ex, rendezvous(url, 2, 3, 8s));
        for (auto* r : {&r0, &r1, &r2}) {
            auto got = co_await r->join();
            REQUIRE_FALSE(got);
            INFO(got.error().to_string());
            REQUIRE(got.error().code() == Errc::invalid_argument);
            REQUIRE(has(got.error().message(), "world sizes disagree: rank 0 was told 2; rank"));
            REQUIRE(has(got.error().message(), "told 3"));
        }
        REQUIRE(Clock::now() - start < 5s);  // at once, not at the 8 s timeout
    });
}

TEST_CASE("a rank told another world size than rank 0 fails even after the others have joined", "[store]") {
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const auto url = "tcp://127.0.0.1:" + std::to_string(free_port(ex));
        Spawned<Rendezvous> r0(ex, rendezvous(url, 0, 2, 5s));
        auto r1 = co_await rendezvous(url, 1, 2, 5s);
        CO_REQUIRE(r1);
        auto host = co_await r0.join();
        CO_REQUIRE(host);
        auto late = co_await rendezvous(url, 2, 3, 5s);
        REQUIRE_FALSE(late);
        INFO(late.error().to_string());
        REQUIRE(late.error().code() == Errc::invalid_argument);
        REQUIRE(has(late.error().message(), "world sizes disagree: rank 2 was told 3, rank 0 was told 2"));
    });
}

TEST_CASE("join_world refuses a rank outside the world", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto store = std::make_shared<HashStore>();
        auto r = co_await join_world(*store, 3, 3, 1s);
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::invalid_argument);
    });
}

namespace {
/// One rank's view of a shared store whose add() reaches the store only after `delay` (a slow
/// link for that one request): what lets another rank read the count before it.
class LateAddStore final : public Store {
public:
    LateAddStore(std::shared_ptr<Store> inner, Duration delay) : inner_(std::move(inner)), delay_(delay) {
        set_timeout(inner_->timeout());
    }
    Task<Result<void>> set(std::string k, Bytes v) override { return inner_->set(std::move(k), std::move(v)); }
    Task<Result<Bytes>> get(std::string k) override { return inner_->get(std::move(k)); }
    Task<Result<std::int64_t>> add(std::string k, std::int64_t d) override {
        asio::steady_timer t(co_await asio::this_coro::executor, delay_);
        co_await t.async_wait(detail::use_nothrow);
        co_return co_await inner_->add(std::move(k), d);
    }
    Task<Result<Bytes>> compare_set(std::string k, Bytes e, Bytes d) override {
        return inner_->compare_set(std::move(k), std::move(e), std::move(d));
    }
    Task<Result<void>> wait(std::vector<std::string> k, Duration t) override { return inner_->wait(std::move(k), t); }
    Task<Result<bool>> check(std::vector<std::string> k) override { return inner_->check(std::move(k)); }
    Task<Result<bool>> delete_key(std::string k) override { return inner_->delete_key(std::move(k)); }
    Task<Result<std::int64_t>> num_keys() override { return inner_->num_keys(); }
    Task<Result<void>> append(std::string k, Bytes v) override { return inner_->append(std::move(k), std::move(v)); }
    Task<Result<std::vector<Bytes>>> multi_get(std::vector<std::string> k) override { return inner_->multi_get(std::move(k)); }
    Task<Result<void>> multi_set(std::vector<std::string> k, std::vector<Bytes> v) override {
        return inner_->multi_set(std::move(k), std::move(v));
    }

private:
    std::shared_ptr<Store> inner_;
    Duration delay_;
};
}  // namespace

TEST_CASE("an extra rank is seen even when the last rank of rank 0's world is counted in late", "[store]") {
    // Rank 2 (told 3) joined first; ranks 0 and 1 are told 2, and rank 1's count reaches the store
    // 300 ms late. Rank 0 must not read the count before it and take rank 2's count for rank 1's.
    run_with_deadline(10s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto shared = std::make_shared<HashStore>(5s);
        auto late = std::make_shared<LateAddStore>(shared, 300ms);
        Spawned<void> r2(ex, join_world(*shared, 2, 3, 5s));
        for (int i = 0; i < 100; ++i) {
            std::vector<std::string> k(1, "tp/rdzv/ws/2");
            auto c = co_await shared->check(std::move(k));
            if (c && *c) break;
            asio::steady_timer t(ex, 5ms);
            co_await t.async_wait(detail::use_nothrow);
        }
        Spawned<void> r0(ex, join_world(*shared, 0, 2, 5s));
        Spawned<void> r1(ex, join_world(*late, 1, 2, 5s));
        for (auto* r : {&r0, &r1, &r2}) {
            auto got = co_await r->join();
            REQUIRE_FALSE(got);
            INFO(got.error().to_string());
            REQUIRE(got.error().code() == Errc::invalid_argument);
            REQUIRE(has(got.error().message(), "world sizes disagree: ranks 0, 1 were told 2; rank 2 was told 3"));
        }
    });
}

}  // namespace tp_rendezvous_test

namespace tp_rendezvous_test {

TEST_CASE("Slurm host lists expand as scontrol expands them, and bounded", "[store]") {
    using tensorplay::detail::expand_hostlist;
    const std::vector<std::pair<std::string, std::vector<std::string>>> good{
        {"node01", {"node01"}},
        {"node[01-03]", {"node01", "node02", "node03"}},
        {"a[1,3-4],b", {"a1", "a3", "a4", "b"}},
        {"n[8-11]", {"n8", "n9", "n10", "n11"}},
        {"n[08-10]", {"n08", "n09", "n10"}},
        {"rack[1-2]-gpu[0-1]", {"rack1-gpu0", "rack1-gpu1", "rack2-gpu0", "rack2-gpu1"}},
        {"login,c[7]x", {"login", "c7x"}},
    };
    for (const auto& [list, hosts] : good) {
        INFO(list);
        auto r = expand_hostlist(list);
        REQUIRE(r);
        CHECK(*r == hosts);
    }
    for (const char* list : {"n[1-", "n]1[", "n[]", "n[a-b]", "n[3-1]", "a,,b", ",a", "n[1-2[3]]", "n[0-99999999]", "n[0-999]m[0-999]"}) {
        INFO(list);
        auto r = expand_hostlist(list);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::invalid_argument);
        CHECK(r.error().message().find("Slurm host list") != std::string::npos);
    }
    CHECK(tensorplay::detail::slurm_port(4242) == 19242);
    CHECK(tensorplay::detail::slurm_port(123456789) == 21789);
}

TEST_CASE("env:// under srun: Slurm's variables stand in for torch's, which win where both are set", "[store]") {
    // A port Slurm's job id derives (15000 + its last four digits) that is free here.
    std::uint16_t port = 0;
    std::uint64_t job = 0;
    {
        asio::io_context ctx;
        for (job = 300123; job < 310123 && port == 0; ++job) {
            const auto p = tensorplay::detail::slurm_port(job);
            std::error_code ec;
            asio::ip::tcp::acceptor a(ctx);
            a.open(asio::ip::tcp::v4(), ec);
            if (!ec) a.bind(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), p), ec);
            if (!ec) port = p;
        }
        --job;
    }
    REQUIRE(port != 0);
    EnvScope env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "localhost,gpu[2-3]"},
                  {"SLURM_JOB_ID", std::to_string(job)}});
    run_with_deadline(10s, [port]() -> Task<void> {
        auto rv = co_await rendezvous("env://", -1, -1, 5s);
        CO_REQUIRE(rv);
        CHECK(rv->rank == 0);
        CHECK(rv->world_size == 1);
        REQUIRE(rv->server);
        CHECK(rv->server->port() == port);
    });
    // torch's variables win: RANK and WORLD_SIZE say another world than Slurm's.
    ::setenv("RANK", "1", 1);
    ::setenv("WORLD_SIZE", "3", 1);
    ::setenv("MASTER_PORT", "1", 1);  // (not the derived one: rank 1 connects there, and is refused)
    run_with_deadline(10s, []() -> Task<void> {
        auto rv = co_await rendezvous("env://", -1, -1, 300ms);
        REQUIRE_FALSE(rv);
        INFO(rv.error().to_string());
        CHECK(rv.error().message().find("localhost:1") != std::string::npos);
    });
}

}  // namespace tp_rendezvous_test
