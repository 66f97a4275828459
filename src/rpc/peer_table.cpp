// PeerTable: members by rank (shared links) and by name.
#include "rpc/peer_table.hpp"

namespace tensorplay::detail {

PeerTable::PeerTable() = default;
PeerTable::~PeerTable() = default;

Result<std::shared_ptr<PeerLink>> PeerTable::add(const WorkerInfo& info) {
    if (info.id < 0) return fail(Errc::invalid_argument, "worker \"" + info.name + "\" has the negative rank " + std::to_string(info.id));
    if (auto* other = at(info.id))
        return fail(Errc::invalid_argument, "rank " + std::to_string(info.id) + " is taken by worker \"" + other->info.name +
                                                "\", and claimed by worker \"" + info.name + "\"");
    if (auto it = by_name_.find(info.name); it != by_name_.end())
        return fail(Errc::invalid_argument, "RPC worker name " + info.name + " is not unique. Workers " + std::to_string(it->second) +
                                                " and " + std::to_string(info.id) + " share the same name.");
    auto link = std::make_shared<PeerLink>();
    link->info = info;
    std::lock_guard lock(mutex_);
    if (static_cast<std::size_t>(info.id) >= by_rank_.size()) by_rank_.resize(static_cast<std::size_t>(info.id) + 1);
    by_rank_[static_cast<std::size_t>(info.id)] = link;
    by_name_.emplace(info.name, info.id);
    return link;
}

std::shared_ptr<PeerLink> PeerTable::remove(int rank) {
    if (!at(rank)) return nullptr;
    std::lock_guard lock(mutex_);
    auto link = std::move(by_rank_[static_cast<std::size_t>(rank)]);
    by_name_.erase(link->info.name);
    while (!by_rank_.empty() && !by_rank_.back()) by_rank_.pop_back();
    return link;
}

std::shared_ptr<PeerLink> PeerTable::link(int rank) const {
    if (!at(rank)) return nullptr;
    return by_rank_[static_cast<std::size_t>(rank)];
}

int PeerTable::rank_of(std::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? -1 : it->second;
}

std::vector<WorkerInfo> PeerTable::infos() const {
    std::lock_guard lock(mutex_);
    std::vector<WorkerInfo> out;
    out.reserve(by_name_.size());
    for (const auto& p : by_rank_)
        if (p) out.push_back(p->info);
    return out;
}

Result<WorkerInfo> PeerTable::find(std::string_view name) const {
    std::lock_guard lock(mutex_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return fail(Errc::invalid_argument, "unknown worker \"" + std::string(name) + "\"");
    return by_rank_[static_cast<std::size_t>(it->second)]->info;
}

std::string PeerTable::names() const {
    std::string s;
    for_each([&s](const PeerLink& p) { s += (s.empty() ? "" : ", ") + p.info.name; });
    return s;
}

}  // namespace tensorplay::detail
