// Tests of the device-map exchange: the versioned record (golden bytes, round trips, every malformed
// form) and the all-gather over an in-process HashStore with 8 workers as coroutines.
#include <tensorplay/rpc/device_map_exchange.hpp>

#include <tensorplay/core/wire.hpp>
#include <tensorplay/store/collectives.hpp>
#include <tensorplay/store/hash_store.hpp>
#include <tensorplay/store/prefix_store.hpp>

#include <catch2/catch.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <memory>
#include <optional>
#include <random>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_device_map_exchange_test {

using namespace tensorplay;
using namespace std::chrono_literals;

namespace {

Device c(int i) { return Device::cuda(i); }
const Device cpu = Device::cpu();

using ExchangeResult = Result<DeviceMapExchangeResult>;

struct Worker {
    std::string name;
    int device_count = 1;
    DeviceMaps maps;
    std::vector<Device> devices;
};

// Runs every worker's exchange as a coroutine on one io_context; each result, by rank.
std::vector<std::optional<ExchangeResult>> run_group(Store& store, const std::vector<Worker>& workers) {
    asio::io_context ctx;
    std::vector<std::optional<ExchangeResult>> results(workers.size());
    const int n = static_cast<int>(workers.size());
    for (int rank = 0; rank < n; ++rank) {
        const Worker& w = workers[rank];
        asio::co_spawn(ctx,
                       exchange_and_check_all_device_maps(store, w.name, rank, n, w.device_count, w.maps, w.devices),
                       [&results, rank](std::exception_ptr e, ExchangeResult r) {
                           if (e) r = fail(Errc::internal, "exception escaped the exchange");
                           results[rank] = std::move(r);
                       });
    }
    ctx.run_for(5s);
    return results;
}

// Eight workers in a ring: wi sends cuda:0 to w(i+1)'s cuda:0.
std::vector<Worker> ring(int n) {
    std::vector<Worker> workers;
    for (int i = 0; i < n; ++i) {
        Worker w{"w" + std::to_string(i), 1, {}, {}};
        w.maps["w" + std::to_string((i + 1) % n)] = {{c(0), c(0)}};
        workers.push_back(w);
    }
    return workers;
}

WorkerDeviceInfo random_info(std::mt19937& rng) {
    WorkerDeviceInfo info;
    info.name = "worker" + std::to_string(rng() % 1000);
    info.device_count = static_cast<int>(rng() % 9);
    const int n_maps = static_cast<int>(rng() % 4);
    for (int m = 0; m < n_maps; ++m) {
        DeviceMap map;
        for (int p = static_cast<int>(rng() % 4); p > 0; --p) map[c(static_cast<int>(rng() % 8))] = c(static_cast<int>(rng() % 8));
        if (rng() % 2) map[cpu] = cpu;
        info.device_maps["peer" + std::to_string(m)] = map;
    }
    for (int d = static_cast<int>(rng() % 5); d > 0; --d) info.devices.push_back(rng() % 3 ? c(static_cast<int>(rng() % 8)) : Device::cuda());
    return info;
}

}  // namespace

TEST_CASE("the device-map record has a stable little-endian encoding", "[rpc][wire]") {
    WorkerDeviceInfo info{"w1", 2, {{"w0", {{cpu, c(1)}}}}, {c(0)}};
    const Bytes expected = {
        0x54, 0x50, 0x44, 0x4D,  // magic "TPDM"
        0x01, 0x00,              // version 1
        0x02, 0x00, 0x00, 0x00, 'w', '1',  // name
        0x02, 0x00, 0x00, 0x00,            // device count
        0x01, 0x00, 0x00, 0x00,            // one map
        0x02, 0x00, 0x00, 0x00, 'w', '0',  // to w0
        0x01, 0x00, 0x00, 0x00,            // one pair
        0x00, 0xFF, 0xFF, 0xFF, 0xFF,      // cpu
        0x01, 0x01, 0x00, 0x00, 0x00,      // cuda:1
        0x01, 0x00, 0x00, 0x00,            // one device
        0x01, 0x00, 0x00, 0x00, 0x00,      // cuda:0
    };
    CHECK(encode_worker_device_info(info) == expected);
    auto back = decode_worker_device_info(expected);
    REQUIRE(back);
    CHECK(*back == info);
}

TEST_CASE("random device-map records decode to what was encoded", "[rpc][wire][property]") {
    for (unsigned seed = 1; seed <= 200; ++seed) {
        std::mt19937 rng(seed);
        const auto info = random_info(rng);
        auto back = decode_worker_device_info(encode_worker_device_info(info));
        INFO("seed " << seed);
        REQUIRE(back);
        CHECK(*back == info);  // duplicated devices survive: the seed's rules must see them
    }
}

TEST_CASE("every truncation of a device-map record is a protocol_error", "[rpc][wire][fault]") {
    std::mt19937 rng(7);
    const Bytes full = encode_worker_device_info(random_info(rng));
    for (std::size_t len = 0; len < full.size(); ++len) {
        auto r = decode_worker_device_info(std::span(full.data(), len));
        INFO("length " << len);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::protocol_error);
    }
    Bytes trailing = full;
    trailing.push_back(0);
    auto r = decode_worker_device_info(trailing);
    REQUIRE_FALSE(r);
    CHECK(r.error().message() == "malformed device-map record: 1 unexpected trailing bytes");
}

TEST_CASE("malformed device-map records are refused with a clear protocol_error", "[rpc][wire][fault]") {
    auto header = [](std::uint32_t magic, std::uint16_t version) {
        WireWriter w;
        w.u32(magic).u16(version).str32("w").i32(1);
        return w;
    };
    auto check = [](const Bytes& b, const std::string& message) {
        auto r = decode_worker_device_info(b);
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == Errc::protocol_error);
        CHECK(r.error().message() == "malformed device-map record: " + message);
    };
    check(std::move(header(0x12345678, 1).u32(0).u32(0)).take(), "not a device-map record (bad magic)");
    check(std::move(header(0x4D445054, 2).u32(0).u32(0)).take(),
          "device-map record version 2 is not supported (this build speaks version 1)");
    {
        WireWriter w;
        w.u32(0x4D445054).u16(1).str32("w").i32(-3).u32(0).u32(0);
        check(std::move(w).take(), "negative device count -3");
    }
    {
        WireWriter w;
        w.u32(0x4D445054).u16(1).u32(0xFFFFFFFF);  // a name length of 4 GiB
        check(std::move(w).take(), "worker name length 4294967295 exceeds the limit of 1024 bytes");
    }
    // A hostile map count is refused before anything is allocated.
    check(std::move(header(0x4D445054, 1).u32(0xFFFFFFFF)).take(),
          "device map count 4294967295 exceeds the limit of 4096 or the 0 bytes left");
    check(std::move(header(0x4D445054, 1).u32(0).u32(100)).take(),
          "device count 100 exceeds the limit of 4096 or the 0 bytes left");
    // An unknown device type and an index below -1.
    check(std::move(header(0x4D445054, 1).u32(0).u32(1).u8(7).i32(0)).take(), "unknown device type 7");
    check(std::move(header(0x4D445054, 1).u32(0).u32(1).u8(1).i32(-2)).take(), "invalid device index -2");
    // A map repeating a source device or a target worker.
    check(std::move(header(0x4D445054, 1).u32(1).str32("p").u32(2).u8(1).i32(0).u8(1).i32(0).u8(1).i32(0).u8(1).i32(1).u32(0))
              .take(),
          "source device cuda:0 repeated in the map to p");
    check(std::move(header(0x4D445054, 1).u32(2).str32("p").u32(0).str32("p").u32(0).u32(0)).take(), "map target repeated");
}

TEST_CASE("eight workers exchange their maps and each gets its reverse maps and devices", "[rpc][exchange]") {
    HashStore store(2s);
    auto workers = ring(8);
    workers[2].devices = {c(0), cpu};  // listed devices are kept, CPU included
    auto results = run_group(store, workers);
    std::vector<std::string> names;
    for (const auto& w : workers) names.push_back(w.name);
    for (int i = 0; i < 8; ++i) {
        INFO("rank " << i);
        REQUIRE(results[i]);
        REQUIRE(*results[i]);
        const auto& r = **results[i];
        CHECK(r.all_names == names);
        const std::string prev = "w" + std::to_string((i + 7) % 8);
        CHECK(r.reverse_device_maps == DeviceMaps{{prev, {{c(0), c(0)}}}});
        CHECK(r.devices == (i == 2 ? std::vector<Device>{c(0), cpu} : std::vector<Device>{c(0)}));
    }
}

TEST_CASE("one worker with an invalid map makes all eight fail with the same error", "[rpc][exchange][fault]") {
    auto [broken, expected] = GENERATE(table<int, std::string>({
        {5, "worker w5 has invalid source devices"},
        {0, "worker w0 has invalid source devices"},
        {7, "worker w7 has invalid source devices"},
    }));
    HashStore store(2s);
    auto workers = ring(8);
    workers[broken].maps.begin()->second = {{c(3), c(0)}};  // it has one GPU, so cuda:3 is not its
    auto results = run_group(store, workers);
    for (int i = 0; i < 8; ++i) {
        INFO("rank " << i);
        REQUIRE(results[i]);
        REQUIRE_FALSE(*results[i]);
        CHECK(results[i]->error().code() == Errc::invalid_argument);
        CHECK(results[i]->error().message() == expected);
    }
}

TEST_CASE("an unknown map target fails the whole static group", "[rpc][exchange][fault]") {
    HashStore store(2s);
    auto workers = ring(8);
    workers[4].maps["w99"] = {{c(0), c(0)}};
    auto results = run_group(store, workers);
    for (int i = 0; i < 8; ++i) {
        INFO("rank " << i);
        REQUIRE(results[i]);
        REQUIRE_FALSE(*results[i]);
        CHECK(results[i]->error().message() == "worker w4 has an unknown map target");
    }
}

TEST_CASE("a malformed record gives every worker the same protocol_error naming its rank", "[rpc][exchange][fault]") {
    auto store = std::make_shared<HashStore>(2s);
    auto workers = ring(8);
    asio::io_context ctx;
    std::vector<std::optional<ExchangeResult>> results(8);
    for (int rank = 0; rank < 8; ++rank) {
        if (rank == 3) continue;  // rank 3 is an impostor that all-gathers garbage
        const Worker& w = workers[rank];
        asio::co_spawn(ctx, exchange_and_check_all_device_maps(*store, w.name, rank, 8, 1, w.maps, w.devices),
                       [&results, rank](std::exception_ptr, ExchangeResult r) { results[rank] = std::move(r); });
    }
    auto scoped = std::make_shared<PrefixStore>(std::string(kDeviceMapExchangePrefix), store);
    std::optional<Result<std::vector<Bytes>>> impostor;
    asio::co_spawn(ctx, all_gather(*scoped, 3, 8, bytes("garbage!")),
                   [&](std::exception_ptr, Result<std::vector<Bytes>> r) { impostor = std::move(r); });
    ctx.run_for(5s);
    REQUIRE(impostor);
    CHECK(*impostor);
    for (int i = 0; i < 8; ++i) {
        if (i == 3) continue;
        INFO("rank " << i);
        REQUIRE(results[i]);
        REQUIRE_FALSE(*results[i]);
        CHECK(results[i]->error().code() == Errc::protocol_error);
        CHECK(results[i]->error().message() ==
              "device-map exchange: the record of rank 3: malformed device-map record: not a device-map record (bad magic)");
    }
}

TEST_CASE("the exchange refuses bad arguments and reports a missing worker as the store's timeout",
          "[rpc][exchange][fault]") {
    HashStore store(100ms);
    asio::io_context ctx;
    std::vector<std::optional<ExchangeResult>> results(4);
    auto spawn = [&](int slot, std::string name, int rank, int world, int count) {
        asio::co_spawn(ctx, exchange_and_check_all_device_maps(store, std::move(name), rank, world, count, {}, {}),
                       [&results, slot](std::exception_ptr, ExchangeResult r) { results[slot] = std::move(r); });
    };
    spawn(0, "w0", 2, 2, 0);
    spawn(1, "w0", 0, 2, -1);
    spawn(2, "", 0, 1, 0);
    spawn(3, "w0", 0, 2, 0);  // w1 never comes
    ctx.run_for(5s);
    for (auto& r : results) REQUIRE(r);
    CHECK(results[0]->error().code() == Errc::invalid_argument);
    CHECK(results[0]->error().message() == "device-map exchange: rank 2 is outside a group of world size 2");
    CHECK(results[1]->error().message() == "device-map exchange: negative device count -1");
    CHECK(results[2]->error().code() == Errc::invalid_argument);
    REQUIRE_FALSE(*results[3]);
    CHECK(results[3]->error().code() == Errc::timeout);
    CHECK_THAT(results[3]->error().message(), Catch::StartsWith("device-map exchange"));
}

TEST_CASE("a group of one exchanges with itself", "[rpc][exchange]") {
    HashStore store(1s);
    auto results = run_group(store, {Worker{"solo", 2, {{"solo", {{c(0), c(1)}}}}, {}}});
    REQUIRE(results[0]);
    REQUIRE(*results[0]);
    CHECK((*results[0])->reverse_device_maps == DeviceMaps{{"solo", {{c(1), c(0)}}}});
    CHECK((*results[0])->devices == std::vector<Device>{c(0), c(1)});
}

TEST_CASE("the dynamic-group check allows unknown targets and builds every worker's device list", "[rpc][exchange]") {
    std::vector<WorkerDeviceInfo> infos = {
        {"a", 2, {{"b", {{c(0), c(1)}}}, {"later", {{c(1), c(0)}}}}, {}},
        {"b", 2, {{"a", {{c(1), c(1)}}}}, {}},
    };
    auto r = check_dynamic_group_device_maps("a", infos);
    REQUIRE(r);
    CHECK(r->reverse_device_maps == DeviceMaps{{"b", {{c(1), c(1)}}}});
    CHECK(r->devices.at("a") == std::vector<Device>{c(0), c(1)});
    CHECK(r->devices.at("b") == std::vector<Device>{c(1)});

    infos[1].device_maps["a"] = {{c(1), c(5)}};
    auto bad = check_dynamic_group_device_maps("a", infos);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message() == "worker b has invalid target devices");
}

}  // namespace tp_device_map_exchange_test
