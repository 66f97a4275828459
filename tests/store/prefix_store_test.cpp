// Tests of PrefixStore: the Store contract through a prefix, c10d key mapping, nesting, timeouts.
#include <tensorplay/store/prefix_store.hpp>
#include <tensorplay/store/hash_store.hpp>

#include "store/store_conformance.hpp"

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_prefix_store_test {

using namespace tensorplay;
using namespace tensorplay::test;
using namespace std::chrono_literals;

namespace {

Task<std::shared_ptr<Store>> make_prefixed() {
    co_return std::make_shared<PrefixStore>("pre", std::make_shared<HashStore>());
}

}  // namespace

STORE_CONFORMANCE_TESTS("PrefixStore", "[store]", make_prefixed)

TEST_CASE("PrefixStore maps k to prefix/k and nests like torch", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto base = std::make_shared<HashStore>();
        auto outer = std::make_shared<PrefixStore>("/rpc_prefix_0", base);
        auto inner = std::make_shared<PrefixStore>("names", outer);
        CO_REQUIRE(co_await inner->set("1", bytes("worker1")));
        auto v = co_await base->get("/rpc_prefix_0/names/1");
        REQUIRE((v && *v == bytes("worker1")));
        CO_REQUIRE(co_await base->set("/rpc_prefix_0/x", bytes("from base")));
        auto x = co_await outer->get("x");
        REQUIRE((x && *x == bytes("from base")));
        auto c = co_await inner->check(keys("x"));
        REQUIRE((c && !*c));  // not visible one level further in
        auto n = co_await inner->num_keys();  // c10d: the whole store's count
        REQUIRE((n && *n == 2));
        REQUIRE(inner->has_extended_api());
    });
}

TEST_CASE("PrefixStore's own timeout bounds get and names the prefixed key", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        auto base = std::make_shared<HashStore>(10s);
        PrefixStore p("grp", base);
        REQUIRE(p.timeout() == 10s);  // inherited
        p.set_timeout(40ms);
        auto start = Clock::now();
        auto v = co_await p.get("late");
        REQUIRE_FALSE(v);
        REQUIRE(v.error().code() == Errc::timeout);
        REQUIRE(v.error().message().find("grp/late") != std::string::npos);
        auto m = co_await p.multi_get(keys("late"));
        REQUIRE_FALSE(m);
        REQUIRE(m.error().code() == Errc::timeout);
        REQUIRE(Clock::now() - start < 5s);
    });
}

TEST_CASE("a PrefixStore without a base refuses every operation", "[store]") {
    run_with_deadline(5s, []() -> Task<void> {
        PrefixStore p("x", nullptr);
        auto r = co_await p.get("k");
        REQUIRE_FALSE(r);
        REQUIRE(r.error().code() == Errc::invalid_argument);
        auto s = co_await p.set("k", bytes("v"));
        REQUIRE_FALSE(s);
        REQUIRE_FALSE(p.has_extended_api());
    });
}

}  // namespace tp_prefix_store_test
