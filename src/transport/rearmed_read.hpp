// RearmedRead: one read operation that a long-lived reader starts again after every completion.
#pragma once

#include "core/recycled.hpp"
#include "core/resume_slot.hpp"
#include "transport/edge_read.hpp"

#include <asio/dispatch.hpp>

#include <cstddef>
#include <system_error>
#include <utility>

namespace tensorplay::detail {

/// A socket read that one reader starts over and over: made once (recycled_new), so a read neither
/// allocates nor moves a handler. When a read completes, `reader(op, ec, n)` runs on the reader's
/// executor (`Reader::get_executor()`): in place when the completion runs on that event loop's
/// thread, else dispatched to it. From then on the op is the reader's until it calls start() again
/// or end(), which frees it (and the reader in it). If the event loop goes with a read pending, or
/// a dispatched completion is never run, the op is freed unrun.
///
/// Reads are edge reads (async_edge_read: drained sockets skip the EAGAIN read) where those exist,
/// else async_read_some.
template <class Reader>
class RearmedRead;

/// Frees the op it holds unless released: for a reader's op held across a coroutine.
template <class Reader>
struct RearmedReadOwner {
    RearmedRead<Reader>* op = nullptr;
    explicit RearmedReadOwner(RearmedRead<Reader>* o) noexcept : op(o) {}
    RearmedReadOwner(RearmedReadOwner&& o) noexcept : op(std::exchange(o.op, nullptr)) {}
    RearmedReadOwner& operator=(RearmedReadOwner&&) = delete;
    ~RearmedReadOwner() {
        if (op) op->end();
    }
    RearmedRead<Reader>* release() noexcept { return std::exchange(op, nullptr); }
};

namespace rearmed {
/// Runs the reader of `o` with (ec, n) on its executor; owns `o` until then.
template <class Op>
struct Completion {
    RearmedReadOwner<typename Op::reader_type> owner;
    std::error_code ec;
    std::size_t n;
    void operator()() {
        Op* o = owner.release();
        o->reader(*o, ec, n);
    }
};

template <class Op>
void complete_on_executor(Op* o, std::error_code ec, std::size_t n) {
    auto ex = o->reader.get_executor();
    if (auto* io = target_of<asio::io_context::executor_type>(ex); io && io->running_in_this_thread()) {
        o->reader(*o, ec, n);
        return;
    }
    asio::dispatch(ex, Completion<Op>{RearmedReadOwner<typename Op::reader_type>(o), ec, n});
}
}  // namespace rearmed

#if TP_EDGE_READ

template <class Reader>
class RearmedRead final : public edge::OpBase {
public:
    using reader_type = Reader;

    template <class... Args>
    RearmedRead(asio::generic::stream_protocol::socket& socket, EdgeReadState& state, Args&&... args)
        : edge::OpBase(Steps<&edge::OpBase::perform, &RearmedRead::complete>{}, -1, asio::mutable_buffer(), state),
          reader(std::forward<Args>(args)...),
          socket_(&socket),
          edge_(&state) {}

    /// Reads into `b` (at least one byte); the reader runs when it completes. `recheck`: as for
    /// async_edge_read (read now even if the last read drained the socket).
    void start(asio::mutable_buffer b, bool recheck = false) {
        const auto reg = edge::prepare(*socket_, *edge_);
        fd = reg.fd;
        buf = b;
        ec() = std::error_code();
        bytes() = 0;
        edge::start(reg, this, recheck);
    }
    /// Frees the op and its reader (not while a read is pending).
    void end() noexcept { recycled_delete(this); }

    Reader reader;

private:
    static void complete(ReactorReadOp& base, bool live) {
        auto* o = static_cast<RearmedRead*>(&base);
        if (!live) {  // the event loop is going: the pending read with it
            o->end();
            return;
        }
        rearmed::complete_on_executor(o, o->ec(), o->bytes());
    }

    asio::generic::stream_protocol::socket* socket_;
    EdgeReadState* edge_;
};

#else

template <class Reader>
class RearmedRead {
public:
    using reader_type = Reader;

    template <class... Args>
    RearmedRead(asio::generic::stream_protocol::socket& socket, EdgeReadState&, Args&&... args)
        : reader(std::forward<Args>(args)...), socket_(&socket) {}

    void start(asio::mutable_buffer b, bool = false) { socket_->async_read_some(b, Handler{RearmedReadOwner<Reader>(this)}); }
    void end() noexcept { recycled_delete(this); }

    Reader reader;

private:
    /// Owns the op while the read is pending (and frees it if it is destroyed unrun).
    struct Handler {
        RearmedReadOwner<Reader> owner;
        using executor_type = decltype(std::declval<Reader&>().get_executor());
        executor_type get_executor() const noexcept { return owner.op->reader.get_executor(); }
        void operator()(std::error_code ec, std::size_t n) {
            RearmedRead* o = owner.release();
            o->reader(*o, ec, n);
        }
    };

    asio::generic::stream_protocol::socket* socket_;
};

#endif

}  // namespace tensorplay::detail
