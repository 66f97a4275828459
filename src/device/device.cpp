// Device: printing, parsing of user input ("cpu", "cuda", "cuda:N", N) and the CUDA device count.
#include <tensorplay/device/device.hpp>

#include <tensorplay/config.hpp>

#if TP_HAS_CUDA
#include "device/cuda_api.hpp"
#endif

#include <charconv>
#include <limits>
#include <ostream>
#include <system_error>

namespace tensorplay {
namespace {

// Parses a device index: "0" or a decimal without leading zeros or sign, fitting an int.
bool parse_index(std::string_view s, int& out) {
    if (s.empty() || (s.size() > 1 && s[0] == '0')) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size();
}

Failure invalid_device(std::string_view text) {
    return fail(Errc::invalid_argument,
                "invalid device string '" + std::string(text) +
                    "': expected \"cpu\", \"cuda\", \"cuda:N\" or a device index N (N >= 0, no sign or leading zeros)");
}

}  // namespace

std::string Device::str() const {
    std::string out = is_cuda() ? "cuda" : "cpu";
    if (has_index()) out += ":" + std::to_string(index);
    return out;
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

Result<Device> parse_device(std::string_view text) {
    if (text == "cpu") return Device::cpu();
    if (text == "cuda") return Device::cuda();
    constexpr std::string_view prefix = "cuda:";
    int index = -1;
    if (text.substr(0, prefix.size()) == prefix) {
        if (parse_index(text.substr(prefix.size()), index)) return Device::cuda(index);
        return invalid_device(text);
    }
    if (parse_index(text, index)) return Device::cuda(index);
    return invalid_device(text);
}

Result<Device> parse_device(int index) {
    if (index < 0)
        return fail(Errc::invalid_argument,
                    "invalid device index " + std::to_string(index) + ": a device index must be >= 0");
    return Device::cuda(index);
}

int cuda_device_count() noexcept {
#if TP_HAS_CUDA
    // No runtime, no driver, no device, or a broken runtime: "no CUDA devices here".
    const auto& api = detail::default_cuda_api();
    if (!api) return 0;
    auto n = detail::usable_device_count(**api);
    return n ? *n : 0;
#else
    return 0;
#endif
}

}  // namespace tensorplay
