// Collectives over any Store: all_gather and barrier for a fixed group of ranks.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/store/store.hpp>

#include <string>
#include <vector>

namespace tensorplay {

/// Key layout (all keys under "tp/"; give each group its own PrefixStore):
///
///   tp/ag/seq/<rank>           all_gather counter: rounds rank has started (ASCII decimal)
///   tp/bar/seq/<rank>          barrier counter: barriers rank has started
///   tp/bar/<round>/arrived     counter: ranks that reached barrier <round>
///   tp/bar/<round>/done        set by the last rank to arrive; the others wait for it
///
/// all_gather over a store with the extended API (append, multi_get):
///   tp/ag/<round>/v            every rank's value as a frame (u32 rank, u64 length, bytes), appended
///   tp/ag/<round>/n            counter: ranks that appended
///   tp/ag/<round>/done         set by the last rank to arrive; every rank multi_gets {done, v}
/// so that a rank's requests stay O(1) bytes whatever the world size. Otherwise:
///   tp/ag/<round>/<rank>       rank's value in all_gather round <round> (rounds count from 1)
///
/// Each rank numbers its rounds with its own counter, so that round k never reads round k-1's keys.
/// Keys stay bounded: the last rank to reach all_gather round k deletes round k-1's keys (extended
/// API; otherwise each rank deletes its own key of round k-2, as every rank has finished reading
/// round k-2 before anyone can start round k); the last rank to reach barrier k deletes barrier
/// k-1's keys. At rest a group holds at most 4 * world_size + 4 keys.
/// Every rank of a group must call the same collectives in the same order; after a failed round
/// (timeout, lost store) the group's counters disagree and it must start over under a new prefix.

/// Gathers one value from every rank: element r of the result is rank r's value.
/// Waits with the store's timeout(). Costs O(1) store round trips per rank when the store has the
/// extended API (append, multi_get), O(world_size) otherwise.
/// Errors: invalid_argument when rank is not in [0, world_size) or world_size < 1; the store's
/// error (timeout naming the ranks that never came, connection_lost, ...) with the round as context.
[[nodiscard]] TP_API Task<Result<std::vector<Bytes>>> all_gather(Store& store, int rank, int world_size, Bytes value);

/// Returns once every rank of the group has entered this barrier (same errors as all_gather).
/// The store must outlive both coroutines.
[[nodiscard]] TP_API Task<Result<void>> barrier(Store& store, int rank, int world_size);

}  // namespace tensorplay
