// TcpStoreServer internals: connections, the key space, waiters and watchers (all on one strand).
#pragma once

#include <tensorplay/store/tcp_store.hpp>

#include "core/log_throttle.hpp"
#include "core/resume_slot.hpp"
#include "core/task_group.hpp"
#include "store/c10d_protocol.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tensorplay::detail {

using ServerStrand = asio::strand<Executor>;

struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

struct StoreServerState;

/// One client connection. Its reader parses every request buffered and runs it; the replies (and
/// other connections' wake-ups) collect in `out`, which is sent once per read batch, directly with a
/// non-blocking send; the writer coroutine sends only what the socket would not take at once.
/// Owned by its two coroutines (and, between a request and the end of its batch, the dirty list).
/// Its two hand-offs resume in place (on the strand): `wake` the writer, `drained` the reader. A
/// coroutine resumed so runs inside the call that completed it, up to its next wait; close()
/// completes both last, and its callers hold the connection (or touch it no more) after it.
struct StoreConn : std::enable_shared_from_this<StoreConn> {
    /// `endpoint` ("host:port") and `host` are empty when the peer's address could not be read.
    StoreConn(StoreServerState& server, asio::ip::tcp::socket socket, std::uint64_t id, std::string endpoint,
              std::string host);

    StoreServerState& server;
    asio::ip::tcp::socket socket;
    std::uint64_t id;
    std::string peer;
    std::string host;    // the peer's IP address (max_connections_per_host)
    bool heard = false;  // it has sent a byte (until then it is in the server's `silent`)

    bool sniffed = false;  // dialect decided from the first bytes
    c10d::Dialect dialect = c10d::Dialect::legacy;
    bool closed = false;

    // Read buffer [begin, end) inside [0, cap); grown only to what a request needs (limits checked first).
    std::unique_ptr<std::uint8_t[]> in;
    std::size_t in_cap = 0, in_begin = 0, in_end = 0;

    Bytes out;      // replies not yet sent
    Bytes writing;  // the buffer the writer is sending; its first `written` bytes are sent
    std::size_t written = 0;
    bool writer_busy = false;  // the writer is sending `writing`: `out` must wait for it (order)
    bool dirty = false;        // listed in the server's `dirty`: `out` has data to send
    std::string overflow;      // why pushed output overflowed: closed at the end of the batch
    Clock::time_point progress_at;  // the socket last took bytes (or the writer began waiting for it)
    ResumeSlot wake;     ///< the parked writer: `out` has data (or the connection closed)
    ResumeSlot drained;  ///< the reader held by back-pressure: output went under the limit (or closed)

    // Pending WAITs: id -> keys still missing. Keys registered in the server's waiters map.
    struct Wait {
        std::uint64_t id;
        std::size_t missing;
    };
    std::vector<Wait> waits;
    std::vector<std::string> wait_keys;   // keys this connection is registered under
    std::vector<std::string> watch_keys;  // keys this connection watches (legacy WATCH_KEY)
    std::uint64_t next_wait_id = 1;

    /// Output not yet taken by the socket.
    [[nodiscard]] std::size_t queued() const noexcept { return out.size() + writing.size() - written; }
    /// Notes that `out` has something to send (sent at the end of the current read batch).
    void flush();
};

/// The state shared by all connections: only touched on `strand`.
///
/// Its coroutines (acceptors, the output sweeper, each connection's reader and writer) are members
/// of `tasks`. stop_all() closes the acceptors and connections (each coroutine ends at its next
/// wait), cancels the tasks and starts the join: a coroutine that holds the state until every task
/// has ended, so that the state is freed on the strand after its last coroutine.
struct StoreServerState : std::enable_shared_from_this<StoreServerState> {
    explicit StoreServerState(Executor ex, TcpStoreServerOptions opts);
    ~StoreServerState();

    ServerStrand strand;
    SlotRegistry* slots;  ///< the strand's event loop's, for the connections' hand-offs
    TcpStoreServerOptions options;
    c10d::Limits limits;
    std::vector<asio::ip::tcp::acceptor> acceptors;
    std::uint16_t port = 0;
    std::string address;
    bool stopped = false;
    std::uint64_t next_conn_id = 1;

    StringMap<Bytes> data;
    std::size_t stored_bytes = 0;  ///< what `data` holds, as max_stored_bytes counts it
    struct WaitRef {
        StoreConn* conn;
        std::uint64_t wait_id;
    };
    StringMap<std::vector<WaitRef>> waiters;
    StringMap<std::vector<StoreConn*>> watchers;
    std::unordered_set<StoreConn*> conns;
    bool refusing = false;  ///< the last connection accepted was refused (max_connections): log once
    /// Connections that have not sent a byte yet, by id (oldest first): the first to go when
    /// max_connections are open.
    std::map<std::uint64_t, StoreConn*> silent;
    StringMap<std::size_t> per_host;  ///< connections open from each host (max_connections_per_host)
    bool evicting = false;            ///< the last accept ended a silent connection: log once per burst
    /// Warnings a client causes at will (a connection closed for what it sent or did not read, a
    /// failed accept): at most one a second, the next saying how many were left out.
    LogThrottle warnings;
    void warn(const std::string& line);
    std::vector<const Bytes*> multi_get_scratch;  // reused by MULTI_GET
    // Connections with output to send, sent at the end of each read batch. The list owns what it
    // names and close() takes a connection off it, so an entry can never outlive its connection,
    // whatever path (an exception included) ends a batch.
    std::vector<std::shared_ptr<StoreConn>> dirty;
    std::vector<std::shared_ptr<StoreConn>> sending;  // send_dirty's copy of `dirty` (kept for its capacity)
    asio::steady_timer sweep;  // paces close_stalled (cancelled by stop_all)
    bool joining = false;      // stop_all started the join of `tasks`
    /// Declared last: destroyed first, while what its tasks wait on still exists.
    TaskGroup tasks;

    /// Sends what every dirty connection has in `out`: one non-blocking send each, the writer
    /// coroutine taking over what the socket did not accept; closes those whose pushed output
    /// overflowed. Called at the end of each read batch.
    void send_dirty() noexcept;

    /// Runs one parsed request of `c`; false when the connection must close (`why` says why).
    /// May throw (std::bad_alloc): the caller closes `c` then.
    bool handle(StoreConn& c, const c10d::Request& r, std::string& why);
    /// Closes `c`: drops its waits and watches, takes it off the dirty list, closes the socket,
    /// wakes its coroutines. Idempotent.
    void close(StoreConn& c) noexcept;
    /// Closes the connections over max_queued_output whose socket took nothing for queued_output_timeout.
    void close_stalled(Clock::time_point now);
    /// Stops accepting, closes every connection, cancels the tasks and starts their join. Idempotent.
    void stop_all();
    /// Starts `task` in `tasks`, counted by server_tasks_running(); false when refused (stopped).
    bool spawn(Task<void> task, const char* what);

private:
    /// Accounts for output pushed to `w` by another request (a wake-up, a watch event): `w` is
    /// closed at the end of the batch when it was already over max_queued_output and is now over
    /// max_queued_output_hard.
    void pushed(StoreConn& w, std::size_t before);
    /// False (with `why`) when a reply of `size` bytes to `op` would be over max_reply_size.
    bool reply_fits(c10d::Op op, std::size_t size, std::string& why) const;
    void store(std::string_view key, std::span<const std::uint8_t> value, bool append);
    /// False (with `why`) when storing `grow` more bytes would pass max_stored_bytes.
    bool space_for(c10d::Op op, std::size_t grow, std::string& why) const;
    /// What max_stored_bytes charges for `key` holding `value_size` bytes (0 for an absent key).
    static std::size_t charge(std::string_view key, std::size_t value_size) noexcept;
    /// Removes the key, uncharges its bytes, and returns its value.
    Bytes erase(StringMap<Bytes>::iterator it);
    void key_changed(std::string_view key);
    void notify_watchers(std::string_view key, std::uint8_t event, std::span<const std::uint8_t> old_value,
                         std::span<const std::uint8_t> new_value);
    void start_wait(StoreConn& c, const std::vector<std::string_view>& keys);
    void cancel_waits(StoreConn& c);
    bool add(StoreConn& c, std::string_view key, std::int64_t delta, std::string& why);
    void compare_set(StoreConn& c, std::string_view key, std::span<const std::uint8_t> expected,
                     std::span<const std::uint8_t> desired);
};

/// Test hooks: server states alive in this process, and their coroutines running now.
[[nodiscard]] std::size_t server_states_alive() noexcept;
[[nodiscard]] std::size_t server_tasks_running() noexcept;

}  // namespace tensorplay::detail
