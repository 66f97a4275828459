// rendezvous: turns an init_method URL (env://, tcp://, file://) into a connected Store, as torch does.
#pragma once

#include <tensorplay/store/store.hpp>

#include <memory>
#include <string>

namespace tensorplay {

class TcpStoreServer;

/// What rendezvous() gives: the store every rank shares, and the server when this rank hosts it.
struct Rendezvous {
    std::shared_ptr<Store> store;
    /// The embedded server when this rank hosts the store (rank 0 with tcp:// or env://, unless the
    /// launcher's agent store is used); keep it alive as long as any rank uses the store.
    std::shared_ptr<TcpStoreServer> server;
    int rank = -1;        ///< the rank, from the argument, the URL query or RANK
    int world_size = -1;  ///< the world size, from the argument, the URL query or WORLD_SIZE
};

/// Connects this rank to the group's store. `rank` and `world_size` of -1 are taken from the URL
/// query (`?rank=R&world_size=W`), then (env:// only) from RANK and WORLD_SIZE.
///  - `tcp://host:port` (host may be `[v6addr]`): rank 0 starts a TcpStoreServer on `port` (all
///    interfaces, as torch) and waits, up to `timeout`, for the world to connect (c10d's "init/"
///    count); the others connect, retrying until `timeout`. Port 0 is allowed for the hosting rank
///    only: it binds an ephemeral port (server->port()) and does not wait for the others, who can
///    only learn the port from the caller.
///  - `env://`: the same with host MASTER_ADDR and port MASTER_PORT. With
///    TORCHELASTIC_USE_AGENT_STORE=True every rank is a client of the launcher's store and the
///    store is PrefixStore("/worker/attempt_<TORCHELASTIC_RESTART_COUNT>", client), like torch.
///  - `file:///path` (or `file://relative/path`): a FileStore on that file. As with torch, the file
///    must be new or empty for each job: stale keys of an earlier job would be read.
/// `timeout` is also the store's default timeout. Errors: invalid_argument naming the culprit
/// (malformed URL, unknown scheme, missing or non-numeric variable or parameter, rank outside the
/// world; env:// keeps torch's "environment variable MASTER_ADDR expected, but not set"); the
/// store's errors (io_error, timeout, connection_lost) with the URL as context.
[[nodiscard]] Task<Result<Rendezvous>> rendezvous(std::string init_method, int rank, int world_size,
                                                  Duration timeout = Store::kDefaultTimeout);

}  // namespace tensorplay
