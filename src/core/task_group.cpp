// TaskGroup: each task's completion handler carries its membership of the group.
#include "core/task_group.hpp"

#include "core/resume_slot.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/runtime.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>

#include <list>
#include <vector>

namespace tensorplay::detail {

struct TaskGroup::State {
    explicit State(Executor e) : ex(std::move(e)) {}

    /// A running task: listed for cancel() while its operation exists.
    struct Member {
        asio::cancellation_signal signal;
        std::list<std::shared_ptr<Member>>::iterator pos;
    };

    Executor ex;
    std::list<std::shared_ptr<Member>> members;
    bool closed = false;
    ResumeSlot idle;  ///< the joiner, completed when the last task ends
};

/// Carried by a task's completion handler: its destruction (after the handler ran, or with the
/// task's frames when the event loop is destroyed first) takes the task off the list. So cancel()
/// never signals an operation that is gone, and the signal outlives the operation bound to it.
struct TaskGroup::Membership {
    std::shared_ptr<State> state;
    std::shared_ptr<State::Member> member;

    Membership(std::shared_ptr<State> s, std::shared_ptr<State::Member> m)
        : state(std::move(s)), member(std::move(m)) {}
    Membership(Membership&&) noexcept = default;
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;
    Membership& operator=(Membership&&) = delete;
    ~Membership() {
        if (!member) return;
        state->members.erase(member->pos);
        if (state->members.empty()) state->idle.complete();
    }
};

TaskGroup::TaskGroup(Executor ex) : state_(std::make_shared<State>(std::move(ex))) {}

TaskGroup::~TaskGroup() {
    state_->closed = true;
    cancel();
}

bool TaskGroup::spawn(Task<void> task, const char* what) {
    auto& st = *state_;
    if (st.closed) return false;
    auto m = std::make_shared<State::Member>();
    m->pos = st.members.insert(st.members.end(), m);
    auto slot = m->signal.slot();
    asio::co_spawn(st.ex, std::move(task),
                   asio::bind_cancellation_slot(slot, [in = Membership(state_, std::move(m)), what](std::exception_ptr e) {
                       if (!e) return;
                       // (A cancelled task may end by the operation_aborted that Asio throws at its
                       // next wait: that is how cancel() ends it, not a failure.)
                       auto err = error_from_exception_ptr(e, what);
                       log(err.code() == Errc::cancelled ? LogLevel::debug : LogLevel::error, "core", err.to_string());
                   }));
    return true;
}

void TaskGroup::close() noexcept { state_->closed = true; }

void TaskGroup::cancel() {
    // A copy: a task that ends in place leaves the list while we walk it.
    auto now = std::vector<std::shared_ptr<State::Member>>(state_->members.begin(), state_->members.end());
    for (auto& m : now) m->signal.emit(asio::cancellation_type::terminal);
}

Task<void> TaskGroup::join() {
    auto st = state_;
    st->closed = true;
    while (!st->members.empty()) {
        co_await st->idle.wait();
        if (st->idle.error()) co_return;  // the join itself was cancelled
    }
}

std::size_t TaskGroup::running() const noexcept { return state_->members.size(); }

}  // namespace tensorplay::detail
