// multihost_worker: one worker of tests/rpc/multihost_test.sh (several "hosts", each a network
// namespace, one machine), driven by commands on stdin.
//
// Joins over env:// as "w<RANK>" with exactly the variables a launcher sets: MASTER_ADDR,
// MASTER_PORT, RANK and WORLD_SIZE (Kubeflow PyTorchJob's contract; without WORLD_SIZE it joins a
// dynamic group). Rank 0 hosts the store. Also read: TP_MH_LISTEN (listen_address, "host:port";
// unset: the library's choice, e.g. by TP_SOCKET_IFNAME), TP_MH_MEMBER_TIMEOUT (member_timeout, s),
// TP_MH_INIT_TIMEOUT (init_timeout, s; 30 unset).
// Prints "ready rank=R members=N init_ms=T pid=P sanitizer=none|thread|address" once it has joined.
//
// Handlers: "echo" (the request back), "hold" (the request back after the milliseconds its payload
// names), "sink" (answers the byte count of the request's tensors), "work" ("<payload> served by
// w<RANK>", counted).
//
// Commands, one a line, each `TAG COMMAND ARGS...`; each runs as its own coroutine (the next line is
// read at once) and ends with one line `TAG result ...` (lines before it start with TAG too):
//   TAG info                          TAG peer NAME rank=R transport=T channel=C connected=0|1 per peer
//   TAG calls TO N TIMEOUT HANDLER [PAYLOAD]    N calls one after another
//   TAG pending TO N TIMEOUT HANDLER [PAYLOAD]  N calls at once; "TAG started" once they are sent
//   TAG load TO SECONDS TIMEOUT [STREAMS]   calls to TO's "echo" for SECONDS, one after another in
//                                     each of STREAMS (1) streams
//       result of calls, pending, load: ok=K failed=F codes=<code>:<n>,... p50_us= mean_ms= first_ms= max_ms=
//       end_us= (p50 of the calls that succeeded; end_us: when the last ended, system clock, microseconds)
//   TAG bulk TO MIB TIMEOUT           one call carrying a MIB MiB tensor to TO's "sink":
//       result ok=0|1 bytes= ms= mbps= (MB/s, 10^6 bytes)
//   TAG front start INFLIGHT TIMEOUT  sends "work" requests, INFLIGHT at once, round robin over the
//                                     other members; a request that fails is retried on another
//                                     member (for at most 30 s) as examples/elastic_pool does
//   TAG front stop                    stops, waits for the requests under way:
//       result requests= answered= retried= lost= wrong=
//   TAG watch-gone NAMES [S] | watch-joined NAMES [S]   (NAMES comma-separated) until none / all
//       of them are members here: result at_us=<system clock, microseconds since the epoch> (-1: S
//       seconds, 30 by default, passed first)
//   TAG members                       result names=<the group's names, comma-separated>
//   TAG stats                         result served=<"work" requests served>
//   TAG quit                          shuts down locally and exits 0 (so does the end of stdin)
#include <tensorplay/rpc.hpp>

#include "../support/worker_main.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
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
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace tp = tensorplay;
using Clock = std::chrono::steady_clock;

namespace {

// Which sanitizer instruments this build (the script holds only unsanitized builds to its
// throughput and latency targets).
#if defined(__SANITIZE_THREAD__)
constexpr const char* kSanitizer = "thread";
#elif defined(__SANITIZE_ADDRESS__)
constexpr const char* kSanitizer = "address";
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr const char* kSanitizer = "thread";
#elif __has_feature(address_sanitizer)
constexpr const char* kSanitizer = "address";
#else
constexpr const char* kSanitizer = "none";
#endif
#else
constexpr const char* kSanitizer = "none";
#endif

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

long long now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One line of output, flushed (the script reads the files while the worker runs).
void say(const std::string& tag, const std::string& line) {
    std::printf("%s %s\n", tag.c_str(), line.c_str());
    std::fflush(stdout);
}

tp::Task<void> pause(std::chrono::microseconds d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(tp::detail::use_nothrow);
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    std::istringstream in(s);
    while (std::getline(in, cur, sep))
        if (!cur.empty()) out.push_back(cur);
    return out;
}

// ---- state shared by the handlers and the commands (one thread: the io_context's) ----

struct State {
    std::shared_ptr<tp::RpcAgent> agent;
    std::string name;
    std::uint64_t served = 0;
    // the front
    bool front_running = false, front_stop = false;
    int front_issuers = 0;
    double front_timeout = 5;
    std::uint64_t next_id = 0, answered = 0, retried = 0, lost = 0, wrong = 0;
    std::size_t round_robin = 0;
};
State g;

// ---- calls ----

struct Outcome {
    bool ok = false;
    std::string code;
    double ms = 0;
};

tp::Task<Outcome> one_call(std::string to, std::string handler, std::string payload, double timeout) {
    const auto t0 = Clock::now();
    tp::Message m(tp::bytes(payload));
    auto r = co_await g.agent->rpc_async(std::move(to), std::move(handler), std::move(m), timeout);
    Outcome o;
    o.ms = ms_since(t0);
    o.ok = r && tp::to_string(r->payload) == payload;
    if (!r) o.code = std::string(tp::to_string(r.error().code()));
    else if (!o.ok) o.code = "wrong_reply";
    if (!r) std::fprintf(stderr, "%s: call failed after %.1f ms: %s\n", g.name.c_str(), o.ms, r.error().to_string().c_str());
    co_return o;
}

std::string summary(std::vector<Outcome> all) {
    int ok = 0;
    std::map<std::string, int> codes;
    double sum = 0, first = 0, worst = 0;
    std::vector<double> oks;
    for (auto& o : all) {
        if (o.ok) {
            ++ok;
            oks.push_back(o.ms);
        } else {
            codes[o.code]++;
        }
        sum += o.ms;
        first = first == 0 ? o.ms : std::min(first, o.ms);
        worst = std::max(worst, o.ms);
    }
    double p50 = 0;
    if (!oks.empty()) {
        std::nth_element(oks.begin(), oks.begin() + static_cast<std::ptrdiff_t>(oks.size() / 2), oks.end());
        p50 = oks[oks.size() / 2];
    }
    std::string c;
    for (auto& [k, n] : codes) c += (c.empty() ? "" : ",") + k + ":" + std::to_string(n);
    char buf[300];
    std::snprintf(buf, sizeof buf, "ok=%d failed=%d codes=%s p50_us=%.1f mean_ms=%.3f first_ms=%.1f max_ms=%.1f end_us=%lld", ok,
                  static_cast<int>(all.size()) - ok, c.empty() ? "-" : c.c_str(), p50 * 1000,
                  all.empty() ? 0 : sum / double(all.size()), first, worst, now_us());
    return buf;
}

tp::Task<void> cmd_calls(std::string tag, std::string to, int n, double timeout, std::string handler, std::string payload) {
    std::vector<Outcome> all;
    all.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        std::string t = to, h = handler, p = payload;  // (named: no temporaries inside a co_await, GCC 12)
        auto o = co_await one_call(std::move(t), std::move(h), std::move(p), timeout);
        all.push_back(std::move(o));
    }
    say(tag, "result " + summary(std::move(all)));
}

// One stream of load: calls one after another until `end`, their outcomes added to `all`.
tp::Task<void> load_stream(std::string to, Clock::time_point end, double timeout, std::shared_ptr<std::vector<Outcome>> all) {
    while (Clock::now() < end) {
        std::string t = to, h = "echo", p = "load " + std::to_string(all->size());
        auto o = co_await one_call(std::move(t), std::move(h), std::move(p), timeout);
        all->push_back(std::move(o));
    }
}

tp::Task<void> cmd_load(std::string tag, std::string to, double seconds, double timeout, int streams) {
    auto ex = co_await asio::this_coro::executor;
    auto all = std::make_shared<std::vector<Outcome>>();
    const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    auto left = std::make_shared<int>(std::max(streams, 1));
    auto done = std::make_shared<asio::steady_timer>(ex, Clock::time_point::max());
    for (int i = 0; i < *left; ++i)
        asio::co_spawn(ex, load_stream(to, end, timeout, all), [left, done](std::exception_ptr) {
            if (--*left == 0) done->cancel();
        });
    co_await done->async_wait(tp::detail::use_nothrow);
    say(tag, "result " + summary(*all));
}

tp::Task<void> cmd_pending(std::string tag, std::string to, int n, double timeout, std::string handler, std::string payload) {
    auto ex = co_await asio::this_coro::executor;
    auto all = std::make_shared<std::vector<Outcome>>(static_cast<std::size_t>(n));
    auto left = std::make_shared<int>(n);
    auto done = std::make_shared<asio::steady_timer>(ex, Clock::time_point::max());
    for (int i = 0; i < n; ++i)
        asio::co_spawn(ex, one_call(to, handler, payload, timeout), [all, left, done, i](std::exception_ptr, Outcome o) {
            (*all)[static_cast<std::size_t>(i)] = std::move(o);
            if (--*left == 0) done->cancel();
        });
    co_await pause(std::chrono::milliseconds(200));  // the requests are on the wire by then
    say(tag, "started");
    if (*left > 0) co_await done->async_wait(tp::detail::use_nothrow);
    say(tag, "result " + summary(*all));
}

tp::Task<void> cmd_bulk(std::string tag, std::string to, int mib, double timeout) {
    const std::size_t bytes = std::size_t(mib) << 20;
    std::vector<std::int64_t> shape(1, static_cast<std::int64_t>(bytes));
    std::vector<tp::Tensor> tensors(1, tp::Tensor::cpu(tp::DType::uint8, std::move(shape)));
    std::memset(tensors[0].data(), 0x5a, bytes);  // (touched: no page faults inside the measurement)
    tp::Message m(tp::bytes("bulk"), std::move(tensors));
    std::string handler = "sink";
    const auto t0 = Clock::now();
    auto r = co_await g.agent->rpc_async(std::move(to), std::move(handler), std::move(m), timeout);
    const double ms = ms_since(t0);
    const bool ok = r && tp::to_string(r->payload) == std::to_string(bytes);
    if (!r) std::fprintf(stderr, "%s: bulk call failed: %s\n", g.name.c_str(), r.error().to_string().c_str());
    char buf[160];
    std::snprintf(buf, sizeof buf, "result ok=%d bytes=%zu ms=%.1f mbps=%.1f", ok ? 1 : 0, bytes, ms, double(bytes) / (ms * 1000));
    say(tag, buf);
}

// ---- the front (examples/elastic_pool's, over every other member) ----

std::vector<std::string> others() {
    std::vector<std::string> names;
    for (const auto& w : g.agent->get_worker_infos())
        if (w.name != g.name) names.push_back(w.name);
    return names;
}

tp::Task<void> one_request(std::uint64_t id) {
    const std::string body = "request " + std::to_string(id);
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < give_up) {
        auto pool = others();
        if (pool.empty()) {
            co_await pause(std::chrono::milliseconds(10));
            continue;
        }
        const std::string to = pool[g.round_robin++ % pool.size()];
        tp::Message m(tp::bytes(body));
        std::string t = to, h = "work";
        auto r = co_await g.agent->rpc_async(std::move(t), std::move(h), std::move(m), g.front_timeout);
        if (r) {
            if (tp::to_string(r->payload) != body + " served by " + to) ++g.wrong;
            ++g.answered;
            co_return;
        }
        ++g.retried;  // it left, died or was removed meanwhile: another one takes it
        co_await pause(std::chrono::milliseconds(2));
    }
    ++g.lost;
    std::fprintf(stderr, "%s: request %llu lost (no reply within 30 s)\n", g.name.c_str(), static_cast<unsigned long long>(id));
}

tp::Task<void> issuer() {
    while (!g.front_stop) co_await one_request(g.next_id++);
}

tp::Task<void> cmd_front(std::string tag, std::string what, int in_flight, double timeout) {
    auto ex = co_await asio::this_coro::executor;
    if (what == "start") {
        if (g.front_running) {
            say(tag, "result error=already_running");
            co_return;
        }
        g.front_running = true;
        g.front_stop = false;
        g.front_timeout = timeout > 0 ? timeout : 5;
        for (int i = 0; i < in_flight; ++i) {
            ++g.front_issuers;
            asio::co_spawn(ex, issuer(), [](std::exception_ptr) { --g.front_issuers; });
        }
        say(tag, "result started=" + std::to_string(in_flight));
        co_return;
    }
    g.front_stop = true;
    while (g.front_issuers > 0) co_await pause(std::chrono::milliseconds(5));
    g.front_running = false;
    char buf[200];
    std::snprintf(buf, sizeof buf, "result requests=%llu answered=%llu retried=%llu lost=%llu wrong=%llu",
                  static_cast<unsigned long long>(g.next_id), static_cast<unsigned long long>(g.answered),
                  static_cast<unsigned long long>(g.retried), static_cast<unsigned long long>(g.lost),
                  static_cast<unsigned long long>(g.wrong));
    say(tag, buf);
}

// ---- membership ----

tp::Task<void> cmd_watch(std::string tag, bool until_gone, std::string names, double seconds) {
    const auto wanted = split(names, ',');
    const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds > 0 ? seconds : 30));
    for (;;) {
        const auto members = others();
        int present = 0;
        for (const auto& n : wanted) present += std::count(members.begin(), members.end(), n) > 0 ? 1 : 0;
        if (until_gone ? present == 0 : present == static_cast<int>(wanted.size())) break;
        if (Clock::now() > give_up) {
            say(tag, "result at_us=-1");
            co_return;
        }
        co_await pause(std::chrono::milliseconds(2));
    }
    say(tag, "result at_us=" + std::to_string(now_us()));
}

tp::Task<void> cmd_info(std::string tag) {
    auto info = co_await g.agent->get_debug_info();
    if (!info) {
        say(tag, "result error=" + info.error().to_string());
        co_return;
    }
    for (const auto& p : info->peers)
        say(tag, "peer " + p.worker + " rank=" + std::to_string(p.rank) + " transport=" + (p.transport.empty() ? "-" : p.transport) +
                     " channel=" + (p.channel.empty() ? "-" : p.channel) + " connected=" + (p.connected ? "1" : "0"));
    say(tag, "result peers=" + std::to_string(info->peers.size()));
}

// ---- handlers ----

tp::Task<tp::Result<tp::Message>> echo(tp::WorkerInfo, tp::Message m) { co_return m; }

tp::Task<tp::Result<tp::Message>> hold(tp::WorkerInfo, tp::Message m) {
    const int ms = std::atoi(tp::to_string(m.payload).c_str());
    co_await pause(std::chrono::milliseconds(ms));
    co_return m;
}

tp::Task<tp::Result<tp::Message>> sink(tp::WorkerInfo, tp::Message m) {
    std::size_t n = 0;
    for (const auto& t : m.tensors) n += t.nbytes();
    co_return tp::Message(tp::bytes(std::to_string(n)));
}

tp::Task<tp::Result<tp::Message>> work(tp::WorkerInfo, tp::Message m) {
    ++g.served;
    co_return tp::Message(tp::bytes(tp::to_string(m.payload) + " served by " + g.name));
}

// ---- the worker ----

void dispatch(asio::any_io_executor ex, const std::string& line) {
    std::istringstream in(line);
    std::string tag, cmd, a, b, c, d, e;
    in >> tag >> cmd >> a >> b >> c >> d >> e;
    if (tag.empty()) return;
    auto spawn = [&](tp::Task<void> t) { asio::co_spawn(ex, std::move(t), asio::detached); };
    if (cmd == "info") spawn(cmd_info(tag));
    else if (cmd == "calls") spawn(cmd_calls(tag, a, std::atoi(b.c_str()), std::atof(c.c_str()), d, e.empty() ? "multihost call" : e));
    else if (cmd == "pending") spawn(cmd_pending(tag, a, std::atoi(b.c_str()), std::atof(c.c_str()), d, e.empty() ? "multihost call" : e));
    else if (cmd == "load") spawn(cmd_load(tag, a, std::atof(b.c_str()), std::atof(c.c_str()), std::atoi(d.c_str())));
    else if (cmd == "bulk") spawn(cmd_bulk(tag, a, std::atoi(b.c_str()), std::atof(c.c_str())));
    else if (cmd == "front") spawn(cmd_front(tag, a, std::atoi(b.c_str()), std::atof(c.c_str())));
    else if (cmd == "watch-gone" || cmd == "watch-joined") spawn(cmd_watch(tag, cmd == "watch-gone", a, std::atof(b.c_str())));
    else if (cmd == "members") {
        std::string s;
        for (const auto& w : g.agent->get_worker_infos()) s += (s.empty() ? "" : ",") + w.name;
        say(tag, "result names=" + s);
    } else if (cmd == "stats") {
        say(tag, "result served=" + std::to_string(g.served));
    } else {
        say(tag, "result error=unknown_command");
    }
}

tp::Task<int> worker() {
    const std::string rank = env("RANK");
    g.name = "w" + rank;
    auto options = std::make_shared<tp::TensorPipeRpcBackendOptions>();
    options->init_method = "env://";
    options->listen_address = env("TP_MH_LISTEN");
    options->init_timeout = 30;
    if (const auto it = env("TP_MH_INIT_TIMEOUT"); !it.empty()) options->init_timeout = std::atof(it.c_str());
    options->rpc_timeout = 10;
    if (const auto mt = env("TP_MH_MEMBER_TIMEOUT"); !mt.empty()) options->member_timeout = std::atof(mt.c_str());
    // (No braced list here: GCC 12 mishandles std::initializer_list inside coroutines.)
    if (!tp::register_startup_handler("echo", echo) || !tp::register_startup_handler("hold", hold) ||
        !tp::register_startup_handler("sink", sink) || !tp::register_startup_handler("work", work))
        co_return 1;
    const auto t0 = Clock::now();
    auto agent = co_await tp::init_rpc(g.name, tp::BackendType::tensorpipe(), -1, -1, options);
    if (!agent) {
        std::fprintf(stderr, "%s: init_rpc failed: %s\n", g.name.c_str(), agent.error().to_string().c_str());
        co_return 1;
    }
    g.agent = *agent;
    char buf[160];
    std::snprintf(buf, sizeof buf, "rank=%d members=%zu init_ms=%.0f pid=%d sanitizer=%s", g.agent->get_worker_info().id,
                  g.agent->get_worker_infos().size(), ms_since(t0), static_cast<int>(::getpid()), kSanitizer);
    say("ready", buf);
    auto ex = co_await asio::this_coro::executor;
    asio::posix::stream_descriptor in(ex, ::dup(0));
    std::string input;
    for (;;) {
        auto [ec, n] = co_await asio::async_read_until(in, asio::dynamic_buffer(input), '\n', tp::detail::use_nothrow);
        if (ec) break;
        const std::string line = input.substr(0, n - 1);
        input.erase(0, n);
        std::istringstream words(line);
        std::string tag, cmd;
        words >> tag >> cmd;
        if (cmd == "quit") break;
        dispatch(ex, line);
    }
    g.front_stop = true;
    auto down = co_await g.agent->shutdown(false, 2);
    if (!down) std::fprintf(stderr, "%s: shutdown: %s\n", g.name.c_str(), down.error().to_string().c_str());
    say("bye", g.name);
    co_return 0;
}

}  // namespace

int main() { return tensorplay::test::run_worker(worker); }
