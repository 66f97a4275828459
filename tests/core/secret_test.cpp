// Secret: the group's key as a value that shares one buffer between copies, wipes what it takes,
// and cannot be printed.
#include <tensorplay/core/secret.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <ostream>
#include <string>

namespace tp_secret_test {

using tensorplay::Secret;

std::string text_of(const Secret& s) { return {reinterpret_cast<const char*>(s.bytes().data()), s.size()}; }

template <class T>
concept printable = requires(std::ostream& os, const T& t) { os << t; };

TEST_CASE("a secret holds a copy of its bytes; copies share it", "[core][secret]") {
    const Secret none;
    CHECK(none.empty());
    CHECK(none.bytes().empty());
    CHECK(Secret("").empty());
    CHECK(Secret(static_cast<const char*>(nullptr)).empty());

    std::string source = "a key with \0 inside";
    source.push_back('\0');
    source += "and after";
    const Secret s{std::string_view(source)};
    CHECK(s.size() == source.size());
    CHECK(text_of(s) == source);
    CHECK(s.bytes().data() != reinterpret_cast<const std::uint8_t*>(source.data()));
    const Secret copy = s;  // NOLINT(performance-unnecessary-copy-initialization): the point
    CHECK(copy.bytes().data() == s.bytes().data());
    static_assert(!printable<Secret>, "a Secret must not be printable");
}

TEST_CASE("a secret taken from a string wipes the string's buffer", "[core][secret]") {
    for (const std::size_t n : {std::size_t{7}, std::size_t{300}}) {  // a short string's own buffer, and a heap one
        std::string source(n, 'k');
        const char* buffer = source.data();
        const std::size_t capacity = source.capacity();
        const Secret s{std::move(source)};
        CHECK(s.size() == n);
        CHECK(text_of(s) == std::string(n, 'k'));
        CHECK(source.empty());  // NOLINT(bugprone-use-after-move): the documented state
        // (The moved-from string keeps its buffer, now zeros.)
        REQUIRE(source.data() == buffer);
        CHECK(std::all_of(buffer, buffer + capacity, [](char c) { return c == 0; }));
    }
}

}  // namespace tp_secret_test
