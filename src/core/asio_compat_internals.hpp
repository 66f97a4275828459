// The one file that names Asio's private types (asio::detail), in our own vocabulary: a parked
// coroutine that a ResumeSlot takes over, reactor read operations for edge reads, and an
// io_context's concurrency hint. Written against Asio 1.22; built only when TP_ASIO_INTERNALS
// (core/asio_compat.hpp) says so.
#pragma once

#include "core/asio_compat.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/execution/context.hpp>
#include <asio/generic/stream_protocol.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/query.hpp>

#include <cstddef>
#include <cstdint>
#include <system_error>
#include <utility>

#if TP_ASIO_INTERNALS
#include <asio/detail/concurrency_hint.hpp>
#include <asio/detail/reactive_socket_service.hpp>
#include <asio/detail/reactor.hpp>
#include <asio/detail/reactor_op.hpp>
#include <asio/detail/scheduler.hpp>
#endif

// TP_REACTOR_READS: 1 when reactor read operations of our own can be started (Asio's epoll
// reactor, without io_uring as the default backend). Edge reads (transport/edge_read.hpp) need it.
#if TP_ASIO_INTERNALS && defined(ASIO_HAS_EPOLL) && !defined(ASIO_HAS_IO_URING_AS_DEFAULT)
#define TP_REACTOR_READS 1
#else
#define TP_REACTOR_READS 0
#endif

namespace tensorplay::detail {

/// The number of threads `ctx` was made for, when it says (its concurrency hint); 0 for the special
/// hints (ASIO_CONCURRENCY_HINT_UNSAFE and the like), which promise one thread; -1 when it cannot be
/// told (built without TP_ASIO_INTERNALS: Asio keeps the hint in its private scheduler).
inline int io_context_threads([[maybe_unused]] asio::io_context& ctx) {
#if TP_ASIO_INTERNALS
    const int hint = asio::use_service<asio::detail::scheduler>(ctx).concurrency_hint();
    return ASIO_CONCURRENCY_HINT_IS_SPECIAL(hint) ? 0 : hint;
#else
    return -1;
#endif
}

#if TP_ASIO_INTERNALS

/// A Task's coroutine taken off its frame while it waits (its thread of execution: the stack of
/// frames that use_awaitable's initiation would hand to a completion handler). Calling it resumes
/// the coroutine where it suspended; destroying it unresumed destroys the coroutine through its
/// executor, as Asio does with the handler of an operation that never completes.
class ParkedCoroutine {
    using Thread = asio::detail::awaitable_thread<asio::any_io_executor>;

public:
    using executor_type = asio::any_io_executor;
    using cancellation_slot_type = asio::cancellation_slot;

    /// What park_awaiting() hands its function: the coroutine, detached from its frame. Build a
    /// ParkedCoroutine from it at once (it is valid only during that call).
    struct Detached {
        Thread* thread;
    };

    explicit ParkedCoroutine(Detached d) noexcept : thread_(std::move(*d.thread)) {}
    ParkedCoroutine(ParkedCoroutine&&) noexcept = default;
    ParkedCoroutine& operator=(ParkedCoroutine&&) = delete;

    /// The executor the coroutine runs on.
    [[nodiscard]] executor_type get_executor() const noexcept { return thread_.get_executor(); }
    /// The coroutine's cancellation slot (where the awaiting operation's canceller goes).
    [[nodiscard]] cancellation_slot_type get_cancellation_slot() const noexcept { return thread_.get_cancellation_slot(); }
    /// Resumes it (it runs here, until it next suspends or ends).
    void operator()() { thread_.launch(); }

private:
    Thread thread_;
};

/// `co_await park_awaiting(f)` in a Task suspends it and calls `f(ParkedCoroutine::Detached)`
/// once it is suspended: `f` takes the coroutine over (until it is resumed, nothing runs it).
/// Uses the frame's suspension hook, the one use_awaitable's initiation uses.
template <class F>
auto park_awaiting(F f) noexcept {
    return [f](asio::detail::awaitable_frame_base<asio::any_io_executor>* frame)
               -> asio::detail::awaitable_thread<asio::any_io_executor>* {
        f(ParkedCoroutine::Detached{frame->detach_thread()});
        return nullptr;
    };
}

#endif

#if TP_REACTOR_READS

/// How a reactor read's perform step ended: not done (nothing to read: the reactor waits for
/// readiness), done, or done and the descriptor drained (the reactor's next read of it waits for
/// the next readiness edge instead of trying at once).
enum class ReadStatus : std::uint8_t { not_done, done, done_and_drained };

/// A socket's registration with its event loop's reactor. Opaque; from register_socket().
struct ReactorRegistration {
    void* reactor;     ///< the event loop's reactor
    void* descriptor;  ///< the socket's per-descriptor state in it
    int fd;
};

/// A read operation that the reactor runs: its perform step reads when the socket is ready (on
/// whichever thread runs the reactor, outside any strand), its completion then runs on the event
/// loop. Owned by the reactor from start_read() (or post_completed()) until the completion, which
/// also runs, with `live` false, when the event loop is destroyed with the read pending: it must
/// then only free the op. Both steps are bound at compile time (Steps): the reactor calls them
/// through one trampoline each.
class ReactorReadOp : private asio::detail::reactor_op {
public:
    /// The two steps: `Perform(op)` reads and says how it went (setting ec() and bytes());
    /// `Complete(op, live)` takes the result.
    template <ReadStatus (*Perform)(ReactorReadOp&), void (*Complete)(ReactorReadOp&, bool live)>
    struct Steps {};

    /// The read's error (clear on success), set by the perform step.
    [[nodiscard]] std::error_code& ec() noexcept { return ec_; }
    /// The bytes read, set by the perform step.
    [[nodiscard]] std::size_t& bytes() noexcept { return bytes_transferred_; }
    /// Marks the op as the one that cancel_reads(reg, key) cancels.
    void set_cancellation_key(void* key) noexcept { cancellation_key_ = key; }

    friend void start_read(const ReactorRegistration& reg, ReactorReadOp* op);
    friend void post_completed(const ReactorRegistration& reg, ReactorReadOp* op);

protected:
    template <ReadStatus (*Perform)(ReactorReadOp&), void (*Complete)(ReactorReadOp&, bool)>
    explicit ReactorReadOp(Steps<Perform, Complete>) noexcept
        : reactor_op(asio::error_code(), &perform_step<Perform>, &complete_step<Complete>) {}
    ~ReactorReadOp() = default;

private:
    static_assert(int(ReadStatus::not_done) == int(not_done) && int(ReadStatus::done) == int(done) &&
                  int(ReadStatus::done_and_drained) == int(done_and_exhausted));

    template <ReadStatus (*Perform)(ReactorReadOp&)>
    static status perform_step(reactor_op* base) {
        return static_cast<status>(Perform(static_cast<ReactorReadOp&>(*base)));
    }
    template <void (*Complete)(ReactorReadOp&, bool)>
    static void complete_step(void* owner, asio::detail::operation* base, const asio::error_code&, std::size_t) {
        Complete(static_cast<ReactorReadOp&>(*static_cast<reactor_op*>(base)), owner != nullptr);
    }
};

/// Starts `op` on the reactor: performed at once when the socket was ready and not reported
/// drained, else when readiness comes.
inline void start_read(const ReactorRegistration& reg, ReactorReadOp* op) {
    static_cast<asio::detail::reactor*>(reg.reactor)
        ->start_op(asio::detail::reactor::read_op, reg.fd,
                   *static_cast<asio::detail::reactor::per_descriptor_data*>(reg.descriptor), op, false, true);
}

/// Queues the completion of `op`, already performed (as Asio posts its speculative reads').
inline void post_completed(const ReactorRegistration& reg, ReactorReadOp* op) {
    static_cast<asio::detail::reactor*>(reg.reactor)->post_immediate_completion(op, false);
}

/// Cancels the pending reads of `reg`'s socket whose cancellation key is `key` (they complete
/// with operation_aborted).
inline void cancel_reads(const ReactorRegistration& reg, void* key) {
    static_cast<asio::detail::reactor*>(reg.reactor)
        ->cancel_ops_by_key(reg.fd, *static_cast<asio::detail::reactor::per_descriptor_data*>(reg.descriptor),
                            asio::detail::reactor::read_op, key);
}

namespace internals {
/// Reaches basic_socket's protected implementation (a pointer to a member named through a
/// derived class is the one well-defined way to).
template <class Socket>
struct SocketAccess : Socket {
    static auto& impl(Socket& s) { return (s.*(&SocketAccess::impl_)).get_implementation(); }
};
}  // namespace internals

/// The reactor registration of `socket` (a TCP or generic stream socket). `reactor`: a cache of
/// its event loop's reactor, filled when null (the lookup takes the context's service mutex).
template <class Socket>
ReactorRegistration register_socket(Socket& socket, void*& reactor) {
    auto& impl = internals::SocketAccess<Socket>::impl(socket);
    if (!reactor)
        reactor = &asio::use_service<asio::detail::reactor>(asio::query(socket.get_executor(), asio::execution::context));
    return ReactorRegistration{reactor, &impl.reactor_data_, impl.socket_};
}

#endif

}  // namespace tensorplay::detail
