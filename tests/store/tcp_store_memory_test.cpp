// Store server memory under clients that claim much and send little, or ask much and never read:
// what one connection can pin stays bounded, and everyone else keeps being served.
// Links alloc_probe.cpp, whose operator new counts the live heap of this process (server included).
#include <tensorplay/store/tcp_store.hpp>

#include "support/alloc_probe.hpp"
#include "store/raw_store_client.hpp"
#include "support/deadline.hpp"

#include <algorithm>
#include <cstdio>

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

/// The live heap once it has stopped changing (the server has finished what it was doing).
inline Task<std::size_t> settled_live_bytes() {
    std::size_t last = alloc_probe::live_bytes();
    for (int i = 0; i < 40; ++i) {
        co_await pause(std::chrono::milliseconds(50));
        const std::size_t now = alloc_probe::live_bytes();
        const std::size_t diff = now > last ? now - last : last - now;
        last = now;
        if (i >= 3 && diff < 64 * 1024) break;
    }
    co_return last;
}

std::int64_t delta(std::size_t after, std::size_t before) {
    return static_cast<std::int64_t>(after) - static_cast<std::int64_t>(before);
}

void report(const char* what, std::int64_t heap, std::int64_t rss, std::size_t conns) {
    std::printf("MEASURE %s: heap %+.1f MiB, VmRSS %+.1f MiB, over %zu connection(s): %.2f MiB each\n", what,
                static_cast<double>(heap) / kMiB, static_cast<double>(rss) / kMiB, conns,
                static_cast<double>(heap) / kMiB / static_cast<double>(conns));
}

// Legacy (PyTorch 1.13) requests: no handshake, SET has no reply.
Bytes legacy_set(std::string_view key, const Bytes& value) {
    Bytes b{0x00};
    put_str(b, key);
    put_blob(b, value);
    return b;
}

Bytes legacy_watch(std::string_view key) {
    Bytes b{0x07};
    put_str(b, key);
    return b;
}

// As many legacy GETs of `key` as fit in `budget` bytes (4 KiB: 372 GETs of "/v").
Bytes pipelined_gets(std::string_view key, std::size_t budget, std::size_t* count) {
    Bytes b;
    *count = 0;
    while (b.size() + 9 + key.size() <= budget) {
        b.push_back(0x02);
        put_str(b, key);
        ++*count;
    }
    return b;
}

// Waits until the server has stored `key` (the raw SET before it had no reply).
Task<void> require_key(TcpStore& c, const char* key) {
    auto ok = co_await c.wait(keys(key), 5s);
    CO_REQUIRE(ok);
}

// A watcher that reads: counts and checks each legacy watch event (type, key, old, new).
struct EventLog {
    std::size_t seen = 0;
    std::vector<Bytes> news;
    bool broken = false;
};

Task<Result<int>> read_events(tcp::socket* s, std::size_t n, EventLog* log) {
    for (std::size_t i = 0; i < n; ++i) {
        auto head = co_await read_within(*s, 9, 10s);
        if (!head.complete) break;
        auto key = co_await read_within(*s, get64(head.bytes.data() + 1) + 8, 10s);
        if (!key.complete) break;
        auto old = co_await read_within(*s, get64(key.bytes.data() + key.bytes.size() - 8) + 8, 10s);
        if (!old.complete) break;
        auto fresh = co_await read_within(*s, get64(old.bytes.data() + old.bytes.size() - 8), 10s);
        if (!fresh.complete) break;
        log->news.push_back(std::move(fresh.bytes));
        ++log->seen;
    }
    log->broken = log->seen != n;
    co_return 0;
}

}  // namespace

TEST_CASE("a client that pipelines GETs and never reads pins a bounded amount of server memory", "[store][fault]") {
    run_with_deadline(60s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        const Bytes value = pattern(kMiB, 7);
        tcp::socket p(ex);
        co_await raw_connect(&p, server->port());
        co_await send_all(p, legacy_set("/v", value));
        co_await require_key(*c, "v");
        const auto heap0 = co_await settled_live_bytes();
        const auto rss0 = alloc_probe::proc_status_bytes("VmRSS");

        std::size_t n = 0;
        co_await send_all(p, pipelined_gets("/v", 4096, &n));  // 4 KiB asking for 372 MiB
        const auto heap1 = co_await settled_live_bytes();
        report("4 KiB of pipelined GETs of a 1 MiB value, never read", delta(heap1, heap0),
               delta(alloc_probe::proc_status_bytes("VmRSS"), rss0), 1);
        CHECK(delta(heap1, heap0) < static_cast<std::int64_t>(64 * kMiB));

        co_await require_server_healthy(server->port(), "while-not-reading");
        // The client reads after all: every reply arrives, complete and in order.
        for (std::size_t i = 0; i < n; ++i) {
            auto r = co_await read_within(p, 8 + kMiB, 10s);
            REQUIRE(r.complete);
            REQUIRE(get64(r.bytes.data()) == kMiB);
            REQUIRE(std::equal(value.begin(), value.end(), r.bytes.begin() + 8));
        }
        c->close();
        server->stop();
    });
}

TEST_CASE("watchers that never read are closed past the hard output limit; a reading watcher is not",
          "[store][fault]") {
    run_with_deadline(60s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        TcpStoreServerOptions so;
        so.host = "127.0.0.1";
        so.max_queued_output = kMiB;
        so.max_queued_output_hard = 4 * kMiB;
        auto server = *TcpStoreServer::start(ex, so);
        constexpr std::size_t kSilent = 20, kSets = 12;
        std::vector<tcp::socket> silent;
        silent.reserve(kSilent + 1);
        for (std::size_t i = 0; i <= kSilent; ++i) {
            silent.emplace_back(ex);
            co_await raw_connect(&silent.back(), server->port());
            co_await send_all(silent.back(), legacy_watch("/w"));
            auto registered = co_await read_within(silent.back(), 1, 5s);
            REQUIRE(registered.bytes == Bytes{0x03});
        }
        tcp::socket reader = std::move(silent.back());  // the one that reads its events
        silent.pop_back();
        EventLog log;
        Spawned<int> reading(ex, read_events(&reader, kSets, &log));
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        const auto heap0 = co_await settled_live_bytes();
        const auto rss0 = alloc_probe::proc_status_bytes("VmRSS");
        std::size_t peak = 0;
        for (std::size_t i = 0; i < kSets; ++i) {
            CO_REQUIRE(co_await c->set("w", pattern(kMiB, static_cast<std::uint32_t>(i))));
            for (int t = 0; t < 500 && log.seen <= i && !reading.ready(); ++t) co_await pause(10ms);
            peak = std::max(peak, alloc_probe::live_bytes());
        }
        auto done = co_await reading.join();
        CO_REQUIRE(done);
        const auto conns = co_await wait_for_connections(*server, 2, 5s);
        const auto heap1 = co_await settled_live_bytes();
        report("12 SETs of 1 MiB to 20 watchers that never read (peak)", delta(peak, heap0),
               delta(alloc_probe::proc_status_bytes("VmRSS"), rss0), kSilent);
        CHECK(conns == 2);  // the reading watcher and the setter
        CHECK(delta(heap1, heap0) < static_cast<std::int64_t>(16 * kMiB));
        CHECK(delta(peak, heap0) < static_cast<std::int64_t>(kSilent * 16 * kMiB));
        REQUIRE_FALSE(log.broken);
        for (std::size_t i = 0; i < kSets; ++i) CHECK(log.news[i] == pattern(kMiB, static_cast<std::uint32_t>(i)));
        co_await require_server_healthy(server->port(), "after-watchers");
        c->close();
        server->stop();
    });
}

TEST_CASE("a connection over the output limit whose socket takes nothing is closed after the timeout",
          "[store][fault]") {
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        TcpStoreServerOptions so;
        so.host = "127.0.0.1";
        so.max_queued_output = kMiB;
        so.max_queued_output_hard = 256 * kMiB;  // only the timeout closes them here
        so.queued_output_timeout = 300ms;
        auto server = *TcpStoreServer::start(ex, so);
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        tcp::socket getter(ex), watcher(ex);
        co_await raw_connect(&getter, server->port());
        co_await raw_connect(&watcher, server->port());
        co_await send_all(watcher, legacy_watch("/w"));
        auto registered = co_await read_within(watcher, 1, 5s);
        REQUIRE(registered.bytes == Bytes{0x03});
        co_await send_all(getter, legacy_set("/v", pattern(kMiB, 1)));
        co_await require_key(*c, "v");
        std::size_t n = 0;
        co_await send_all(getter, pipelined_gets("/v", 4096, &n));
        for (std::uint32_t i = 0; i < 16; ++i) CO_REQUIRE(co_await c->set("w", pattern(kMiB, i)));
        const auto conns = co_await wait_for_connections(*server, 1, 10s);
        CHECK(conns == 1);  // both stalled connections closed; the setter stays
        auto rest = co_await read_within(getter, 64 * kMiB, 5s);  // what the kernel held, then the close
        CHECK(rest.closed);
        co_await require_server_healthy(server->port(), "after-stall");
        c->close();
        server->stop();
    });
}

TEST_CASE("deleting a watched key gives its bytes back to max_stored_bytes", "[store][fault]") {
    // (Issue 32: the DELETE of a watched key moved the value out before uncharging it, so every
    // cycle left its size counted: 17 cycles of 64 KiB here were refused as over 1 MiB.)
    run_with_deadline(30s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        TcpStoreServerOptions so;
        so.host = "127.0.0.1";
        so.max_stored_bytes = kMiB;
        so.max_queued_output = 256 * kMiB;  // the watcher below never reads, and must stay
        so.max_queued_output_hard = 256 * kMiB;
        so.queued_output_timeout = 60s;
        auto server = *TcpStoreServer::start(ex, so);
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        tcp::socket watcher(ex);
        co_await raw_connect(&watcher, server->port());
        co_await send_all(watcher, legacy_watch("/w"));
        auto registered = co_await read_within(watcher, 1, 5s);
        REQUIRE(registered.bytes == Bytes{0x03});
        for (std::uint32_t i = 0; i < 64; ++i) {
            CO_REQUIRE(co_await c->set("w", pattern(64 * 1024, i)));
            auto deleted = co_await c->delete_key("w");
            CO_REQUIRE(deleted);
            REQUIRE(*deleted);
        }
        // One key of 3/4 of the limit fits: nothing of the 64 deleted values is still counted.
        CO_REQUIRE(co_await c->set("after", pattern(768 * 1024, 99)));
        auto back = co_await c->get("after");
        CO_REQUIRE(back);
        CHECK(*back == pattern(768 * 1024, 99));
        c->close();
        server->stop();
    });
}

TEST_CASE("many connections that claim a 64 MiB value and send a few bytes do not make the server reserve it",
          "[store][fault]") {
    run_with_deadline(120s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        constexpr std::size_t kConns = 100, kClaim = 64 * kMiB, kSent = 100, kCompleted = 4;
        const auto heap0 = co_await settled_live_bytes();
        const auto rss0 = alloc_probe::proc_status_bytes("VmRSS");
        const auto vm0 = alloc_probe::proc_status_bytes("VmSize");
        std::vector<tcp::socket> socks;
        socks.reserve(kConns);
        for (std::size_t i = 0; i < kConns; ++i) {
            socks.emplace_back(ex);
            co_await raw_connect(&socks.back(), server->port());
            Bytes head{0x00};
            put_str(head, "/claim" + std::to_string(i));
            put64(head, kClaim);
            const Bytes first = pattern(kSent, static_cast<std::uint32_t>(i));
            head.insert(head.end(), first.begin(), first.end());
            co_await send_all(socks.back(), head);
        }
        const auto heap1 = co_await settled_live_bytes();
        report("100 connections claiming 64 MiB, 100 bytes sent", delta(heap1, heap0),
               delta(alloc_probe::proc_status_bytes("VmRSS"), rss0), kConns);
        std::printf("MEASURE   VmSize %+.1f MiB\n",
                    static_cast<double>(delta(alloc_probe::proc_status_bytes("VmSize"), vm0)) / kMiB);
        CHECK(delta(heap1, heap0) < static_cast<std::int64_t>(64 * kMiB));

        // A few send the rest of their value: each is stored whole and correct.
        for (std::size_t i = 0; i < kCompleted; ++i) {
            const Bytes full = pattern(kClaim, static_cast<std::uint32_t>(i));
            const Bytes rest(full.begin() + kSent, full.end());
            co_await send_all(socks[i], rest);
        }
        for (std::size_t i = 0; i < kCompleted; ++i) {
            const std::string key = "claim" + std::to_string(i);
            co_await require_key(*c, key.c_str());
            auto v = co_await c->get(key);
            REQUIRE(v);
            CHECK(*v == pattern(kClaim, static_cast<std::uint32_t>(i)));
        }
        auto open = co_await server->num_connections();
        CHECK(open == kConns + 1);
        for (auto& s : socks) s.close();
        const auto left = co_await wait_for_connections(*server, 1, 5s);
        CHECK(left == 1);
        c->close();
        server->stop();
    });
}

TEST_CASE("connections that claim 256 KiB values and send them slowly all complete correctly", "[store][fault]") {
    run_with_deadline(60s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        constexpr std::size_t kConns = 100, kClaim = 256 * 1024;
        std::vector<tcp::socket> socks;
        socks.reserve(kConns);
        for (std::size_t i = 0; i < kConns; ++i) {
            socks.emplace_back(ex);
            co_await raw_connect(&socks.back(), server->port());
            Bytes head{0x00};
            put_str(head, "/slow" + std::to_string(i));
            put64(head, kClaim);
            co_await send_all(socks.back(), head);
        }
        // Round-robin in pieces of growing size, so that every buffer grows step by step.
        std::vector<std::size_t> sent(kConns, 0);
        for (std::size_t piece = 10; piece < kClaim; piece *= 3) {
            for (std::size_t i = 0; i < kConns; ++i) {
                const Bytes full = pattern(kClaim, static_cast<std::uint32_t>(i + 1000));
                const std::size_t take = std::min(piece, kClaim - sent[i]);
                const Bytes part(full.begin() + static_cast<std::ptrdiff_t>(sent[i]),
                                 full.begin() + static_cast<std::ptrdiff_t>(sent[i] + take));
                co_await send_all(socks[i], part);
                sent[i] += take;
            }
            co_await pause(2ms);
        }
        for (std::size_t i = 0; i < kConns; ++i) {
            const Bytes full = pattern(kClaim, static_cast<std::uint32_t>(i + 1000));
            const Bytes rest(full.begin() + static_cast<std::ptrdiff_t>(sent[i]), full.end());
            co_await send_all(socks[i], rest);
        }
        for (std::size_t i = 0; i < kConns; ++i) {
            const std::string key = "slow" + std::to_string(i);
            co_await require_key(*c, key.c_str());
            auto v = co_await c->get(key);
            REQUIRE(v);
            CHECK(*v == pattern(kClaim, static_cast<std::uint32_t>(i + 1000)));
        }
        c->close();
        server->stop();
    });
}

// The measurements with the default options, printed for the record: run with "[measure]".
TEST_CASE("measure: 50 watchers that never read and 2 MiB of SETs, default options", "[.][measure]") {
    run_with_deadline(60s, []() -> Task<void> {
        auto ex = co_await asio::this_coro::executor;
        auto server = *TcpStoreServer::start(ex, {.host = "127.0.0.1"});
        std::vector<tcp::socket> ws;
        ws.reserve(50);
        for (int i = 0; i < 50; ++i) {
            ws.emplace_back(ex);
            co_await raw_connect(&ws.back(), server->port());
            co_await send_all(ws.back(), legacy_watch("/w"));
            auto registered = co_await read_within(ws.back(), 1, 5s);
            REQUIRE(registered.bytes == Bytes{0x03});
        }
        auto c = *co_await TcpStore::connect(ex, client_options(server->port()));
        const auto heap0 = co_await settled_live_bytes();
        const auto rss0 = alloc_probe::proc_status_bytes("VmRSS");
        std::size_t peak = 0;
        for (std::uint32_t i = 0; i < 32; ++i) {
            CO_REQUIRE(co_await c->set("w", pattern(64 * 1024, i)));
            peak = std::max(peak, alloc_probe::live_bytes());
        }
        auto n = co_await c->num_keys();
        CO_REQUIRE(n);
        const auto heap1 = co_await settled_live_bytes();
        peak = std::max(peak, heap1);
        report("32 SETs of 64 KiB to 50 watchers that never read", delta(peak, heap0),
               delta(alloc_probe::proc_status_bytes("VmRSS"), rss0), 50);
        auto open = co_await server->num_connections();
        std::printf("MEASURE   connections still open: %zu\n", open);
        c->close();
        server->stop();
    });
}
