// Native agent, dynamic groups (issue 19): a member joins under the group token (rank claimed,
// members learnt from the store, their device infos gathered over RPC, checked with the seed's
// dynamic rules, everyone updated), and leaves the same way. Every member recomputes its maps
// and device list from the whole group at each change, so that they are what the static
// exchange would compute over the current members. Dead members: native_agent_liveness.cpp.
#include "rpc/native_agent.hpp"

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/log.hpp>

#include <tensorplay/core/timeout.hpp>

#include "rpc/group_token.hpp"

#include "core/asio_compat.hpp"

#include <asio/post.hpp>

#include <algorithm>

namespace tensorplay::detail {
namespace {

const char* change_verb(MembershipChange c) {
    switch (c) {
    case MembershipChange::join: return "joined";
    case MembershipChange::leave: return "left";
    case MembershipChange::removal: return "was removed (it died without leaving)";
    }
    return "changed";
}

/// Whether a failed call says that its worker is gone (unreachable), rather than that it refused.
bool unreachable(const Error& e) {
    return e.code() == Errc::connection_lost || e.code() == Errc::timeout;
}

}  // namespace

Task<Result<Message>> AgentCore::answer_device_infos(std::shared_ptr<AgentCore> core) {
    co_return Message{encode_worker_device_info(core->self_member().devices), {}};
}

Task<Result<Message>> AgentCore::answer_membership(std::shared_ptr<AgentCore> core, WorkerInfo caller, Message m) {
    auto u = decode_membership_update(m.payload);
    if (!u) co_return fail(std::move(u).error().context("membership update from worker \"" + caller.name + "\""));
    // A member joins and leaves by itself; any member may remove a dead one (not itself, nor us).
    const bool by_itself = u->change != MembershipChange::removal;
    if (by_itself && u->subject != caller.name)
        co_return fail(Errc::invalid_argument, "worker \"" + caller.name + "\" sent a membership change of worker \"" +
                                                   u->subject + "\" (a member joins and leaves by itself)");
    if (!by_itself && (u->subject == caller.name || core->peers_.rank_of(caller.name) < 0))
        co_return fail(Errc::invalid_argument, "worker \"" + caller.name + "\" may not remove worker \"" + u->subject +
                                                   "\" (only another member removes a dead one)");
    if (auto checked = co_await core->check_update_sender(caller, *u); !checked) {
        log(LogLevel::warn, "rpc", "worker \"" + core->config_.self.name + "\": " + checked.error().message());
        co_return fail(std::move(checked).error());
    }
    // (The group may have changed while the store was asked: a leaver or remover that left since.)
    if (u->change != MembershipChange::join && core->peers_.rank_of(caller.name) != caller.id)
        co_return fail(Errc::unauthorized, "worker \"" + caller.name + "\" is no longer a member of the group");
    // A leaver's calls that we sent before this update still get their replies: it waits for our
    // answer, which we give once they have (so that no member may still call it after).
    std::shared_ptr<PeerLink> leaver;
    if (u->change == MembershipChange::leave) leaver = core->peers_.link(core->peers_.rank_of(u->subject));
    if (auto r = core->apply_membership(*u); !r) co_return fail(std::move(r).error());
    log(LogLevel::info, "rpc", "worker \"" + core->config_.self.name + "\": worker \"" + u->subject + "\" " + change_verb(u->change) +
                                   "; the group has " + std::to_string(u->members.size()) + " member(s)");
    if (leaver) {
        auto draining = core->calls_.drained(leaver->info.id, Clock::now() + core->config_.store_wait_limit());
        const bool drained = co_await std::move(draining);
        const Error why(Errc::shutdown, "worker \"" + leaver->info.name + "\" left the group", leaver->info.name);
        if (!drained) core->calls_.fail(leaver->info.id, nullptr, why);
        if (leaver->conn) leaver->conn->close(why);
        leaver->conn.reset();
    }
    co_return Message{};
}

Task<Result<Message>> AgentCore::refuse_membership(std::shared_ptr<AgentCore> core, WorkerInfo caller) {
    co_return fail(Errc::invalid_argument, "worker \"" + core->config_.self.name + "\" is a member of a static group (world size " +
                                               std::to_string(core->config_.world_size) + "): it refuses the dynamic membership request of worker \"" +
                                               caller.name + "\"");
}

Task<Result<void>> AgentCore::join_under_token(Clock::time_point deadline, std::vector<int>& unreached) {
    const auto& store = config_.store;
    const std::string me = config_.self.name;
    const GroupMember mine = self_member();
    if (auto r = co_await store->set(member_info_key(config_.self.id), encode_record(mine.record)); !r)
        co_return fail(std::move(r).error().context("publishing the address of worker \"" + me + "\""));
    auto listed = co_await read_member_ranks();
    if (!listed) co_return fail(std::move(listed).error());
    std::vector<int> ranks = std::move(*listed);
    std::erase(ranks, config_.self.id);  // (a member of this rank that died without leaving: it is us now)
    std::vector<PeerRecord> records;
    for (int r : ranks) {
        auto b = co_await store->get(member_info_key(r));
        if (!b) co_return fail(std::move(b).error().context("reading the address of the member of rank " + std::to_string(r)));
        auto rec = decode_record(*b);
        if (!rec) co_return fail(std::move(rec).error());
        records.push_back(std::move(*rec));
    }
    // Known to ourselves first, so that we may call them (and they, once updated, us).
    auto add = [this](const PeerRecord& rec) -> Result<void> {
        if (peers_.at(rec.rank)) return ok();
        return add_member(WorkerInfo{rec.name, rec.rank}, rec.addresses);
    };
    for (const auto& rec : records)
        if (auto a = add(rec); !a) co_return a;
    if (auto a = add(mine.record); !a) co_return a;
    peers_.mark_roster_read();
    life_.enter(State::running);

    // The seed's _get_device_infos of every member, over RPC. A member that cannot be reached
    // died without leaving: it is left out (the update removes it from everyone), its entries go.
    // (All at once, each bounded by the probe timeout: a member that died silently, its host
    // lost, must not hold the token, and every other change of the group, until `deadline`.)
    std::vector<GroupMember> all;
    std::vector<int> dead;
    std::vector<std::string> names;
    for (const auto& rec : records) names.push_back(rec.name);
    auto replies = co_await call_each(std::move(names), kDeviceInfosHandler, Bytes{}, member_call_deadline(deadline));
    // A member that does not answer is left out only on evidence (as a removal): its heartbeat
    // stood still for the member timeout. One that beats is alive, cut off from this joiner only:
    // the join fails and the group is unchanged.
    std::vector<int> silent;
    for (std::size_t i = 0; i < records.size(); ++i)
        if (!replies[i] && unreachable(replies[i].error())) silent.push_back(records[i].rank);
    std::vector<bool> still;
    if (!silent.empty()) still = co_await beats_stood_still(silent, config_.member_timeout());
    for (std::size_t i = 0, s = 0; i < records.size(); ++i) {
        const auto& rec = records[i];
        auto& reply = replies[i];
        if (!reply && unreachable(reply.error())) {
            if (!still[s++])
                co_return fail(Errc::connection_lost, "worker \"" + me + "\" cannot reach member \"" + rec.name + "\" (" +
                                                          reply.error().message() + "), which is alive (its heartbeat moves): it "
                                                          "cannot join, and the group is unchanged (a partition between the two?)");
            log(LogLevel::warn, "rpc", "worker \"" + me + "\" leaves member \"" + rec.name + "\" out of the group it joins: " +
                                           reply.error().message() + ", and its heartbeat stood still");
            dead.push_back(rec.rank);
            continue;
        }
        if (!reply) co_return fail(std::move(reply).error().context("asking member \"" + rec.name + "\" for its devices"));
        auto info = decode_worker_device_info(reply->payload);
        if (!info) co_return fail(std::move(info).error().context("the device info of member \"" + rec.name + "\""));
        if (info->name != rec.name)
            co_return fail(Errc::protocol_error, "member \"" + rec.name + "\" answered with the devices of \"" + info->name + "\"");
        all.push_back(GroupMember{rec, std::move(*info)});
    }
    all.push_back(mine);
    std::sort(all.begin(), all.end(), [](const GroupMember& a, const GroupMember& b) { return a.record.rank < b.record.rank; });
    // The seed's _validate_device_maps(..., is_static_group=False): refused before anyone changed.
    std::vector<WorkerDeviceInfo> infos;
    for (const auto& m : all) infos.push_back(m.devices);
    if (auto checked = check_dynamic_group_device_maps(me, infos); !checked)
        co_return fail(std::move(checked).error().context("worker \"" + me + "\" cannot join the group"));

    // Everyone, ourselves included, takes the group as it is with us (the seed's _update_group_membership).
    MembershipUpdate update{MembershipChange::join, me, all};
    std::vector<std::string> others;
    std::vector<int> other_ranks;
    for (const auto& m : all)
        if (m.record.name != me) {
            others.push_back(m.record.name);
            other_ranks.push_back(m.record.rank);
        }
    auto told = co_await call_each(others, kMembershipHandler, encode_membership_update(update), member_call_deadline(deadline));
    for (std::size_t i = 0; i < told.size(); ++i) {
        if (told[i]) continue;
        if (!unreachable(told[i].error()))
            co_return fail(std::move(told[i]).error().context("telling member \"" + others[i] + "\" that worker \"" + me + "\" joins"));
        // (It took the devices call a moment ago: checked for death once we are in.)
        log(LogLevel::warn, "rpc", "worker \"" + me + "\" could not tell member \"" + others[i] + "\" that it joins: " +
                                       told[i].error().message());
        unreached.push_back(other_ranks[i]);
    }
    if (auto r = apply_membership(update); !r) co_return fail(std::move(r).error());
    if (auto r = co_await store->set(kMembersKey, encode_member_ranks(Membership::ranks_of(all))); !r)
        co_return fail(std::move(r).error().context("recording the group's members"));
    for (int r : dead) co_await forget_member(r);
    co_return ok();
}

Task<Result<Message>> AgentCore::call_builtin(const std::string& to, const char* handler, const Bytes& payload,
                                              Clock::time_point deadline) {
    const double secs = std::max(std::chrono::duration<double>(deadline - Clock::now()).count(), 0.001);
    return call(to, handler, Message{payload, {}}, secs);
}

struct AgentCore::Fanout {
    std::vector<std::optional<Result<Message>>> results;
    std::size_t left = 0;
    Flag done;
};

Task<void> AgentCore::fanout_one(std::shared_ptr<AgentCore> core, std::shared_ptr<Fanout> f, std::size_t i, BuiltinCall call,
                                 Clock::time_point deadline) {
    f->results[i] = co_await core->call_builtin(call.to, call.handler, call.payload, deadline);
    if (--f->left == 0) f->done.set();
}

Task<std::vector<Result<Message>>> AgentCore::call_each(std::vector<std::string> to, const char* handler, Bytes payload,
                                                        Clock::time_point deadline) {
    std::vector<BuiltinCall> calls;
    calls.reserve(to.size());
    for (auto& name : to) calls.push_back(BuiltinCall{std::move(name), handler, payload});
    return call_all(std::move(calls), deadline);
}

Task<std::vector<Result<Message>>> AgentCore::call_all(std::vector<BuiltinCall> calls, Clock::time_point deadline) {
    auto keep = shared_from_this();
    auto f = std::make_shared<Fanout>();
    f->results.resize(calls.size());
    f->left = calls.size();
    for (std::size_t i = 0; i < calls.size(); ++i) {
        if (!tasks_->spawn(fanout_one(keep, f, i, std::move(calls[i]), deadline), "a membership call")) {
            f->results[i] = fail(Errc::shutdown, "the agent of worker \"" + config_.self.name + "\" is shut down");
            --f->left;
        }
    }
    if (f->left > 0) {
        auto ec = co_await f->done.wait();
        (void)ec;  // (cancelled: the calls not ended count as failed below)
    }
    std::vector<Result<Message>> out;
    for (auto& r : f->results)
        out.push_back(r ? std::move(*r) : fail(Errc::shutdown, "the call was cut short by the agent's shutdown"));
    co_return out;
}

Task<Result<std::vector<int>>> AgentCore::read_member_ranks() {
    auto keep = shared_from_this();
    std::vector<std::string> key(1, std::string(kMembersKey));
    auto listed = co_await config_.store->check(std::move(key));
    if (!listed) co_return fail(std::move(listed).error().context("reading the group's members"));
    if (!*listed) co_return std::vector<int>{};
    auto b = co_await config_.store->get(std::string(kMembersKey));
    if (!b) co_return fail(std::move(b).error().context("reading the group's members"));
    co_return decode_member_ranks(*b);
}

Task<void> AgentCore::forget_member(int rank) {
    auto keep = shared_from_this();
    (void)co_await config_.store->delete_key(member_info_key(rank));
    (void)co_await config_.store->delete_key(member_claim_key(rank));
    (void)co_await config_.store->delete_key(member_beat_key(rank));
}

Task<bool> NativeAgent::until_members(std::vector<std::string> names, Duration limit) {
    return core_->until_members(std::move(names), limit);
}

Task<bool> AgentCore::until_members(std::vector<std::string> names, Duration limit) {
    auto keep = shared_from_this();
    std::sort(names.begin(), names.end());
    auto listed = [&] {
        std::vector<std::string> now;
        for (const auto& w : peers_.infos()) now.push_back(w.name);
        std::sort(now.begin(), now.end());
        return now == names;
    };
    auto waiting = [](Flag& e) -> Task<Result<void>> {
        auto ec = co_await e.wait();
        if (ec) co_return fail(from_error_code(ec, "waiting for a membership change"));
        co_return ok();
    };
    const auto deadline = Clock::now() + limit;
    while (!listed()) {
        const auto left = deadline - Clock::now();
        if (left <= Duration::zero()) co_return false;
        membership_.changed().reset();
        auto wait = with_timeout(waiting(membership_.changed()), left);
        (void)co_await std::move(wait);
        // (Resumed inside the update that set the event: go on from the next turn of the loop.)
        co_await asio::post(config_.ex, use_nothrow);
    }
    co_return true;
}

GroupMember AgentCore::self_member() const {
    WorkerDeviceInfo d{config_.self.name, local_cuda_device_count(), {}, {}};
    if (config_.tp_options) {
        d.device_maps = config_.tp_options->device_maps;
        d.devices = config_.tp_options->devices;
    }
    return GroupMember{PeerRecord{config_.self.name, config_.self.id, endpoint_.offers()}, std::move(d)};
}

Result<void> AgentCore::add_membership_handlers() {
    // (Each handler is a plain function that starts a coroutine with its arguments by value: the
    // coroutine never refers to the std::function that holds the handler.)
    std::weak_ptr<AgentCore> weak = weak_from_this();
    auto core_of = [weak]() { return weak.lock(); };
    if (!config_.dynamic()) {
        auto refuse = [core_of](WorkerInfo caller, Message) { return refuse_membership(core_of(), std::move(caller)); };
        if (auto r = handlers_.add(kMembershipHandler, refuse, {}); !r) return r;
        if (auto r = handlers_.add(kWitnessHandler, refuse, {}); !r) return r;
        return handlers_.add(kDeviceInfosHandler, refuse, {});
    }
    if (auto r = handlers_.add(kDeviceInfosHandler, [core_of](WorkerInfo, Message) { return answer_device_infos(core_of()); }, {}); !r)
        return r;
    if (auto r = handlers_.add(kWitnessHandler, [core_of](WorkerInfo caller, Message m) {
            return answer_witness(core_of(), std::move(caller), std::move(m));
        }, {}); !r)
        return r;
    return handlers_.add(kMembershipHandler, [core_of](WorkerInfo caller, Message m) {
        return answer_membership(core_of(), std::move(caller), std::move(m));
    }, {});
}

Result<void> AgentCore::add_member(const WorkerInfo& info, std::vector<TransportOffer> addresses) {
    auto link = peers_.add(info);
    if (!link) return fail(std::move(link).error());
    (*link)->addresses = std::move(addresses);
    if (metrics_.peers.size() <= static_cast<std::size_t>(info.id)) metrics_.peers.resize(static_cast<std::size_t>(info.id) + 1);
    return ok();
}

namespace {
const char* change_token_purpose(MembershipChange c) {
    switch (c) {
    case MembershipChange::join: return "join";
    case MembershipChange::leave: return "leave";
    case MembershipChange::removal: return "removal";
    }
    return "?";
}

/// What `key` holds, without waiting for it: a compare_set that changes nothing ("" when absent:
/// c10d answers a missing key's compare_set with the expected value, which no key here holds).
Task<Result<std::string>> peek(Store& store, std::string key) {
    static constexpr std::string_view kNever = "\x01tensorplay:peek\x01";
    const Bytes probe(kNever.begin(), kNever.end());
    auto v = co_await store.compare_set(std::move(key), probe, probe);
    if (!v) co_return fail(std::move(v).error());
    if (*v == probe) co_return std::string();
    co_return to_string(*v);
}
}  // namespace

Task<Result<void>> AgentCore::check_update_sender(WorkerInfo caller, const MembershipUpdate& u) {
    auto keep = shared_from_this();
    const std::string what = std::string("a membership update (\"") + change_token_purpose(u.change) + "\" of worker \"" + u.subject +
                             "\") from worker \"" + caller.name + "\" (rank " + std::to_string(caller.id) + ")";
    auto refuse = [&](const std::string& why) { return fail(Errc::unauthorized, what + " is refused: " + why); };
    const PeerLink* link = peers_.at(caller.id);
    const bool caller_member = link && link->info.name == caller.name;
    if (u.change != MembershipChange::join && !caller_member) co_return refuse("the sender is not a member of the group");
    // Every change is made under the group token, by its holder.
    auto holder = co_await peek(*config_.store, kGroupTokenKey);
    if (!holder) co_return fail(std::move(holder).error().context("checking " + what));
    const std::string expect = "Token_for_" + caller.name + "_" + change_token_purpose(u.change) + "_";
    if (!holder->starts_with(expect)) co_return refuse("the sender does not hold the group token for it");
    if (u.change == MembershipChange::join) {
        const bool lists_joiner = std::any_of(u.members.begin(), u.members.end(), [&](const GroupMember& m) {
            return m.record.name == caller.name && m.record.rank == caller.id;
        });
        if (!lists_joiner) co_return refuse("it does not list the joiner under its rank");
        auto claim = co_await peek(*config_.store, member_claim_key(caller.id));
        if (!claim) co_return fail(std::move(claim).error().context("checking " + what));
        if (*claim != caller.name) co_return refuse("rank " + std::to_string(caller.id) + " is not claimed by the joiner");
    }
    // Every member it lists is one of ours; one that is not (we may have missed a change) must be
    // one of the store's: listed there, its rank claimed under its name. A phantom is neither.
    std::optional<std::vector<int>> listed;
    for (const auto& m : u.members) {
        const auto& r = m.record;
        if (r.name == config_.self.name && r.rank == config_.self.id) continue;
        if (u.change == MembershipChange::join && r.name == caller.name && r.rank == caller.id) continue;
        if (const PeerLink* p = peers_.at(r.rank); p && p->info.name == r.name) continue;
        if (!listed) {
            auto l = co_await read_member_ranks();
            if (!l) co_return fail(std::move(l).error().context("checking " + what));
            listed = std::move(*l);
        }
        auto claim = co_await peek(*config_.store, member_claim_key(r.rank));
        if (!claim) co_return fail(std::move(claim).error().context("checking " + what));
        if (std::find(listed->begin(), listed->end(), r.rank) == listed->end() || *claim != r.name)
            co_return refuse("it lists worker \"" + r.name + "\" (rank " + std::to_string(r.rank) + "), which is not a member of the group");
    }
    co_return ok();
}

std::optional<Error> AgentCore::refuse_caller(const HelloInfo& peer, std::string_view handler) {
    const PeerLink* link = peers_.at(peer.rank);
    if (link && link->info.name == peer.name) return std::nullopt;
    if (handler == kDeviceInfosHandler || handler == kMembershipHandler) return std::nullopt;  // (what joining needs)
    Error why(Errc::unauthorized, "worker \"" + peer.name + "\" (rank " + std::to_string(peer.rank) + ") is not a member of the group of worker \"" +
                                      config_.self.name + "\": it may not call handler \"" + std::string(handler) + "\"");
    if (membership_.first_refusal(peer.name)) log(LogLevel::warn, "rpc", why.message());
    return why;
}

Result<void> AgentCore::apply_membership(const MembershipUpdate& update) {
    const bool listed = std::any_of(update.members.begin(), update.members.end(), [&](const GroupMember& m) {
        return m.record.name == config_.self.name && m.record.rank == config_.self.id;
    });
    if (!listed)
        return fail(Errc::invalid_argument, "a membership update for worker \"" + config_.self.name + "\" (rank " +
                                                std::to_string(config_.self.id) + ") does not list it");
    std::vector<WorkerDeviceInfo> infos;
    for (const auto& m : update.members) infos.push_back(m.devices);
    auto checked = check_dynamic_group_device_maps(config_.self.name, infos);
    if (!checked) return fail(std::move(checked).error().context("a membership update for worker \"" + config_.self.name + "\""));
    // Members that are gone leave the table (new calls to them fail at once, naming them); whoever
    // holds their link keeps a valid object. A graceful leaver's pending calls still get their
    // replies (answer_membership waits for them); a dead or vanished member's end now.
    std::vector<int> gone;
    peers_.for_each([&](const PeerLink& p) {
        const bool still = std::any_of(update.members.begin(), update.members.end(), [&](const GroupMember& m) {
            return m.record.rank == p.info.id && m.record.name == p.info.name;
        });
        if (!still) gone.push_back(p.info.id);
    });
    for (int r : gone) {
        auto link = peers_.remove(r);
        if (!link) continue;
        if (update.change == MembershipChange::leave && link->info.name == update.subject) continue;
        const Error why(Errc::connection_lost, "worker \"" + link->info.name + "\" is no longer a member of the group", link->info.name);
        calls_.fail(link->info.id, nullptr, why);
        if (link->conn) link->conn->close(why);
        link->conn.reset();
        // Its connect's waiters wake and see it removed (ensure_connected): a set event left in
        // place would resume them at once, every time, without the connect having ended.
        link->removed = why;
        if (link->connecting) link->connecting->set();
        // Its own connections to us too: a removed member (taken for dead, or left out of a join)
        // that is still alive calls nobody any more. (A leaver's stay: its update call is on one.)
        endpoint_.for_each_inbound([&](Connection& c) {
            if (c.peer().rank == link->info.id && c.peer().name == link->info.name) c.close(why);
        });
    }
    for (const auto& m : update.members) {
        if (peers_.at(m.record.rank)) continue;
        if (auto a = add_member(WorkerInfo{m.record.name, m.record.rank}, m.record.addresses); !a) return a;
    }
    const DeviceMaps my_maps = config_.tp_options ? config_.tp_options->device_maps : DeviceMaps{};
    peers_.for_each([&](PeerLink& p) {
        const auto map = my_maps.find(p.info.name);
        p.map = map != my_maps.end() ? map->second : DeviceMap{};
        const auto rev = checked->reverse_device_maps.find(p.info.name);
        p.reverse = rev != checked->reverse_device_maps.end() ? rev->second : DeviceMap{};
    });
    if (auto d = checked->devices.find(config_.self.name); d != checked->devices.end()) membership_.set_devices(d->second);
    membership_.adopt(update);
    peers_.mark_roster_read();
    membership_.notify_changed();
    return ok();
}

Task<Result<void>> AgentCore::start_dynamic() {
    auto keep = shared_from_this();
    const auto deadline = Clock::now() + config_.store_wait_limit();
    // The rank is ours while we are a member (torch: "RPC worker id X is not unique").
    const std::string claim = member_claim_key(config_.self.id);
    auto claimed = co_await config_.store->compare_set(claim, Bytes{}, bytes(config_.self.name));
    if (!claimed) co_return fail(std::move(claimed).error().context("claiming rank " + std::to_string(config_.self.id)));
    if (to_string(*claimed) != config_.self.name)
        co_return fail(Errc::invalid_argument, "rank " + std::to_string(config_.self.id) + " of the dynamic group is worker \"" +
                                                   to_string(*claimed) + "\"'s (RPC worker id " + std::to_string(config_.self.id) +
                                                   " is not unique)");
    auto token = co_await GroupToken::acquire(config_.store, config_.self.name, TokenPurpose::join, deadline);
    if (!token) {
        (void)co_await config_.store->delete_key(claim);
        co_return fail(std::move(token).error());
    }
    std::vector<int> unreached;
    auto joined = co_await join_under_token(deadline, unreached);
    if (!joined) {
        // Nobody was changed before the check, nor after a failed update of the first member;
        // our own entries go.
        (void)co_await config_.store->delete_key(member_info_key(config_.self.id));
        (void)co_await config_.store->delete_key(claim);
    }
    if (auto r = co_await (*token)->release(); !r)
        log(LogLevel::warn, "rpc", "worker \"" + config_.self.name + "\" could not give the group token back: " + r.error().to_string());
    if (!joined) co_return joined;
    log(LogLevel::info, "rpc", "worker \"" + config_.self.name + "\" joined the dynamic group (" + std::to_string(membership_.members().size()) +
                                   " member(s))");
    start_liveness();
    for (int r : unreached) suspect(r, "it did not take the update of our join");
    co_return ok();
}

Task<Result<void>> AgentCore::leave_dynamic(Clock::time_point deadline) {
    auto keep = shared_from_this();
    membership_.start_leaving();
    // A removal that we began ends first (it may hold the token, and should not be cut short: a
    // token whose holder ended without giving it back blocks the group until it goes stale).
    {
        auto ended = membership_.removals_ended(deadline);
        co_await std::move(ended);
    }
    // Evicted: no member any more, so nobody to tell and no token to take (its rank may be
    // another worker's by now).
    if (membership_.evicted()) co_return ok();
    auto token = co_await GroupToken::acquire(config_.store, config_.self.name, TokenPurpose::leave, deadline);
    if (!token) co_return fail(std::move(token).error().context("worker \"" + config_.self.name + "\" leaving the group"));
    Result<void> result = ok();
    // Our own calls first: they may still need the others.
    {
        auto draining = calls_.drained(deadline);
        if (!co_await std::move(draining))
            result = fail(Errc::timeout, std::to_string(calls_.outstanding()) + " call(s) of worker \"" + config_.self.name +
                                             "\" were still outstanding when it left the group");
    }
    // The group as the store lists it now: a member that the others removed (taking it for dead)
    // is no longer in it and tells nobody.
    auto listed = co_await read_member_ranks();
    // (An evicted member's rank may be listed again: a new worker took it. It is not ours: the
    // claim says whose it is, and removing that worker's entries would evict it.)
    auto holder = co_await claim_holder();
    const bool claimed = !holder || !evicted_by(*holder);  // (a store that fails here fails the set below too)
    const bool member = claimed && !membership_.evicted() && listed && std::find(listed->begin(), listed->end(), config_.self.id) != listed->end();
    if (listed && !member)
        log(LogLevel::warn, "rpc", "worker \"" + config_.self.name + "\" leaves a group that had removed it already");
    const auto update = membership_.leave_update(config_.self.name, listed ? &*listed : nullptr);
    if (member) {
        // Each member answers once it no longer calls us (its calls to us have their replies).
        // (All at once: each answer waits for that member's calls to us, which we serve meanwhile.)
        std::vector<std::string> others;
        for (const auto& m : update.members) others.push_back(m.record.name);
        auto told = co_await call_each(others, kMembershipHandler, encode_membership_update(update), deadline);
        for (std::size_t i = 0; i < told.size(); ++i) {
            if (told[i]) continue;
            log(LogLevel::warn, "rpc", "worker \"" + config_.self.name + "\" could not tell member \"" + others[i] + "\" that it leaves: " +
                                           told[i].error().to_string());
            if (result) result = fail(std::move(told[i]).error().context("leaving the group"));
        }
        if (auto r = co_await config_.store->set(kMembersKey, encode_member_ranks(Membership::ranks_of(update.members))); !r && result)
            result = fail(std::move(r).error().context("recording the group's members"));
        co_await forget_member(config_.self.id);
    }
    if (auto r = co_await (*token)->release(); !r && result) result = fail(std::move(r).error());
    co_return result;
}

}  // namespace tensorplay::detail
