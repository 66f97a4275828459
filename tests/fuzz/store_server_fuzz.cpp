// Stateful fuzzing of the store server's request handling: up to four fake connections (each a
// socketpair, the server's end adopted as its socket) open, send request bytes in arbitrary
// pieces, close and reconnect. Each piece runs the server's batch step (parse every buffered
// request, handle it, send the replies and wake-ups), as the connection's reader does. After every
// step the key space matches a model of the c10d semantics, every waiter and watcher refers to a
// live connection, and nothing is left on the dirty list; after the last, nothing is left at all.
#include "store/tcp_store_server_impl.hpp"

#include "fuzz_util.hpp"

#include <asio/io_context.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>

using namespace tensorplay;
using namespace tensorplay::detail;
using c10d::Op;

namespace {

asio::io_context& context() {
    static asio::io_context io;
    return io;
}

/// The c10d key space as the protocol defines it, advanced request by request.
struct Model {
    std::map<std::string, Bytes, std::less<>> data;

    static Bytes copy(std::span<const std::uint8_t> v) { return Bytes(v.begin(), v.end()); }

    void apply(const c10d::Request& r) {
        switch (r.op) {
            case Op::set: data[std::string(r.keys[0])] = copy(r.values[0]); break;
            case Op::append: {
                Bytes& v = data[std::string(r.keys[0])];
                v.insert(v.end(), r.values[0].begin(), r.values[0].end());
                break;
            }
            case Op::multi_set:
                for (std::size_t i = 0; i < r.keys.size(); ++i) data[std::string(r.keys[i])] = copy(r.values[i]);
                break;
            case Op::compare_set: {
                auto it = data.find(r.keys[0]);
                const auto expected = r.values[0];
                if (it == data.end() ? expected.empty()
                                     : std::equal(it->second.begin(), it->second.end(), expected.begin(), expected.end()))
                    data[std::string(r.keys[0])] = copy(r.values[1]);
                break;
            }
            case Op::add: {
                std::int64_t value = 0;
                if (auto it = data.find(r.keys[0]); it != data.end()) value = *c10d::parse_counter(it->second);
                value = static_cast<std::int64_t>(static_cast<std::uint64_t>(value) + static_cast<std::uint64_t>(r.integer));
                const std::string s = std::to_string(value);
                data[std::string(r.keys[0])] = Bytes(s.begin(), s.end());
                break;
            }
            case Op::delete_key: data.erase(std::string(r.keys[0])); break;
            default: break;
        }
    }
};

/// A client connection: the server's StoreConn on one end of a socketpair, the client's fd on
/// the other, and the bytes the client sent that the server has not parsed yet.
struct Client {
    std::shared_ptr<StoreConn> conn;
    int peer = -1;
    Bytes pending;
    ~Client() {
        if (peer >= 0) ::close(peer);
    }
};

struct Harness {
    StoreServerState server;
    Model model;
    std::array<std::optional<Client>, 4> clients;
    std::uint64_t next_id = 1;

    explicit Harness(TcpStoreServerOptions opts) : server(context().get_executor(), std::move(opts)) {}

    ~Harness() {
        for (auto& c : clients) drop(c);
        TP_FUZZ_CHECK(server.conns.empty() && server.waiters.empty() && server.watchers.empty());
    }

    void open(std::optional<Client>& slot, c10d::Dialect dialect) {
        if (slot) return;
        int fds[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) return;
        asio::ip::tcp::socket socket(server.strand);
        std::error_code ec;
        socket.assign(asio::ip::tcp::v4(), fds[0], ec);
        TP_FUZZ_CHECK(!ec);
        socket.non_blocking(true, ec);
        slot.emplace();
        slot->peer = fds[1];
        slot->conn = std::make_shared<StoreConn>(server, std::move(socket), next_id++, std::string(), std::string());
        slot->conn->sniffed = true;
        slot->conn->dialect = dialect;
        server.conns.insert(slot->conn.get());
    }

    // The peer closes (or the server closed): the server forgets the connection.
    void drop(std::optional<Client>& slot) {
        if (!slot) return;
        server.close(*slot->conn);
        slot.reset();
    }

    // What run_reader does with the bytes that arrived: every complete request runs, then the
    // replies go out in one batch; a bad request closes this connection only.
    void receive(std::optional<Client>& slot, std::span<const std::uint8_t> bytes) {
        if (!slot) return;
        StoreConn& c = *slot->conn;
        slot->pending.insert(slot->pending.end(), bytes.begin(), bytes.end());
        c10d::Request request;
        std::string why;
        std::size_t used = 0;
        while (used < slot->pending.size() && !c.closed) {
            const std::span<const std::uint8_t> rest(slot->pending.data() + used, slot->pending.size() - used);
            auto r = c10d::parse_request(c.dialect, rest, server.limits, request);
            if (r.status == c10d::ParseStatus::incomplete) {
                TP_FUZZ_CHECK(r.size > rest.size() && r.size <= server.limits.max_request_size);
                break;
            }
            if (r.status == c10d::ParseStatus::error) {
                why = r.error;
                break;
            }
            const bool keeps = server.handle(c, request, why);
            TP_FUZZ_CHECK(keeps == why.empty());
            if (!keeps) break;
            model.apply(request);
            used += r.size;
        }
        slot->pending.erase(slot->pending.begin(), slot->pending.begin() + static_cast<std::ptrdiff_t>(used));
        if (!c.out.empty()) c.flush();
        server.send_dirty();
        TP_FUZZ_CHECK(server.dirty.empty());
        if (!why.empty()) drop(slot);
        // The server may close any connection in a batch (one whose queued output overflowed).
        for (auto& other : clients) {
            if (other && other->conn->closed) other.reset();
            drain(other);
        }
    }

    // The client reads what was sent to it; what the socket did not take, the writer would send.
    void drain(std::optional<Client>& slot) {
        if (!slot) return;
        static std::uint8_t buf[65536];  // (not on the stack: ASan would poison and unpoison 64 KiB per call)
        while (::read(slot->peer, buf, sizeof buf) > 0) {
        }
        slot->conn->out.clear();
    }

    void check() const {
        TP_FUZZ_CHECK(server.dirty.empty());
        TP_FUZZ_CHECK(server.data.size() == model.data.size());
        for (const auto& [key, value] : model.data) {
            auto it = server.data.find(key);
            TP_FUZZ_CHECK(it != server.data.end() && it->second == value);
        }
        std::size_t live = 0;
        for (const auto& c : clients) {
            if (!c) continue;
            ++live;
            TP_FUZZ_CHECK(server.conns.contains(c->conn.get()) && !c->conn->closed);
        }
        TP_FUZZ_CHECK(server.conns.size() == live);
        for (const auto& [key, refs] : server.waiters) {
            TP_FUZZ_CHECK(!refs.empty() && !server.data.contains(key));
            for (const auto& ref : refs) {
                TP_FUZZ_CHECK(server.conns.contains(ref.conn));
                const auto& waits = ref.conn->waits;
                TP_FUZZ_CHECK(std::any_of(waits.begin(), waits.end(), [&](const auto& w) { return w.id == ref.wait_id; }));
            }
        }
        for (const auto& [key, conns] : server.watchers) {
            TP_FUZZ_CHECK(!conns.empty());
            for (StoreConn* c : conns) TP_FUZZ_CHECK(server.conns.contains(c));
        }
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input in(data, size);
    TcpStoreServerOptions opts;
    if (in.byte() & 1) {
        // Small limits, so that the limit checks are reached with small inputs.
        opts.max_key_size = 32;
        opts.max_value_size = 256;
        opts.max_keys_per_request = 8;
        opts.max_request_size = 1024;
    }
    {
        Harness h(opts);
        while (!in.empty()) {
            const std::uint8_t op = in.byte();
            auto& slot = h.clients[(op >> 2) & 3];
            switch (op & 3) {
                case 0: h.open(slot, (op & 16) ? c10d::Dialect::modern : c10d::Dialect::legacy); break;
                case 1:
                case 2: {
                    const std::size_t n = in.byte();
                    h.receive(slot, in.take(n));
                    break;
                }
                case 3: h.drop(slot); break;
            }
            h.check();
        }
    }
    // Nothing the server did may leave work behind for the event loop (no posted handlers).
    context().poll();
    context().restart();
    return 0;
}
