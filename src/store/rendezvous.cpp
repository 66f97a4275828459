// rendezvous: parses an init_method (env://, tcp://, file://), then hosts or connects to its store.
// env:// reads torch's variables, else Slurm's (launcher_env.hpp).
#include <tensorplay/store/rendezvous.hpp>

#include <tensorplay/core/log.hpp>
#include <tensorplay/store/file_store.hpp>
#include <tensorplay/store/prefix_store.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include "core/asio_compat.hpp"
#include "store/launcher_env.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <string_view>

namespace tensorplay {

namespace {

struct Target {
    std::string scheme;  // "tcp", "env", "file"
    std::string host;    // tcp/env
    int port = -1;       // tcp/env
    std::string path;    // file
    int rank = -1;
    int world_size = -1;
    bool agent_store = false;  // env:// with TORCHELASTIC_USE_AGENT_STORE=True
    std::string attempt;       // TORCHELASTIC_RESTART_COUNT
};

Failure bad(const std::string& url, const std::string& why) {
    return fail(Errc::invalid_argument, "init_method \"" + url + "\": " + why);
}

// A decimal integer that fits an int, or nothing.
std::optional<int> parse_int(std::string_view s) {
    if (s.empty()) return std::nullopt;
    bool negative = s.front() == '-';
    if (negative || s.front() == '+') s.remove_prefix(1);
    if (s.empty() || s.size() > 10) return std::nullopt;
    long long v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        v = v * 10 + (c - '0');
    }
    if (negative) v = -v;
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) return std::nullopt;
    return int(v);
}

std::optional<std::string> env(const char* name) {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
}

Failure env_missing(const char* name) {
    const std::string_view n(name);
    const char* slurm = n == "RANK"          ? "SLURM_PROCID"
                        : n == "WORLD_SIZE"  ? "SLURM_NTASKS"
                        : n == "MASTER_ADDR" ? "SLURM_JOB_NODELIST"
                        : n == "MASTER_PORT" ? "SLURM_JOB_ID"
                                             : nullptr;
    return fail(Errc::invalid_argument, std::string("env:// rendezvous: environment variable ") + name + " expected, but not set" +
                                            (slurm ? std::string(" (nor Slurm's ") + slurm + ")" : std::string()));
}

// torch's variable `name` of the launcher's environment, else what Slurm's give for it
// (launcher_env.hpp); `required` ones must come from one of them.
Result<std::optional<detail::LauncherValue>> launcher(const char* name, bool required) {
    auto v = detail::launcher_env(name);
    if (!v) return fail(std::move(v).error().context("env:// rendezvous"));
    if (!*v && required) return env_missing(name);
    return v;
}

// An integer of the launcher's environment; `required` ones must be set.
Result<std::optional<int>> env_int(const char* name, bool required) {
    auto v = launcher(name, required);
    if (!v) return fail(v.error());
    if (!*v) return std::optional<int>{};
    auto n = parse_int((*v)->value);
    if (!n)
        return fail(Errc::invalid_argument, "env:// rendezvous: environment variable " + (*v)->source + " must be an integer, got \"" +
                                                (*v)->value + "\"" + ((*v)->source == name ? "" : std::string(" (for ") + name + ")"));
    return n;
}

// "rank=1&world_size=2" -> map; a piece without '=' is malformed.
Result<std::map<std::string, std::string>> parse_query(const std::string& url, std::string_view q) {
    std::map<std::string, std::string> out;
    while (!q.empty()) {
        auto amp = q.find('&');
        auto piece = q.substr(0, amp);
        q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
        if (piece.empty()) continue;
        auto eq = piece.find('=');
        if (eq == std::string_view::npos || eq == 0)
            return bad(url, "query parameter \"" + std::string(piece) + "\" is not name=value");
        out[std::string(piece.substr(0, eq))] = std::string(piece.substr(eq + 1));
    }
    return out;
}

// Splits "host:port" / "[v6]:port" of tcp://.
Result<void> parse_host_port(const std::string& url, std::string_view hp, Target& t) {
    if (hp.empty()) return bad(url, "no host:port after tcp://");
    std::string_view host, port;
    if (hp.front() == '[') {
        auto close = hp.find(']');
        if (close == std::string_view::npos) return bad(url, "unterminated [ in the IPv6 address");
        host = hp.substr(1, close - 1);
        auto rest = hp.substr(close + 1);
        if (rest.empty() || rest.front() != ':') return bad(url, "a port is required after the address (tcp://[addr]:port)");
        port = rest.substr(1);
    } else {
        auto colon = hp.rfind(':');
        if (colon == std::string_view::npos) return bad(url, "a port is required (tcp://host:port)");
        host = hp.substr(0, colon);
        if (host.find(':') != std::string_view::npos)
            return bad(url, "an IPv6 address must be in brackets (tcp://[addr]:port)");
        port = hp.substr(colon + 1);
    }
    if (host.empty()) return bad(url, "the host is empty");
    auto p = parse_int(port);
    if (!p || *p < 0 || *p > 65535) return bad(url, "the port \"" + std::string(port) + "\" is not a number in 0..65535");
    t.host = std::string(host);
    t.port = *p;
    return ok();
}

// Settles one of rank/world_size: the argument, else the query, else (env://) the environment.
// `optional`: -1 when no source gives it (the world size of a dynamic group's member).
Result<int> settle(const std::string& url, const char* name, int arg, const std::map<std::string, std::string>& query,
                   const char* env_name, bool optional = false) {
    if (arg != -1) return arg;
    if (auto it = query.find(name); it != query.end()) {
        auto n = parse_int(it->second);
        if (!n) return bad(url, std::string("query parameter ") + name + "=\"" + it->second + "\" is not an integer");
        return *n;
    }
    if (env_name) {
        auto e = env_int(env_name, !optional);
        if (!e) return fail(e.error());
        if (*e) return **e;
    }
    if (optional) return -1;
    return bad(url, std::string(name) + " is not set: pass it or add ?" + name + "= to the URL");
}

Result<Target> parse(const std::string& url, int rank, int world_size) {
    auto sep = url.find("://");
    if (sep == std::string::npos || sep == 0) return bad(url, "not a URL (expected env://, tcp://host:port or file:///path)");
    Target t;
    t.scheme = url.substr(0, sep);
    std::string_view rest(url);
    rest.remove_prefix(sep + 3);
    std::string_view query_text;
    if (auto q = rest.find('?'); q != std::string_view::npos) {
        query_text = rest.substr(q + 1);
        rest = rest.substr(0, q);
    }
    auto query = parse_query(url, query_text);
    if (!query) return fail(query.error());

    if (t.scheme == "tcp") {
        if (auto hp = parse_host_port(url, rest, t); !hp) return fail(hp.error());
    } else if (t.scheme == "file") {
        if (rest.empty()) return bad(url, "no path after file://");
        t.path = std::string(rest);
    } else if (t.scheme == "env") {
        if (!rest.empty() && rest != "/") return bad(url, "env:// takes no address (it reads MASTER_ADDR and MASTER_PORT)");
        t.agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True");
        auto addr = launcher("MASTER_ADDR", true);
        if (!addr) return fail(addr.error());
        if ((*addr)->value.empty()) return fail(Errc::invalid_argument, "env:// rendezvous: environment variable MASTER_ADDR is empty");
        t.host = (*addr)->value;
        if ((*addr)->source != "MASTER_ADDR")
            log(LogLevel::debug, "store", "env:// rendezvous: MASTER_ADDR is " + t.host + ", " + (*addr)->source + " (Slurm)");
        if (t.host.size() > 2 && t.host.front() == '[' && t.host.back() == ']') t.host = t.host.substr(1, t.host.size() - 2);
        auto port = env_int("MASTER_PORT", true);
        if (!port) return fail(port.error());
        if (**port < 0 || **port > 65535)
            return fail(Errc::invalid_argument, "env:// rendezvous: environment variable MASTER_PORT must be in 0..65535, got " +
                                                    std::to_string(**port));
        t.port = **port;
        if (t.agent_store) {
            auto attempt = env("TORCHELASTIC_RESTART_COUNT");
            if (!attempt) return env_missing("TORCHELASTIC_RESTART_COUNT");
            t.attempt = *attempt;
        }
    } else {
        return bad(url, "unknown scheme \"" + t.scheme + "://\" (expected env://, tcp:// or file://)");
    }

    const bool from_env = t.scheme == "env";
    auto r = settle(url, "rank", rank, *query, from_env ? "RANK" : nullptr);
    if (!r) return fail(r.error());
    // No world size from any source: a dynamic group's member (torch 2.x: world_size=None).
    auto w = settle(url, "world_size", world_size, *query, from_env ? "WORLD_SIZE" : nullptr, true);
    if (!w) return fail(w.error());
    t.rank = *r;
    t.world_size = *w;
    if (t.world_size == -1) {
        if (t.rank < 0) return bad(url, "rank " + std::to_string(t.rank) + ": a dynamic group's member still needs a rank >= 0");
    } else if (t.world_size < 1) {
        return bad(url, "world_size must be at least 1, got " + std::to_string(t.world_size));
    } else if (t.rank < 0 || t.rank >= t.world_size)
        return bad(url, "rank " + std::to_string(t.rank) + " is outside the world [0, " + std::to_string(t.world_size) + ")");
    const bool hosts = (t.scheme == "tcp" || t.scheme == "env") && t.rank == 0 && !t.agent_store;
    if (t.port == 0 && (t.scheme == "tcp" || t.scheme == "env") && !hosts)
        return bad(url, "port 0 is only for the rank that hosts the store (rank 0); rank " + std::to_string(t.rank) +
                            " needs the port it bound");
    return t;
}

// The join every rendezvous ends with. Keys (under the rendezvous store, so under the attempt's
// prefix with a launcher's store):
//   tp/rdzv/ws/<rank>   the world size <rank> was told (ASCII decimal), set as it joins
//   tp/rdzv/joined      counter of ranks that joined
//   tp/rdzv/verdict     set by rank 0 once every rank of its world has joined: "ok" or the
//                       disagreement, which every waiting rank then reports as its own error;
//                       or "timeout:" and why, when rank 0 gave up waiting
// Rank 0 decides alone, so that every rank reaches the same verdict. A rank that was told another
// world size than rank 0 always fails; the others fail with it when rank 0 sees the disagreement
// before it decides (every rank of rank 0's world is there, plus any extra rank that has joined).
const std::string kJoin = "tp/rdzv/";
constexpr Duration kProgressEvery = std::chrono::seconds(3);

const std::string kTimedOut = "timeout:";  // a verdict of rank 0 that gave up waiting

std::string ws_key(int rank) { return kJoin + "ws/" + std::to_string(rank); }

std::string named_ranks(const std::vector<int>& ranks) {
    std::string out = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size() && i < 16; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    if (ranks.size() > 16) out += ", ... (" + std::to_string(ranks.size()) + " ranks)";
    return out;
}

std::string seconds(Duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + " s";
}

// "2/3 joined; missing: rank 2", from one CHECK per rank.
Task<std::string> joined_so_far(Store& store, int world_size) {
    std::vector<int> missing;
    for (int r = 0; r < world_size; ++r) {
        std::vector<std::string> key(1, ws_key(r));
        auto c = co_await store.check(std::move(key));
        if (!c) co_return "(the store did not answer: " + c.error().message() + ")";
        if (!*c) missing.push_back(r);
    }
    std::string out = std::to_string(world_size - static_cast<int>(missing.size())) + "/" +
                      std::to_string(world_size) + " joined";
    if (!missing.empty()) out += "; missing: " + named_ranks(missing);
    co_return out;
}

// Waits for `keys`, logging who has joined every few seconds, until `deadline`.
Task<Result<void>> wait_logging(Store& store, std::vector<std::string> keys, int rank, int world_size,
                                Clock::time_point deadline, Clock::time_point started) {
    std::string so_far;
    for (;;) {
        const auto now = Clock::now();
        Duration slice = kProgressEvery;
        if (deadline != Clock::time_point::max()) slice = std::min(slice, deadline - now);
        if (slice <= Duration::zero()) slice = std::chrono::milliseconds(1);
        auto these = keys;
        auto w = co_await store.wait(std::move(these), slice);
        if (w) co_return ok();
        if (w.error().code() != Errc::timeout) {
            if (so_far.empty()) co_return w;
            co_return fail(std::move(w).error().context("waiting for workers (last seen: " + so_far + ")"));
        }
        so_far = co_await joined_so_far(store, world_size);
        if (Clock::now() >= deadline)
            co_return fail(Errc::timeout, "timed out after " + seconds(Clock::now() - started) +
                                              " waiting for workers: " + so_far);
        log(LogLevel::info, "rendezvous", "rank " + std::to_string(rank) + ": waiting for workers: " + so_far + " (" +
                                              seconds(Clock::now() - started) + " so far)");
    }
}

std::optional<int> parse_size(const Bytes& v) { return parse_int(std::string_view(reinterpret_cast<const char*>(v.data()), v.size())); }

// Rank 0: every rank's world size, as one verdict ("ok" or what disagrees). `largest` gets the
// largest world size any rank was told.
Task<Result<std::string>> decide(Store& store, int world_size, int& largest) {
    std::vector<std::string> keys;
    for (int r = 0; r < world_size; ++r) keys.push_back(ws_key(r));
    auto told = co_await store.multi_get(std::move(keys));
    if (!told) co_return fail(told.error());
    std::map<int, std::vector<int>> by_size;  // world size -> ranks told it
    for (int r = 0; r < world_size; ++r) {
        auto n = parse_size((*told)[static_cast<std::size_t>(r)]);
        by_size[n ? *n : -1].push_back(r);
    }
    // Ranks beyond this world that have joined anyway (told a larger world, or started twice).
    std::string joined_key = kJoin + "joined";
    auto joined = co_await store.add(std::move(joined_key), 0);
    if (!joined) co_return fail(joined.error());
    int extra = static_cast<int>(std::max<std::int64_t>(0, *joined - world_size));
    for (int r = world_size; extra > 0 && r < world_size + 64; ++r) {
        std::vector<std::string> key(1, ws_key(r));
        auto c = co_await store.check(std::move(key));
        if (!c) co_return fail(c.error());
        if (!*c) continue;
        std::string name = ws_key(r);
        auto v = co_await store.get(std::move(name));
        if (!v) co_return fail(v.error());
        auto n = parse_size(*v);
        by_size[n ? *n : -1].push_back(r);
        --extra;
    }
    largest = std::max(world_size, by_size.rbegin()->first);
    if (by_size.size() == 1 && *joined <= world_size) co_return std::string("ok");
    std::string out = "world sizes disagree: ";
    bool first = true;
    for (const auto& [size, ranks] : by_size) {
        out += (first ? "" : "; ") + named_ranks(ranks) + (ranks.size() == 1 ? " was" : " were") + " told " +
               (size < 0 ? std::string("something that is not a number") : std::to_string(size));
        first = false;
    }
    if (by_size.size() == 1)
        out = std::to_string(*joined) + " workers joined a world of " + std::to_string(world_size) +
              " (a rank started twice, or ranks told another world size joined and left)";
    co_return out + "; start every worker with the same WORLD_SIZE";
}

// Publishes this rank's world size and waits until the world has joined and agrees on its size.
// `wait_for_world` false (rank 0 only, hosting on port 0: nobody can reach it before it returns):
// rank 0 publishes "ok" at once and each other rank compares its world size with rank 0's alone.
// `largest` (rank 0) gets the largest world size a rank was told (for linger()).
Task<Result<void>> join(Store& store, int rank, int world_size, Duration timeout, bool wait_for_world, int& largest) {
    const auto started = Clock::now();
    const auto deadline = timeout > Duration::zero() ? started + timeout : Clock::time_point::max();
    // Counted in before publishing: once rank 0 sees every world size of its world, their counts
    // are in `joined` too (each rank's add is answered before its set is sent), so the count it
    // reads then exceeds its world by the extra ranks that joined (counted the other way round, it
    // could read the count before the last rank's add and take an extra rank's count for it).
    std::string joined_key = kJoin + "joined";
    if (auto r = co_await store.add(std::move(joined_key), 1); !r)
        co_return fail(std::move(r).error().context("counting this rank in"));
    std::string mine = ws_key(rank);
    Bytes size = bytes(std::to_string(world_size));
    if (auto r = co_await store.set(std::move(mine), std::move(size)); !r)
        co_return fail(std::move(r).error().context("publishing this rank's world size"));
    const std::string verdict_key = kJoin + "verdict";
    if (rank == 0 && !wait_for_world) {
        std::string key = verdict_key;
        Bytes value = bytes("ok");
        if (auto r = co_await store.set(std::move(key), std::move(value)); !r)
            co_return fail(std::move(r).error().context("publishing the rendezvous verdict"));
        co_return ok();
    }
    if (rank == 0) {
        std::vector<std::string> keys;
        for (int r = 0; r < world_size; ++r) keys.push_back(ws_key(r));
        if (auto w = co_await wait_logging(store, std::move(keys), rank, world_size, deadline, started); !w) {
            // Tell the waiting ranks why, so that they fail now with the same words.
            if (w.error().code() == Errc::timeout) {
                std::string key = verdict_key;
                Bytes value = bytes(kTimedOut + w.error().message());
                (void)co_await store.set(std::move(key), std::move(value));
            }
            co_return w;
        }
        auto verdict = co_await decide(store, world_size, largest);
        if (!verdict) co_return fail(std::move(verdict).error().context("comparing the world sizes"));
        std::string key = verdict_key;
        Bytes value = bytes(*verdict);
        if (auto r = co_await store.set(std::move(key), std::move(value)); !r)
            co_return fail(std::move(r).error().context("publishing the rendezvous verdict"));
    } else {
        std::vector<std::string> keys(1, verdict_key);
        if (auto w = co_await wait_logging(store, std::move(keys), rank, world_size, deadline, started); !w)
            co_return w;
    }
    std::string key = verdict_key;
    auto verdict = co_await store.get(std::move(key));
    if (!verdict) co_return fail(std::move(verdict).error().context("reading the rendezvous verdict"));
    const std::string said = to_string(*verdict);
    if (said.starts_with(kTimedOut)) co_return fail(Errc::timeout, "rank 0 " + said.substr(kTimedOut.size()));
    if (said != "ok") co_return fail(Errc::invalid_argument, said);
    if (rank != 0) {
        // Rank 0 decided "ok" for its world: this rank must have been told the same size.
        std::string zero_key = ws_key(0);
        auto zero = co_await store.get(std::move(zero_key));
        if (!zero) co_return fail(std::move(zero).error().context("reading rank 0's world size"));
        auto n = parse_size(*zero);
        if (n != world_size)
            co_return fail(Errc::invalid_argument,
                           "world sizes disagree: rank " + std::to_string(rank) + " was told " +
                               std::to_string(world_size) + ", rank 0 was told " + to_string(*zero) +
                               "; start every worker with the same WORLD_SIZE");
    }
    co_return ok();
}

// The hosting rank failed the join: its store stays up a little (5 s at most) while other ranks
// are connected or, when world sizes disagree, until as many ranks as the largest world size told
// have joined, so that the ranks it told why (and those still connecting) read its verdict.
Task<void> linger(TcpStoreServer& server, Store& store, int expected) {
    asio::steady_timer pause(co_await asio::this_coro::executor);
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < until) {
        std::string joined_key = kJoin + "joined";
        auto joined = co_await store.add(std::move(joined_key), 0);
        if (!joined) break;
        if (*joined >= expected && co_await server.num_connections() <= 1) break;  // only our own client is left
        pause.expires_after(std::chrono::milliseconds(10));
        co_await pause.async_wait(detail::use_nothrow);
    }
}

Task<Result<Rendezvous>> connect_tcp(Target t, Duration timeout, std::string url, TcpStoreServerOptions hosted) {
    auto ex = co_await asio::this_coro::executor;
    Rendezvous out;
    out.rank = t.rank;
    out.world_size = t.world_size;
    const bool hosts = t.rank == 0 && !t.agent_store;
    TcpStoreOptions client;
    client.host = t.host;
    client.port = std::uint16_t(t.port);
    client.timeout = timeout;
    client.world_size = t.world_size;
    client.wait_for_workers = false;
    if (hosts) {
        TcpStoreServerOptions so = std::move(hosted);  // (host "" by default: all interfaces, as torch's master)
        so.port = std::uint16_t(t.port);
        auto server = TcpStoreServer::start(ex, so);
        if (!server) co_return fail(std::move(server).error().context("rendezvous " + url + ": hosting the store"));
        out.server = *server;
        client.host = "127.0.0.1";  // our own server: reach it locally whatever MASTER_ADDR says
        client.port = out.server->port();
        log(LogLevel::info, "rendezvous",
            (t.scheme == "env" ? std::string("env://: no launcher-hosted store (TORCHELASTIC_USE_AGENT_STORE is not True): ")
                               : std::string(url + ": ")) +
                "rank 0 hosts the store on port " + std::to_string(out.server->port()) + " of all interfaces");
    } else if (t.agent_store) {
        log(LogLevel::info, "rendezvous", "env://: rank " + std::to_string(t.rank) + " uses the launcher's store at " +
                                              t.host + ":" + std::to_string(t.port) + " (keys under /worker/attempt_" +
                                              t.attempt + "/)");
    }
    auto store = co_await TcpStore::connect(ex, client);
    if (!store) co_return fail(std::move(store).error().context("rendezvous " + url));
    if (t.agent_store)
        out.store = std::make_shared<PrefixStore>("/worker/attempt_" + t.attempt, *store);
    else
        out.store = *store;
    out.store->set_timeout(timeout);
    if (t.world_size == -1) co_return out;  // (dynamic: members join the group, not a world)
    // With port 0 nobody else can know the port yet: the hosting rank does not wait for them.
    int largest = 0;
    if (auto j = co_await join(*out.store, t.rank, t.world_size, timeout, !(hosts && t.port == 0), largest); !j) {
        if (out.server) co_await linger(*out.server, *out.store, largest);
        co_return fail(std::move(j).error().context("rendezvous " + url));
    }
    co_return out;
}

}  // namespace

Task<Result<void>> join_world(Store& store, int rank, int world_size, Duration timeout) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
        co_return fail(Errc::invalid_argument, "join_world: rank " + std::to_string(rank) +
                                                   " is outside the world [0, " + std::to_string(world_size) + ")");
    int largest = 0;
    co_return co_await join(store, rank, world_size, timeout, true, largest);
}

Task<Result<Rendezvous>> rendezvous(std::string init_method, int rank, int world_size, Duration timeout) {
    return rendezvous(std::move(init_method), rank, world_size, timeout, TcpStoreServerOptions());
}

Task<Result<Rendezvous>> rendezvous(std::string init_method, int rank, int world_size, Duration timeout,
                                    TcpStoreServerOptions hosted) {
    auto target = parse(init_method, rank, world_size);
    if (!target) co_return fail(target.error());
    if (target->scheme == "file") {
        FileStoreOptions o;
        o.timeout = timeout;
        auto store = FileStore::open(target->path, o);
        if (!store) co_return fail(std::move(store).error().context("rendezvous " + init_method));
        Rendezvous out;
        out.store = *store;
        out.rank = target->rank;
        out.world_size = target->world_size;
        int largest = 0;
        if (out.world_size == -1) co_return out;  // (dynamic: members join the group, not a world)
        if (auto j = co_await join(*out.store, out.rank, out.world_size, timeout, true, largest); !j)
            co_return fail(std::move(j).error().context("rendezvous " + init_method));
        co_return out;
    }
    auto connecting = connect_tcp(std::move(*target), timeout, init_method, std::move(hosted));
    co_return co_await std::move(connecting);
}

}  // namespace tensorplay
