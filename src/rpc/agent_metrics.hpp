// Private: the counters behind RpcAgent::get_debug_info (strand-bound, like the agent's state).
#pragma once

#include <tensorplay/core/error.hpp>
#include <tensorplay/rpc/debug_info.hpp>
#include <tensorplay/rpc/message.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

namespace tensorplay::detail {

/// Round-trip times in log-linear buckets (8 per power of two of nanoseconds: within 12.5%), so
/// that recording is an increment and percentiles cost no sorting.
class LatencyHistogram {
public:
    void record(std::chrono::nanoseconds d) noexcept;
    [[nodiscard]] std::uint64_t count() const noexcept { return count_; }
    /// The upper bound of the bucket holding the `p`-th percentile (0 < p <= 100), in microseconds.
    [[nodiscard]] double percentile_us(double p) const noexcept;
    [[nodiscard]] double max_us() const noexcept { return static_cast<double>(max_ns_) / 1000.0; }

private:
    static constexpr int kSub = 8;
    static constexpr int kBuckets = 64 * kSub;
    std::array<std::uint64_t, kBuckets> buckets_{};
    std::uint64_t count_ = 0;
    std::uint64_t max_ns_ = 0;
};

struct PeerCounters {
    std::uint64_t calls_done = 0;
    std::uint64_t calls_failed = 0;
    std::uint64_t requests_served = 0;
    std::uint64_t bytes_sent = 0;
    std::uint64_t bytes_received = 0;
};

/// What an agent counts. Strand-bound.
struct AgentMetrics {
    std::vector<PeerCounters> peers;  // by rank
    std::array<std::uint64_t, 32> errors{};  // by Errc
    std::uint64_t requests_running = 0;
    LatencyHistogram latency;

    /// A call to `rank` ended: `r` is its result, `sent_at` when its request went out.
    void call_ended(int rank, std::chrono::steady_clock::time_point sent_at, const Result<Message>& r) noexcept;
    /// A call to `rank` ended without a reply, with `code`.
    void call_failed(int rank, Errc code) noexcept;
};

/// Payload and tensor bytes of `m`.
[[nodiscard]] std::uint64_t message_bytes(const Message& m) noexcept;

}  // namespace tensorplay::detail
