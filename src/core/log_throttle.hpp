// A bound on log lines that a peer can cause at will (one per refused connection, say): at most
// one per period; the next line that passes says how many were left out.
#pragma once

#include <tensorplay/core/timeout.hpp>

#include <cstddef>
#include <string>
#include <utility>

namespace tensorplay::detail {

class LogThrottle {
public:
    explicit LogThrottle(Duration period = std::chrono::seconds(1)) noexcept : period_(period) {}

    /// Whether a line may be logged now. When it may, `note` is what to append to it about the
    /// lines left out since the last one (empty when none were).
    bool allow(std::string& note, Clock::time_point now = Clock::now()) {
        if (now < next_) {
            ++left_out_;
            return false;
        }
        next_ = now + period_;
        const std::size_t n = std::exchange(left_out_, 0);
        note = n == 0 ? std::string() : " (and " + std::to_string(n) + " more like it, not logged)";
        return true;
    }

private:
    Duration period_;
    Clock::time_point next_{};
    std::size_t left_out_ = 0;
};

}  // namespace tensorplay::detail
