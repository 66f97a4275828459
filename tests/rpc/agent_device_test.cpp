// CUDA tensors in one process's agents (on the fake CUDA runtime, a test double loaded through
// TP_CUDART): they go by cuda_basic (a process cannot open its own IPC handles), through the
// device maps and back; a tensor with no device map is refused naming worker and device; and a hostile peer
// that sends cuda_ipc references the agent cannot honour (no marker, a range past the outbox, an
// offer that does not decode, a ring notice for a ring never sent, a one-copy tensor never
// announced, an outbox offered or announced wrongly, export notices no frame takes) loses its own
// connection, while the group goes on. The two-process tests of the device channels are
// cuda_rpc_test.cpp.
#include "rpc/agent_test_util.hpp"
#include "rpc/cuda_test_util.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/device/backend.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "transport/channels/cuda_ipc/outbox.hpp"
#include "transport/channels/cuda_ipc/rings.hpp"
#include "transport/connection_ext.hpp"
#include "transport/transport.hpp"

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_agent_device_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

Task<void> calls_work(test::AgentGroup& g) {
    for (int from = 0; from < 2; ++from) {
        auto r = co_await g[from]->rpc_async(test::worker_name(1 - from), "echo", test::text_message("ping"));
        REQUIRE(r);
        CHECK(r->payload == bytes("ping"));
    }
}

/// The agent closes `conn` instead of answering, and the group's calls go on.
Task<void> closed_alone(Connection& conn, test::AgentGroup& g) {
    auto got = co_await conn.receive();
    CHECK_FALSE(got);
    CHECK_FALSE(conn.is_open());
    co_await calls_work(g);
}

/// A connection to `address` that says it is worker1 and offers cuda_ipc with `params`.
Task<Result<std::shared_ptr<Connection>>> impostor(std::string address, std::string params) {
    const auto colon = address.rfind(':');
    HelloInfo h;
    h.name = "worker1";
    h.rank = 1;
    h.channels = {ChannelOffer{"basic", "cpu", "any"},
                  ChannelOffer{"cuda_ipc", "cuda", "cuda_ipc:" + detail::same_host_domain(), std::move(params)}};
    auto c = Connection::connect(address.substr(0, colon), static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))), h,
                                 ConnectionLimits{});
    co_return co_await std::move(c);
}

/// Sends a request for "echo" whose one cuda tensor of `n` bytes goes by the cuda_ipc reference `ref`.
Result<void> send_ref(Connection& c, std::uint64_t ref, std::size_t n = 4096) {
    auto t = empty(Device::cuda(0), DType::uint8, {static_cast<std::int64_t>(n)});
    if (!t) return fail(t.error());
    std::vector<Tensor> tensors{*t};
    std::vector<Device> targets{Device::cuda(0)};
    detail::SendPlan parts;
    parts.sources = {Device::cuda(0)};
    parts.refs = {ref};
    Bytes payload = bytes("x");
    return detail::send_parts(c, FrameKind::request, 1, "echo", payload, tensors, targets, parts, detail::Flush::now);
}

}  // namespace

TEST_CASE("a cuda tensor without a device map to the callee is refused, naming the worker and the device", "[rpc][agent][device]") {
    if (cuda_device_count() < 1) {
        WARN("no cuda device (the fake runtime was not loaded): skipped");
        return;
    }
    test::run_with_deadline(20s, []() -> Task<void> {
        auto g = co_await test::make_group(2);
        test::register_echo(g);
        auto t = empty(Device{DeviceType::cuda, 0}, DType::float32, {4});
        REQUIRE(t);
        Message m = test::text_message("with a cuda tensor");
        m.tensors.push_back(*t);
        auto r = co_await g[0]->rpc_async(test::worker_name(1), "echo", std::move(m));
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::device_error);
        INFO(r.error().to_string());
        CHECK(r.error().to_string().find("cuda:0") != std::string::npos);
        CHECK(r.error().to_string().find("worker1") != std::string::npos);
        CHECK(r.error().to_string().find("set_device_map") != std::string::npos);
        co_await calls_work(g);
        auto down = co_await test::shutdown_all(g);
        for (auto& d : down) CHECK(d);
    });
}

TEST_CASE("agents of one process move cuda tensors by cuda_basic, through the maps and back", "[rpc][agent][device]") {
    if (cuda_device_count() < 2) {
        WARN("fewer than two cuda devices (the fake runtime was not loaded): skipped");
        return;
    }
    test::run_with_deadline(30s, []() -> Task<void> {
        auto g = co_await test::make_group(2, [](int rank, TensorPipeRpcBackendOptions& o) {
            o.devices = {Device::cuda(0), Device::cuda(1)};
            if (rank == 0) o.device_maps["worker1"] = DeviceMap{{Device::cuda(0), Device::cuda(1)}};
        });
        test::register_echo(g);
        auto s = test::cuda().acquire_stream(Device::cuda(0));
        REQUIRE(s);
        const std::size_t n = 300000;
        auto t = test::filled(*s, n, 5);
        REQUIRE(t);
        Message m{bytes("one process"), {*t}};
        m.streams.push_back(*s);
        const std::string to = "worker1", handler = "echo";
        auto r = co_await g[0]->rpc_async(to, handler, std::move(m));
        REQUIRE(r);
        REQUIRE(r->tensors.size() == 1);
        CHECK(r->tensors[0].device() == Device::cuda(0));
        auto back = co_await test::read_back(r->tensors[0], test::stream_of(*r, Device::cuda(0)));
        CHECK(back == test::pattern(n, 5));
        const auto st = g[0]->device_stats();
        CHECK(st.ipc_sent == 0);
        CHECK(st.staged_sent == 1);
        CHECK(st.staged_received == 1);
        // The producer's work does not end while the call waits to stage its tensor: the call
        // still ends at its timeout (a hang here fails the test's deadline).
        std::atomic<bool> go{false};
        REQUIRE(test::cuda().enqueue_host(*s, [&go] {
            go.wait(false);  // (a kernel that runs until the test says)
        }));
        Message stalled{bytes("stalled"), {*t}};
        stalled.streams.push_back(*s);
        auto late = co_await g[0]->rpc_async(to, handler, std::move(stalled), 0.3);
        go = true;
        go.notify_all();
        REQUIRE_FALSE(late);
        CHECK(late.error().code() == Errc::timeout);
        auto again = co_await g[0]->rpc_async(to, handler, test::text_message("after"));
        CHECK(again);
        auto down = co_await test::shutdown_all(g);
        for (auto& d : down) CHECK(d);
    });
}

TEST_CASE("cuda_ipc references and ring notices a peer cannot have sent close its connection only", "[rpc][agent][device][hostile]") {
    if (cuda_device_count() < 1) {
        WARN("no cuda device (the fake runtime was not loaded): skipped");
        return;
    }
    test::run_with_deadline(30s, []() -> Task<void> {
        auto g = co_await test::make_group(2, [](int, TensorPipeRpcBackendOptions& o) { o.devices = {Device::cuda(0)}; });
        test::register_echo(g);
        // An offer of one device, and the notice that announces its outbox: 1 MiB, rings of 4 64 KiB
        // chunks, one event.
        detail::IpcDeviceParams dev;
        dev.index = 0;
        dev.bus_id = "0000:00:00.0";
        detail::IpcParams params;
        params.pid = ::getpid() + 1;  // (another process's offer: one naming this process is refused too)
        params.devices = {dev};
        const std::string offer = detail::encode_ipc_params(params);
        params.pid = ::getpid();
        const std::string own_offer = detail::encode_ipc_params(params);
        params.pid = ::getpid() + 1;
        dev.outbox = true;
        dev.size = 1 << 20;
        dev.chunk = 64 << 10;
        dev.ring = 4;
        dev.events.resize(1);
        params.devices = {dev};
        const std::string outbox = detail::encode_ipc_params(params);  // (in an offer: version 4's way, refused)
        params.pid = ::getpid() + 2;
        const std::string other_process = detail::encode_ipc_params(params);
        params.pid = ::getpid() + 1;
        params.devices[0].index = 1;
        const std::string not_offered = detail::encode_ipc_params(params);
        params.devices[0].index = 0;
        params.devices[0].ring = 1;  // (a ring must have 2 slots or more)
        const std::string bad_ring = detail::encode_ipc_params(params);
        struct Case {
            const char* what;
            std::string offer;
            std::vector<std::string> notices;  ///< kIpcOutbox notices sent before the reference
            std::uint64_t ref;
            std::size_t bytes = 4096;
        };
        const std::size_t big = (std::size_t{256} << 10) + 1;  // (over a ring: its chunks come through one)
        const std::vector<Case> cases{
            {"a reference without its marker", offer, {outbox}, std::uint64_t{4096} << 16},
            {"a range past the outbox", offer, {outbox}, detail::encode_ipc_ref(std::size_t{1} << 20, 0, false)},
            {"an event the outbox does not have", offer, {outbox}, detail::encode_ipc_ref(0, 3, false)},
            {"an offer that does not decode", std::string("\x07garbage", 8), {}, detail::encode_ipc_ref(0, 0, false)},
            {"an offer that names the receiving process", own_offer, {}, detail::encode_ipc_ref(0, 0, false)},
            {"an offer that carries an outbox", outbox, {}, detail::encode_ipc_ref(0, 0, false)},
            {"a reference into an outbox never announced", offer, {}, detail::encode_ipc_ref(0, 0, false)},
            {"an outbox announced twice", offer, {outbox, outbox}, detail::encode_ipc_ref(0, 0, false)},
            {"an outbox of a device not offered", offer, {not_offered}, detail::encode_ipc_ref(0, 0, false)},
            {"an outbox of another process", offer, {other_process}, detail::encode_ipc_ref(0, 0, false)},
            {"an outbox whose rings have one slot", offer, {bad_ring}, detail::encode_ipc_ref(0, 0, true), big},
            {"a ring past the outbox", offer, {outbox}, detail::encode_ipc_ref(std::size_t{800} << 10, 0, true), big},
            {"a tensor in a ring that it fits whole", offer, {outbox}, detail::encode_ipc_ref(0, 0, true)},
            {"a one-copy reference whose export was never announced", offer, {outbox}, detail::encode_pool_ref(7, 0)},
        };
        {
            // (The control: a good offer and outbox notice leave the connection serving.)
            auto conn = co_await impostor(g[0]->listen_address(), offer);
            REQUIRE(conn);
            Bytes payload(outbox.begin(), outbox.end());
            std::vector<Tensor> none;
            REQUIRE(detail::send_parts(**conn, FrameKind::control, 0, detail::kIpcOutbox, payload, none, {}, detail::Flush::later));
            Frame f;
            f.id = 1;
            f.name = "echo";
            f.payload = bytes("announced");
            REQUIRE((*conn)->send(std::move(f), true));
            auto reply = co_await (*conn)->receive();
            REQUIRE(reply);
            CHECK(reply->kind == FrameKind::response);
            CHECK(reply->payload == bytes("announced"));
            CHECK((*conn)->is_open());
        }
        for (const auto& c : cases) {
            INFO(c.what);
            auto conn = co_await impostor(g[0]->listen_address(), c.offer);
            REQUIRE(conn);
            REQUIRE((*conn)->negotiated().channels.size() >= 1);
            for (const auto& n : c.notices) {
                Bytes payload(n.begin(), n.end());
                std::vector<Tensor> none;
                REQUIRE(detail::send_parts(**conn, FrameKind::control, 0, detail::kIpcOutbox, payload, none, {}, detail::Flush::later));
            }
            REQUIRE(send_ref(**conn, c.ref, c.bytes));
            co_await closed_alone(**conn, g);
        }
        // Control frames about rings that were never sent, cut short, or of no known name. Their
        // names are not handler names: a handler may have one, and requests reach it.
        REQUIRE(g[0]->register_handler(std::string(detail::kRingFree),
                                       [](WorkerInfo, Message m) -> Task<Result<Message>> { co_return m; }));
        auto served = co_await g[1]->rpc_async("worker0", std::string(detail::kRingFree), test::text_message("a call"));
        REQUIRE(served);
        CHECK(served->payload == bytes("a call"));
        const Bytes notice = detail::encode_ring_notice(detail::RingNotice{0, 0, 0});
        struct Notice {
            const char* what;
            std::string_view name;
            Bytes payload;
        };
        const Bytes exported = detail::encode_pool_export(detail::PoolExport{1, 0, 0, {}});
        const std::vector<Notice> notices{
            {"a free for a ring we did not send", detail::kRingFree, notice},
            {"a ready for a ring it did not send", detail::kRingReady, notice},
            {"a notice cut short", detail::kRingFree, Bytes(notice.begin(), notice.begin() + 5)},
            {"an export notice cut short", detail::kIpcExport, Bytes(exported.begin(), exported.begin() + 20)},
            {"a control frame of no known name", "cuda_ipc.nonsense", notice},
        };
        for (const auto& c : notices) {
            INFO(c.what);
            auto conn = co_await impostor(g[0]->listen_address(), std::string("\x07garbage", 8));
            REQUIRE(conn);
            Bytes payload = c.payload;
            std::vector<Tensor> none;
            REQUIRE(detail::send_parts(**conn, FrameKind::control, 0, c.name, payload, none, {}, detail::Flush::now));
            co_await closed_alone(**conn, g);
        }
        // Export notices that no frame takes: the same id twice, and more than the receiver keeps.
        for (const std::size_t count : {std::size_t{2}, std::size_t{4097}}) {
            INFO(count << " export notices");
            auto conn = co_await impostor(g[0]->listen_address(), offer);
            REQUIRE(conn);
            for (std::size_t i = 0; i < count; ++i) {
                Bytes payload = detail::encode_pool_export(detail::PoolExport{count == 2 ? 1 : i, 0, 0, {}});
                std::vector<Tensor> none;
                if (!detail::send_parts(**conn, FrameKind::control, 0, detail::kIpcExport, payload, none, {}, i + 1 == count ? detail::Flush::now : detail::Flush::later)) break;
            }
            co_await closed_alone(**conn, g);
        }
        auto down = co_await test::shutdown_all(g);
        for (auto& d : down) CHECK(d);
    });
}

TEST_CASE("a cuda_ipc outbox takes a dropped hold's ranges back only once the copies into them ran", "[rpc][device]") {
    if (cuda_device_count() < 1) {
        WARN("no cuda device (the fake runtime was not loaded): skipped");
        return;
    }
    test::run_with_deadline(20s, []() -> Task<void> {
        auto& b = test::cuda();
        const Device d = Device::cuda(0);
        const std::size_t size = std::size_t{1} << 20;
        auto box = detail::Outbox::create(b, d, size);
        REQUIRE(box);
        auto s = b.acquire_stream(d);
        auto src = b.allocate(d, 4096);
        REQUIRE(s);
        REQUIRE(src);
        // A copy into the whole outbox that waits behind work only the test lets go of.
        std::atomic<bool> go{false};
        REQUIRE(b.enqueue_host(*s, [&go] {
            go.wait(false);  // (a kernel that runs until the test says)
        }));
        auto off = (*box)->take_range(size);
        auto k = (*box)->take_event();
        REQUIRE(off);
        REQUIRE(k);
        REQUIRE(b.copy_async(*s, (*box)->data() + *off, (*src)->data(), 4096));
        REQUIRE(b.record_again(*s, (*box)->event(*k)));
        {
            detail::OutboxHold hold;  // (dropped as a closed connection drops it, the copy still queued)
            hold.ranges.push_back(detail::OutboxHold::Range{*box, *off, size});
            hold.events.emplace_back(*box, *k);
        }
        CHECK_FALSE((*box)->take_range(4096));  // (another frame's copy would race the queued one)
        go = true;
        go.notify_all();
        auto done = b.record_event(*s);
        REQUIRE(done);
        auto waited = co_await b.wait(*done);
        REQUIRE(waited);
        auto again = (*box)->take_range(size);
        CHECK(again);
    });
}

}  // namespace tp_agent_device_test
