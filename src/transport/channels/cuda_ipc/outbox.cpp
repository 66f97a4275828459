// cuda_ipc's outboxes and the parameters of its offer.
#include "transport/channels/cuda_ipc/outbox.hpp"

#include <tensorplay/core/wire.hpp>

#include <algorithm>
#include <cstring>

namespace tensorplay::detail {

Result<std::shared_ptr<Outbox>> Outbox::create(DeviceBackend& backend, Device device, std::size_t bytes) {
    auto box = std::make_shared<Outbox>(backend, device);
    bytes = (bytes + kOutboxAlign - 1) / kOutboxAlign * kOutboxAlign;
    auto memory = backend.allocate_exportable(device, bytes);
    if (!memory) return fail(std::move(memory).error().context("allocating the " + std::to_string(bytes) + "-byte cuda_ipc outbox"));
    auto handle = backend.export_memory(**memory);
    if (!handle) return fail(std::move(handle).error().context("exporting the cuda_ipc outbox"));
    box->memory_ = std::move(*memory);
    box->handle_ = *handle;
    box->size_ = bytes;
    box->chunk_ = std::max(kOutboxAlign, std::min(kOutboxChunkMax, bytes / 16 / kOutboxAlign * kOutboxAlign));
    box->ranges_.emplace(bytes, kOutboxAlign);
    for (int k = 0; k < kOutboxEvents; ++k) {
        auto e = backend.create_ipc_event(device);
        if (!e) return fail(std::move(e).error().context("creating the cuda_ipc outbox's events"));
        box->events_.push_back(std::move(*e));
        box->free_events_.push_back(kOutboxEvents - 1 - k);
    }
    return box;
}

IpcDeviceParams Outbox::params() const {
    IpcDeviceParams p;
    p.index = device_.index;
    p.outbox = true;
    p.memory = handle_;
    p.size = size_;
    p.chunk = chunk_;
    p.ring = kOutboxRing;
    for (const auto& e : events_) p.events.push_back(e.second);
    return p;
}

std::optional<std::size_t> Outbox::take_range(std::size_t n) {
    {
        std::lock_guard lock(mutex_);
        sweep();
    }
    return ranges_->take(n);
}

void Outbox::give_range(std::size_t off, std::size_t n) noexcept { ranges_->give(off, n); }

void Outbox::give_back(std::vector<std::pair<std::size_t, std::size_t>> ranges, std::vector<int> events) {
    std::lock_guard lock(mutex_);
    parked_.push_back(Parked{std::move(ranges), std::move(events)});
    sweep();
}

void Outbox::sweep() {
    std::erase_if(parked_, [this](Parked& p) {
        for (int k : p.events)
            if (!events_[static_cast<std::size_t>(k)].first.ready()) return false;
        for (auto [off, n] : p.ranges) ranges_->give(off, n);
        free_events_.insert(free_events_.end(), p.events.begin(), p.events.end());
        return true;
    });
}

std::optional<int> Outbox::take_event() {
    std::lock_guard lock(mutex_);
    sweep();
    if (free_events_.empty()) return std::nullopt;
    const int k = free_events_.back();
    free_events_.pop_back();
    return k;
}

bool Outbox::idle() {
    std::lock_guard lock(mutex_);
    sweep();
    return free_events_.size() == events_.size();
}

void Outbox::give_event(int k) noexcept {
    std::lock_guard lock(mutex_);
    free_events_.push_back(k);
}

OutboxHold::~OutboxHold() {
    // Per outbox, its ranges with its events (every range of a hold has an event of its outbox).
    std::vector<Outbox*> boxes;
    auto note = [&boxes](Outbox* b) {
        if (std::find(boxes.begin(), boxes.end(), b) == boxes.end()) boxes.push_back(b);
    };
    for (auto& r : ranges) note(r.box.get());
    for (auto& e : events) note(e.first.get());
    for (Outbox* box : boxes) {
        std::vector<std::pair<std::size_t, std::size_t>> rs;
        std::vector<int> ks;
        for (auto& r : ranges)
            if (r.box.get() == box) rs.emplace_back(r.offset, r.len);
        for (auto& [b, k] : events)
            if (b.get() == box) ks.push_back(k);
        box->give_back(std::move(rs), std::move(ks));
    }
}

}  // namespace tensorplay::detail
