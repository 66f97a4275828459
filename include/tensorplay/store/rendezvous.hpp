// rendezvous: turns an init_method URL (env://, tcp://, file://) into a connected Store, as torch does.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/store/store.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <memory>
#include <string>

namespace tensorplay {

/// What rendezvous() gives: the store every rank shares, and the server when this rank hosts it.
struct Rendezvous {
    std::shared_ptr<Store> store;
    /// The embedded server when this rank hosts the store (rank 0 with tcp:// or env://, unless the
    /// launcher's agent store is used); keep it alive as long as any rank uses the store.
    std::shared_ptr<TcpStoreServer> server;
    int rank = -1;        ///< the rank, from the argument, the URL query or RANK
    int world_size = -1;  ///< the world size, from the argument, the URL query or WORLD_SIZE; -1: none (dynamic)
};

/// Connects this rank to the group's store and joins the world (see join_world). `rank` and
/// `world_size` of -1 are taken from the URL query (`?rank=R&world_size=W`), then (env:// only)
/// from RANK and WORLD_SIZE. A world size that no source gives makes this rank a member of a
/// dynamic group (torch 2.x's world_size=None; DYNAMIC_WORLD_SIZE, -1): it connects to the store
/// (rank 0 hosting it, as below, or an external one) and returns without joining a world.
///  - `tcp://host:port` (host may be `[v6addr]`): rank 0 starts a TcpStoreServer on `port` (all
///    interfaces, as torch, with an info log line); the others connect, retrying a refused
///    connection until `timeout`. Port 0 is allowed for the hosting rank only: it binds an
///    ephemeral port (server->port()) and returns at once, since the others can only learn the
///    port from the caller; they then check their world size against rank 0's alone.
///  - `env://`: the same with host MASTER_ADDR and port MASTER_PORT. With
///    TORCHELASTIC_USE_AGENT_STORE=True (torchrun's default static rendezvous) every rank is a
///    client of the launcher's store (its dialect, e.g. PyTorch 1.13's, is detected) and the store
///    is PrefixStore("/worker/attempt_<TORCHELASTIC_RESTART_COUNT>", client), like torch.
///  - `file:///path` (or `file://relative/path`): a FileStore on that file. As with torch, the file
///    must be new or empty for each job: stale keys of an earlier job would be read.
/// `timeout` bounds the whole rendezvous (connecting and joining; <= 0: no bound) and is the
/// store's default timeout. Errors: invalid_argument naming the culprit (malformed URL, unknown
/// scheme, missing or non-numeric variable or parameter, rank outside the world, a host name that
/// does not resolve, world sizes that disagree; env:// keeps torch's "environment variable
/// MASTER_ADDR expected, but not set"); timeout naming the ranks that did not join; the store's
/// errors (protocol_error for a listener that is not a store, connection_lost) with the URL as context.
[[nodiscard]] TP_API Task<Result<Rendezvous>> rendezvous(std::string init_method, int rank, int world_size,
                                                  Duration timeout = Store::kDefaultTimeout);
/// rendezvous(), whose rank, when it hosts the store, starts the server with `hosted`: its limits
/// and bind host (the port comes from the init method).
[[nodiscard]] TP_API Task<Result<Rendezvous>> rendezvous(std::string init_method, int rank, int world_size, Duration timeout,
                                                  TcpStoreServerOptions hosted);

/// The join every rendezvous ends with, for a store made otherwise (e.g. before
/// init_rpc_with_store): publishes this rank's world size under "tp/rdzv/", waits up to `timeout`
/// (<= 0: no bound) until every rank of the world has joined, logging at info level every few
/// seconds who is missing ("waiting for workers: 2/3 joined; missing: rank 2"), and lets rank 0
/// judge: when the world sizes disagree every waiting rank fails with Errc::invalid_argument naming
/// them, and a rank told another size than rank 0 always fails. Once per world and store (prefix).
/// Errors: invalid_argument (rank outside [0, world_size), a disagreement), timeout naming the
/// missing ranks, the store's errors. `store` must outlive the coroutine.
[[nodiscard]] TP_API Task<Result<void>> join_world(Store& store, int rank, int world_size, Duration timeout);

}  // namespace tensorplay
