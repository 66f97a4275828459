// One body of channel behaviour run over each of the four channels (issue 35), as TensorPipe's
// channel conformance suite does: basic and cma carry CPU tensors, cuda_basic and cuda_ipc cuda
// tensors (on the fake runtime), each between two worker processes (cuda_ipc needs two; the others
// run the same way). Tensors of 0 B to 64 MiB go and come back byte for byte by that channel, 200
// calls are in flight at once, and an impostor of the caller that sends references the channel
// cannot honour, control frames out of order, or stops in the middle of a tensor fails that frame
// or loses its own connection while the workers go on.
#include "rpc/agent_test_util.hpp"
#include "rpc/cuda_test_util.hpp"
#include "rpc/forked.hpp"

#include <tensorplay/store/tcp_store.hpp>

#include "transport/channels/cuda_ipc/outbox.hpp"
#include "transport/channels/cuda_ipc/rings.hpp"
#include "transport/connection_ext.hpp"
#include "transport/transport.hpp"

#include <asio/co_spawn.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstring>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_channel_conformance_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

bool on_cuda(const std::string& channel) { return channel.rfind("cuda", 0) == 0; }

/// Where the caller's tensors start, and where they land on the callee (the device map).
Device source_of(const std::string& channel) { return on_cuda(channel) ? Device::cuda(0) : Device::cpu(); }
Device target_of(const std::string& channel) { return on_cuda(channel) ? Device::cuda(1) : Device::cpu(); }

/// `channel`, then basic; for the cuda channels both devices, and the caller's map to its peer's
/// other device.
void configure(const std::string& channel, int rank, TensorPipeRpcBackendOptions& o) {
    o.channels = std::vector<std::string>{channel};  // (first: the order is the priority)
    if (channel != "basic") o.channels->push_back("basic");
    o.rpc_timeout = 30;
    if (!on_cuda(channel)) return;
    o.devices = {Device::cuda(0), Device::cuda(1)};
    if (rank == 0) o.device_maps["worker1"] = DeviceMap{{Device::cuda(0), Device::cuda(1)}, {Device::cuda(1), Device::cuda(0)}};
}

/// A message with one `n`-byte tensor of `seed`'s pattern on `d`.
Result<Message> message_of(Device d, std::size_t n, int seed) {
    Message m{bytes("conform"), {}};
    if (d.is_cpu()) {
        Tensor t = Tensor::cpu(DType::uint8, {static_cast<std::int64_t>(n)});
        const auto p = test::pattern(n, seed);
        if (n) std::memcpy(t.data(), p.data(), n);
        m.tensors.push_back(std::move(t));
        return m;
    }
    auto s = test::cuda().acquire_stream(d);
    if (!s) return fail(s.error());
    auto t = test::filled(*s, n, seed);
    if (!t) return fail(t.error());
    m.tensors.push_back(std::move(*t));
    m.streams.push_back(*s);
    return m;
}

/// Whether `r` is one tensor on `d` with `seed`'s `n`-byte pattern.
Task<bool> holds_pattern(const Result<Message>& r, Device d, std::size_t n, int seed) {
    if (!r) {
        std::fprintf(stderr, "a call of %zu bytes failed: %s\n", n, r.error().to_string().c_str());
        co_return false;
    }
    if (r->tensors.size() != 1 || r->tensors[0].device() != d || r->tensors[0].nbytes() != n) co_return false;
    const Tensor& t = r->tensors[0];
    if (d.is_cpu()) co_return n == 0 || std::memcmp(t.data(), test::pattern(n, seed).data(), n) == 0;
    co_return co_await test::read_back(t, test::stream_of(*r, d)) == test::pattern(n, seed);
}

/// One echo of an `n`-byte tensor to worker1 and back, checked.
Task<bool> round_trip(detail::NativeAgent& a, const std::string& channel, std::size_t n, int seed) {
    auto m = message_of(source_of(channel), n, seed);
    if (!m) co_return false;
    const std::string to = "worker1", handler = "echo";
    auto r = co_await a.rpc_async(to, handler, std::move(*m), 30);
    co_return co_await holds_pattern(r, source_of(channel), n, seed);
}

#define EXPECT(cond, code)                                                                                   \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            std::fprintf(stderr, "%s: %s (line %d)\n", channel.c_str(), #cond, __LINE__);                    \
            co_return code;                                                                                  \
        }                                                                                                    \
    } while (0)

/// Tensors of 0 B, 1 B, 4 KiB, 1 MiB and 64 MiB each go and come back by the channel (its counters
/// say so).
Task<int> sizes(detail::NativeAgent& a, const std::string& channel) {
    static constexpr std::size_t kSizes[] = {0, 1, 4096, std::size_t{1} << 20, std::size_t{64} << 20};
    int seed = 1;
    for (const std::size_t n : kSizes) {
        const bool ok = co_await round_trip(a, channel, n, seed++);
        if (!ok) std::fprintf(stderr, "%s: %zu bytes\n", channel.c_str(), n);
        EXPECT(ok, 20);
    }
    const auto conn = a.connection_to(1);
    EXPECT(conn != nullptr, 21);
    const auto st = tensorplay::detail::channel_stats(*conn);
    const auto dev = a.device_stats();
    std::fprintf(stderr, "%s over %s: cma %llu sent, %llu received; cuda_ipc %llu, staged %llu\n", channel.c_str(),
                 conn->transport().c_str(), static_cast<unsigned long long>(st.cma_sent), static_cast<unsigned long long>(st.cma_received),
                 static_cast<unsigned long long>(dev.ipc_sent), static_cast<unsigned long long>(dev.staged_sent));
    // (cma takes 64 KiB and more; each tensor goes out and comes back.)
    EXPECT((st.cma_sent >= 2 && st.cma_received >= 2) == (channel == "cma"), 22);
    EXPECT((dev.ipc_sent >= 3) == (channel == "cuda_ipc"), 23);
    EXPECT((dev.staged_sent >= 4) == (channel == "cuda_basic"), 24);
    if (channel == "cuda_ipc") EXPECT(dev.staged_sent == 1, 25);  // (the empty tensor: no memory to refer to)
    co_return 0;
}

/// 200 calls of 1 B to 1 MiB in flight at once, each coming back whole.
Task<int> in_flight(detail::NativeAgent& a, const std::string& channel) {
    auto ex = co_await asio::this_coro::executor;
    constexpr int n = 200;
    int ok = 0, done = 0;
    test::Signal all(ex, 1);
    const std::size_t sizes[] = {1, 4096, 100000, std::size_t{1} << 20};
    for (int i = 0; i < n; ++i) {
        asio::co_spawn(ex, round_trip(a, channel, sizes[i % 4], 100 + i), [&](std::exception_ptr e, bool good) {
            ok += !e && good;
            if (++done == n) all.try_send(std::error_code{}, 0);
        });
    }
    co_await all.async_receive(asio::use_awaitable);
    EXPECT(ok == n, 30);
    co_return 0;
}

/// A connection to worker1 at `address` that says it is worker0 and offers `channel` as the
/// worker does (cuda_ipc: this process, both devices, no outbox yet).
Task<Result<std::shared_ptr<Connection>>> impostor(std::string address, std::string channel) {
    HelloInfo h;
    h.name = "worker0";
    h.rank = 0;
    h.channels = {ChannelOffer{"basic", "cpu", "any"}};
    if (channel == "cma") h.channels.push_back(ChannelOffer{"cma", "cpu", ""});  // (filled in when it connects)
    if (channel == "cuda_basic") h.channels.push_back(ChannelOffer{"cuda_basic", "cuda", "any"});
    if (channel == "cuda_ipc") {
        detail::IpcParams params;
        params.pid = ::getpid();
        for (int d = 0; d < 2; ++d) {
            detail::IpcDeviceParams p;
            p.index = d;
            p.bus_id = "0000:0" + std::to_string(d) + ":00.0";
            params.devices.push_back(p);
        }
        h.channels.push_back(ChannelOffer{"cuda_ipc", "cuda", "cuda_ipc:" + detail::same_host_domain(), detail::encode_ipc_params(params)});
    }
    const auto colon = address.rfind(':');
    auto c = Connection::connect(address.substr(0, colon), static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))), h,
                                 ConnectionLimits{});
    co_return co_await std::move(c);
}

/// The outbox notice of an outbox of cuda:`device` of this process (its handles open nothing).
Bytes outbox_notice(int device) {
    detail::IpcDeviceParams p;
    p.index = device;
    p.outbox = true;
    p.size = 1 << 20;
    p.chunk = 64 << 10;
    p.ring = 4;
    p.events.resize(1);
    detail::IpcParams params{::getpid(), {p}};
    const std::string s = detail::encode_ipc_params(params);
    return Bytes(s.begin(), s.end());
}

/// A request to "echo" whose one `n`-byte tensor goes from our `source` to worker1's `target` by
/// reference `ref` (0: inline, its bytes a host tensor's); `flush`.
Result<void> send_tensor(Connection& c, Device source, Device target, std::uint64_t ref, std::size_t n, bool flush = true) {
    const auto pace = flush ? detail::Flush::now : detail::Flush::later;
    std::vector<Tensor> tensors{Tensor::cpu(DType::uint8, {static_cast<std::int64_t>(n)})};
    std::vector<Device> targets{target};
    detail::SendPlan parts;
    parts.sources = {source};
    parts.refs = {ref};
    Bytes payload = bytes("x");
    return detail::send_parts(c, FrameKind::request, 7, "echo", payload, tensors, targets, parts, pace);
}

Result<void> send_control(Connection& c, std::string_view name, Bytes payload) {
    std::vector<Tensor> none;
    return detail::send_parts(c, FrameKind::control, 0, name, payload, none, {}, detail::Flush::now);
}

enum class Outcome { closed, failed_frame, any };

/// What worker1 did with what the impostor sent: closed its connection, or answered that one frame
/// with an error (the connection staying open) whose text has `why`.
Task<bool> answered(Connection& c, Outcome want, std::string_view why = {}) {
    auto got = co_await with_timeout(c.receive(), 10s);
    if (want == Outcome::any) co_return true;
    if (want == Outcome::closed) co_return !got && !c.is_open();
    if (!got || got->kind != FrameKind::error) co_return false;
    const Error e = detail::decode_error(got->payload, "worker1");
    if (e.message().find(why) == std::string::npos) {
        std::fprintf(stderr, "the frame failed with: %s\n", e.to_string().c_str());
        co_return false;
    }
    co_return c.is_open();
}

struct Step {
    const char* what;
    std::function<Result<void>(Connection&)> send;
    Outcome outcome;
    std::string why = {};
};

/// What the impostor sends over `channel`, and how worker1 must answer each.
std::vector<Step> hostile_steps(const std::string& channel) {
    const Device src = source_of(channel), dst = target_of(channel);
    const std::size_t big = std::size_t{64} << 20;
    std::vector<Step> steps;
    // References the channel cannot honour.
    if (channel == "basic" || channel == "cuda_basic")
        steps.push_back({"a reference on a pair whose channel sends none", [=](Connection& c) { return send_tensor(c, src, dst, 1, 4096); },
                         Outcome::closed});
    if (channel == "cma") {
        steps.push_back({"a reference to memory it cannot read", [=](Connection& c) { return send_tensor(c, src, dst, 8, 4096); },
                         Outcome::failed_frame, "by cma"});
        static std::vector<std::uint8_t> unleased(4096, 7);
        const auto at = reinterpret_cast<std::uint64_t>(unleased.data());
        steps.push_back({"a reference under a hold it does not lease", [=](Connection& c) { return send_tensor(c, src, dst, at, 4096); },
                         Outcome::failed_frame, "let go"});
    }
    if (channel == "cuda_ipc") {
        steps.push_back({"a reference into an outbox never announced",
                         [=](Connection& c) { return send_tensor(c, src, dst, detail::encode_ipc_ref(0, 0, false), 4096); }, Outcome::closed});
        steps.push_back({"a reference a cuda tensor of the pair cannot be (cpu to cuda)",
                         [=](Connection& c) { return send_tensor(c, Device::cpu(), dst, detail::encode_ipc_ref(0, 0, false), 4096); },
                         Outcome::closed});
    }
    // Control frames out of order.
    steps.push_back({"a release of a hold never sent", [](Connection& c) {
                         detail::release_hold(c, 12345);
                         return send_control(c, "cuda_ipc.nothing", {});  // (flushes the release; never read)
                     },
                     Outcome::closed});
    steps.push_back({"a ring notice for a ring never sent",
                     [](Connection& c) { return send_control(c, detail::kRingReady, detail::encode_ring_notice(detail::RingNotice{0, 0, 4})); },
                     Outcome::closed});
    if (channel == "cuda_ipc")
        steps.push_back({"an outbox announced twice", [](Connection& c) {
                             if (auto r = send_control(c, detail::kIpcOutbox, outbox_notice(0)); !r) return r;
                             return send_control(c, detail::kIpcOutbox, outbox_notice(0));
                         },
                         Outcome::closed});
    // Stopping in the middle of a tensor (the socket takes a part of 64 MiB; the rest is dropped with
    // the close), or right after a frame by reference.
    if (channel == "basic" || channel == "cuda_basic")
        steps.push_back({"a close in the middle of a tensor's bytes", [=](Connection& c) {
                             auto r = send_tensor(c, src, dst, 0, big);
                             c.close();
                             return r;
                         },
                         Outcome::any});
    if (channel == "cma")
        steps.push_back({"a close right after a frame by reference", [=](Connection& c) {
                             Frame f;
                             f.id = 9;
                             f.name = "echo";
                             f.tensors.push_back(Tensor::cpu(DType::uint8, {static_cast<std::int64_t>(big)}));
                             auto r = c.send(std::move(f), true);
                             c.close();
                             return r;
                         },
                         Outcome::any});
    if (channel == "cuda_ipc")
        steps.push_back({"a close right after a frame by reference into an outbox that does not open", [=](Connection& c) {
                             if (auto r = send_control(c, detail::kIpcOutbox, outbox_notice(0)); !r) return r;
                             auto r = send_tensor(c, src, dst, detail::encode_ipc_ref(0, 0, false), 4096);
                             c.close();
                             return r;
                         },
                         Outcome::any});
    return steps;
}

/// The hostile steps for `channel`: each on a fresh impostor connection, each answered as it must
/// be, and after each the real caller's calls still work.
Task<int> hostile(detail::NativeAgent& a, const std::string& channel, const std::string& address) {
    const std::vector<Step> steps = hostile_steps(channel);
    int k = 0;
    for (const auto& step : steps) {
        ++k;
        auto conn = co_await impostor(address, channel);
        if (!conn) std::fprintf(stderr, "%s: %s: %s\n", channel.c_str(), step.what, conn.error().to_string().c_str());
        EXPECT(conn, 40 + k);
        (void)step.send(**conn);  // (a close in the middle reports itself: nothing to check here)
        const bool as_expected = co_await answered(**conn, step.outcome, step.why);
        if (!as_expected) std::fprintf(stderr, "%s: %s: not answered as expected\n", channel.c_str(), step.what);
        EXPECT(as_expected, 60 + k);
        (*conn)->close();
        EXPECT(co_await round_trip(a, channel, 4096, k), 80 + k);
    }
    co_return 0;
}

#undef EXPECT

/// A worker of the run over `channel`: rank 0 runs the body, rank 1 serves echo until it is done.
Task<int> worker(std::string channel, int rank, std::uint16_t port) {
    auto ex = co_await asio::this_coro::executor;
    auto store = co_await TcpStore::connect(ex, test::local_store(port, 30s));
    if (!store) co_return 10;
    std::shared_ptr<Store> st = *store;
    if (on_cuda(channel) && cuda_device_count() < 2) co_return 77;
    auto args = test::init_args(st, rank, 2, [&channel](int r, TensorPipeRpcBackendOptions& o) { configure(channel, r, o); });
    auto agent = co_await detail::NativeAgent::create(std::move(args), {});
    if (!agent) {
        std::fprintf(stderr, "%s, rank %d: %s\n", channel.c_str(), rank, agent.error().to_string().c_str());
        co_return 11;
    }
    auto& a = **agent;
    const Bytes one = bytes("1");
    if (rank == 1) {
        if (!a.register_handler("echo", [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; })) co_return 12;
        const std::string address = a.listen_address();
        if (!co_await st->set("test/address", Bytes(address.begin(), address.end()))) co_return 13;
        std::vector<std::string> keys{"test/done"};
        if (!co_await st->wait(std::move(keys), 120s)) co_return 14;
        auto down = co_await a.shutdown(true, 20);
        co_return down ? 0 : 15;
    }
    std::vector<std::string> keys{"test/address"};
    if (!co_await st->wait(keys, 30s)) co_return 16;
    auto address = co_await st->get("test/address");
    if (!address) co_return 17;
    int code = co_await sizes(a, channel);
    if (code == 0) code = co_await in_flight(a, channel);
    if (code == 0) code = co_await hostile(a, channel, std::string(address->begin(), address->end()));
    (void)co_await st->set("test/done", one);
    auto down = co_await a.shutdown(true, 20);
    if (code == 0 && !down) code = 18;
    co_return code;
}

/// Runs the body over `channel` between two forked workers: both exit codes.
std::vector<int> run(const std::string& channel) {
    return test::run_workers(2, [&channel](int rank, std::uint16_t port) { return worker(channel, rank, port); }, 100s);
}

}  // namespace

TEST_CASE("each channel carries tensors of every size, many in flight, and survives a hostile peer", "[rpc][channel][multiprocess]") {
    const std::string channel = GENERATE(std::string("basic"), std::string("cma"), std::string("cuda_basic"), std::string("cuda_ipc"));
    INFO("channel " << channel);
    const auto codes = run(channel);
    if (on_cuda(channel) && codes[0] == 77 && codes[1] == 77) {
        WARN("fewer than two cuda devices (the fake runtime was not loaded): " << channel << " skipped");
        return;
    }
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
}

}  // namespace tp_channel_conformance_test
