// The c10d Store contract as one test body per behaviour, run against every Store implementation.
// Use: STORE_CONFORMANCE_TESTS("HashStore", "[store]", make_store) where make_store is a named
// coroutine `Task<std::shared_ptr<Store>> make_store()`; each store starts empty.
#pragma once

#include <tensorplay/store/store.hpp>

#include "store/store_test_util.hpp"
#include "support/deadline.hpp"

#include <catch2/catch.hpp>

#include <memory>

namespace tensorplay::test::conformance {

using namespace std::chrono_literals;
using StoreFactory = Task<std::shared_ptr<Store>> (*)();

inline bool mentions(const Error& e, std::string_view s) { return e.message().find(s) != std::string::npos; }

inline Task<void> set_get(std::shared_ptr<Store> s) {
    CO_REQUIRE(co_await s->set("a", bytes("1")));
    auto v = co_await s->get("a");
    REQUIRE(v);
    REQUIRE(*v == bytes("1"));
    CO_REQUIRE(co_await s->set("a", bytes("")));  // overwrite, empty values allowed
    v = co_await s->get("a");
    REQUIRE(v);
    REQUIRE(v->empty());
}

inline Task<void> get_times_out_naming_key(std::shared_ptr<Store> s) {
    s->set_timeout(50ms);
    auto start = Clock::now();
    auto v = co_await s->get("never-set");
    REQUIRE_FALSE(v);
    REQUIRE(v.error().code() == Errc::timeout);
    REQUIRE(mentions(v.error(), "never-set"));
    REQUIRE(Clock::now() - start >= 45ms);
    REQUIRE(Clock::now() - start < 3s);
}

inline Task<void> add_counts_in_ascii_decimal(std::shared_ptr<Store> s) {
    auto a = co_await s->add("n", 5);
    REQUIRE(a);
    REQUIRE(*a == 5);
    a = co_await s->add("n", -2);
    REQUIRE(a);
    REQUIRE(*a == 3);
    auto v = co_await s->get("n");
    REQUIRE(v);
    REQUIRE(*v == bytes("3"));
    a = co_await s->add("n", 0);
    REQUIRE(a);
    REQUIRE(*a == 3);
    CO_REQUIRE(co_await s->set("m", bytes("-40")));
    a = co_await s->add("m", 2);
    REQUIRE(a);
    REQUIRE(*a == -38);
}

inline Task<void> add_on_non_number_fails(std::shared_ptr<Store> s) {
    CO_REQUIRE(co_await s->set("text", bytes("abc")));
    auto a = co_await s->add("text", 1);
    REQUIRE_FALSE(a);
    REQUIRE(mentions(a.error(), "text"));
    auto v = co_await s->get("text");  // still usable, value untouched
    REQUIRE(v);
    REQUIRE(*v == bytes("abc"));
}

inline Task<void> compare_set_follows_c10d(std::shared_ptr<Store> s) {
    // absent key, empty expected: stores desired
    auto r = co_await s->compare_set("k", {}, bytes("n1"));
    REQUIRE(r);
    REQUIRE(*r == bytes("n1"));
    // match: stores desired, returns it
    r = co_await s->compare_set("k", bytes("n1"), bytes("v2"));
    REQUIRE(r);
    REQUIRE(*r == bytes("v2"));
    // mismatch: returns the current value, stores nothing
    r = co_await s->compare_set("k", bytes("zz"), bytes("v3"));
    REQUIRE(r);
    REQUIRE(*r == bytes("v2"));
    // absent key, non-empty expected: returns expected, stores nothing
    r = co_await s->compare_set("absent", bytes("xx"), bytes("yy"));
    REQUIRE(r);
    REQUIRE(*r == bytes("xx"));
    auto c = co_await s->check(keys("absent"));
    REQUIRE(c);
    REQUIRE_FALSE(*c);
}

inline Task<void> wait_and_check(std::shared_ptr<Store> s) {
    CO_REQUIRE(co_await s->set("x", bytes("1")));
    CO_REQUIRE(co_await s->wait(keys("x"), 1s));
    auto c = co_await s->check(keys("x"));
    REQUIRE((c && *c));
    c = co_await s->check(keys("x", "y"));
    REQUIRE((c && !*c));
    auto w = co_await s->wait(keys("x", "y", "z"), 50ms);
    REQUIRE_FALSE(w);
    REQUIRE(w.error().code() == Errc::timeout);
    // only the missing keys are named, quoted (a prefixing store may show them as 'prefix/y')
    REQUIRE(mentions(w.error(), "y'"));
    REQUIRE(mentions(w.error(), "z'"));
    REQUIRE_FALSE(mentions(w.error(), "x'"));
}

inline Task<void> wait_is_woken_by_each_writer(std::shared_ptr<Store> s) {
    auto ex = co_await asio::this_coro::executor;
    Spawned<void> by_set(ex, s->wait(keys("s1"), 5s));
    Spawned<void> by_add(ex, s->wait(keys("s2"), 5s));
    Spawned<void> by_append(ex, s->wait(keys("s3"), 5s));
    Spawned<void> by_cas(ex, s->wait(keys("s4"), 5s));
    Spawned<void> by_multi(ex, s->wait(keys("s5", "s6"), 5s));
    Spawned<Bytes> getter(ex, s->get("s7"));
    co_await pause(20ms);
    REQUIRE_FALSE(by_set.ready());
    REQUIRE_FALSE(getter.ready());
    CO_REQUIRE(co_await s->set("s1", bytes("v")));
    CO_REQUIRE(co_await s->add("s2", 1));
    CO_REQUIRE(co_await s->append("s3", bytes("v")));
    CO_REQUIRE(co_await s->compare_set("s4", {}, bytes("v")));
    CO_REQUIRE(co_await s->multi_set(keys("s5", "s6"), vals(bytes("a"), bytes("b"))));
    CO_REQUIRE(co_await s->set("s7", bytes("seven")));
    CO_REQUIRE(co_await by_set.join());
    CO_REQUIRE(co_await by_add.join());
    CO_REQUIRE(co_await by_append.join());
    CO_REQUIRE(co_await by_cas.join());
    CO_REQUIRE(co_await by_multi.join());
    auto g = co_await getter.join();
    REQUIRE(g);
    REQUIRE(*g == bytes("seven"));
}

inline Task<void> wait_on_several_keys_needs_all(std::shared_ptr<Store> s) {
    auto ex = co_await asio::this_coro::executor;
    Spawned<void> w(ex, s->wait(keys("p", "q"), 5s));
    CO_REQUIRE(co_await s->set("p", bytes("1")));
    co_await pause(20ms);
    REQUIRE_FALSE(w.ready());
    CO_REQUIRE(co_await s->set("q", bytes("1")));
    CO_REQUIRE(co_await w.join());
}

inline Task<void> delete_and_num_keys(std::shared_ptr<Store> s) {
    auto n0 = co_await s->num_keys();
    REQUIRE(n0);
    CO_REQUIRE(co_await s->set("d1", bytes("1")));
    CO_REQUIRE(co_await s->set("d2", bytes("2")));
    auto n = co_await s->num_keys();
    REQUIRE(n);
    REQUIRE(*n == *n0 + 2);
    auto d = co_await s->delete_key("d1");
    REQUIRE((d && *d));
    d = co_await s->delete_key("d1");
    REQUIRE((d && !*d));
    n = co_await s->num_keys();
    REQUIRE(n);
    REQUIRE(*n == *n0 + 1);
    auto c = co_await s->check(keys("d1"));
    REQUIRE((c && !*c));
    CO_REQUIRE(co_await s->set("d1", bytes("again")));  // a deleted key can come back
    auto v = co_await s->get("d1");
    REQUIRE((v && *v == bytes("again")));
}

inline Task<void> append_creates_then_extends(std::shared_ptr<Store> s) {
    CO_REQUIRE(co_await s->append("log", bytes("ab")));
    CO_REQUIRE(co_await s->append("log", bytes("cd")));
    auto v = co_await s->get("log");
    REQUIRE(v);
    REQUIRE(*v == bytes("abcd"));
}

inline Task<void> multi_set_and_multi_get(std::shared_ptr<Store> s) {
    CO_REQUIRE(co_await s->multi_set(keys("m1", "m2", "m3"), vals(bytes("1"), bytes(""), bytes("3"))));
    auto v = co_await s->multi_get(keys("m3", "m1", "m2", "m1"));
    REQUIRE(v);
    REQUIRE(v->size() == 4);
    REQUIRE((*v)[0] == bytes("3"));
    REQUIRE((*v)[1] == bytes("1"));
    REQUIRE((*v)[2].empty());
    REQUIRE((*v)[3] == bytes("1"));
    auto bad = co_await s->multi_set(keys("a", "b"), vals(bytes("1")));
    REQUIRE_FALSE(bad);
    REQUIRE(bad.error().code() == Errc::invalid_argument);
    auto empty = co_await s->multi_get({});
    REQUIRE((empty && empty->empty()));
}

inline Task<void> multi_get_waits_and_times_out_naming_keys(std::shared_ptr<Store> s) {
    auto ex = co_await asio::this_coro::executor;
    Spawned<std::vector<Bytes>> g(ex, s->multi_get(keys("late1", "late2")));
    CO_REQUIRE(co_await s->set("late2", bytes("2")));
    co_await pause(10ms);
    REQUIRE_FALSE(g.ready());
    CO_REQUIRE(co_await s->set("late1", bytes("1")));
    auto v = co_await g.join();
    REQUIRE(v);
    REQUIRE(*v == vals(bytes("1"), bytes("2")));
    s->set_timeout(50ms);
    auto t = co_await s->multi_get(keys("late1", "missing-one"));
    REQUIRE_FALSE(t);
    REQUIRE(t.error().code() == Errc::timeout);
    REQUIRE(mentions(t.error(), "missing-one"));
}

inline Task<void> binary_keys_and_values_round_trip(std::shared_ptr<Store> s) {
    std::string key("k\0/\xff", 4);
    Bytes value{0, 1, 2, 255, 0};
    CO_REQUIRE(co_await s->set(key, value));
    auto v = co_await s->get(key);
    REQUIRE((v && *v == value));
}

/// Runs one body against a fresh store from `make`.
inline void run_case(StoreFactory make, Task<void> (*body)(std::shared_ptr<Store>)) {
    run_with_deadline(10s, [make, body]() -> Task<void> {
        auto store = co_await make();
        REQUIRE(store);
        co_await body(store);
    });
}

}  // namespace tensorplay::test::conformance

#define TP_STORE_CASE(name, tag, factory, body, what) \
    TEST_CASE(name ": " what, tag) { ::tensorplay::test::conformance::run_case(factory, ::tensorplay::test::conformance::body); }

/// Defines one TEST_CASE per behaviour of the Store contract for the store made by `factory`.
#define STORE_CONFORMANCE_TESTS(name, tag, factory)                                                            \
    TP_STORE_CASE(name, tag, factory, set_get, "set then get returns the value, overwrites allowed")            \
    TP_STORE_CASE(name, tag, factory, get_times_out_naming_key, "get of a missing key times out naming it")    \
    TP_STORE_CASE(name, tag, factory, add_counts_in_ascii_decimal, "add counts and stores ASCII decimal")      \
    TP_STORE_CASE(name, tag, factory, add_on_non_number_fails, "add on a non-numeric value fails naming key")  \
    TP_STORE_CASE(name, tag, factory, compare_set_follows_c10d, "compare_set follows c10d in all four cases")  \
    TP_STORE_CASE(name, tag, factory, wait_and_check, "wait and check see existing keys; timeout names missing") \
    TP_STORE_CASE(name, tag, factory, wait_is_woken_by_each_writer, "waiters are woken by every kind of write") \
    TP_STORE_CASE(name, tag, factory, wait_on_several_keys_needs_all, "a wait on several keys needs all")      \
    TP_STORE_CASE(name, tag, factory, delete_and_num_keys, "delete_key and num_keys")                          \
    TP_STORE_CASE(name, tag, factory, append_creates_then_extends, "append creates then extends")              \
    TP_STORE_CASE(name, tag, factory, multi_set_and_multi_get, "multi_set and multi_get keep order")           \
    TP_STORE_CASE(name, tag, factory, multi_get_waits_and_times_out_naming_keys,                                \
                  "multi_get waits for all keys and times out naming them")                                     \
    TP_STORE_CASE(name, tag, factory, binary_keys_and_values_round_trip, "binary keys and values round-trip")
