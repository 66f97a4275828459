// CallTable: registration, failure and draining of a worker's calls.
#include "rpc/call_table.hpp"

#include <tensorplay/core/timeout.hpp>

namespace tensorplay::detail {

CallTable::CallTable(Executor ex, TaskGroup& tasks)
    : slots_(&SlotRegistry::of(ex)), deadlines_(std::move(ex), tasks, [](DeadlineHook& h) { static_cast<PendingCall&>(h).signal(); }) {}

void CallTable::remove(int rank, std::uint64_t id, PendingCall& pc) noexcept {
    // A reply or a failure took it out of the map already (and set its result); only a timeout,
    // a cancellation or the frame's destruction leaves it there.
    if (!pc.result)
        if (PendingCalls* p = of(rank)) p->erase(id);
    deadlines_.remove(pc);
}

void CallTable::fail(int rank, const Connection* conn, const Error& reason) {
    PendingCalls* pending = of(rank);
    if (!pending) return;
    // Ids first: finishing a call resumes its caller in place, which may start (or end) others
    // (and grow by_rank_: take() looks the rank up again each time).
    std::vector<std::uint64_t> ids;
    for (const auto& [id, pc] : *pending)
        if (conn == nullptr || pc->conn == conn) ids.push_back(id);
    for (auto id : ids)
        if (PendingCall* pc = take(rank, id)) pc->finish(tensorplay::fail(reason));
}

template <class Done>
Task<bool> CallTable::wait_until(Done done, Clock::time_point deadline) {
    auto waiting = [](Flag& e) -> Task<Result<void>> {
        auto ec = co_await e.wait();
        if (ec) co_return tensorplay::fail(from_error_code(ec, "waiting for calls"));
        co_return ok();
    };
    while (!done() && !closed_) {
        Duration left = Duration::zero();  // (with_timeout: none)
        if (deadline != Clock::time_point::max()) {
            left = deadline - Clock::now();
            if (left <= Duration::zero()) break;
        }
        idle_.reset();
        auto wait = with_timeout(waiting(idle_), left);
        if (auto r = co_await std::move(wait); !r) break;  // the deadline passed, or we were cancelled
    }
    co_return done();
}

Task<bool> CallTable::drained(Clock::time_point deadline) {
    return wait_until([this] { return outstanding_ == 0; }, deadline);
}

Task<bool> CallTable::drained(int rank, Clock::time_point deadline) {
    ++watching_;
    struct Unwatch {
        std::size_t& n;
        ~Unwatch() { --n; }
    } unwatch{watching_};
    co_return co_await wait_until([this, rank] { return in_flight(rank) == 0; }, deadline);
}

void CallTable::close() {
    closed_ = true;
    deadlines_.close();
    idle_.set();
}

}  // namespace tensorplay::detail
