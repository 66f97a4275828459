// Message: what an RPC carries, payload bytes plus tensors.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/device/tensor.hpp>

#include <vector>

namespace tensorplay {

/// An RPC request or reply: opaque payload bytes and tensors sent alongside (never copied into
/// the payload). Tensors on non-CPU devices move through the device maps.
struct Message {
    Bytes payload;
    std::vector<Tensor> tensors;
};

}  // namespace tensorplay
