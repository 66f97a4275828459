// Flag and RemoteSignal over ResumeSlot.
#include "core/flag.hpp"

#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>

#include <mutex>
#include <utility>

namespace tensorplay::detail {

/// One parked waiter of an Flag: lives in the waiting coroutine's frame, linked while it waits.
struct Flag::Node {
    explicit Node(Flag& e) : event(&e), next(e.head_) {
        if (next) next->prev = this;
        e.head_ = this;
        ++e.count_;
    }
    ~Node() {
        if (event) event->unlink(*this);
    }
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;

    Flag* event;  // null once unlinked (woken, or the event destroyed)
    Node* prev = nullptr;
    Node* next;
    ResumeSlot slot;
};

void Flag::unlink(Node& n) noexcept {
    if (n.prev) n.prev->next = n.next;
    else head_ = n.next;
    if (n.next) n.next->prev = n.prev;
    n.prev = n.next = nullptr;
    n.event = nullptr;
    --count_;
}

Flag::~Flag() {
    if (gone_) *gone_ = true;
    // Waiters still parked end with operation_aborted (resumed here; they must not touch us).
    while (head_) {
        Node* n = head_;
        unlink(*n);
        n->slot.complete(asio::error::operation_aborted);
    }
}

void Flag::set(std::error_code ec) {
    if (set_) return;
    set_ = true;
    ec_ = ec;
    bool gone = false;
    gone_ = &gone;
    // One at a time, re-reading the list: a resumed waiter may wait again (after a reset), end
    // other waits, or destroy the event.
    while (head_) {
        Node* n = head_;
        unlink(*n);
        n->slot.complete(ec);
        if (gone) return;
        if (!set_) break;  // reset by a waiter: those parked since then wait for the next set()
    }
    gone_ = nullptr;
}

Task<std::error_code> Flag::wait() {
    if (set_) co_return ec_;
    Node node(*this);
    co_await node.slot.wait();
    co_return node.slot.error();
}

struct RemoteSignal::Notifier::State {
    explicit State(asio::any_io_executor e) : ex(std::move(e)) {}
    asio::any_io_executor ex;
    ResumeSlot slot;  // touched on ex only
    // The notifier posts to ex only while a wait is parked: once the waiter has gone (cancelled,
    // or destroyed with its event loop) that loop may be gone too.
    std::mutex mutex;
    bool parked = false;    // guarded by mutex
    bool notified = false;  // guarded by mutex
    std::error_code ec;     // guarded by mutex; set with notified
};

RemoteSignal::RemoteSignal(asio::any_io_executor ex) : s_(std::make_shared<Notifier::State>(std::move(ex))) {}

RemoteSignal::Notifier RemoteSignal::notifier() const {
    Notifier n;
    n.s_ = s_;
    return n;
}

void RemoteSignal::Notifier::notify(std::error_code ec) const {
    if (!s_) return;
    std::lock_guard lock(s_->mutex);
    if (s_->notified) return;
    s_->notified = true;
    s_->ec = ec;
    if (s_->parked) asio::post(s_->ex, [s = s_, ec] { s->slot.complete(ec); });
}

namespace {
/// Marks a RemoteSignal's wait parked for as long as its frame waits (also when the frame is
/// destroyed unresumed).
template <class State>
struct Parked {
    State& s;
    explicit Parked(State& st) : s(st) {}
    ~Parked() {
        std::lock_guard lock(s.mutex);
        s.parked = false;
    }
};
}  // namespace

Task<std::error_code> RemoteSignal::wait() {
    auto s = s_;
    {
        std::lock_guard lock(s->mutex);
        if (s->notified) co_return s->ec;
        s->parked = true;
    }
    Parked<Notifier::State> parked(*s);
    // Outstanding work while parked: the notifier's post may come from a thread the event loop
    // does not know about, after everything else it runs has ended.
    auto work = asio::prefer(s->ex, asio::execution::outstanding_work.tracked);
    co_await s->slot.wait();
    std::lock_guard lock(s->mutex);
    co_return s->notified ? s->ec : s->slot.error();
}

}  // namespace tensorplay::detail
