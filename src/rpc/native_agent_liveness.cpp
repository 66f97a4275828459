// Native agent, dynamic groups: members that die without leaving. Each member beats (an `add` on
// its heartbeat key) and watches its two successors by rank, so that every member is watched by
// two others (a host's consecutive workers lost at once each by a live one) and the store sees
// O(members) operations per period. A member is suspected when its
// heartbeat stands still for the member timeout, or at once when a connection to it is lost. It
// is removed only on evidence (docs/protocol.md, "Removal by evidence"): the suspecter's own probe
// fails, and a second member (a witness, asked at the same moment) cannot reach it either, or,
// when no witness answers (a group of two), its heartbeat in the store stands still. A member cut
// off from one peer only stays. The removal is made under the group token: every other member is
// sent the group without it. A live member that the group removed (a partition from everyone)
// finds its rank claim gone at its next beat, and says so.
#include "rpc/native_agent.hpp"

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"
#include "rpc/group_token.hpp"

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>

namespace tensorplay::detail {
namespace {

/// The longest member name a witness is asked about (a worker name is far shorter).
constexpr std::size_t kMaxWitnessName = 4096;

std::string millis(Duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

}  // namespace

Task<void> AgentCore::liveness_loop(std::shared_ptr<AgentCore> core) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const Duration timeout = core->config_.member_timeout();
    const Duration interval = Membership::beat_interval(timeout);
    const std::string beat = member_beat_key(core->config_.self.id);
    bool store_failing = false;
    Clock::time_point due = Clock::time_point::max();  // when a watched heartbeat will have stood still for `timeout`
    while (core->life_.state() == State::running) {
        // (Woken at the next beat, or earlier at the moment a watched heartbeat is due: a dead
        // successor is suspected member_timeout after its last beat, not up to a beat later.)
        timer.expires_at(std::min(Clock::now() + interval, due));
        auto [ec] = co_await timer.async_wait(use_nothrow);
        if (ec || core->life_.state() != State::running) co_return;
        due = Clock::time_point::max();
        auto beaten = co_await core->config_.store->add(beat, 1);
        Result<std::optional<std::string>> holder = fail(Errc::internal, "unread");
        if (beaten)
            holder = co_await core->claim_holder();
        else
            holder = fail(beaten.error());
        if (!holder) {
            if (!store_failing)
                log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\" cannot beat its heartbeat in the store: " +
                                               holder.error().to_string());
            store_failing = true;
            continue;
        }
        store_failing = false;
        if (core->evicted_by(*holder)) co_return;
        const auto watched = core->membership_.successors(core->config_.self.id, kWatchedSuccessors);
        core->membership_.keep_watches(watched);
        for (const int next : watched) {
            auto seen = co_await core->config_.store->add(member_beat_key(next), 0);
            if (!seen) continue;
            const auto now = Clock::now();
            const auto still_since = core->membership_.observe_beat(next, *seen, now);
            if (now - still_since >= timeout) {
                core->suspect(next, "its heartbeat stood still for " + millis(now - still_since));
                core->membership_.restart_watch(next, now);  // (suspected once per period at most)
            } else {
                due = std::min(due, still_since + timeout);
            }
        }
    }
}

Task<bool> AgentCore::answers(std::string name, Duration limit) {
    auto keep = shared_from_this();
    auto r = co_await call_builtin(name, kDeviceInfosHandler, Bytes{}, Clock::now() + limit);
    co_return r.has_value();
}

Task<Result<Message>> AgentCore::answer_witness(std::shared_ptr<AgentCore> core, WorkerInfo caller, Message m) {
    if (!core) co_return fail(Errc::shutdown, "the agent is shut down");
    const PeerLink* from = core->peers_.at(caller.id);
    if (!from || from->info.name != caller.name)
        co_return fail(Errc::unauthorized, "worker \"" + caller.name + "\" asked worker \"" + core->config_.self.name +
                                                "\" to witness a member's death, but it is not a member of the group");
    if (m.payload.size() > kMaxWitnessName)
        co_return fail(Errc::invalid_argument, "worker \"" + caller.name + "\" asked worker \"" + core->config_.self.name +
                                                   "\" to witness a member's death under a name of " + std::to_string(m.payload.size()) +
                                                   " bytes (at most " + std::to_string(kMaxWitnessName) + ")");
    const std::string name = to_string(m.payload);
    WitnessAnswer answer = WitnessAnswer::not_a_member;
    if (name == core->config_.self.name) {
        answer = WitnessAnswer::reachable;
    } else if (name != caller.name && core->peers_.rank_of(name) >= 0) {
        const bool reached = co_await core->answers(name, Membership::witness_probe_timeout(core->config_.member_timeout()));
        answer = reached ? WitnessAnswer::reachable : WitnessAnswer::unreachable;
    }
    co_return Message{Bytes(1, static_cast<std::uint8_t>(answer)), {}};
}

Task<std::vector<bool>> AgentCore::beats_stood_still(std::vector<int> ranks, Duration timeout) {
    auto keep = shared_from_this();
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const Duration interval = Membership::beat_interval(timeout);
    const std::size_t n = ranks.size();
    std::vector<bool> still(n, true);
    std::vector<std::int64_t> first(n, 0);
    std::vector<Clock::time_point> since(n);
    for (std::size_t i = 0; i < n; ++i) {
        auto seen = co_await config_.store->add(member_beat_key(ranks[i]), 0);
        if (!seen) {
            still[i] = false;  // (no evidence: the store cannot be read)
            continue;
        }
        first[i] = *seen;
        since[i] = membership_.beat_still_since(ranks[i], *seen).value_or(Clock::now());
    }
    for (;;) {
        const auto now = Clock::now();
        auto due = Clock::time_point::max();
        for (std::size_t i = 0; i < n; ++i)
            if (still[i] && now - since[i] < timeout) due = std::min(due, since[i] + timeout);
        if (due == Clock::time_point::max()) co_return still;
        if (life_.state() != State::running) co_return std::vector<bool>(n, false);
        timer.expires_at(std::min(now + interval, due));
        auto [ec] = co_await timer.async_wait(use_nothrow);
        if (ec) co_return std::vector<bool>(n, false);
        for (std::size_t i = 0; i < n; ++i) {
            if (!still[i] || Clock::now() - since[i] >= timeout) continue;
            auto seen = co_await config_.store->add(member_beat_key(ranks[i]), 0);
            if (!seen || *seen != first[i]) still[i] = false;
        }
    }
}

Task<AgentCore::Evidence> AgentCore::gather_evidence(int rank, std::string name) {
    auto keep = shared_from_this();
    const Duration timeout = config_.member_timeout();
    // This worker's probe and the witnesses' at once: the whole check takes one probe timeout.
    std::vector<BuiltinCall> calls;
    calls.push_back(BuiltinCall{name, kDeviceInfosHandler, Bytes{}});
    const auto witnesses = membership_.witnesses(config_.self.id, rank, kRemovalWitnesses);
    for (const auto& w : witnesses) calls.push_back(BuiltinCall{w, kWitnessHandler, bytes(name)});
    auto results = co_await call_all(std::move(calls), Clock::now() + Membership::probe_timeout(timeout));
    if (results[0]) co_return Evidence{false, true, "it answers"};
    std::string confirmed_by;
    for (std::size_t i = 0; i < witnesses.size(); ++i) {
        const auto& r = results[i + 1];
        if (!r || r->payload.size() != 1) continue;  // (no answer: no evidence either way)
        const auto answer = static_cast<WitnessAnswer>(r->payload[0]);
        if (answer == WitnessAnswer::reachable)
            co_return Evidence{false, false, "it does not answer this worker, while member \"" + witnesses[i] +
                                          "\" reaches it (a partition between these two only): it stays"};
        if (answer == WitnessAnswer::unreachable && confirmed_by.empty()) confirmed_by = witnesses[i];
    }
    if (!confirmed_by.empty()) co_return Evidence{true, false, "it does not answer, nor does it answer member \"" + confirmed_by + "\""};
    // No witness answered (a group of two, or every other member unreachable too): the store's
    // heartbeat record decides. A member that beats reaches the store: it is alive.
    std::vector<int> suspect(1, rank);
    const auto still = co_await beats_stood_still(std::move(suspect), timeout);
    if (still[0])
        co_return Evidence{true, false, "it does not answer, no other member could witness, and its heartbeat stood still for " + millis(timeout)};
    co_return Evidence{false, false, "it does not answer this worker, while its heartbeat in the store moves: it stays"};
}

Task<void> AgentCore::remove_if_dead(std::shared_ptr<AgentCore> core, int rank, std::string name, std::string why) {
    struct Done {
        AgentCore& core;
        int rank;
        ~Done() { core.membership_.end_check(rank); }
    } done{*core, rank};
    // (Suspected inside a connection's close: the probe starts on the next turn of the loop.)
    co_await asio::post(co_await asio::this_coro::executor, use_nothrow);
    const auto evidence = co_await core->gather_evidence(rank, name);
    if (!evidence.unreachable) {
        log(evidence.answered ? LogLevel::info : LogLevel::warn, "rpc",
            "worker \"" + core->config_.self.name + "\" suspected member \"" + name + "\" (" + why + "), but " + evidence.why);
        co_return;
    }
    if (core->membership_.evicted() || core->life_.state() != State::running) co_return;  // (no member to remove anyone)
    core->membership_.confirm_unreachable(rank);
    const auto deadline = Clock::now() + core->config_.store_wait_limit();
    auto token = co_await GroupToken::acquire(core->config_.store, core->config_.self.name, TokenPurpose::removal, deadline);
    if (!token) {
        log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\" could not remove dead member \"" + name + "\": " +
                                       token.error().to_string());
        co_return;
    }
    // Under the token nobody else changes the group, so what the store says of us holds until we
    // give it back: a member that was itself removed while it did not run (stopped, partitioned)
    // and has not seen it yet must not remove anyone (the others' group would lose a live member).
    auto holder = co_await core->claim_holder();
    if (core->membership_.evicted() || !holder || core->evicted_by(*holder)) {
        if (!holder)
            log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\" could not remove dead member \"" + name +
                                           "\": reading its own claim: " + holder.error().to_string());
        (void)co_await (*token)->release();
        co_return;
    }
    // Under the token the group is as the store lists it: gone already (it left, or another member
    // removed it, or a new worker took its rank), or still there and to be removed. (No second
    // probe: the evidence is one probe timeout old at most.)
    auto listed = co_await core->read_member_ranks();
    const PeerLink* link = core->peers_.at(rank);
    const bool still = listed && std::find(listed->begin(), listed->end(), rank) != listed->end() && link &&
                       link->info.name == name && core->life_.state() == State::running;
    if (still) {
        const auto update = core->membership_.removal_update(rank, name, *listed);
        log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\" removes member \"" + name + "\" from the group: " + why +
                                       "; " + evidence.why);
        std::vector<std::string> others;
        std::vector<int> other_ranks, unreached;
        // (Not to the members found unreachable meanwhile: they are removed next.)
        for (const auto& m : update.members)
            if (m.record.rank != core->config_.self.id && !core->membership_.confirmed_unreachable(m.record.rank)) {
                others.push_back(m.record.name);
                other_ranks.push_back(m.record.rank);
            }
        // (Bounded by the probe timeout: a member that does not take it then, e.g. the next of a
        // lost host's workers, is suspected once the token is back, instead of holding it.)
        auto told = co_await core->call_each(others, kMembershipHandler, encode_membership_update(update),
                                             core->member_call_deadline(deadline));
        for (std::size_t i = 0; i < told.size(); ++i) {
            if (told[i]) continue;
            log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\" could not tell member \"" + others[i] + "\" that \"" +
                                           name + "\" is removed: " + told[i].error().to_string());
            unreached.push_back(other_ranks[i]);
        }
        if (auto a = core->apply_membership(update); !a)
            log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\": " + a.error().to_string());
        if (auto s = co_await core->config_.store->set(kMembersKey, encode_member_ranks(Membership::ranks_of(update.members))); !s)
            log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\" could not record the group's members: " + s.error().to_string());
        co_await core->forget_member(rank);
        for (int r : unreached) core->suspect(r, "it did not take the update of a removal");
    }
    if (auto r = co_await (*token)->release(); !r)
        log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\" could not give the group token back: " + r.error().to_string());
}

Clock::time_point AgentCore::member_call_deadline(Clock::time_point deadline) const {
    return std::min(deadline, Clock::now() + Membership::probe_timeout(config_.member_timeout()));
}

Duration AgentConfig::member_timeout() const {
    if (tuning.member_timeout > Duration::zero()) return tuning.member_timeout;
    const double secs = tp_options ? tp_options->member_timeout : DEFAULT_MEMBER_TIMEOUT_SEC;
    return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(secs));
}

void AgentCore::start_liveness() {
    tasks_->spawn(liveness_loop(shared_from_this()), "a dynamic member's heartbeat");
}

void AgentCore::evict(Error why) {
    if (life_.state() == State::closed || !membership_.evict(why)) return;
    peers_.for_each([&](PeerLink& p) {
        calls_.fail(p.info.id, nullptr, why);
        if (p.conn) p.conn->close(why);
        p.conn.reset();
    });
    endpoint_.for_each_inbound([&](Connection& c) { c.close(why); });
}

// (The claim is read by value: a compare_set of the key with itself is no check, as c10d answers
// a missing key with the expected value; a key that is there answers with what it holds.)
Task<Result<std::optional<std::string>>> AgentCore::claim_holder() {
    auto keep = shared_from_this();
    const std::string claim = member_claim_key(config_.self.id);
    const Bytes mine = bytes(config_.self.name);
    std::vector<std::string> claim_key(1, claim);  // (no braced list in a co_await: GCC 12)
    auto present = co_await config_.store->check(std::move(claim_key));
    if (!present) co_return fail(present.error());
    if (!*present) co_return std::optional<std::string>();
    auto held = co_await config_.store->compare_set(claim, mine, mine);
    if (!held) co_return fail(held.error());
    co_return std::optional<std::string>(to_string(*held));
}

bool AgentCore::evicted_by(const std::optional<std::string>& holder) {
    if (holder && *holder == config_.self.name) return false;
    std::string by;
    if (holder) by = " (rank " + std::to_string(config_.self.id) + " is now worker \"" + *holder + "\")";
    Error why(Errc::shutdown, "worker \"" + config_.self.name + "\" was removed from the dynamic group by the others" + by +
                                  " (they could not reach it); it is no longer a member: shut it down and start it again",
              config_.self.name);
    log(LogLevel::error, "rpc", why.message());
    evict(std::move(why));
    return true;
}

void AgentCore::suspect(int rank, std::string why) {
    if (!config_.dynamic() || membership_.evicted() || membership_.leaving() || life_.state() != State::running || rank == config_.self.id) return;
    const PeerLink* link = peers_.at(rank);
    if (!link || !membership_.begin_check(rank)) return;
    if (!tasks_->spawn(remove_if_dead(shared_from_this(), rank, link->info.name, std::move(why)), "a dead member's removal"))
        membership_.end_check(rank);
}

}  // namespace tensorplay::detail
