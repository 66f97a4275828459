// WorkerInfo: a worker's name and id (its rank in a static group).
#pragma once

#include <tensorplay/core/export.hpp>
#include <compare>
#include <iosfwd>
#include <string>

namespace tensorplay {

/// Identity of a worker. Printable as "WorkerInfo(id=1, name=worker1)".
struct TP_API WorkerInfo {
    std::string name;
    int id = -1;

    [[nodiscard]] std::string str() const;
    friend bool operator==(const WorkerInfo&, const WorkerInfo&) = default;
    friend auto operator<=>(const WorkerInfo&, const WorkerInfo&) = default;
};

TP_API std::ostream& operator<<(std::ostream& os, const WorkerInfo& w);

}  // namespace tensorplay
