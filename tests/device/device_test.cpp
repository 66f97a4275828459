// Tests of Device: printing, ordering, hashing, parse_device and cuda_device_count.
#include <tensorplay/device/device.hpp>

#include <catch2/catch.hpp>

#include <sstream>
#include <unordered_set>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_device_test {

using namespace tensorplay;

TEST_CASE("devices print as cpu, cuda and cuda:N", "[device]") {
    CHECK(Device::cpu().str() == "cpu");
    CHECK(Device::cuda().str() == "cuda");
    CHECK(Device::cuda(1).str() == "cuda:1");
    std::ostringstream os;
    os << Device::cuda(12);
    CHECK(os.str() == "cuda:12");
}

TEST_CASE("parse_device accepts cpu, cuda, cuda:N and a bare index", "[device]") {
    auto [text, expected] = GENERATE(table<const char*, Device>({
        {"cpu", Device::cpu()},
        {"cuda", Device::cuda()},
        {"cuda:0", Device::cuda(0)},
        {"cuda:7", Device::cuda(7)},
        {"cuda:2147483647", Device::cuda(2147483647)},
        {"0", Device::cuda(0)},
        {"3", Device::cuda(3)},
    }));
    INFO(text);
    auto d = parse_device(text);
    REQUIRE(d);
    CHECK(*d == expected);
    // Printing and parsing again gives the same device.
    auto again = parse_device(d->str());
    REQUIRE(again);
    CHECK(*again == expected);
}

TEST_CASE("parse_device refuses anything else with invalid_argument naming the text", "[device]") {
    auto text = GENERATE("", "gpu:0", "cuda:-1", "cuda:1x", "cuda:", "cuda:+1", "cuda:01", "CUDA", " cpu", "cpu ",
                         "cpu:0", "-1", "1.5", "cuda:99999999999", "cuda:0:0", "x");
    INFO("'" << text << "'");
    auto d = parse_device(std::string_view(text));
    REQUIRE_FALSE(d);
    CHECK(d.error().code() == Errc::invalid_argument);
    CHECK(d.error().message() ==
          "invalid device string '" + std::string(text) +
              "': expected \"cpu\", \"cuda\", \"cuda:N\" or a device index N (N >= 0, no sign or leading zeros)");
}

TEST_CASE("parse_device of an integer means cuda:N and refuses a negative one", "[device]") {
    auto d = parse_device(2);
    REQUIRE(d);
    CHECK(*d == Device::cuda(2));
    auto bad = parse_device(-1);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code() == Errc::invalid_argument);
    CHECK(bad.error().message() == "invalid device index -1: a device index must be >= 0");
}

TEST_CASE("devices are ordered and hashable by type and index", "[device]") {
    CHECK(Device::cpu() < Device::cuda());
    CHECK(Device::cuda() < Device::cuda(0));
    CHECK(Device::cuda(0) < Device::cuda(1));
    CHECK(Device::cuda(1) == Device::cuda(1));
    std::unordered_set<Device> set{Device::cpu(), Device::cuda(), Device::cuda(0), Device::cuda(0), Device::cuda(1)};
    CHECK(set.size() == 4);
}

TEST_CASE("cuda_device_count is never negative and is stable", "[device]") {
    const int n = cuda_device_count();
    CHECK(n >= 0);
    CHECK(cuda_device_count() == n);
}

}  // namespace tp_device_test
