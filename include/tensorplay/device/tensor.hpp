// Tensor: device-tagged contiguous storage held by reference, so sending does not copy it.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/device/device.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace tensorplay {

enum class DType : std::uint8_t {
    uint8 = 0, int8, int16, int32, int64, float16, bfloat16, float32, float64, boolean,
};

/// Size of one element in bytes.
[[nodiscard]] TP_API std::size_t element_size(DType dtype) noexcept;
[[nodiscard]] TP_API std::string_view to_string(DType dtype) noexcept;
/// The DType whose numeric value is `code` (as sent on the wire); Errc::protocol_error otherwise.
[[nodiscard]] TP_API Result<DType> dtype_from_code(std::uint8_t code);
/// Bytes needed by `shape` of `dtype`; Errc::invalid_argument for a negative dimension or when a
/// partial product of the shape (in bytes) passes INT64_MAX, even if a later dimension is 0.
[[nodiscard]] TP_API Result<std::size_t> checked_nbytes(DType dtype, std::span<const std::int64_t> shape);

struct Stream;  // device/backend.hpp

/// Contiguous bytes on one device. Implementations come from a DeviceBackend.
class TP_API Storage {
public:
    virtual ~Storage() = default;
    [[nodiscard]] virtual Device device() const noexcept = 0;
    /// Start of the bytes: host-addressable for cpu (and the test-only sim backend), a device
    /// pointer for cuda.
    [[nodiscard]] virtual std::uint8_t* data() noexcept = 0;
    [[nodiscard]] virtual std::size_t size() const noexcept = 0;
    /// Says that work queued on `stream` (of this storage's device) uses these bytes: when the last
    /// reference goes, the memory is reused only after the work queued there by then (torch's
    /// recordStream). Needed for stream-ordered memory (DeviceBackend::allocate_on) used on a stream
    /// other than its own; a no-op for memory whose release is not stream-ordered. Errc::invalid_argument
    /// for a stream of another device; Errc::not_supported for pinned staging memory (hold a reference).
    [[nodiscard]] virtual Result<void> record_stream(const Stream& stream);
};

/// A dense, contiguous tensor: dtype, shape and shared storage. Copies share the storage.
class TP_API Tensor {
public:
    Tensor() = default;
    /// Wraps `storage`; Errc::invalid_argument when the shape needs more bytes than it has.
    [[nodiscard]] static Result<Tensor> wrap(std::shared_ptr<Storage> storage, DType dtype, std::vector<std::int64_t> shape);
    /// A new CPU tensor (contents unspecified). A negative dimension or an overflowing size gives
    /// an undefined tensor; use tensorplay::empty() (device/backend.hpp) for a Result.
    [[nodiscard]] static Tensor cpu(DType dtype, std::vector<std::int64_t> shape);
    /// A new 1-D uint8 CPU tensor holding a copy of `data`.
    [[nodiscard]] static Tensor from_bytes(std::span<const std::uint8_t> data);

    [[nodiscard]] bool defined() const noexcept { return storage_ != nullptr; }
    [[nodiscard]] Device device() const noexcept;
    [[nodiscard]] DType dtype() const noexcept { return dtype_; }
    [[nodiscard]] const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
    [[nodiscard]] std::int64_t numel() const noexcept;
    [[nodiscard]] std::size_t nbytes() const noexcept { return numel() * element_size(dtype_); }
    /// Start of the data (see Storage::data()).
    [[nodiscard]] std::uint8_t* data() const noexcept;
    /// The bytes as a span; only meaningful where the storage is host-addressable (cpu, sim).
    [[nodiscard]] std::span<std::uint8_t> bytes() const noexcept { return {data(), nbytes()}; }
    [[nodiscard]] const std::shared_ptr<Storage>& storage() const noexcept { return storage_; }
    /// storage()->record_stream(stream); Errc::invalid_argument for an undefined tensor.
    [[nodiscard]] Result<void> record_stream(const Stream& stream) const;

private:
    std::shared_ptr<Storage> storage_;
    DType dtype_ = DType::uint8;
    std::vector<std::int64_t> shape_;
};

}  // namespace tensorplay
