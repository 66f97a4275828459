// Helpers of the tests that move CUDA tensors between agents (on the fake runtime or a GPU):
// patterned tensors filled by a queued copy, and their bytes read back on a stream.
#pragma once

#include <tensorplay/core/task.hpp>
#include <tensorplay/device/backend.hpp>
#include <tensorplay/rpc/message.hpp>

#include "device/cuda_support.hpp"  // (cuda(): the process's cuda backend)

#include <cstdint>
#include <cstring>
#include <vector>

namespace tensorplay::test {

inline std::vector<std::uint8_t> pattern(std::size_t n, int seed) {
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 131 + static_cast<std::size_t>(seed) * 7 + i / 4093) & 0xff);
    return v;
}

/// A tensor on `s`'s device whose bytes `seed`'s pattern fills by a copy queued on `s` (not yet run).
inline Result<Tensor> filled(Stream s, std::size_t n, int seed) {
    auto& b = cuda();
    auto storage = b.allocate_on(s, n);
    if (!storage) return fail(storage.error());
    auto host = b.allocate_host(n);
    if (!host) return fail(host.error());
    const auto p = pattern(n, seed);
    std::memcpy((*host)->data(), p.data(), n);
    if (auto c = b.copy_async(s, (*storage)->data(), (*host)->data(), n, *host); !c) return fail(c.error());
    return Tensor::wrap(*storage, DType::uint8, {static_cast<std::int64_t>(n)});
}

/// The bytes of `t` once the work queued on `s` (the stream its bytes are ready on) has run.
inline Task<std::vector<std::uint8_t>> read_back(Tensor t, Stream s) {
    auto& b = cuda();
    auto host = b.allocate_host(t.nbytes());
    if (!host) co_return std::vector<std::uint8_t>{};
    if (!b.copy_async(s, (*host)->data(), t.data(), t.nbytes(), t.storage())) co_return std::vector<std::uint8_t>{};
    auto done = co_await b.synchronize(s);
    if (!done) co_return std::vector<std::uint8_t>{};
    co_return std::vector<std::uint8_t>((*host)->data(), (*host)->data() + t.nbytes());
}

/// The stream a received message names for `d` (its default stream when none, which fails the
/// checks below: the agent must name one).
inline Stream stream_of(const Message& m, Device d) {
    const Stream* s = m.stream_for(d);
    return s ? *s : Stream{d, 0};
}

}  // namespace tensorplay::test
