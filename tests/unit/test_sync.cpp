// Sync planning (Faraj/Yuan/Patarasuk section 5) and the verifier's sync checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/verify.hpp"
#include "paths.hpp"

using namespace aapc::sched;

namespace {

Schedule tree_of(const Topology& t) { return make_schedule(t, {Algorithm::kTree, 0}); }

// Removes sync `id` from the plan, keeping ids dense.
Schedule without_sync(Schedule s, std::uint32_t id) {
  auto drop = [&](std::vector<std::uint32_t>& ids) {
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    for (auto& x : ids)
      if (x > id) --x;
  };
  for (auto& prog : s.programs) {
    for (auto& round : prog.rounds) {
      drop(round.waits);
      drop(round.emits);
    }
    for (auto& entry : prog.on_receive) drop(entry.second);
  }
  s.syncs.erase(s.syncs.begin() + id);
  for (std::uint32_t i = 0; i < s.syncs.size(); ++i) s.syncs[i].id = i;
  return s;
}

}  // namespace

TEST_CASE("sync names parse and print") {
  for (const auto& name : SyncSpec::names()) {
    auto spec = SyncSpec::parse(name);
    REQUIRE(spec);
    CHECK(spec->name() == name);
  }
  CHECK(SyncSpec::parse("sender-partial(8)")->block == 8);
  CHECK(SyncSpec::parse("sender-partial")->block == 4);
  CHECK(!SyncSpec::parse("sender-all:3"));
  CHECK(!SyncSpec::parse("sideways"));
}

TEST_CASE("sender all on the paper's example: every token is needed, and the verifier catches a missing one") {
  Topology t = load_topology(aapc::test::topology_path("fyp-sync-fig1"));
  Schedule s = plan_sync(t, tree_of(t), {SyncKind::kSenderAll, 1});
  auto report = verify(t, s);
  INFO(report.summary());
  REQUIRE(report.ok());
  CHECK(s.sync_stats.contending_pairs > s.sync_stats.consecutive_pairs);
  CHECK(s.sync_stats.consecutive_pairs >= s.sync_stats.tokens + s.sync_stats.local_waits);
  REQUIRE(!s.syncs.empty());
  for (std::uint32_t id = 0; id < s.syncs.size(); ++id) {
    INFO("without sync " << id);
    auto broken = verify(t, without_sync(s, id));
    CHECK(!broken.ok());
    CHECK_THAT(broken.errors.front(), Catch::Contains("not synchronised"));
  }
}

// The tree's phases, and pairwise-ec's, which share links inside a phase on a tree of switches:
// there a round waits for many earlier users of its links at once.
TEST_CASE("no redundant synchronisation survives, for every pair-wise variant on small trees") {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 80; ++trial) {
    RandomTreeOptions o;
    o.machines = 3 + trial % 8;
    o.switches = 1 + trial % 4;
    Topology t = random_tree(o, rng);
    Schedule base = trial < 40 ? tree_of(t) : make_schedule(t, {Algorithm::kPairwiseEc, 0});
    for (SyncSpec spec : {SyncSpec{SyncKind::kSenderAll, 1}, SyncSpec{SyncKind::kReceiverAll, 1}, SyncSpec{SyncKind::kSenderPartial, 2},
                          SyncSpec{SyncKind::kReceiverPartial, 3}}) {
      Schedule s = plan_sync(t, base, spec);
      REQUIRE(verify(t, s).ok());
      for (std::uint32_t id = 0; id < s.syncs.size(); ++id) {
        INFO("trial " << trial << ", " << spec.name() << ", sync " << id);
        CHECK(!verify(t, without_sync(s, id)).ok());
      }
    }
  }
}

namespace {

bool same_rounds(const Round& a, const Round& b) {
  auto key = [](const Round& r) {
    std::vector<std::pair<Rank, int>> sends;
    for (const Send& x : r.sends) sends.emplace_back(x.dst, x.phase);
    return std::tuple(sends, r.dummy, r.waits, r.emits);
  };
  return key(a) == key(b);
}

bool same_sync(const Sync& a, const Sync& b) {
  return std::tie(a.id, a.from, a.to, a.trigger, a.from_round, a.after_src, a.to_round) ==
         std::tie(b.id, b.from, b.to, b.trigger, b.from_round, b.after_src, b.to_round);
}

}  // namespace

TEST_CASE("a node's part of a plan, planned from every program or from the phases alone, is that node's program and tokens of the whole plan, for every variant") {
  std::mt19937_64 rng(7);
  std::vector<Topology> trees{load_topology(aapc::test::topology_path("12-three-level")), load_topology(aapc::test::topology_path("8-two-switch"))};
  for (int trial = 0; trial < 6; ++trial) {
    RandomTreeOptions o;
    o.machines = 4 + trial * 3;
    o.switches = 1 + trial % 4;
    trees.push_back(random_tree(o, rng));
  }
  for (const Topology& t : trees) {
    for (const std::string& name : SyncSpec::names()) {
      for (const Algorithm a : {Algorithm::kTree, Algorithm::kBruck}) {
        const SyncSpec spec = *SyncSpec::parse(name);
        const Schedule base = make_schedule(t, {a, 0});
        if (base.combining() && spec.kind != SyncKind::kNone) continue;
        const Schedule whole = plan_sync(t, base, spec);
        CHECK(whole.part == -1);
        CHECK(whole.sync_total() == whole.syncs.size());
        for (Rank me = 0; me < t.machine_count(); ++me) {
          INFO(t.machine_count() << " machines, " << base.algorithm << "+" << name << ", node " << me);
          // Planned from a schedule with every program, and from the phases alone (what a daemon plans).
          const Schedule parts[] = {plan_sync_part(t, base, spec, me), plan_part(t, {a, 0}, spec, me)};
          for (const Schedule& part : parts) {
            REQUIRE(part.part == me);
            CHECK(part.sync_total() == whole.syncs.size());
            CHECK(part.sync_stats.tokens == whole.sync_stats.tokens);
            CHECK(part.sync_stats.local_waits == whole.sync_stats.local_waits);
            CHECK(part.phases.size() == whole.phases.size());
            const Program& mine = part.programs.at(static_cast<std::size_t>(me));
            const Program& theirs = whole.programs.at(static_cast<std::size_t>(me));
            REQUIRE(mine.rounds.size() == theirs.rounds.size());
            for (std::size_t r = 0; r < mine.rounds.size(); ++r) CHECK(same_rounds(mine.rounds[r], theirs.rounds[r]));
            CHECK(mine.on_receive == theirs.on_receive);
            if (whole.combining()) CHECK(part.combine.at(static_cast<std::size_t>(me)).size() == whole.combine.at(static_cast<std::size_t>(me)).size());
            std::vector<Sync> touching;
            for (const Sync& y : whole.syncs)
              if (y.from == me || y.to == me) touching.push_back(y);
            REQUIRE(part.syncs.size() == touching.size());
            for (std::size_t i = 0; i < touching.size(); ++i) CHECK(same_sync(part.syncs[i], touching[i]));
            for (Rank other = 0; other < t.machine_count(); ++other)
              if (other != me) CHECK(part.programs.at(static_cast<std::size_t>(other)).rounds.empty());
          }
        }
      }
    }
  }
  CHECK_THROWS_AS(plan_sync_part(trees.front(), tree_of(trees.front()), {SyncKind::kSenderAll, 1}, 12), std::invalid_argument);
}

TEST_CASE("receiver-based tokens come from the receiver after the receipt") {
  Topology t = load_topology(aapc::test::topology_path("8-two-switch"));
  Schedule s = plan_sync(t, tree_of(t), {SyncKind::kReceiverAll, 1});
  REQUIRE(verify(t, s).ok());
  REQUIRE(!s.syncs.empty());
  for (const Sync& sy : s.syncs) {
    REQUIRE(sy.trigger == SyncTrigger::kAfterReceive);
    const auto* ids = s.programs[static_cast<std::size_t>(sy.from)].emits_on_receive(sy.after_src);
    REQUIRE(ids != nullptr);
    CHECK(std::count(ids->begin(), ids->end(), sy.id) == 1);
  }
  // A sender-based plan on the same schedule orders less strictly: it does not pass as
  // receiver-based.
  Schedule sender = plan_sync(t, tree_of(t), {SyncKind::kSenderAll, 1});
  sender.sync = {SyncKind::kReceiverAll, 1};
  CHECK(!verify(t, sender).ok());
}

TEST_CASE("barriers are dissemination barriers of tokens") {
  Topology t = load_topology(aapc::test::topology_path("8-one-switch"));
  Schedule base = tree_of(t);
  Schedule all = plan_sync(t, base, {SyncKind::kBarrierAll, 1});
  REQUIRE(verify(t, all).ok());
  CHECK(all.sync_stats.barriers == 6);  // between 7 phases
  // 3 stages of 8 tokens per barrier.
  CHECK(all.sync_stats.barrier_tokens == 6 * 3 * 8);
  Schedule partial = plan_sync(t, base, {SyncKind::kBarrierPartialNone, 3});
  REQUIRE(verify(t, partial).ok());
  CHECK(partial.sync_stats.barriers == 2);
  // Partial with no sync inside blocks does not pass as fully synchronised.
  partial.sync = {SyncKind::kBarrierAll, 1};
  CHECK(!verify(t, partial).ok());
}

TEST_CASE("a plan whose barriers would make hundreds of millions of rounds is refused at once, saying what to use instead") {
  // A barrier after each of the tree's 31,744 phases at 1,024 machines: 325 million rounds of
  // ten stages, which took 22 GB before the planner failed. The daemon's part is refused too,
  // with the same words on every node.
  RandomTreeOptions o;
  o.machines = 1024;
  o.switches = 33;
  o.shape = TreeShape::kTwoLevel;
  std::mt19937_64 rng(1);
  const Topology t = random_tree(o, rng);
  const Schedule tree = tree_of(t);
  for (const SyncSpec spec : {SyncSpec{SyncKind::kBarrierAll, 1}, SyncSpec{SyncKind::kBarrierPartialSender, 4}}) {
    INFO(spec.name());
    CHECK_THROWS_WITH(plan_sync(t, tree, spec), Catch::Contains("too large to plan") && Catch::Contains("barriers of 10 stages") &&
                                                    Catch::Contains("a larger block of phases between barriers"));
    CHECK_THROWS_WITH(plan_part(t, {Algorithm::kTree, 0}, spec, 7), Catch::Contains("too large to plan"));
  }
  // A barrier after every 4,096 phases is 7 barriers: planned.
  CHECK(plan_part(t, {Algorithm::kTree, 0}, {SyncKind::kBarrierPartialSender, 4096}, 7).sync_stats.barriers == 7);
}

TEST_CASE("dummy messages keep idle machines busy without contention") {
  Topology t = load_topology(aapc::test::topology_path("12-three-level"));
  Schedule s = plan_sync(t, tree_of(t), {SyncKind::kDummy, 1});
  auto report = verify(t, s);
  INFO(report.summary());
  REQUIRE(report.ok());
  CHECK(s.sync_stats.dummy_messages > 0);
  // Every machine now has a round in every phase.
  for (const auto& prog : s.programs) CHECK(prog.rounds.size() == s.phases.size());
}

TEST_CASE("sync on the single-switch phased algorithms; packet-level ones refuse") {
  Topology t = single_switch_topology(9);
  for (const char* name : {"ring", "pairwise", "lp", "tree"}) {
    INFO(name);
    Schedule s = plan_sync(t, make_schedule(t, *AlgorithmSpec::parse(name)), {SyncKind::kSenderAll, 1});
    CHECK(verify(t, s).ok());
  }
  CHECK_THROWS_WITH(plan_sync(t, sync_shuffle_schedule(9), {SyncKind::kSenderAll, 1}), Catch::Contains("--sync none"));
  CHECK_NOTHROW(plan_sync(t, sync_shuffle_schedule(9), {SyncKind::kNone, 1}));
}

TEST_CASE("the verifier reports deadlocks and malformed plans") {
  Topology t = load_topology(aapc::test::topology_path("8-one-switch"));
  Schedule s = plan_sync(t, tree_of(t), {SyncKind::kSenderAll, 1});
  REQUIRE(s.syncs.size() >= 2);
  // Make node 0's first round wait for a token that node 1 emits only after a round that
  // itself waits for node 0: a cycle.
  Schedule cyc = s;
  std::uint32_t a = static_cast<std::uint32_t>(cyc.syncs.size()), b = a + 1;
  cyc.syncs.push_back({a, 1, 0, SyncTrigger::kAfterSend, 0, -1, 0});
  cyc.syncs.push_back({b, 0, 1, SyncTrigger::kAfterSend, 0, -1, 0});
  cyc.programs[1].rounds[0].emits.push_back(a);
  cyc.programs[0].rounds[0].waits.push_back(a);
  cyc.programs[0].rounds[0].emits.push_back(b);
  cyc.programs[1].rounds[0].waits.push_back(b);
  auto report = verify(t, cyc);
  CHECK(!report.ok());
  CHECK_THAT(report.errors.front(), Catch::Contains("deadlock"));
  // A token nobody emits.
  Schedule orphan = s;
  orphan.programs[orphan.syncs[0].from].rounds[static_cast<std::size_t>(orphan.syncs[0].from_round)].emits.clear();
  CHECK(!verify(t, orphan).ok());
  // A message sent twice / never.
  Schedule dup = tree_of(t);
  dup.phases[0].push_back(dup.phases[1].front());
  CHECK(!verify(t, dup).ok());
  // Contention within a phase.
  Schedule clash = tree_of(t);
  std::swap(clash.phases[0][0].dst, clash.phases[0][1].dst);
  auto r = verify(t, clash);
  CHECK(!r.ok());
}

TEST_CASE("tree schedule fails verification when it is not contention-free on a tree of switches") {
  Topology t = load_topology(aapc::test::topology_path("8-two-switch"));
  Schedule ring = make_schedule(t, {Algorithm::kRing, 0});
  CHECK(!ring.contention_free);
  CHECK(verify(t, ring).ok());  // a correct exchange, only not claimed contention-free
  ring.contention_free = true;
  auto report = verify(t, ring);
  CHECK(!report.ok());
  CHECK_THAT(report.errors.front(), Catch::Contains("both use edge"));
}

TEST_CASE("auto picks the calibrated schedule and sync variant, and verified plans") {
  Topology one = load_topology(aapc::test::topology_path("8-one-switch"));
  Topology two = load_topology(aapc::test::topology_path("8-two-switch"));
  Topology three = load_topology(aapc::test::topology_path("12-three-level"));
  for (std::uint64_t b : {std::uint64_t{362}, std::uint64_t{4096}, std::uint64_t{1} << 20, kAnyBlockSize}) {
    Choice c = auto_choice(one, b);
    CHECK(c.algorithm.algorithm == Algorithm::kSyncShuffle);
    CHECK(c.sync.kind == SyncKind::kNone);
  }
  // Tiny blocks, where half the cluster's blocks fit one frame (MTU 1500 less the 30-byte DATA
  // header and a key's 24-byte tag): Bruck's combining exchange, on any topology and any
  // number of machines.
  for (auto [t, last_tiny] : {std::pair{&one, std::uint64_t{361}}, std::pair{&three, std::uint64_t{241}}}) {
    for (std::uint64_t b : {std::uint64_t{1}, std::uint64_t{8}, last_tiny}) {
      Choice c = auto_choice(*t, b);
      CHECK(c.algorithm.algorithm == Algorithm::kBruck);
      CHECK(verify(*t, plan_sync(*t, make_schedule(*t, c.algorithm), c.sync)).ok());
    }
  }
  CHECK(auto_choice(three, 242).algorithm.algorithm == Algorithm::kPairwiseEc);
  // Trees: below three switch buffers (64 KiB each here) over the bottleneck load, the
  // pairwise exchange without tokens; from there to 32 KiB the tree's phases with sender-based
  // tokens; from 32 KiB the paced shuffle (no tokens: its pacing keeps every link within its rate).
  // 8-two-switch: load 16, so blocks below 12 KiB; 12-three-level: load 36, up to 5,461 bytes.
  for (auto [t, last_small] : {std::pair{&two, std::uint64_t{12287}}, std::pair{&three, std::uint64_t{5461}}}) {
    INFO(t->name());
    for (std::uint64_t b : {std::uint64_t{1024}, std::uint64_t{4096}, last_small}) {
      Choice c = auto_choice(*t, b);
      CHECK(c.algorithm.algorithm == Algorithm::kPairwiseEc);
      CHECK(c.sync.kind == SyncKind::kNone);
      CHECK(!c.reason.empty());
      CHECK(verify(*t, plan_sync(*t, make_schedule(*t, c.algorithm), c.sync)).ok());
    }
    for (std::uint64_t b : {last_small + 1, std::uint64_t{32 * 1024 - 1}}) {
      Choice c = auto_choice(*t, b);
      CHECK(c.algorithm.algorithm == Algorithm::kTree);
      CHECK(c.sync.kind == SyncKind::kSenderAll);
      CHECK(verify(*t, plan_sync(*t, make_schedule(*t, c.algorithm), c.sync)).ok());
    }
    // alltoallv: ranks see different sizes, so all of them take the large-block choice.
    for (std::uint64_t b : {std::uint64_t{32 * 1024}, std::uint64_t{65536}, kAnyBlockSize}) {
      Choice c = auto_choice(*t, b);
      CHECK(c.algorithm.algorithm == Algorithm::kPacedShuffle);
      CHECK(c.sync.kind == SyncKind::kNone);
      CHECK(verify(*t, plan_sync(*t, make_schedule(*t, c.algorithm), c.sync)).ok());
    }
  }
  // Many senders on the bottleneck (64 machines on 8 leaves: each node 63 of a link's 448
  // blocks): the tree's phases at every size above the pairwise exchange's.
  Topology big = load_topology(aapc::test::topology_path("64-two-level"));
  for (std::uint64_t b : {std::uint64_t{65536}, std::uint64_t{1} << 20, kAnyBlockSize})
    CHECK(auto_choice(big, b).algorithm.algorithm == Algorithm::kTree);
  // The switches' own buffers count: with 256 KiB ports, 8-two-switch absorbs blocks below 48 KiB.
  TopologySpec spec = read_dot(to_dot(two), "8-two-switch");
  for (auto& node : spec.nodes)
    if (node.attrs.count("buffer") != 0) node.attrs["buffer"] = "256K";
  Topology deep = Topology::from_spec(spec);
  CHECK(auto_choice(deep, 48 * 1024 - 1).algorithm.algorithm == Algorithm::kPairwiseEc);
  CHECK(auto_choice(deep, 48 * 1024).algorithm.algorithm == Algorithm::kPacedShuffle);
  CHECK(auto_choice(deep, 96 * 1024).algorithm.algorithm == Algorithm::kPacedShuffle);
}

namespace {

// Who each node has heard from, transitively, when it finishes barrier `s`: a token carries
// what its emitter knew when it emitted it (the rounds before), rounds run in order.
std::vector<std::set<int>> barrier_knowledge(const Schedule& s) {
  const auto n = static_cast<std::size_t>(s.machines);
  std::vector<std::set<int>> know(n);
  for (std::size_t i = 0; i < n; ++i) know[i].insert(static_cast<int>(i));
  std::size_t rounds = s.programs.empty() ? 0 : s.programs[0].rounds.size();
  for (std::size_t r = 0; r < rounds; ++r) {
    std::vector<std::set<int>> carried(s.syncs.size());
    for (std::size_t i = 0; i < n; ++i)
      for (std::uint32_t id : s.programs[i].rounds[r].emits) carried[id] = know[i];
    for (std::size_t i = 0; i < n; ++i)
      if (r + 1 < rounds)
        for (std::uint32_t id : s.programs[i].rounds[r + 1].waits) know[i].insert(carried[id].begin(), carried[id].end());
  }
  return know;
}

}  // namespace

TEST_CASE("k-ary dissemination barriers: every node hears from every other, in ceil(log_k N) stages") {
  for (int n = 2; n <= 40; ++n) {
    for (int k = 2; k <= n + 1; ++k) {
      INFO(n << " machines, radix " << k);
      const Schedule s = barrier_schedule(n, k);
      int stages = 0;
      for (long reach = 1; reach < n; reach *= k) ++stages;
      REQUIRE(s.programs.size() == static_cast<std::size_t>(n));
      CHECK(s.programs[0].rounds.size() == static_cast<std::size_t>(stages + 1));
      for (const auto& know : barrier_knowledge(s)) CHECK(know.size() == static_cast<std::size_t>(n));
    }
  }
  CHECK(barrier_schedule(8, 8).syncs.size() == 8 * 7);  // one stage: every node to every other
  CHECK(barrier_schedule(8, 2).syncs.size() == 3 * 8);
  CHECK_THROWS_AS(barrier_schedule(8, 1), std::invalid_argument);
  // Named by its radix, which the ranks compare at the start; a radix of N or more is N's.
  CHECK(barrier_schedule(7, 2).algorithm == "barrier:2");
  CHECK(barrier_schedule(7, 7).algorithm == "barrier:7");
  CHECK(barrier_schedule(7, 9).algorithm == "barrier:7");
  CHECK(barrier_schedule(7, 9).syncs.size() == barrier_schedule(7, 7).syncs.size());
  // The radix the daemons use, where a hop costs what a token does (choice.cpp): one stage of
  // two tokens for 3 machines, stages of one token from there.
  CHECK(barrier_radix(3) == 3);
  CHECK(barrier_radix(8) == 2);
  CHECK(barrier_radix(64) == 2);
  // aapcd --barrier-radix K: K, within 2 and the number of machines.
  CHECK(barrier_radix(8, 3) == 3);
  CHECK(barrier_radix(8, 20) == 8);
  CHECK(barrier_radix(12, 1) == 2);
  CHECK(barrier_radix(1, 4) == 2);
}

TEST_CASE("a barrier that loses a token does not reach everyone") {
  Schedule s = barrier_schedule(8, 2);
  // Node 2's first token (sync 2, to node 3) is gone, and node 3 no longer waits for it.
  s.programs[3].rounds[1].waits.clear();
  for (auto& r : s.programs[2].rounds) r.emits.erase(std::remove(r.emits.begin(), r.emits.end(), 2U), r.emits.end());
  const auto know = barrier_knowledge(s);
  CHECK(std::any_of(know.begin(), know.end(), [](const std::set<int>& k) { return k.size() < 8; }));
}
