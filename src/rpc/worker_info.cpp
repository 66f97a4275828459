// WorkerInfo printing, as torch's repr: "WorkerInfo(id=1, name=worker1)".
#include <tensorplay/rpc/worker_info.hpp>

#include <ostream>

namespace tensorplay {

std::string WorkerInfo::str() const { return "WorkerInfo(id=" + std::to_string(id) + ", name=" + name + ")"; }

std::ostream& operator<<(std::ostream& os, const WorkerInfo& w) { return os << w.str(); }

}  // namespace tensorplay
