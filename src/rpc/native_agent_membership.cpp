// Native agent, dynamic groups (issue 19): a member joins under the group token (rank claimed,
// members learnt from the store, their device infos gathered over RPC, checked with the seed's
// dynamic rules, everyone updated), and leaves the same way. Every member recomputes its maps
// and device list from the whole group at each change, so that they are what the static
// exchange would compute over the current members.
#include "rpc/native_agent.hpp"

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/log.hpp>

#include "rpc/group_token.hpp"

#include <algorithm>
#include <set>

namespace tensorplay::detail {
namespace {

constexpr std::string_view kInfoPrefix = "native_agent/info/";
constexpr std::string_view kNamesPrefix = "native_agent/dynamic/names/";
constexpr std::string_view kMembersKey = "native_agent/dynamic/members";

Task<Result<Message>> answer_device_infos(std::shared_ptr<AgentCore> core) {
    co_return Message{encode_worker_device_info(core->self_member().devices), {}};
}

Task<Result<Message>> answer_membership(std::shared_ptr<AgentCore> core, WorkerInfo caller, Message m) {
    auto u = decode_membership_update(m.payload);
    if (!u) co_return fail(std::move(u).error().context("membership update from worker \"" + caller.name + "\""));
    if (u->subject != caller.name)
        co_return fail(Errc::invalid_argument, "worker \"" + caller.name + "\" sent a membership change of worker \"" +
                                                   u->subject + "\" (a member joins and leaves by itself)");
    if (auto r = core->apply_membership(*u); !r) co_return fail(std::move(r).error());
    log(LogLevel::info, "rpc", "worker \"" + core->self.name + "\": worker \"" + u->subject + "\" " +
                                   (u->join ? "joined" : "left") + "; the group has " + std::to_string(u->members.size()) +
                                   " member(s)");
    co_return Message{};
}

Task<Result<Message>> refuse_membership(std::shared_ptr<AgentCore> core, WorkerInfo caller) {
    co_return fail(Errc::invalid_argument, "worker \"" + core->self.name + "\" is a member of a static group (world size " +
                                               std::to_string(core->world_size) + "): it refuses the dynamic membership request of worker \"" +
                                               caller.name + "\"");
}

/// A call of a built-in handler, its arguments built here (not as temporaries of the awaiting
/// expression, which GCC 12 may destroy too early in a coroutine).
Task<Result<Message>> call_member(AgentCore& core, const std::string& to, const char* handler, const Bytes& payload,
                                  double timeout_sec) {
    return core.call(to, handler, Message{payload, {}}, timeout_sec);
}

double seconds_until(Clock::time_point deadline) {
    const auto left = std::chrono::duration<double>(deadline - Clock::now()).count();
    return std::max(left, 0.001);
}

std::vector<int> ranks_of(const std::vector<GroupMember>& members) {
    std::vector<int> r;
    for (const auto& m : members) r.push_back(m.record.rank);
    return r;
}

/// What start_dynamic does while it holds the token.
Task<Result<void>> join_under_token(std::shared_ptr<AgentCore> core, Clock::time_point deadline) {
    auto& store = core->store;
    const std::string me = core->self.name;
    const GroupMember mine = core->self_member();
    if (auto r = co_await store->set(std::string(kInfoPrefix) + std::to_string(core->self.id), encode_record(mine.record)); !r)
        co_return fail(std::move(r).error().context("publishing the address of worker \"" + me + "\""));
    // The members now (none: the first one).
    std::vector<int> ranks;
    std::vector<std::string> members_key(1, std::string(kMembersKey));
    auto listed = co_await store->check(std::move(members_key));
    if (!listed) co_return fail(std::move(listed).error().context("reading the group's members"));
    if (*listed) {
        auto b = co_await store->get(std::string(kMembersKey));
        if (!b) co_return fail(std::move(b).error().context("reading the group's members"));
        auto r = decode_member_ranks(*b);
        if (!r) co_return fail(std::move(r).error());
        ranks = std::move(*r);
    }
    std::erase(ranks, core->self.id);  // (a member of this rank that died without leaving: it is us now)
    std::vector<PeerRecord> records;
    for (int r : ranks) {
        auto b = co_await store->get(std::string(kInfoPrefix) + std::to_string(r));
        if (!b) co_return fail(std::move(b).error().context("reading the address of the member of rank " + std::to_string(r)));
        auto rec = decode_record(*b);
        if (!rec) co_return fail(std::move(rec).error());
        records.push_back(std::move(*rec));
    }
    // Known to ourselves first, so that we may call them (and they, once updated, us).
    auto add = [&core](const PeerRecord& rec) -> Result<void> {
        if (core->peers.at(rec.rank)) return ok();
        return core->add_member(WorkerInfo{rec.name, rec.rank}, rec.addresses);
    };
    for (const auto& rec : records)
        if (auto a = add(rec); !a) co_return a;
    if (auto a = add(mine.record); !a) co_return a;
    core->roster_read = true;
    core->roster_known.set();
    core->state = AgentCore::State::running;

    // The seed's _get_device_infos of every member, over RPC.
    std::vector<GroupMember> all;
    for (auto& rec : records) {
        auto reply = co_await call_member(*core, rec.name, kDeviceInfosHandler, Bytes{}, seconds_until(deadline));
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
    MembershipUpdate update{true, me, all};
    const Bytes payload = encode_membership_update(update);
    for (const auto& m : all) {
        if (m.record.name == me) continue;
        auto r = co_await call_member(*core, m.record.name, kMembershipHandler, payload, seconds_until(deadline));
        if (!r) co_return fail(std::move(r).error().context("telling member \"" + m.record.name + "\" that worker \"" + me + "\" joins"));
    }
    if (auto r = core->apply_membership(update); !r) co_return fail(std::move(r).error());
    if (auto r = co_await store->set(std::string(kMembersKey), encode_member_ranks(ranks_of(all))); !r)
        co_return fail(std::move(r).error().context("recording the group's members"));
    co_return ok();
}

}  // namespace

GroupMember AgentCore::self_member() const {
    WorkerDeviceInfo d{self.name, local_cuda_device_count(), {}, {}};
    if (tp_options) {
        d.device_maps = tp_options->device_maps;
        d.devices = tp_options->devices;
    }
    return GroupMember{PeerRecord{self.name, self.id, transport_offers}, std::move(d)};
}

Result<void> AgentCore::add_membership_handlers() {
    // (Each handler is a plain function that starts a coroutine with its arguments by value: the
    // coroutine never refers to the std::function that holds the handler.)
    std::weak_ptr<AgentCore> weak = weak_from_this();
    auto core_of = [weak]() { return weak.lock(); };
    if (!dynamic()) {
        auto refuse = [core_of](WorkerInfo caller, Message) { return refuse_membership(core_of(), std::move(caller)); };
        if (auto r = handlers.add(kMembershipHandler, refuse, {}); !r) return r;
        return handlers.add(kDeviceInfosHandler, refuse, {});
    }
    if (auto r = handlers.add(kDeviceInfosHandler, [core_of](WorkerInfo, Message) { return answer_device_infos(core_of()); }, {}); !r)
        return r;
    return handlers.add(kMembershipHandler, [core_of](WorkerInfo caller, Message m) {
        return answer_membership(core_of(), std::move(caller), std::move(m));
    }, {});
}

Result<void> AgentCore::add_member(const WorkerInfo& info, std::vector<TransportOffer> addresses) {
    auto link = peers.add(info);
    if (!link) return fail(std::move(link).error());
    (*link)->addresses = std::move(addresses);
    if (metrics.peers.size() <= static_cast<std::size_t>(info.id)) metrics.peers.resize(static_cast<std::size_t>(info.id) + 1);
    return ok();
}

Result<void> AgentCore::apply_membership(const MembershipUpdate& update) {
    const bool listed = std::any_of(update.members.begin(), update.members.end(), [&](const GroupMember& m) {
        return m.record.name == self.name && m.record.rank == self.id;
    });
    if (!listed)
        return fail(Errc::invalid_argument, "a membership update for worker \"" + self.name + "\" (rank " +
                                                std::to_string(self.id) + ") does not list it");
    std::vector<WorkerDeviceInfo> infos;
    for (const auto& m : update.members) infos.push_back(m.devices);
    auto checked = check_dynamic_group_device_maps(self.name, infos);
    if (!checked) return fail(std::move(checked).error().context("a membership update for worker \"" + self.name + "\""));
    // Members that are gone: their calls end, their connections close; whoever holds their link
    // keeps a valid object.
    std::vector<int> gone;
    peers.for_each([&](const PeerLink& p) {
        const bool still = std::any_of(update.members.begin(), update.members.end(), [&](const GroupMember& m) {
            return m.record.rank == p.info.id && m.record.name == p.info.name;
        });
        if (!still) gone.push_back(p.info.id);
    });
    for (int r : gone) {
        auto link = peers.remove(r);
        if (!link) continue;
        const Error why(Errc::shutdown, "worker \"" + link->info.name + "\" left the group", link->info.name);
        calls.fail(link->pending, nullptr, why);
        if (link->conn) link->conn->close(why);
        link->conn.reset();
        if (link->connecting) link->connecting->set();
    }
    for (const auto& m : update.members) {
        if (peers.at(m.record.rank)) continue;
        if (auto a = add_member(WorkerInfo{m.record.name, m.record.rank}, m.record.addresses); !a) return a;
    }
    const DeviceMaps my_maps = tp_options ? tp_options->device_maps : DeviceMaps{};
    peers.for_each([&](PeerLink& p) {
        const auto map = my_maps.find(p.info.name);
        p.map = map != my_maps.end() ? map->second : DeviceMap{};
        const auto rev = checked->reverse_device_maps.find(p.info.name);
        p.reverse = rev != checked->reverse_device_maps.end() ? rev->second : DeviceMap{};
    });
    if (auto d = checked->devices.find(self.name); d != checked->devices.end()) devices = d->second;
    members = update.members;
    roster_read = true;
    roster_known.set();
    return ok();
}

Task<Result<void>> AgentCore::start_dynamic() {
    auto keep = shared_from_this();
    const Duration wait_limit = tuning.init_timeout > Duration::zero() ? tuning.init_timeout : store->timeout();
    const auto deadline = Clock::now() + wait_limit;
    // The rank is ours while we are a member (torch: "RPC worker id X is not unique").
    const std::string names_key = std::string(kNamesPrefix) + std::to_string(self.id);
    auto claimed = co_await store->compare_set(names_key, Bytes{}, bytes(self.name));
    if (!claimed) co_return fail(std::move(claimed).error().context("claiming rank " + std::to_string(self.id)));
    if (to_string(*claimed) != self.name)
        co_return fail(Errc::invalid_argument, "rank " + std::to_string(self.id) + " of the dynamic group is worker \"" +
                                                   to_string(*claimed) + "\"'s (RPC worker id " + std::to_string(self.id) +
                                                   " is not unique)");
    auto token = co_await GroupToken::acquire(store, self.name, true, deadline);
    if (!token) {
        (void)co_await store->delete_key(names_key);
        co_return fail(std::move(token).error());
    }
    auto joined = co_await join_under_token(keep, deadline);
    if (!joined) {
        // Nobody was changed before the check, nor after a failed update of the first member;
        // our own entries go.
        (void)co_await store->delete_key(std::string(kInfoPrefix) + std::to_string(self.id));
        (void)co_await store->delete_key(names_key);
    }
    if (auto r = co_await (*token)->release(); !r)
        log(LogLevel::warn, "rpc", "worker \"" + self.name + "\" could not give the group token back: " + r.error().to_string());
    if (!joined) co_return joined;
    log(LogLevel::info, "rpc", "worker \"" + self.name + "\" joined the dynamic group (" + std::to_string(members.size()) +
                                   " member(s))");
    co_return ok();
}

Task<Result<void>> AgentCore::leave_dynamic(Clock::time_point deadline) {
    auto keep = shared_from_this();
    auto token = co_await GroupToken::acquire(store, self.name, false, deadline);
    if (!token) co_return fail(std::move(token).error().context("worker \"" + self.name + "\" leaving the group"));
    Result<void> result = ok();
    // Our own calls first: they may still need the others.
    {
        auto draining = calls.drained(deadline);
        if (!co_await std::move(draining))
            result = fail(Errc::timeout, std::to_string(calls.outstanding()) + " call(s) of worker \"" + self.name +
                                             "\" were still outstanding when it left the group");
    }
    MembershipUpdate update{false, self.name, {}};
    for (const auto& m : members)
        if (m.record.name != self.name) update.members.push_back(m);
    const Bytes payload = encode_membership_update(update);
    for (const auto& m : update.members) {
        auto r = co_await call_member(*this, m.record.name, kMembershipHandler, payload, seconds_until(deadline));
        if (!r) {
            log(LogLevel::warn, "rpc", "worker \"" + self.name + "\" could not tell member \"" + m.record.name +
                                           "\" that it leaves: " + r.error().to_string());
            if (result) result = fail(std::move(r).error().context("leaving the group"));
        }
    }
    if (auto r = co_await store->set(std::string(kMembersKey), encode_member_ranks(ranks_of(update.members))); !r && result)
        result = fail(std::move(r).error().context("recording the group's members"));
    (void)co_await store->delete_key(std::string(kInfoPrefix) + std::to_string(self.id));
    (void)co_await store->delete_key(std::string(kNamesPrefix) + std::to_string(self.id));
    if (auto r = co_await (*token)->release(); !r && result) result = fail(std::move(r).error());
    co_return result;
}

}  // namespace tensorplay::detail
