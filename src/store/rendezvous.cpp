// rendezvous: parses an init_method (env://, tcp://, file://), then hosts or connects to its store.
#include <tensorplay/store/rendezvous.hpp>

#include <tensorplay/store/file_store.hpp>
#include <tensorplay/store/prefix_store.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <asio/this_coro.hpp>

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
    return fail(Errc::invalid_argument,
                std::string("env:// rendezvous: environment variable ") + name + " expected, but not set");
}

// An integer environment variable; `required` ones must be set.
Result<std::optional<int>> env_int(const char* name, bool required) {
    auto v = env(name);
    if (!v) {
        if (required) return env_missing(name);
        return std::optional<int>{};
    }
    auto n = parse_int(*v);
    if (!n)
        return fail(Errc::invalid_argument, std::string("env:// rendezvous: environment variable ") + name +
                                                " must be an integer, got \"" + *v + "\"");
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
Result<int> settle(const std::string& url, const char* name, int arg, const std::map<std::string, std::string>& query,
                   const char* env_name) {
    if (arg != -1) return arg;
    if (auto it = query.find(name); it != query.end()) {
        auto n = parse_int(it->second);
        if (!n) return bad(url, std::string("query parameter ") + name + "=\"" + it->second + "\" is not an integer");
        return *n;
    }
    if (env_name) {
        auto e = env_int(env_name, true);
        if (!e) return fail(e.error());
        return **e;
    }
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
        auto addr = env("MASTER_ADDR");
        if (!addr) return env_missing("MASTER_ADDR");
        if (addr->empty()) return fail(Errc::invalid_argument, "env:// rendezvous: environment variable MASTER_ADDR is empty");
        t.host = *addr;
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
    auto w = settle(url, "world_size", world_size, *query, from_env ? "WORLD_SIZE" : nullptr);
    if (!w) return fail(w.error());
    t.rank = *r;
    t.world_size = *w;
    if (t.world_size < 1) return bad(url, "world_size must be at least 1, got " + std::to_string(t.world_size));
    if (t.rank < 0 || t.rank >= t.world_size)
        return bad(url, "rank " + std::to_string(t.rank) + " is outside the world [0, " + std::to_string(t.world_size) + ")");
    const bool hosts = (t.scheme == "tcp" || t.scheme == "env") && t.rank == 0 && !t.agent_store;
    if (t.port == 0 && (t.scheme == "tcp" || t.scheme == "env") && !hosts)
        return bad(url, "port 0 is only for the rank that hosts the store (rank 0); rank " + std::to_string(t.rank) +
                            " needs the port it bound");
    return t;
}

Task<Result<Rendezvous>> connect_tcp(Target t, Duration timeout, std::string url) {
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
        TcpStoreServerOptions so;
        so.port = std::uint16_t(t.port);  // all interfaces, as torch's master
        auto server = TcpStoreServer::start(ex, so);
        if (!server) co_return fail(std::move(server).error().context("rendezvous " + url + ": hosting the store"));
        out.server = *server;
        client.host = "127.0.0.1";  // our own server: reach it locally whatever MASTER_ADDR says
        client.port = out.server->port();
        // c10d: the master waits until the world has connected; with port 0 nobody can have the port yet.
        client.wait_for_workers = t.port != 0;
    }
    auto store = co_await TcpStore::connect(ex, client);
    if (!store) co_return fail(std::move(store).error().context("rendezvous " + url));
    if (t.agent_store)
        out.store = std::make_shared<PrefixStore>("/worker/attempt_" + t.attempt, *store);
    else
        out.store = *store;
    out.store->set_timeout(timeout);
    co_return out;
}

}  // namespace

Task<Result<Rendezvous>> rendezvous(std::string init_method, int rank, int world_size, Duration timeout) {
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
        co_return out;
    }
    co_return co_await connect_tcp(std::move(*target), timeout, init_method);
}

}  // namespace tensorplay
