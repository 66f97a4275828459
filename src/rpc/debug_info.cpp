// AgentDebugInfo's JSON form, the agent counters behind it, and RpcAgent's default get_debug_info.
#include <tensorplay/rpc/agent.hpp>
#include <tensorplay/rpc/debug_info.hpp>

#include "rpc/agent_metrics.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

namespace tensorplay {

namespace {
std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
            out += buf;
        } else {
            out += c;
        }
    }
    return out + "\"";
}
std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", v);
    return buf;
}
}  // namespace

namespace {
std::string map_json(const DeviceMap& m) {
    std::string out = "{";
    bool first = true;
    for (const auto& [from, to] : m) {
        out += (first ? "" : ",") + json_string(from.str()) + ":" + json_string(to.str());
        first = false;
    }
    return out + "}";
}
}  // namespace

std::string AgentDebugInfo::to_json() const {
    std::string out = "{\"worker\":" + json_string(worker) + ",\"rank\":" + std::to_string(rank) +
                      ",\"world_size\":" + std::to_string(world_size) + ",\"peers\":[";
    for (std::size_t i = 0; i < peers.size(); ++i) {
        const auto& p = peers[i];
        out += (i ? "," : "") + std::string("{\"worker\":") + json_string(p.worker) + ",\"rank\":" + std::to_string(p.rank) +
               ",\"connected\":" + (p.connected ? "true" : "false") +
               ",\"transport\":" + json_string(p.transport) + ",\"channel\":" + json_string(p.channel) + ",\"calls_in_flight\":" + std::to_string(p.calls_in_flight) +
               ",\"calls_done\":" + std::to_string(p.calls_done) + ",\"calls_failed\":" + std::to_string(p.calls_failed) +
               ",\"requests_served\":" + std::to_string(p.requests_served) + ",\"bytes_sent\":" + std::to_string(p.bytes_sent) +
               ",\"bytes_received\":" + std::to_string(p.bytes_received) + ",\"device_map\":" + map_json(p.device_map) +
               ",\"reverse_device_map\":" + map_json(p.reverse_device_map) + "}";
    }
    out += "],\"devices\":[";
    for (std::size_t i = 0; i < devices.size(); ++i) out += (i ? "," : "") + json_string(devices[i].str());
    out += "],\"errors\":{";
    bool first = true;
    for (const auto& [code, n] : errors) {
        out += (first ? "" : ",") + json_string(code) + ":" + std::to_string(n);
        first = false;
    }
    out += "},\"requests_running\":" + std::to_string(requests_running) + ",\"latency\":{\"samples\":" +
           std::to_string(latency_samples) + ",\"p50_us\":" + num(latency_p50_us) + ",\"p90_us\":" + num(latency_p90_us) +
           ",\"p99_us\":" + num(latency_p99_us) + ",\"max_us\":" + num(latency_max_us) + "}}";
    return out;
}

Task<Result<AgentDebugInfo>> RpcAgent::get_debug_info() {
    co_return fail(Errc::not_supported, "this RPC backend keeps no debug counters");
}

namespace detail {

void LatencyHistogram::record(std::chrono::nanoseconds d) noexcept {
    const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(d.count(), 1));
    // Bucket: the power of two, then the next three bits below the top one.
    const int top = 63 - std::countl_zero(ns);
    const int sub = top >= 3 ? static_cast<int>((ns >> (top - 3)) & (kSub - 1)) : static_cast<int>(ns & (kSub - 1));
    buckets_[static_cast<std::size_t>(std::min(top * kSub + sub, kBuckets - 1))]++;
    ++count_;
    max_ns_ = std::max(max_ns_, ns);
}

double LatencyHistogram::percentile_us(double p) const noexcept {
    if (count_ == 0) return 0;
    const auto want = static_cast<std::uint64_t>(std::ceil(p / 100.0 * static_cast<double>(count_)));
    std::uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
        seen += buckets_[static_cast<std::size_t>(b)];
        if (seen >= std::max<std::uint64_t>(want, 1)) {
            const int top = b / kSub, sub = b % kSub;
            // The bucket's upper bound: (8 + sub + 1) << (top - 3) for top >= 3.
            const double upper = top >= 3 ? std::ldexp(static_cast<double>(kSub + sub + 1), top - 3) : static_cast<double>(sub + 1);
            return std::min(upper, static_cast<double>(max_ns_)) / 1000.0;
        }
    }
    return max_us();
}

void AgentMetrics::call_failed(int rank, Errc code) noexcept {
    if (const auto i = static_cast<std::size_t>(code); i < errors.size()) ++errors[i];
    if (rank < 0 || rank >= static_cast<int>(peers.size())) return;
    ++peers[static_cast<std::size_t>(rank)].calls_done;
    ++peers[static_cast<std::size_t>(rank)].calls_failed;
}

void AgentMetrics::call_ended(int rank, std::chrono::steady_clock::time_point sent_at, const Result<Message>& r) noexcept {
    if (!r) return call_failed(rank, r.error().code());
    latency.record(std::chrono::steady_clock::now() - sent_at);
    if (rank < 0 || rank >= static_cast<int>(peers.size())) return;
    ++peers[static_cast<std::size_t>(rank)].calls_done;
    peers[static_cast<std::size_t>(rank)].bytes_received += message_bytes(*r);
}

std::uint64_t message_bytes(const Message& m) noexcept {
    std::uint64_t n = m.payload.size();
    for (const auto& t : m.tensors)
        if (t.defined()) n += t.nbytes();
    return n;
}

}  // namespace detail
}  // namespace tensorplay
