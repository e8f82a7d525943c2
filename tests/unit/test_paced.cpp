// The paced shuffle (schedules/src/paced_shuffle.cpp): every block paced so that no link of the
// tree carries more than its rate while all blocks are in flight at once, on shipped and random
// trees with mixed link rates, and the verifier's rate check that guards it.
#include <catch2/catch.hpp>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/tree.hpp"
#include "aapc/sched/verify.hpp"
#include "mixed_trees.hpp"
#include "paths.hpp"

using namespace aapc::sched;

TEST_CASE("paced-shuffle paces each block at the limiting link's rate over its load") {
  // 8-two-switch: 4 + 4 machines, 16 blocks each way over the switches' link; 7 blocks on each
  // machine's own link.
  Topology t = load_topology(aapc::test::topology_path("8-two-switch"));
  Schedule s = make_schedule(t, *AlgorithmSpec::parse("paced-shuffle"));
  CHECK(s.algorithm == "paced-shuffle");
  REQUIRE(s.programs.size() == 8);
  for (const Program& prog : s.programs) {
    REQUIRE(prog.rounds.size() == 1);
    CHECK(prog.rounds[0].sends.size() == 7);
  }
  const std::uint64_t rate = t.links().front().rate_bps;
  CHECK(s.block_rate_bps == static_cast<std::uint64_t>(kPacedShare * static_cast<double>(rate) / 16.0));
  auto report = verify(t, s);
  INFO(report.summary());
  CHECK(report.ok());
}

TEST_CASE("a schedule paced faster than a link's rate over its load fails verification") {
  Topology t = load_topology(aapc::test::topology_path("8-two-switch"));
  Schedule s = make_schedule(t, *AlgorithmSpec::parse("paced-shuffle"));
  const std::uint64_t rate = t.links().front().rate_bps;
  s.block_rate_bps = rate / 16 + 1;  // the switches' link would carry 16 such blocks
  auto report = verify(t, s);
  REQUIRE_FALSE(report.ok());
  CHECK_THAT(report.errors.front(), Catch::Contains("carries 16 blocks"));
  s.block_rate_bps = rate / 16;
  CHECK(verify(t, s).ok());
}

TEST_CASE("paced-shuffle keeps every link within its rate on 500 random trees with mixed rates") {
  std::mt19937_64 rng(20261127);
  const std::vector<std::string> rates = {"100Mbit", "1Gbit", "2.5Gbit", "10Gbit", "400Gbit"};
  const int trials = aapc::test::scaled(500);
  for (int trial = 0; trial < trials; ++trial) {
    Topology t = aapc::test::mixed_rate_tree(rng, 40, 8, rates);
    Schedule s = paced_shuffle_schedule(TreeModel(t));
    auto report = verify(t, s);
    INFO("trial " << trial << ": " << report.summary());
    REQUIRE(report.ok());
    // Paced at exactly rate / load of the limiting link, the exchange takes Faraj/Yuan's bound.
    Schedule tight = paced_shuffle_schedule(TreeModel(t), 1.0);
    const double pairs = static_cast<double>(t.machine_count()) * (t.machine_count() - 1);
    // (to the bit per second that the rate is rounded down to)
    const double carried = static_cast<double>(tight.block_rate_bps) * pairs, peak = TreeModel(t).peak_aggregate_bps();
    CHECK(carried <= peak);
    CHECK(carried > peak - pairs);
    CHECK(verify(t, tight).ok());
  }
}

TEST_CASE("paced-shuffle is parsed, named and chosen like every schedule") {
  CHECK(AlgorithmSpec::parse("paced-shuffle")->name() == "paced-shuffle");
  CHECK_FALSE(AlgorithmSpec::parse("paced-shuffle:3"));
  Topology t = load_topology(aapc::test::topology_path("12-three-level"));
  Choice c = choose(TreeModel(t), "paced-shuffle", 65536);
  CHECK(c.algorithm.algorithm == Algorithm::kPacedShuffle);
  CHECK(c.sync.kind == SyncKind::kNone);
}
