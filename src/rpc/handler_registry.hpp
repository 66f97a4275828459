// Private: an agent's handlers by name, with the calls of each running now, so that removing one
// waits until none of its calls runs any more.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/rpc/agent.hpp>

#include "core/resume_slot.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace tensorplay::detail {

/// One registered handler (exactly one of `coro` / `blocking` is set).
struct HandlerEntry {
    std::string name;
    RpcHandler coro;
    BlockingRpcHandler blocking;
    int running = 0;   ///< calls of it between enter() and leave() (strand)
    ResumeSlot drained; ///< remove() waits here until `running` is 0
};

/// add() is thread-safe; enter(), leave() and remove() run on the agent's strand.
class HandlerRegistry {
public:
    /// `worker`: the agent's worker name, for messages.
    explicit HandlerRegistry(std::string worker) : worker_(std::move(worker)) {}

    /// Registers `name` (exactly one of `coro` / `blocking` set). invalid_argument for an empty
    /// handler, already_registered for a taken name.
    [[nodiscard]] Result<void> add(std::string name, RpcHandler coro, BlockingRpcHandler blocking);
    /// The handler named `name`, counted as running (pair it with leave()); null when none is.
    [[nodiscard]] std::shared_ptr<HandlerEntry> enter(std::string_view name);
    /// One call of `entry` ended.
    void leave(HandlerEntry& entry);
    /// Unregisters `name` (no call enters it after this), then waits until none of its calls
    /// runs. not_found naming it when there is none. Cancelling the wait leaves it unregistered.
    [[nodiscard]] Task<Result<void>> remove(std::string name);
    /// The not_found error of a call to a handler `name` that does not exist.
    [[nodiscard]] Error not_found(std::string_view name) const;

private:
    std::string worker_;
    std::mutex mutex_;  // (the map: add() runs on any thread)
    std::map<std::string, std::shared_ptr<HandlerEntry>, std::less<>> by_name_;
    std::shared_ptr<HandlerEntry> last_;  // the one enter() found last (strand; requests come in runs)
};

}  // namespace tensorplay::detail
