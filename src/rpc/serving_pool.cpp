// ServingPool: parking and waking serving workers; the blocking handlers' threads.
#include "rpc/serving_pool.hpp"

#include <algorithm>

namespace tensorplay::detail {

ServeWorker::~ServeWorker() {
    if (parked_in) parked_in->unpark(*this);
}

ServingPool::~ServingPool() { abandon(); }

ServeWorker* ServingPool::take() noexcept {
    if (idle_.empty()) return nullptr;
    ServeWorker* w = idle_.back();
    idle_.pop_back();
    w->parked_in = nullptr;
    return w;
}

bool ServingPool::park(ServeWorker& w) {
    if (closed_ || idle_.size() >= max_idle_) return false;
    idle_.push_back(&w);
    w.parked_in = this;
    return true;
}

void ServingPool::unpark(ServeWorker& w) noexcept {
    if (auto it = std::find(idle_.begin(), idle_.end(), &w); it != idle_.end()) idle_.erase(it);
    w.parked_in = nullptr;
}

void ServingPool::close() {
    closed_ = true;
    // One at a time: a worker that exits may run code that parks or wakes others.
    while (ServeWorker* w = take()) w->wake.complete();
}

void ServingPool::abandon() {
    // One at a time: destroying a worker's frame may touch the list.
    while (ServeWorker* w = take()) w->wake.abandon();
}

asio::thread_pool& ServingPool::blocking_threads(std::size_t threads) {
    std::lock_guard lock(threads_mutex_);
    if (!threads_) threads_ = std::make_unique<asio::thread_pool>(std::max<std::size_t>(threads, 1));
    return *threads_;
}

}  // namespace tensorplay::detail
