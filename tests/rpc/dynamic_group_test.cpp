// Dynamic groups (issue 19): members join one by one and call each other, leave gracefully, a
// member rejoins under its old name, a joiner with invalid maps is refused and the group is
// unchanged, and a static member refuses dynamic membership requests.
#include "agent_test_util.hpp"

#include <tensorplay/rpc/constants.hpp>

#include "rpc/membership.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

// This file's own names: each layer's tests are compiled together (tests/meson.build).
namespace tp_dynamic_group_test {

using namespace tensorplay;
using namespace std::chrono_literals;
using test::AgentPtr;

namespace {

Task<Result<Message>> echo(WorkerInfo, Message m) { co_return m; }

Task<AgentPtr> join(std::shared_ptr<Store> store, int rank, test::Configure configure = {}) {
    auto args = test::init_args(std::move(store), rank, DYNAMIC_WORLD_SIZE, configure);
    auto a = co_await detail::NativeAgent::create(std::move(args));
    if (!a) FAIL("worker" << rank << " did not join: " << a.error().to_string());
    REQUIRE((*a)->register_handler("echo", echo));
    co_return *a;
}

Task<void> calls_everyone(RpcAgent& from, const std::vector<AgentPtr>& group) {
    for (const auto& to : group) {
        Message m{bytes("hi " + to->get_worker_info().name), {}};
        const std::string name = to->get_worker_info().name;
        auto r = co_await from.rpc_async(name, "echo", std::move(m), 5);
        INFO(from.get_worker_info().name << " -> " << name);
        REQUIRE(r);
        CHECK(to_string(r->payload) == "hi " + name);
    }
}

}  // namespace

TEST_CASE("dynamic members join one by one, call each other, leave, and a member rejoins under its old name", "[rpc][dynamic]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(5s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 3; ++r) {
            group.push_back(co_await join(store, r));
            const std::vector<std::string> expect = [&] {
                std::vector<std::string> n;
                for (int i = 0; i <= r; ++i) n.push_back(test::worker_name(i));
                return n;
            }();
            for (const auto& a : group) CHECK(test::member_names(*a) == expect);
            for (const auto& a : group) co_await calls_everyone(*a, group);
        }
        // worker1 leaves gracefully; the others see it go, and calls to it fail at once.
        auto left = co_await group[1]->shutdown(true, 10);
        REQUIRE(left);
        AgentPtr gone = group[1];
        group.erase(group.begin() + 1);
        for (const auto& a : group) {
            CHECK(test::member_names(*a) == std::vector<std::string>{"worker0", "worker2"});
            Message m{bytes("x"), {}};
            auto r = co_await a->rpc_async("worker1", "echo", std::move(m), 5);
            REQUIRE_FALSE(r);
            CHECK(r.error().code() == Errc::invalid_argument);
            CHECK(r.error().message().find("worker1") != std::string::npos);
        }
        for (const auto& a : group) co_await calls_everyone(*a, group);
        // A new worker1 joins under the old name and rank.
        group.insert(group.begin() + 1, co_await join(store, 1));
        for (const auto& a : group) CHECK(test::member_names(*a) == std::vector<std::string>{"worker0", "worker1", "worker2"});
        for (const auto& a : group) co_await calls_everyone(*a, group);
        for (auto it = group.rbegin(); it != group.rend(); ++it) {
            auto s = co_await (*it)->shutdown(true, 10);
            CHECK(s);
        }
    });
}

TEST_CASE("a dynamic joiner with invalid device maps is refused with the seed's message; the group is unchanged", "[rpc][dynamic]") {
    test::run_with_deadline(60s, [&]() -> Task<void> {
        auto store = std::make_shared<HashStore>(5s);
        std::vector<AgentPtr> group;
        for (int r = 0; r < 2; ++r) group.push_back(co_await join(store, r));
        // Two of its devices onto one of worker0's: the seed's "maps multiple devices to one target".
        auto bad = test::init_args(store, 2, DYNAMIC_WORLD_SIZE, [](int, TensorPipeRpcBackendOptions& o) {
            o.device_maps["worker0"] = DeviceMap{{Device::cpu(), Device::cpu()}, {Device::cuda(0), Device::cpu()}};
        });
        auto refused = co_await detail::NativeAgent::create(std::move(bad));
        REQUIRE_FALSE(refused);
        INFO(refused.error().to_string());
        CHECK(refused.error().code() == Errc::invalid_argument);
        CHECK(refused.error().message().find("cannot join the group") != std::string::npos);
        for (const auto& a : group) CHECK(test::member_names(*a) == std::vector<std::string>{"worker0", "worker1"});
        for (const auto& a : group) co_await calls_everyone(*a, group);
        // Its rank is free again.
        group.push_back(co_await join(store, 2));
        for (const auto& a : group) CHECK(test::member_names(*a).size() == 3);
        for (auto it = group.rbegin(); it != group.rend(); ++it) (void)co_await (*it)->shutdown(true, 10);
    });
}

TEST_CASE("a static member refuses dynamic membership requests", "[rpc][dynamic]") {
    test::run_with_deadline(30s, [&]() -> Task<void> {
        auto g = co_await test::make_group(2);
        detail::MembershipUpdate u{detail::MembershipChange::join, "worker0", {}};
        Message m{detail::encode_membership_update(u), {}};
        auto r = co_await g[0]->rpc_async("worker1", detail::kMembershipHandler, std::move(m), 5);
        REQUIRE_FALSE(r);
        INFO(r.error().to_string());
        CHECK(r.error().message().find("static group") != std::string::npos);
        (void)co_await test::shutdown_all(g);
    });
}

namespace {

detail::GroupMember member_of(int rank) {
    const std::string name = test::worker_name(rank);
    detail::PeerRecord rec{name, rank, {TransportOffer{"uv", "uv", "tcp://127.0.0.1:" + std::to_string(4000 + rank)}}};
    WorkerDeviceInfo dev{name, 2, {}, {Device::cuda(rank % 2)}};
    return detail::GroupMember{rec, dev};
}

Bytes with_u32_at(Bytes b, std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b.at(at + i) = static_cast<std::uint8_t>(v >> (8 * i));
    return b;
}

}  // namespace

TEST_CASE("membership updates round-trip, and malformed ones are refused before anything is allocated", "[rpc][dynamic]") {
    const detail::MembershipUpdate u{detail::MembershipChange::removal, "worker1", {member_of(0), member_of(2)}};
    const Bytes b = detail::encode_membership_update(u);
    auto back = detail::decode_membership_update(b);
    REQUIRE(back);
    CHECK(back->change == u.change);
    CHECK(back->subject == "worker1");
    REQUIRE(back->members.size() == 2);
    CHECK(back->members[1].record.addresses.at(0).address == "tcp://127.0.0.1:4002");
    CHECK(back->members[1].devices.devices == std::vector<Device>{Device::cuda(0)});
    CHECK(detail::encode_membership_update(*back) == b);

    auto refused = [](const Bytes& bad, const char* says) {
        auto r = detail::decode_membership_update(bad);
        REQUIRE_FALSE(r);
        INFO(r.error().to_string());
        CHECK(r.error().code() == Errc::protocol_error);
        CHECK(r.error().message().find(says) != std::string::npos);
    };
    refused(with_u32_at(b, 0, 0x12345678), "bad magic");
    Bytes change = b;
    change.at(4) = 9;
    refused(change, "unknown change 9");
    // "worker1" is 7 bytes after its u32 length: the member count follows at 5 + 4 + 7.
    refused(with_u32_at(b, 16, 1u << 30), "members");
    refused(Bytes(b.begin(), b.end() - 3), "");
    Bytes trailing = b;
    trailing.push_back(0);
    refused(trailing, "");
    // Two members of one rank.
    const detail::MembershipUpdate twice{detail::MembershipChange::join, "worker0", {member_of(0), member_of(0)}};
    refused(detail::encode_membership_update(twice), "listed twice");
    // A member whose record and device info name different workers.
    auto odd = member_of(3);
    odd.devices.name = "someone else";
    const detail::MembershipUpdate mixed{detail::MembershipChange::join, "worker3", {odd}};
    refused(detail::encode_membership_update(mixed), "in its device info");

    const Bytes ranks = detail::encode_member_ranks({4, 0, 7});
    auto rb = detail::decode_member_ranks(ranks);
    REQUIRE(rb);
    CHECK(*rb == std::vector<int>{4, 0, 7});
    auto huge = detail::decode_member_ranks(with_u32_at(ranks, 0, 1u << 31));
    REQUIRE_FALSE(huge);
    CHECK(huge.error().code() == Errc::protocol_error);
}

}  // namespace tp_dynamic_group_test
