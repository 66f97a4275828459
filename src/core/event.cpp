// Event and RemoteSignal over ResumeSlot.
#include "core/event.hpp"

#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>

#include <atomic>
#include <utility>

namespace tensorplay::detail {

/// One parked waiter of an Event: lives in the waiting coroutine's frame, linked while it waits.
struct Event::Node {
    explicit Node(Event& e) : event(&e), next(e.head_) {
        if (next) next->prev = this;
        e.head_ = this;
        ++e.count_;
    }
    ~Node() {
        if (event) event->unlink(*this);
    }
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;

    Event* event;  // null once unlinked (woken, or the event destroyed)
    Node* prev = nullptr;
    Node* next;
    ResumeSlot slot;
};

void Event::unlink(Node& n) noexcept {
    if (n.prev) n.prev->next = n.next;
    else head_ = n.next;
    if (n.next) n.next->prev = n.prev;
    n.prev = n.next = nullptr;
    n.event = nullptr;
    --count_;
}

Event::~Event() {
    if (gone_) *gone_ = true;
    // Waiters still parked end with operation_aborted (resumed here; they must not touch us).
    while (head_) {
        Node* n = head_;
        unlink(*n);
        n->slot.complete(asio::error::operation_aborted);
    }
}

void Event::set(std::error_code ec) {
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

Task<std::error_code> Event::wait() {
    if (set_) co_return ec_;
    Node node(*this);
    co_await node.slot.wait();
    co_return node.slot.error();
}

struct RemoteSignal::Notifier::State {
    explicit State(asio::any_io_executor e) : ex(std::move(e)) {}
    asio::any_io_executor ex;
    ResumeSlot slot;              // touched on ex only
    bool fired = false;           // on ex only: the completion ran
    std::error_code ec;           // on ex only
    std::atomic<bool> notified{false};
};

RemoteSignal::RemoteSignal(asio::any_io_executor ex) : s_(std::make_shared<Notifier::State>(std::move(ex))) {}

RemoteSignal::Notifier RemoteSignal::notifier() const {
    Notifier n;
    n.s_ = s_;
    return n;
}

void RemoteSignal::Notifier::notify(std::error_code ec) const {
    if (!s_ || s_->notified.exchange(true, std::memory_order_acq_rel)) return;
    asio::post(s_->ex, [s = s_, ec] {
        s->fired = true;
        s->ec = ec;
        s->slot.complete(ec);
    });
}

Task<std::error_code> RemoteSignal::wait() {
    auto s = s_;
    if (s->fired) co_return s->ec;
    // Outstanding work while parked: the notifier's post may come from a thread the event loop
    // does not know about, after everything else it runs has ended.
    auto work = asio::prefer(s->ex, asio::execution::outstanding_work.tracked);
    co_await s->slot.wait();
    co_return s->fired ? s->ec : s->slot.error();
}

}  // namespace tensorplay::detail
