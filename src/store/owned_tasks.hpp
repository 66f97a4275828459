// Private: what the store's client and server states share about their background coroutines:
// counters for the lifetime tests, and the join that lets a state go only once its tasks ended.
#pragma once

#include <tensorplay/core/error.hpp>
#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/core/task.hpp>

#include "core/task_group.hpp"

#include <asio/co_spawn.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

namespace tensorplay::detail {

/// Live states and running tasks of one kind of store object (test hooks: *_states_alive()).
struct LifetimeCounters {
    std::atomic<std::size_t> states{0};
    std::atomic<std::size_t> tasks{0};
};

/// Runs `task`, counted in `c.tasks` while it runs.
inline Task<void> counted(LifetimeCounters& c, Task<void> task) {
    struct Count {
        LifetimeCounters& c;
        explicit Count(LifetimeCounters& cc) : c(cc) { c.tasks.fetch_add(1, std::memory_order_relaxed); }
        ~Count() { c.tasks.fetch_sub(1, std::memory_order_relaxed); }
    } count(c);
    co_await std::move(task);
}

/// Holds `owner` until every task of its group has ended: started (once, `joining`) by an owner
/// that closed and cancelled its group but cannot await (a void close() or a destructor), so that
/// the owner is let go on `ex` with nothing of it running. Not a member of the group it joins.
/// `what` names the owner in the log line of an exception.
template <class Owner>
void release_after_join(Executor ex, std::shared_ptr<Owner> owner, bool& joining, const char* what) {
    if (joining) return;
    joining = true;
    auto join = [](std::shared_ptr<Owner> o) -> Task<void> { co_await o->tasks.join(); };
    asio::co_spawn(ex, join(std::move(owner)), [what](std::exception_ptr e) {
        if (e) log(LogLevel::error, "store", error_from_exception_ptr(e, std::string("joining the tasks of ") + what).to_string());
    });
}

}  // namespace tensorplay::detail
