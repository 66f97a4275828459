// TcpStoreServer internals: connections, the key space, waiters and watchers (all on one strand).
#pragma once

#include <tensorplay/store/tcp_store.hpp>

#include "store/c10d_protocol.hpp"
#include "transport/edge_read.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <functional>
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
/// Owned by its two coroutines.
struct StoreConn {
    StoreConn(StoreServerState& server, asio::ip::tcp::socket socket, std::uint64_t id);

    StoreServerState& server;
    asio::ip::tcp::socket socket;
    std::uint64_t id;
    std::string peer;

    bool sniffed = false;  // dialect decided from the first bytes
    c10d::Dialect dialect = c10d::Dialect::legacy;
    bool closed = false;

    // Read buffer [begin, end) inside [0, cap); grown only to what a request needs (limits checked first).
    std::unique_ptr<std::uint8_t[]> in;
    std::size_t in_cap = 0, in_begin = 0, in_end = 0;
    EdgeReadState edge;

    Bytes out;      // replies not yet sent
    Bytes writing;  // the buffer the writer is sending
    bool writer_busy = false;  // the writer is sending `writing`: `out` must wait for it (order)
    bool dirty = false;        // listed in the server's `dirty`: `out` has data to send
    asio::steady_timer wake;     // cancelled to tell the writer that `out` has data (or to close)
    asio::steady_timer drained;  // cancelled by the writer after each write (reader back-pressure)

    // Pending WAITs: id -> keys still missing. Keys registered in the server's waiters map.
    struct Wait {
        std::uint64_t id;
        std::size_t missing;
    };
    std::vector<Wait> waits;
    std::vector<std::string> wait_keys;   // keys this connection is registered under
    std::vector<std::string> watch_keys;  // keys this connection watches (legacy WATCH_KEY)
    std::uint64_t next_wait_id = 1;

    /// Notes that `out` has something to send (sent at the end of the current read batch).
    void flush();
};

/// The state shared by all connections: only touched on `strand`.
struct StoreServerState {
    explicit StoreServerState(Executor ex, TcpStoreServerOptions opts);

    ServerStrand strand;
    TcpStoreServerOptions options;
    c10d::Limits limits;
    std::vector<asio::ip::tcp::acceptor> acceptors;
    std::uint16_t port = 0;
    std::string address;
    bool stopped = false;
    std::uint64_t next_conn_id = 1;

    StringMap<Bytes> data;
    struct WaitRef {
        StoreConn* conn;
        std::uint64_t wait_id;
    };
    StringMap<std::vector<WaitRef>> waiters;
    StringMap<std::vector<StoreConn*>> watchers;
    std::unordered_set<StoreConn*> conns;
    std::vector<const Bytes*> multi_get_scratch;  // reused by MULTI_GET
    std::vector<StoreConn*> dirty;  // connections with replies to send; emptied before any suspension

    /// Sends what every dirty connection has in `out`: one non-blocking send each, the writer
    /// coroutine taking over what the socket did not accept. Called at the end of each read batch.
    void send_dirty();

    /// Runs one parsed request of `c`; false when the connection must close (`why` says why).
    bool handle(StoreConn& c, const c10d::Request& r, std::string& why);
    /// Closes `c`: drops its waits and watches, closes the socket, wakes its writer. Idempotent.
    void close(StoreConn& c);
    void stop_all();

private:
    void store(std::string_view key, std::span<const std::uint8_t> value, bool append);
    void key_changed(std::string_view key);
    void notify_watchers(std::string_view key, std::uint8_t event, std::span<const std::uint8_t> old_value,
                         std::span<const std::uint8_t> new_value);
    void start_wait(StoreConn& c, const std::vector<std::string_view>& keys);
    void cancel_waits(StoreConn& c);
    bool add(StoreConn& c, std::string_view key, std::int64_t delta, std::string& why);
    void compare_set(StoreConn& c, std::string_view key, std::span<const std::uint8_t> expected,
                     std::span<const std::uint8_t> desired);
};

}  // namespace tensorplay::detail
