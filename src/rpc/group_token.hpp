// Private: the membership token of a dynamic group (issue 19). Joins and leaves are serialised by
// one store key that a member takes with compare_set, as torch's _group_membership_management
// does: the key holds the holder's token; the others wait until the holder's own key (the token
// itself, as a key) says "Done". Beyond torch, a holder proves it is alive with a heartbeat, and a
// waiter that sees a holder's heartbeat stand still for `stale_after` takes the token from it, so
// that a member that dies while joining or leaving does not block the group for ever.
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/store/store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace tensorplay::detail {

/// The store key that holds the token (torch's name).
inline constexpr const char* kGroupTokenKey = "RpcGroupManagementToken";

/// Why a worker takes the token (named in its value).
enum class TokenPurpose { join, leave, removal };

/// How a token is held and when a silent holder counts as dead.
struct GroupTokenTiming {
    /// The holder's heartbeat period (an `add` on `<token>/beat`).
    Duration beat_interval = std::chrono::milliseconds(500);
    /// A holder whose heartbeat did not move for this long is taken for dead; its token is taken.
    Duration stale_after = std::chrono::seconds(10);
};

/// A held token. release() (or destroying it, which starts the release without waiting for it)
/// gives it back. Call its members on the executor it was acquired on.
class GroupToken {
public:
    /// Takes the token for worker `name` (to join, leave, or remove a dead member) in `store`, waiting while
    /// others hold it, until `deadline`: Errc::timeout naming the holder then. A holder whose
    /// heartbeat stood still for timing.stale_after loses the token to us (logged at warn).
    [[nodiscard]] static Task<Result<std::unique_ptr<GroupToken>>> acquire(std::shared_ptr<Store> store, std::string name,
                                                                          TokenPurpose purpose, Clock::time_point deadline,
                                                                          GroupTokenTiming timing = {});
    ~GroupToken();
    GroupToken(const GroupToken&) = delete;
    GroupToken& operator=(const GroupToken&) = delete;

    /// The token's value ("Token_for_<name>_<join|leave|removal>_<nonce>").
    [[nodiscard]] const std::string& value() const noexcept;
    /// True once a heartbeat found the token key holding another token: a waiter took it from
    /// us, taking us for dead (we were silent past stale_after). What the holder does under the
    /// token must then not be committed.
    [[nodiscard]] bool lost() const noexcept;
    /// Stops the heartbeat, empties the token key if it still holds ours, and marks ours "Done"
    /// (which wakes the waiters). Errors are the store's; the token counts as given back anyway.
    [[nodiscard]] Task<Result<void>> release();

    struct State;  ///< private

private:
    explicit GroupToken(std::shared_ptr<State> s) : s_(std::move(s)) {}
    std::shared_ptr<State> s_;
};

}  // namespace tensorplay::detail
