// Native agents with a FaultProxy on the link from worker0 to worker1: cuts, resets, corrupt
// frames and stalls end pending calls with a clear error, and the agents keep serving others.
//
// The seam needs no library change: worker0's view of the store rewrites worker1's published
// address (the "native_agent/info/1" record) to the proxy's, so worker0's calls to worker1 go
// through the proxy while every other link (worker2 <-> anyone, worker1 -> worker0) is direct.
#include "rpc/agent_test_util.hpp"
#include "support/fault_proxy.hpp"

#include <tensorplay/core/wire.hpp>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_agent_proxy_fault_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using test::Cut;
using test::Direction;
using test::FaultProxy;

namespace {

// Forwards to a shared store; multi_get replaces worker1's address record with a proxy's.
class ProxiedView final : public Store {
public:
    explicit ProxiedView(std::shared_ptr<Store> inner) : inner_(std::move(inner)) { timeout_ = inner_->timeout(); }
    std::unique_ptr<FaultProxy> proxy;  ///< made when worker0 reads worker1's record
    std::function<void(FaultProxy&)> on_proxy;  ///< called once the proxy is made, before any connect
    using Store::wait;

    Task<Result<void>> set(std::string k, Bytes v) override { return inner_->set(std::move(k), std::move(v)); }
    Task<Result<Bytes>> get(std::string k) override { return inner_->get(std::move(k)); }
    Task<Result<std::int64_t>> add(std::string k, std::int64_t d) override { return inner_->add(std::move(k), d); }
    Task<Result<Bytes>> compare_set(std::string k, Bytes e, Bytes d) override {
        return inner_->compare_set(std::move(k), std::move(e), std::move(d));
    }
    Task<Result<void>> wait(std::vector<std::string> k, Duration t) override { return inner_->wait(std::move(k), t); }
    Task<Result<bool>> check(std::vector<std::string> k) override { return inner_->check(std::move(k)); }
    Task<Result<bool>> delete_key(std::string k) override { return inner_->delete_key(std::move(k)); }
    Task<Result<std::int64_t>> num_keys() override { return inner_->num_keys(); }
    Task<Result<void>> append(std::string k, Bytes v) override { return inner_->append(std::move(k), std::move(v)); }
    Task<Result<void>> multi_set(std::vector<std::string> k, std::vector<Bytes> v) override {
        return inner_->multi_set(std::move(k), std::move(v));
    }
    Task<Result<std::vector<Bytes>>> multi_get(std::vector<std::string> keys) override {
        auto asked = keys;  // (named: no temporary inside a co_await, GCC 12)
        auto r = co_await inner_->multi_get(std::move(asked));
        if (!r) co_return r;
        for (std::size_t i = 0; i < keys.size(); ++i)
            if (keys[i] == "native_agent/info/1") (*r)[i] = rewrite((*r)[i]);
        co_return r;
    }

private:
    // The record: u16 version, str32 name, i32 rank, u32 n, n x (str32 transport, str32 domain,
    // str32 address) (native_agent_init.cpp). The uv address is pointed at the proxy.
    Bytes rewrite(const Bytes& record) {
        WireReader in(record);
        auto version = in.u16();
        std::string name(in.str32());
        auto rank = in.i32();
        auto n = in.u32();
        WireWriter out;
        out.u16(version).str32(name).i32(rank).u32(n);
        for (std::uint32_t i = 0; i < n; ++i) {
            std::string transport(in.str32()), domain(in.str32()), address(in.str32());
            if (transport == "uv") {
                auto a = Address::parse(address);
                REQUIRE(a);
                proxy = std::make_unique<FaultProxy>(a->host, a->port);
                address = Address::tcp("127.0.0.1", proxy->port()).str();
            }
            out.str32(transport).str32(domain).str32(address);
        }
        REQUIRE_FALSE(in.failed());
        REQUIRE(proxy);
        if (on_proxy) on_proxy(*proxy);
        return std::move(out).take();
    }
    std::shared_ptr<Store> inner_;
};

struct ProxiedGroup {
    test::AgentGroup g;
    std::shared_ptr<ProxiedView> view;  // worker0's store
    FaultProxy& proxy() { return *view->proxy; }
};

// `n` agents started at once; worker0 reaches worker1 through the proxy (`on_proxy` sees it
// before worker0 connects) and runs with `tuning0`.
Task<ProxiedGroup> start_proxied_group(int n, test::Configure configure0, std::function<void(FaultProxy&)> on_proxy) {
    auto ex = co_await asio::this_coro::executor;
    ProxiedGroup pg;
    pg.g.store = std::make_shared<HashStore>(std::chrono::seconds(5));
    pg.view = std::make_shared<ProxiedView>(pg.g.store);
    pg.view->on_proxy = std::move(on_proxy);
    const test::Configure uv_only = [&configure0](int r, TensorPipeRpcBackendOptions& o) {
        o.transports = std::vector<std::string>{"uv"};
        if (r == 0 && configure0) configure0(r, o);
    };
    pg.g.agents.resize(n);
    std::vector<std::optional<Error>> errors(n);
    test::Signal done(ex, n);
    for (int r = 0; r < n; ++r) {
        std::shared_ptr<Store> s = r == 0 ? std::shared_ptr<Store>(pg.view) : std::shared_ptr<Store>(pg.g.store);
        // TCP only: the proxy sits on the TCP link (a same-host uds connection would bypass it).
        asio::co_spawn(ex, detail::NativeAgent::create(test::init_args(s, r, n, uv_only), detail::NativeAgentTuning{}),
                       [&pg, &errors, &done, r](std::exception_ptr e, Result<test::AgentPtr> a) {
                           if (e) errors[r] = Error(Errc::internal, "exception while starting");
                           else if (a) pg.g.agents[r] = *a;
                           else errors[r] = a.error();
                           done.try_send(std::error_code{}, r);
                       });
    }
    for (int i = 0; i < n; ++i) co_await done.async_receive(asio::use_awaitable);
    for (int r = 0; r < n; ++r)
        if (errors[r]) FAIL("worker" << r << " did not start: " << errors[r]->to_string());
    REQUIRE(pg.view->proxy);
    co_return pg;
}

// Three agents; worker0 reaches worker1 through the proxy. Each has "echo" and "hold" (held
// until `release` is signalled, signalling `entered`).
Task<ProxiedGroup> make_proxied_group(test::Signal& entered, test::Signal& release) {
    const test::Configure none;
    auto pg = co_await start_proxied_group(3, none, {});
    test::register_echo(pg.g);
    for (auto& a : pg.g.agents) REQUIRE(a->register_handler("hold", test::held_handler(entered, release)));
    co_return pg;
}

struct Pending {
    std::vector<std::optional<Result<Message>>> results;
    std::vector<Clock::time_point> ended;
};

// Starts `n` calls worker0 -> worker1 "hold" with `timeout` seconds; each records its result.
void start_held_calls(Executor ex, test::AgentPtr& from, int n, double timeout, Pending& p, test::Signal& finished) {
    p.results.assign(n, std::nullopt);
    p.ended.assign(n, Clock::time_point{});
    for (int i = 0; i < n; ++i)
        asio::co_spawn(ex, from->rpc_async("worker1", "hold", test::text_message("held call"), timeout),
                       [&p, &finished, i](std::exception_ptr, Result<Message> r) {
                           p.results[i] = std::move(r);
                           p.ended[i] = Clock::now();
                           finished.try_send(std::error_code{}, i);
                       });
}

double seconds_since(Clock::time_point t0, Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); }

// After a fault: worker0 still reaches worker2, worker2 still reaches worker1, and worker0's next
// call to worker1 reconnects through the proxy.
Task<void> require_group_healthy(ProxiedGroup& pg) {
    auto a = co_await pg.g[0]->rpc_async("worker2", "echo", test::text_message("to 2"));
    REQUIRE(a);
    auto b = co_await pg.g[2]->rpc_async("worker1", "echo", test::text_message("2 to 1"));
    REQUIRE(b);
    auto accepted = pg.proxy().accepted();
    auto c = co_await pg.g[0]->rpc_async("worker1", "echo", test::text_message("again"), 5);
    REQUIRE(c);
    CHECK(c->payload == bytes("again"));
    CHECK(pg.proxy().accepted() > accepted);  // a new connection through the proxy
}

// Runs one detected-loss scenario: 5 calls held in worker1, `fault` applied, then the handlers
// released (their replies meet the fault); every call must fail with connection_lost or
// protocol_error within 1 s of the release.
template <class Fault>
void detected_loss_case(Fault fault, const char* what) {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 16), release(ex, 16), finished(ex, 16);
        auto pg = co_await make_proxied_group(entered, release);
        Pending p;
        start_held_calls(ex, pg.g[0], 5, 30, p, finished);
        for (int i = 0; i < 5; ++i) co_await entered.async_receive(asio::use_awaitable);
        const auto t0 = Clock::now();
        fault(pg.proxy());
        for (int i = 0; i < 5; ++i) release.try_send(std::error_code{}, 0);
        for (int i = 0; i < 5; ++i) co_await finished.async_receive(asio::use_awaitable);
        double worst = 0;
        for (int i = 0; i < 5; ++i) {
            REQUIRE(p.results[i]);
            const auto& r = *p.results[i];
            INFO(what << ": call " << i << (r ? " succeeded" : " failed: " + r.error().to_string()));
            REQUIRE_FALSE(r);
            CHECK((r.error().code() == Errc::connection_lost || r.error().code() == Errc::protocol_error));
            CHECK(r.error().message().find("worker1") != std::string::npos);
            worst = std::max(worst, seconds_since(t0, p.ended[i]));
        }
        UNSCOPED_INFO(what << ": the last pending call ended " << worst * 1000 << " ms after the fault");
        CHECK(worst < 1.0);  // at once, not at the 30 s timeout
        std::printf("[timing] %s: pending calls ended %.1f ms after the fault\n", what, worst * 1000);
        co_await require_group_healthy(pg);
        co_await test::shutdown_all(pg.g);
    });
}

}  // namespace

TEST_CASE("a link cut mid-reply (FIN) fails every pending call at once", "[rpc][agent][fault][proxy]") {
    detected_loss_case([](FaultProxy& p) { p.cut_after(Direction::to_client, 30, Cut::fin); }, "cut mid-reply, FIN");
}

TEST_CASE("a link cut mid-reply (RST) fails every pending call at once", "[rpc][agent][fault][proxy]") {
    detected_loss_case([](FaultProxy& p) { p.cut_after(Direction::to_client, 30, Cut::rst); }, "cut mid-reply, RST");
}

TEST_CASE("a link reset while calls are pending fails them at once", "[rpc][agent][fault][proxy]") {
    detected_loss_case([](FaultProxy& p) { p.reset_all(); }, "reset while pending");
}

TEST_CASE("a corrupt frame marker in a reply fails the caller's pending calls at once", "[rpc][agent][fault][proxy]") {
    detected_loss_case([](FaultProxy& p) { p.corrupt_at(Direction::to_client, 0); }, "corrupt reply marker");
}

TEST_CASE("a corrupt frame length in a reply fails the caller's pending calls at once", "[rpc][agent][fault][proxy]") {
    // Byte 7 is the top byte of the little-endian meta_len: 2^24 times too long, over the limit.
    detected_loss_case([](FaultProxy& p) { p.corrupt_at(Direction::to_client, 7, 0x7F); }, "corrupt reply length");
}

TEST_CASE("a corrupt request frame closes only that connection and the caller's calls fail at once",
          "[rpc][agent][fault][proxy]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 16), release(ex, 16), finished(ex, 16);
        auto pg = co_await make_proxied_group(entered, release);
        // worker2 holds a call in worker1 over its own (direct) connection meanwhile.
        std::optional<Result<Message>> bystander;
        asio::co_spawn(ex, pg.g[2]->rpc_async("worker1", "hold", test::text_message("bystander"), 30),
                       [&bystander, &finished](std::exception_ptr, Result<Message> r) {
                           bystander = std::move(r);
                           finished.try_send(std::error_code{}, 99);
                       });
        co_await entered.async_receive(asio::use_awaitable);
        Pending p;
        start_held_calls(ex, pg.g[0], 3, 30, p, finished);
        for (int i = 0; i < 3; ++i) co_await entered.async_receive(asio::use_awaitable);
        const auto t0 = Clock::now();
        pg.proxy().corrupt_at(Direction::to_server, 0);  // the marker of worker0's next request
        std::optional<Result<Message>> bad;
        asio::co_spawn(ex, pg.g[0]->rpc_async("worker1", "echo", test::text_message("corrupted"), 30),
                       [&bad, &finished](std::exception_ptr, Result<Message> r) {
                           bad = std::move(r);
                           finished.try_send(std::error_code{}, 98);
                       });
        for (int i = 0; i < 4; ++i) co_await finished.async_receive(asio::use_awaitable);
        const double took = seconds_since(t0, Clock::now());
        REQUIRE(bad);
        REQUIRE_FALSE(*bad);
        CHECK((bad->error().code() == Errc::connection_lost || bad->error().code() == Errc::protocol_error));
        for (auto& r : p.results) {
            REQUIRE(r);
            REQUIRE_FALSE(*r);
            CHECK(r->error().code() == Errc::connection_lost);
        }
        CHECK(took < 1.0);
        std::printf("[timing] corrupt request marker: pending calls ended %.1f ms after the fault\n", took * 1000);
        CHECK_FALSE(bystander);  // worker2's call on its own connection is still held, not failed
        for (int i = 0; i < 4; ++i) release.try_send(std::error_code{}, 0);
        co_await finished.async_receive(asio::use_awaitable);
        REQUIRE(bystander);
        REQUIRE(*bystander);
        CHECK((*bystander)->payload == bytes("bystander"));
        co_await require_group_healthy(pg);
        co_await test::shutdown_all(pg.g);
    });
}

TEST_CASE("a stalled link ends calls at their timeout, and the link works again after", "[rpc][agent][fault][proxy]") {
    for (auto d : {Direction::to_server, Direction::to_client}) {
        test::run_with_deadline(20s, [&]() -> Task<void> {
            auto ex = co_await asio::this_coro::executor;
            test::Signal entered(ex, 16), release(ex, 16), finished(ex, 16);
            auto pg = co_await make_proxied_group(entered, release);
            pg.proxy().stall(d);
            std::vector<std::optional<Result<Message>>> results(4);
            std::vector<Clock::time_point> ended(4);
            const auto t0 = Clock::now();
            for (int i = 0; i < 4; ++i)
                asio::co_spawn(ex, pg.g[0]->rpc_async("worker1", "echo", test::text_message("stalled"), 1.0),
                               [&results, &ended, &finished, i](std::exception_ptr, Result<Message> r) {
                                   results[i] = std::move(r);
                                   ended[i] = Clock::now();
                                   finished.try_send(std::error_code{}, i);
                               });
            // Meanwhile worker0 reaches worker2 without delay.
            auto other = co_await pg.g[0]->rpc_async("worker2", "echo", test::text_message("unaffected"));
            REQUIRE(other);
            CHECK(seconds_since(t0, Clock::now()) < 0.5);
            for (int i = 0; i < 4; ++i) co_await finished.async_receive(asio::use_awaitable);
            double first = 1e9, last = 0;
            for (int i = 0; i < 4; ++i) {
                REQUIRE(results[i]);
                REQUIRE_FALSE(*results[i]);
                CHECK(results[i]->error().code() == Errc::timeout);
                first = std::min(first, seconds_since(t0, ended[i]));
                last = std::max(last, seconds_since(t0, ended[i]));
            }
            CHECK(first >= 0.99);  // not before the 1 s timeout
            CHECK(last < 1.5);     // nor much after
            std::printf("[timing] stall %s: 1 s calls ended after %.3f-%.3f s\n",
                        d == Direction::to_server ? "to_server" : "to_client", first, last);
            pg.proxy().resume(d);  // late requests / replies now arrive and are dropped
            auto again = co_await pg.g[0]->rpc_async("worker1", "echo", test::text_message("resumed"), 5);
            REQUIRE(again);
            CHECK(again->payload == bytes("resumed"));
            co_await test::shutdown_all(pg.g);
        });
    }
}

TEST_CASE("at startup a peer that does not answer within the handshake timeout is tried again until it does",
          "[rpc][agent][fault][proxy]") {
    // worker1 is slow to answer (its loop busy, its machine loaded): for 800 ms nothing crosses
    // the link, and worker0's 200 ms handshakes time out. The start must go on, not fail.
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        const test::Configure short_handshakes = [](int, TensorPipeRpcBackendOptions& o) { o.handshake_timeout = 0.2; };
        auto pg = co_await start_proxied_group(2, short_handshakes, [ex](FaultProxy& proxy) {
            proxy.stall(Direction::to_server);
            proxy.stall(Direction::to_client);
            asio::co_spawn(ex, [&proxy]() -> Task<void> {
                co_await test::sleep_for(800ms);
                proxy.resume(Direction::to_server);
                proxy.resume(Direction::to_client);
            }, asio::detached);
        });
        CHECK(pg.proxy().accepted() >= 2);  // (the first attempt timed out; another got through)
        test::register_echo(pg.g);
        auto r = co_await pg.g[0]->rpc_async("worker1", "echo", test::text_message("late"), 5);
        REQUIRE(r);
        CHECK(r->payload == bytes("late"));
        co_await test::shutdown_all(pg.g);
    });
}

TEST_CASE("a delayed link still delivers every call", "[rpc][agent][fault][proxy]") {
    test::run_with_deadline(20s, [&]() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        test::Signal entered(ex, 16), release(ex, 16);
        auto pg = co_await make_proxied_group(entered, release);
        pg.proxy().delay(Direction::to_server, 20ms);
        pg.proxy().delay(Direction::to_client, 20ms);
        const auto t0 = Clock::now();
        for (int i = 0; i < 5; ++i) {
            auto msg = "delayed " + std::to_string(i);
            auto r = co_await pg.g[0]->rpc_async("worker1", "echo", test::text_message(msg), 5);
            REQUIRE(r);
            CHECK(r->payload == bytes(msg));
        }
        CHECK(seconds_since(t0, Clock::now()) >= 5 * 0.04);  // the delay was applied on the way
        co_await test::shutdown_all(pg.g);
    });
}

}  // namespace tp_agent_proxy_fault_test
