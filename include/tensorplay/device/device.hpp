// Device: where a tensor lives (cpu, cuda, cuda:N), and parse_device for user input.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>

namespace tensorplay {

enum class DeviceType : std::uint8_t { cpu = 0, cuda = 1 };

/// A device value: a type and an optional index (-1 = none). Ordered, hashable, printable.
struct TP_API Device {
    DeviceType type = DeviceType::cpu;
    int index = -1;

    [[nodiscard]] static constexpr Device cpu() noexcept { return {DeviceType::cpu, -1}; }
    [[nodiscard]] static constexpr Device cuda(int index = -1) noexcept { return {DeviceType::cuda, index}; }
    [[nodiscard]] constexpr bool has_index() const noexcept { return index >= 0; }
    [[nodiscard]] constexpr bool is_cpu() const noexcept { return type == DeviceType::cpu; }
    [[nodiscard]] constexpr bool is_cuda() const noexcept { return type == DeviceType::cuda; }
    /// "cpu", "cuda", "cuda:1".
    [[nodiscard]] std::string str() const;

    friend constexpr auto operator<=>(const Device&, const Device&) = default;
};

TP_API std::ostream& operator<<(std::ostream& os, const Device& d);

/// Parses "cpu", "cuda", "cuda:N" or a bare integer N (meaning cuda:N).
/// Anything else ("gpu:0", "cuda:-1", "cuda:1x", "") is Errc::invalid_argument.
[[nodiscard]] TP_API Result<Device> parse_device(std::string_view text);
/// An integer N means cuda:N; negative is Errc::invalid_argument.
[[nodiscard]] TP_API Result<Device> parse_device(int index);

/// Number of CUDA devices visible to this process; 0 without a CUDA runtime or device.
[[nodiscard]] TP_API int cuda_device_count() noexcept;

}  // namespace tensorplay

template <>
struct std::hash<tensorplay::Device> {
    std::size_t operator()(const tensorplay::Device& d) const noexcept {
        return std::hash<int>()(static_cast<int>(d.type) * 65537 + d.index);
    }
};
