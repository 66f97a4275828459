// Tensor and DType: sizes, names, wrapping storage, CPU tensors.
#include <tensorplay/device/tensor.hpp>

#include <tensorplay/device/backend.hpp>

#include <cstring>
#include <limits>
#include <string>

namespace tensorplay {

std::size_t element_size(DType dtype) noexcept {
    switch (dtype) {
        case DType::uint8: case DType::int8: case DType::boolean: return 1;
        case DType::int16: case DType::float16: case DType::bfloat16: return 2;
        case DType::int32: case DType::float32: return 4;
        case DType::int64: case DType::float64: return 8;
    }
    return 1;
}

std::string_view to_string(DType dtype) noexcept {
    switch (dtype) {
        case DType::uint8: return "uint8";
        case DType::int8: return "int8";
        case DType::int16: return "int16";
        case DType::int32: return "int32";
        case DType::int64: return "int64";
        case DType::float16: return "float16";
        case DType::bfloat16: return "bfloat16";
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::boolean: return "bool";
    }
    return "unknown";
}

Result<DType> dtype_from_code(std::uint8_t code) {
    if (code > static_cast<std::uint8_t>(DType::boolean))
        return fail(Errc::protocol_error, "unknown tensor dtype code " + std::to_string(code));
    return static_cast<DType>(code);
}

Result<std::size_t> checked_nbytes(DType dtype, std::span<const std::int64_t> shape) {
    std::size_t n = element_size(dtype);
    // Every partial product stays within int64 (numel's type), whatever dimension follows: a
    // shape such as [2^32, 2^31, 0] is refused, not taken as empty.
    constexpr auto max = static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max());
    for (std::size_t i = 0; i < shape.size(); ++i) {
        const auto d = shape[i];
        if (d < 0)
            return fail(Errc::invalid_argument,
                        "tensor dimension " + std::to_string(i) + " is negative (" + std::to_string(d) + ")");
        const auto ud = static_cast<std::size_t>(d);
        if (ud != 0 && n > max / ud)
            return fail(Errc::invalid_argument, "tensor size overflows (dimension " + std::to_string(i) + ")");
        n *= ud;
    }
    return n;
}

Result<void> Storage::record_stream(const Stream& stream) {
    if (stream.device != device())
        return fail(Errc::invalid_argument, "record_stream: a stream of " + stream.device.str() + " for memory on " + device().str());
    return ok();  // (released at once when the last reference goes: nothing to order)
}

Result<void> Tensor::record_stream(const Stream& stream) const {
    if (!storage_) return fail(Errc::invalid_argument, "record_stream on an undefined tensor");
    return storage_->record_stream(stream);
}

Result<Tensor> Tensor::wrap(std::shared_ptr<Storage> storage, DType dtype, std::vector<std::int64_t> shape) {
    if (!storage) return fail(Errc::invalid_argument, "Tensor::wrap: storage is null");
    auto need = checked_nbytes(dtype, shape);
    if (!need) return fail(std::move(need).error().context("Tensor::wrap"));
    if (*need > storage->size())
        return fail(Errc::invalid_argument, "Tensor::wrap: shape needs " + std::to_string(*need) +
                                                " bytes but the storage has " + std::to_string(storage->size()));
    Tensor t;
    t.storage_ = std::move(storage);
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    return t;
}

Tensor Tensor::cpu(DType dtype, std::vector<std::int64_t> shape) {
    auto t = empty(Device::cpu(), dtype, std::move(shape));
    return t ? std::move(*t) : Tensor{};
}

Tensor Tensor::from_bytes(std::span<const std::uint8_t> data) {
    auto t = cpu(DType::uint8, {static_cast<std::int64_t>(data.size())});
    if (t.defined() && !data.empty()) std::memcpy(t.data(), data.data(), data.size());
    return t;
}

Device Tensor::device() const noexcept { return storage_ ? storage_->device() : Device::cpu(); }

std::int64_t Tensor::numel() const noexcept {
    if (!storage_) return 0;
    // Unsigned: defined for any shape. A tensor's shape passed checked_nbytes, so the product
    // fits int64 and this is exact.
    std::uint64_t n = 1;
    for (auto d : shape_) n *= static_cast<std::uint64_t>(d);
    return static_cast<std::int64_t>(n);
}

std::uint8_t* Tensor::data() const noexcept { return storage_ ? storage_->data() : nullptr; }

}  // namespace tensorplay
