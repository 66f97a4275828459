// The group's key does not outlive its use: no heap block that this process frees (agents, their
// handshakes and connections, the key file's reader) still holds the key. Links
// support/alloc_probe.cpp, whose operator delete searches every freed block for the key, hence an
// executable of its own.
#include "rpc/agent_test_util.hpp"
#include "support/alloc_probe.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace {

using namespace tensorplay;
using namespace std::chrono_literals;
namespace alloc_probe = tensorplay::test::alloc_probe;

// (Longer than a short string: any std::string copy of it is a heap block of its own.)
constexpr const char* kKey = "wipe-me-0123456789abcdef-the-group-key";

/// Two agents with `configure`'s key call each other both ways, shut down and are destroyed.
void run_keyed_group(const test::Configure& configure) {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2, configure);
        test::register_echo(g);
        for (int from = 0; from < 2; ++from) {
            auto r = co_await g[from]->rpc_async(test::worker_name(1 - from), "echo", test::text_message("ping"));
            REQUIRE(r);
        }
        auto results = co_await test::shutdown_all(g);
        for (auto& r : results) CHECK(r);
    });
}

}  // namespace

TEST_CASE("the probe sees a freed copy of the key that was not wiped", "[rpc][auth]") {
    alloc_probe::watch_freed(kKey);
    auto* copy = new std::string(kKey);
    delete copy;
    CHECK(alloc_probe::freed_holding() == 1);
    Secret secret{std::string(kKey)};  // (the temporary string is wiped by Secret, then freed)
    CHECK(alloc_probe::freed_holding() == 1);
}

TEST_CASE("the group's key is wiped from every block the agents free, whatever its source", "[rpc][auth]") {
    SECTION("the auth_key option") {
        alloc_probe::watch_freed(kKey);
        run_keyed_group([](int, TensorPipeRpcBackendOptions& o) { o.auth_key = kKey; });
        CHECK(alloc_probe::freed_holding() == 0);
    }
    SECTION("a key file") {
        char path[] = "/tmp/tp_key_wipe_XXXXXX";
        const int fd = ::mkstemp(path);
        REQUIRE(fd >= 0);
        const std::string_view key(kKey);
        REQUIRE(::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size()));
        REQUIRE(::write(fd, "\n", 1) == 1);
        ::close(fd);
        alloc_probe::watch_freed(kKey);
        run_keyed_group([&path](int, TensorPipeRpcBackendOptions& o) { o.auth_key_file = path; });
        std::remove(path);
        CHECK(alloc_probe::freed_holding() == 0);
    }
    SECTION("TP_RPC_AUTH_KEY") {
        ::setenv("TP_RPC_AUTH_KEY", kKey, 1);
        alloc_probe::watch_freed(kKey);
        run_keyed_group({});
        ::unsetenv("TP_RPC_AUTH_KEY");
        CHECK(alloc_probe::freed_holding() == 0);
    }
}
