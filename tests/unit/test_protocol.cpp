// The control protocol between aapcd and its clients: every message round-trips through its one
// encode and decode, and truncated or garbage input is refused with an error, never a crash.
// Also the one notation of a schedule and its sync variant (aapc/sched/spec.hpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "aapc/proto/protocol.hpp"
#include "aapc/result.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/wire/serial.hpp"
#include "protocol_samples.hpp"

using namespace aapc;

namespace {

// Encodes `m`, checks the header, decodes it back; then every cut of the payload and one byte
// too many are refused; `valid_cut`: a cut there leaves a whole message of the older kind (an
// optional field at the end).
template <typename M>
void round_trip(const M& m, std::size_t valid_cut = 0) {
  auto msg = proto::message(m, 77);
  auto h = proto::header_of(msg);
  REQUIRE(h);
  CHECK(h->type == static_cast<std::uint16_t>(proto::type_of(m)));
  CHECK(h->request == 77);
  M back{};
  if constexpr (requires { back.block; } && !requires { M::kType; }) back.block = m.block;  // WAIT or TEST: told by the type
  proto::Reader r = proto::payload_of(msg);
  REQUIRE(proto::decode(r, back));
  CHECK(back == m);
  for (std::size_t cut = sizeof(proto::Header); cut < msg.size(); ++cut) {
    if (cut == valid_cut) continue;
    proto::Reader shorter(msg.data() + sizeof(proto::Header), cut - sizeof(proto::Header));
    M x{};
    CHECK_FALSE(proto::decode(shorter, x));
  }
  msg.push_back(0);
  proto::Reader longer(msg.data() + sizeof(proto::Header), msg.size() - sizeof(proto::Header));
  M y{};
  CHECK_FALSE(proto::decode(longer, y));
}

// Every request's types (kTypes), gathered from the requests the daemon serves.
template <typename... M>
std::set<std::uint16_t> request_types(std::type_identity<std::variant<M...>> /*requests*/) {
  std::set<std::uint16_t> types;
  (..., [&] {
    for (const proto::RequestType& t : M::kTypes) types.insert(static_cast<std::uint16_t>(t.type));
  }());
  return types;
}

}  // namespace

TEST_CASE("every field of every control message is carried, read from its one field list") {
  for (const test::ProtocolSample& s : test::protocol_samples()) {
    if (s.filled == nullptr) continue;
    INFO(s.name);
    for (int pick = 0; pick < test::kFillerPicks; ++pick) {
      INFO("pick " << pick);
      CHECK(s.filled(pick).empty());
    }
  }
}

TEST_CASE("every message type has a sample in protocol_samples.hpp, so that its bytes are pinned") {
  std::set<std::uint16_t> sampled;
  for (const test::ProtocolSample& s : test::protocol_samples()) sampled.insert(proto::header_of(s.bytes)->type);
  const std::set<std::uint16_t> requests = request_types(std::type_identity<proto::AnyRequest>{});
  for (std::uint16_t t : requests) CHECK(sampled.contains(t));
  // Replies have no list of their own: a type up to the highest in use is a message's.
  const std::uint16_t highest = std::max(*requests.rbegin(), *sampled.rbegin());
  for (std::uint16_t t = 1; t <= highest; ++t) CHECK(sampled.contains(t));
}

TEST_CASE("every control message round-trips, and a cut or a byte too many is refused") {
  round_trip(proto::HelloRequest{"aapc-client 1", ""});
  round_trip(proto::HelloRequest{"aapc-client 1", "pmix:prterun-n0-1234@1"}, proto::message(proto::HelloRequest{"aapc-client 1", ""}, 77).size());
  round_trip(proto::HelloReply{2, 8, 99, 1500, 3.5e8, "m2", "8-two-switch"});
  round_trip(proto::RegisterRequest{1 << 20});
  round_trip(proto::RegisterReply{5});
  round_trip(proto::FreeRequest{5});
  round_trip(test::sample_alltoallv());
  round_trip(proto::StartRequest{.kind = proto::Kind::kAlltoall, .send_buffer = 1, .recv_buffer = 2, .block = 65536, .sends = {}, .recvs = {}});
  round_trip(proto::StartRequest{.kind = proto::Kind::kBarrier, .sends = {}, .recvs = {}});
  round_trip(proto::StartedReply{9, "tree", "sender-all"});
  round_trip(proto::WaitRequest{9, true});
  round_trip(proto::WaitRequest{9, false});
  round_trip(test::sample_done());
  proto::DoneReply failed = test::sample_done();
  failed.ok = false;
  failed.code = static_cast<std::uint32_t>(Errc::kPeerSilent);
  failed.message = "rank 3 stayed silent";
  failed.rounds.clear();
  round_trip(failed);
  round_trip(proto::StatusRequest{});
  round_trip(proto::StatusReply{"{\"rank\": 0}"});
  round_trip(proto::ErrorReply{static_cast<std::uint32_t>(Errc::kInvalidArgument), "no buffer 3"});
  // Groups.
  round_trip(proto::GroupQueryRequest{});
  proto::GroupQueryReply query{std::vector<std::uint64_t>(4, 0x5555), std::vector<std::uint32_t>(256, 7)};
  query.next[200] = 0xABCDEF;
  round_trip(query);
  round_trip(proto::GroupOpenRequest{9, 1234, {3, 0, 2}});
  round_trip(proto::GroupCloseRequest{9, true});
  round_trip(proto::GroupCloseRequest{9, false});
}

TEST_CASE("a START outside groups is version 2's first kind of START; a group's adds one byte, never 0") {
  const auto plain = proto::message(test::sample_alltoallv(), 1);
  proto::StartRequest grouped = test::sample_alltoallv();
  grouped.group = 3;
  auto with_group = proto::message(grouped, 1);
  REQUIRE(with_group.size() == plain.size() + 1);
  CHECK(std::equal(plain.begin() + sizeof(proto::Header), plain.end(), with_group.begin() + sizeof(proto::Header)));
  auto d = proto::decode_request(with_group);
  REQUIRE(d.request);
  CHECK(std::get<proto::StartRequest>(*d.request) == grouped);
  for (const auto& barrier : {proto::StartRequest{.kind = proto::Kind::kBarrier, .sends = {}, .recvs = {}, .group = 200}}) {
    auto b = proto::decode_request(proto::message(barrier, 2));
    REQUIRE(b.request);
    CHECK(std::get<proto::StartRequest>(*b.request) == barrier);
  }
  proto::Writer longer(proto::Type::kStart, 3);
  proto::encode(longer, grouped);
  longer.put(std::uint8_t{1});  // a byte too many
  CHECK(proto::decode_request(longer.done()).error == "malformed START");
  with_group.back() = 0;  // a group byte of 0 is refused: slot 0 is said by leaving it out
  CHECK(proto::decode_request(with_group).error == "malformed START");
}

TEST_CASE("an alltoall carries its block size once; its blocks lie at d x block") {
  proto::StartRequest m;
  m.kind = proto::Kind::kAlltoall;
  m.block = 1000;
  CHECK(m.send_block(3) == proto::Block{3000, 1000});
  CHECK(m.recv_block(0) == proto::Block{0, 1000});
  CHECK(proto::fits(m.send_block(3), 4000));
  CHECK_FALSE(proto::fits(m.send_block(3), 3999));
  CHECK_FALSE(proto::fits({~std::uint64_t{0} - 10, 100}, 4096));  // the offset would overflow
  CHECK(test::sample_alltoallv().send_block(2) == proto::Block{10, 7});
}

TEST_CASE("the request decoder names what is wrong and never crashes") {
  auto error_of = [](const std::vector<std::uint8_t>& msg) { return proto::decode_request(msg).error; };
  CHECK(error_of({1, 2, 3, 4, 5}) == "not an aapc request");
  auto status = proto::message(proto::StatusRequest{}, 1);
  auto d = proto::decode_request(status);
  REQUIRE(d.request);
  CHECK(std::holds_alternative<proto::StatusRequest>(*d.request));
  status[4] = 99;  // the version
  CHECK(error_of(status).starts_with("protocol version 99"));
  proto::Writer truncated(proto::Type::kStart, 2);
  truncated.put(static_cast<std::uint8_t>(proto::Kind::kAlltoallv));
  d = proto::decode_request(truncated.done());
  CHECK(d.ours);
  CHECK(d.error == "malformed START");
  CHECK(d.header.request == 2);
  proto::Writer unknown(proto::Type::kDone, 3);
  CHECK(error_of(unknown.done()) == "unknown request type " + std::to_string(static_cast<int>(proto::Type::kDone)));
  // A forged block count larger than the message is refused before anything is sized by it.
  auto start = proto::message(test::sample_alltoallv(), 4);
  const std::size_t count_at = start.size() - 6 * 16 - 4;
  start[count_at + 3] = 0x7f;
  CHECK(error_of(start) == "malformed START");
  // Random bytes after a valid header, of every request type.
  std::mt19937 rng(16);
  for (int i = 0; i < 20000; ++i) {
    proto::Writer w(static_cast<proto::Type>(1 + rng() % 20), 5);
    const std::size_t n = rng() % 48;
    for (std::size_t k = 0; k < n; ++k) w.put(static_cast<std::uint8_t>(rng() % 4 == 0 ? 0 : rng()));
    auto r = proto::decode_request(w.done());
    CHECK((r.request.has_value() || !r.error.empty()));
  }
  // WAIT and TEST share a payload; the type tells them apart.
  auto test = proto::decode_request(proto::message(proto::WaitRequest{8, false}, 6));
  REQUIRE(test.request);
  CHECK(std::get<proto::WaitRequest>(*test.request) == proto::WaitRequest{8, false});
}

TEST_CASE("one notation for a schedule and its sync variant") {
  CHECK(sched::join_spec("tree", "sender-all") == "tree+sender-all");
  CHECK(sched::join_spec("tree", "auto") == "tree");
  CHECK(sched::join_spec("group-shuffle:4", "") == "group-shuffle:4");
  auto parts = sched::read_spec("tree+sender-partial:4");
  CHECK(parts.algorithm == "tree");
  CHECK(parts.sync == "sender-partial:4");
  // The old spellings, where a user may still type them.
  CHECK(sched::read_spec("tree:sender-all").sync == "sender-all");
  CHECK(sched::read_spec("tree/sender-partial:2").sync == "sender-partial:2");
  CHECK(sched::read_spec("group-shuffle:4").algorithm == "group-shuffle:4");
  CHECK(sched::read_spec("group-shuffle:4:none").algorithm == "group-shuffle:4");
  auto plan = sched::parse_plan_spec("group-shuffle:3+receiver-all");
  REQUIRE(plan.algorithm);
  CHECK(plan.algorithm->param == 3);
  CHECK(plan.sync->kind == sched::SyncKind::kReceiverAll);
  CHECK(sched::format_plan_spec(*plan.algorithm, *plan.sync) == "group-shuffle:3+receiver-all");
  CHECK_FALSE(sched::parse_plan_spec("auto").algorithm);
  CHECK_THROWS_WITH(sched::parse_plan_spec("trees"), "unknown schedule 'trees'");
  CHECK_THROWS_WITH(sched::parse_plan_spec("tree+often"), "unknown sync variant 'often'");
}

TEST_CASE("the choice of schedule and sync is made in one place") {
  sched::Topology topo = sched::load_topology(std::string(AAPC_TEST_TOPOLOGIES) + "/8-two-switch.dot");
  sched::TreeModel model(topo);
  // A named tree gets sender-based tokens, other schedules none, unless a variant is given.
  CHECK(sched::choose(model, "tree", 1 << 20).sync.kind == sched::SyncKind::kSenderAll);
  CHECK(sched::choose(model, "pairwise", 1 << 20).sync.kind == sched::SyncKind::kNone);
  CHECK(sched::choose(model, "tree+receiver-all", 1 << 20).sync.kind == sched::SyncKind::kReceiverAll);
  // auto is auto_choice, whatever sync variant was given (an unknown one is refused: unit/registry).
  for (std::uint64_t block : {std::uint64_t{1024}, std::uint64_t{1} << 20}) {
    const sched::Choice a = sched::choose(model, "auto+receiver-all", block), b = sched::auto_choice(model, block);
    CHECK(a.algorithm.name() == b.algorithm.name());
    CHECK(a.sync.name() == b.sync.name());
  }
  CHECK_THROWS_WITH(sched::choose(model, "ring+often", 1024), "unknown sync variant 'often'");
}

TEST_CASE("send and receive ranges that share a byte are found, in n log n") {
  using proto::Range;
  // Touching is not overlapping; empty ranges share nothing.
  CHECK(!proto::find_overlap({{0, 64, 0}, {64, 128, 1}}, {{128, 192, 0}, {192, 256, 1}}));
  CHECK(!proto::find_overlap({{0, 64, 0}}, {{64, 64, 0}, {32, 32, 1}}));
  CHECK(!proto::find_overlap({{0, 10, 0}, {20, 30, 1}}, {{10, 20, 0}, {30, 40, 1}}));  // interleaved
  auto o = proto::find_overlap({{0, 10, 0}, {20, 30, 1}}, {{10, 20, 0}, {29, 40, 1}});
  REQUIRE(o);
  CHECK(o->send.block == 1);
  CHECK(o->recv.block == 1);
  // A receive range inside a long send range that started earlier, past other ranges.
  o = proto::find_overlap({{0, 1000, 4}, {1000, 1001, 5}}, {{500, 501, 7}});
  REQUIRE(o);
  CHECK(o->send.block == 4);
  CHECK(o->recv.block == 7);
  // The same as the brute force, on random ranges.
  std::mt19937 rng(15);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<Range> sends, recvs;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      std::uint64_t b = rng() % 200, l = rng() % 20;
      sends.push_back({b, b + l, static_cast<std::size_t>(i)});
      b = rng() % 200;
      l = rng() % 20;
      recvs.push_back({b, b + l, static_cast<std::size_t>(i)});
    }
    bool brute = false;
    for (const auto& s : sends)
      for (const auto& r : recvs) brute |= s.end > s.begin && r.end > r.begin && s.begin < r.end && r.begin < s.end;
    auto found = proto::find_overlap(sends, recvs);
    REQUIRE(found.has_value() == brute);
    if (found) CHECK((found->send.begin < found->recv.end && found->recv.begin < found->send.end));
  }
}

TEST_CASE("RUN is START and WAIT in one request: the same payload, its own type") {
  proto::StartRequest m{.kind = proto::Kind::kAlltoall, .send_buffer = 1, .recv_buffer = 2, .block = 8, .sends = {}, .recvs = {}};
  m.run = true;
  const auto msg = proto::message(m, 7);
  CHECK(proto::header_of(msg)->type == static_cast<std::uint16_t>(proto::Type::kRun));
  const auto d = proto::decode_request(msg);
  REQUIRE(d.request);
  const auto* back = std::get_if<proto::StartRequest>(&*d.request);
  REQUIRE(back != nullptr);
  CHECK(*back == m);
  m.run = false;
  const auto start = proto::decode_request(proto::message(m, 8));
  REQUIRE(start.request);
  CHECK_FALSE(std::get<proto::StartRequest>(*start.request).run);
}

TEST_CASE("exchange ids are numbered per group slot; ids of one slot compare as 24-bit serial numbers, across the wrap") {
  using namespace aapc::engine;
  const std::uint32_t a = make_id(5, 10);
  CHECK(id_slot(a) == 5);
  CHECK(id_seq(a) == 10);
  CHECK(later_id(next_id_of(a), a));
  CHECK_FALSE(later_id(a, a));
  CHECK_FALSE(later_id(a, next_id_of(a)));
  CHECK_FALSE(later_id(make_id(6, 11), a));  // another slot: unordered, both ways
  CHECK_FALSE(later_id(a, make_id(6, 11)));
  const std::uint32_t last = make_id(5, kSeqMask);
  CHECK(next_id_of(last) == make_id(5, 0));  // wraps within its slot
  CHECK(later_id(make_id(5, 3), last));
  CHECK(id_distance(make_id(5, 3), last) == 4);
  CHECK(next_id_of(make_id(kWorldSlot, kSeqMask)) == make_id(kWorldSlot, 0));  // the session's ids never reach slot 1
}

TEST_CASE("groups on disjoint machines take different slots, hence different exchange ids, on up to 255 machines") {
  constexpr int kMachines = 255;
  auto all_free = [] {
    std::vector<std::uint64_t> free(proto::kGroupSlots / 64, ~0ULL);
    free[0] &= ~1ULL;  // slot 0 is the cluster's
    return free;
  };
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    // A random partition of the machines into groups of 2..9, opened in a random order; each
    // group takes a slot free on all its members, as Client::open_group does.
    std::vector<int> order(kMachines);
    for (int i = 0; i < kMachines; ++i) order[static_cast<std::size_t>(i)] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::vector<int>> groups;
    for (std::size_t i = 0; i + 1 < order.size();) {
      const std::size_t take = std::min<std::size_t>(order.size() - i, 2 + rng() % 8);
      groups.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(i + take));
      i += take;
    }
    std::vector<std::vector<std::uint64_t>> free_at(kMachines, all_free());
    std::set<int> slots;
    for (const auto& g : groups) {
      std::vector<std::uint64_t> free = all_free();
      for (int m : g)
        for (std::size_t w = 0; w < free.size(); ++w) free[w] &= free_at[static_cast<std::size_t>(m)][w];
      const auto slot = proto::group_slot(free, *std::min_element(g.begin(), g.end()));
      REQUIRE(slot);
      for (int m : g) free_at[static_cast<std::size_t>(m)][*slot / 64] &= ~(1ULL << (*slot % 64));
      CHECK(slots.insert(*slot).second);
    }
  }
}

TEST_CASE("a group's slot: the first free from its own start, going round past 255, never 0, none when none is free") {
  std::vector<std::uint64_t> free(proto::kGroupSlots / 64, ~0ULL);
  CHECK(proto::group_slot(free, 0) == 1);
  CHECK(proto::group_slot(free, 4) == 5);
  CHECK(proto::group_slot(free, 254) == 255);
  CHECK(proto::group_slot(free, 255) == 1);  // 255 machines' worth of starts, then round again
  free[0] &= ~(1ULL << 5);
  CHECK(proto::group_slot(free, 4) == 6);  // held by another group on a member
  free.assign(free.size(), 0);
  free[0] = 1ULL << 3 | 1ULL;  // only slot 3 (and 0, which is never a group's)
  CHECK(proto::group_slot(free, 254) == 3);
  free[0] = 1ULL;
  CHECK_FALSE(proto::group_slot(free, 0));
}

TEST_CASE("a WAIT without a bound is the WAIT it was; one with a bound adds it, never 0; TEST carries none") {
  const auto plain = proto::message(proto::WaitRequest{7, true}, 1);
  const proto::WaitRequest bounded{7, true, 2000};
  const auto with_bound = proto::message(bounded, 1);
  REQUIRE(with_bound.size() == plain.size() + 4);
  CHECK(std::equal(plain.begin() + sizeof(proto::Header), plain.end(), with_bound.begin() + sizeof(proto::Header)));
  auto d = proto::decode_request(with_bound);
  REQUIRE(d.request);
  CHECK(std::get<proto::WaitRequest>(*d.request) == bounded);
  auto test = proto::decode_request(proto::message(proto::WaitRequest{7, false}, 2));
  REQUIRE(test.request);
  CHECK(std::get<proto::WaitRequest>(*test.request) == proto::WaitRequest{7, false});
  auto zero = with_bound;
  std::fill(zero.end() - 4, zero.end(), 0);  // a bound of 0 is said by leaving it out
  CHECK_FALSE(proto::decode_request(zero).request);
}
