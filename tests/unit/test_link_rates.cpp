// Trees whose links differ in rate: every planned round whose blocks would leave faster than a
// link on their path carries is capped at that link's rate (sched::cap_round_rates), and the
// verifier refuses a contention-free schedule whose rounds are not.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/tree.hpp"
#include "aapc/sched/verify.hpp"
#include "mixed_trees.hpp"
#include "paths.hpp"

using namespace aapc::sched;

namespace {

// Two switches, s1 holding no machine: a at 200 Mbit/s and b at 100 on s2, c and d at 50 on
// s0, the switches joined at 100.
Topology mixed() {
  return Topology::from_spec(read_dot(R"(graph g {
    a [mac="02:00:00:00:00:01"]; b [mac="02:00:00:00:00:02"]; c [mac="02:00:00:00:00:03"]; d [mac="02:00:00:00:00:04"];
    s0 -- s1 [rate="100Mbit"]; s0 -- s2 [rate="100Mbit"];
    s2 -- a [rate="200Mbit"]; s2 -- b [rate="100Mbit"]; s0 -- c [rate="50Mbit"]; s0 -- d [rate="50Mbit"];
  })",
                                      "mixed"));
}

// The cap of node `c`'s round that sends to `dst` alone.
std::uint64_t cap_to(const Schedule& s, Rank c, Rank dst) {
  for (const Round& round : s.programs[static_cast<std::size_t>(c)].rounds)
    if (round.sends.size() == 1 && round.sends.front().dst == dst) return round.rate_bps;
  FAIL("no round of " << c << " sends to " << dst << " alone");
  return 0;
}

}  // namespace

TEST_CASE("the tree's phases pace each block at the slowest link of its path where the sender's is faster") {
  const Topology t = mixed();
  for (const char* sync : {"sender-all", "receiver-all", "none"}) {
    INFO(sync);
    const Schedule s = plan_sync(t, make_schedule(t, *AlgorithmSpec::parse("tree")), *SyncSpec::parse(sync));
    CHECK(cap_to(s, 0, 2) == 50'000'000);   // a (200) -> s2 -> s0 (100) -> c (50)
    CHECK(cap_to(s, 0, 1) == 100'000'000);  // a (200) -> b (100)
    CHECK(cap_to(s, 1, 2) == 50'000'000);   // b (100) -> c (50)
    CHECK(cap_to(s, 1, 0) == 0);            // b (100) -> a (200): b's own link is the slowest
    CHECK(cap_to(s, 2, 3) == 0);            // c (50) -> d (50)
    CHECK(cap_to(s, 2, 0) == 0);
    const VerifyReport report = verify(t, s);
    INFO(report.summary());
    CHECK(report.ok());
    // Each node's part caps its rounds as the whole plan does.
    for (Rank node = 0; node < t.machine_count(); ++node) {
      const Schedule part = plan_part(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse(sync), node);
      const auto& mine = part.programs[static_cast<std::size_t>(node)].rounds;
      const auto& whole = s.programs[static_cast<std::size_t>(node)].rounds;
      REQUIRE(mine.size() == whole.size());
      for (std::size_t r = 0; r < mine.size(); ++r) CHECK(mine[r].rate_bps == whole[r].rate_bps);
    }
  }
}

TEST_CASE("a contention-free schedule whose block leaves faster than a link on its path fails verification") {
  const Topology t = mixed();
  Schedule s = plan_sync(t, make_schedule(t, *AlgorithmSpec::parse("tree")), *SyncSpec::parse("sender-all"));
  for (Program& p : s.programs)
    for (Round& round : p.rounds) round.rate_bps = 0;
  const VerifyReport report = verify(t, s);
  REQUIRE_FALSE(report.ok());
  CHECK_THAT(report.errors.front(), Catch::Contains("faster than edge"));
}

TEST_CASE("on one switch with hosts of different rates, the phased single-switch schedules are capped at the receiver's link, and auto leaves the synchronous shuffle") {
  const Topology t = Topology::from_spec(read_dot(R"(graph g {
    a [mac="02:00:00:00:00:01"]; b [mac="02:00:00:00:00:02"]; c [mac="02:00:00:00:00:03"];
    s -- a [rate="1Gbit"]; s -- b [rate="1Gbit"]; s -- c [rate="10Mbit"];
  })",
                                                  "one-switch"));
  for (const char* algorithm : {"pairwise-ec", "linear", "ring"}) {
    INFO(algorithm);
    const Schedule s = plan_sync(t, make_schedule(t, *AlgorithmSpec::parse(algorithm)), *SyncSpec::parse("none"));
    CHECK(cap_to(s, 0, 2) == 10'000'000);
    CHECK(cap_to(s, 0, 1) == 0);
    CHECK(cap_to(s, 2, 0) == 0);
    CHECK(verify(t, s).ok());
  }
  // The shuffles' packet slots are permutations only at one rate: no longer claimed free of
  // contention, and auto runs the paced shuffle (every block at the slow host's share) where
  // the queues no longer absorb what the slow link takes slower (2 x 256 KiB against 3 x 64K).
  CHECK_FALSE(make_schedule(t, *AlgorithmSpec::parse("sync-shuffle")).contention_free);
  CHECK(auto_choice(t, 256 * 1024).algorithm.algorithm == Algorithm::kPacedShuffle);
  CHECK(auto_choice(t, 4 * 1024).algorithm.algorithm == Algorithm::kSyncShuffle);
  const Topology even = single_switch_topology(3, 1'000'000'000);
  CHECK(make_schedule(even, *AlgorithmSpec::parse("sync-shuffle")).contention_free);
  CHECK(auto_choice(even, 64 * 1024).algorithm.algorithm == Algorithm::kSyncShuffle);
}

TEST_CASE("trees whose links all run at one rate get no cap: the shipped topologies' plans are unchanged") {
  for (const char* name : {"8-two-switch", "12-three-level", "8-one-switch", "fy-eval-c-32-chain"}) {
    const Topology t = load_topology(aapc::test::topology_path(name));
    for (const char* algorithm : {"tree", "pairwise-ec", "sync-shuffle", "paced-shuffle"}) {
      INFO(name << " " << algorithm);
      const Schedule s = plan_sync(t, make_schedule(t, *AlgorithmSpec::parse(algorithm)), *SyncSpec::parse("none"));
      for (const Program& p : s.programs)
        for (const Round& round : p.rounds) CHECK(round.rate_bps == 0);
    }
  }
}

TEST_CASE("the tree's phases keep every block within every link of its path on 300 random trees with mixed rates") {
  std::mt19937_64 rng(20261205);
  const std::vector<std::string> rates = {"10Mbit", "100Mbit", "1Gbit", "2.5Gbit", "10Gbit"};
  const int trials = aapc::test::scaled(300);
  int capped = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const Topology t = aapc::test::mixed_rate_tree(rng, 24, 6, rates);
    const char* sync = trial % 2 == 0 ? "sender-all" : "receiver-all";
    const Schedule s = plan_sync(t, make_schedule(t, *AlgorithmSpec::parse("tree")), *SyncSpec::parse(sync));
    const VerifyReport report = verify(t, s);
    INFO("trial " << trial << " (" << sync << "): " << report.summary());
    REQUIRE(report.ok());
    for (const Program& p : s.programs)
      for (const Round& round : p.rounds) capped += round.rate_bps > 0 ? 1 : 0;
  }
  CHECK(capped > 0);  // the rates did differ along some paths
}

TEST_CASE("uplinks four times the hosts' links: the phases reach 7/16 of the limit, and auto runs the paced shuffle wherever it would have run them") {
  // 8-two-switch with its hosts at 1 Gbit/s and the switches' link at 4: the link still carries
  // the most blocks (16, so 16 phases), but the hosts' links, 7 blocks each, set the limit.
  const Topology fat = Topology::from_spec(read_dot(R"(graph g {
    n0 [mac="02:00:00:00:00:01"]; n1 [mac="02:00:00:00:00:02"]; n2 [mac="02:00:00:00:00:03"]; n3 [mac="02:00:00:00:00:04"];
    n4 [mac="02:00:00:00:00:05"]; n5 [mac="02:00:00:00:00:06"]; n6 [mac="02:00:00:00:00:07"]; n7 [mac="02:00:00:00:00:08"];
    edge [rate="1Gbit"]; s0 -- s1 [rate="4Gbit"];
    s0 -- n0; s0 -- n1; s0 -- n2; s0 -- n3; s1 -- n4; s1 -- n5; s1 -- n6; s1 -- n7;
  })",
                                                    "fat-uplink"));
  const TreeModel model(fat);
  CHECK_FALSE(model.uniform_rates());
  CHECK(model.phase_efficiency() == Approx(7.0 / 16).epsilon(0.05));
  for (std::uint64_t block : {std::uint64_t{20'000}, std::uint64_t{256 * 1024}}) {
    INFO(block);
    CHECK(auto_choice(model, block).algorithm.algorithm == Algorithm::kPacedShuffle);
  }
  CHECK(auto_choice(model, 8).algorithm.algorithm == Algorithm::kBruck);  // tiny blocks as before

  // The same tree at one rate: the phases make up the limit, and auto keeps them below 32 KiB.
  const Topology even = load_topology(aapc::test::topology_path("8-two-switch"));
  const TreeModel even_model(even);
  CHECK(even_model.uniform_rates());
  CHECK(even_model.phase_efficiency() == 1.0);
  CHECK(auto_choice(even_model, 20'000).algorithm.algorithm == Algorithm::kTree);
}

namespace {

// 8-two-switch with its hosts at 100 Mbit/s and the switches' link at `uplink`.
Topology two_switches(const char* uplink) {
  return Topology::from_spec(read_dot(std::string(R"(graph g {
    n0 [mac="02:00:00:00:00:01"]; n1 [mac="02:00:00:00:00:02"]; n2 [mac="02:00:00:00:00:03"]; n3 [mac="02:00:00:00:00:04"];
    n4 [mac="02:00:00:00:00:05"]; n5 [mac="02:00:00:00:00:06"]; n6 [mac="02:00:00:00:00:07"]; n7 [mac="02:00:00:00:00:08"];
    edge [rate="100Mbit"]; s0 -- s1 [rate=")") + uplink + R"("];
    s0 -- n0; s0 -- n1; s0 -- n2; s0 -- n3; s1 -- n4; s1 -- n5; s1 -- n6; s1 -- n7;
  })",
                                      "two-switches"));
}

}  // namespace

TEST_CASE("a link slower than the hosts that feed it gathers more of its blocks in its queue, and auto's small-block rule counts them") {
  // Without tokens each host sends its 7 blocks one after another, each at its path's slowest
  // rate: 3 at 100 Mbit/s and 4 over the 25 Mbit/s link, so 4 / (3/100 + 4/25) = 21.05 Mbit/s of
  // them cross it from each host, 84.2 from four. Of the link's 16 blocks, 1 - 25/84.2 queue.
  const Topology slow_link = two_switches("25Mbit");
  const TreeModel slow(slow_link);
  CHECK(slow.unpaced_queue_blocks() == Approx(16 * (1 - 25 / (4 * 4 / (3 / 100.0 + 4 / 25.0)))));
  // At one rate: 16 blocks arrive at 4 x 4/7 of the link's rate, so 16 - 7 of them queue.
  const Topology even = load_topology(aapc::test::topology_path("8-two-switch"));
  const TreeModel even_model(even);
  CHECK(even_model.unpaced_queue_blocks() == Approx(9.0));

  // 10,000-byte blocks: 16 of them are below three switch buffers (196,608 bytes), which on one
  // rate lets the pairwise exchange run without tokens; over the slow link 11.25 of them
  // (112,500 bytes) would queue where one and a half buffers hold 98,304: the phases run.
  CHECK(auto_choice(even_model, 10'000).algorithm.algorithm == Algorithm::kPairwiseEc);
  const Choice slow_choice = auto_choice(slow, 10'000);
  CHECK(slow_choice.algorithm.algorithm == Algorithm::kTree);
  CHECK(slow_choice.sync.kind == SyncKind::kSenderAll);
  CHECK(auto_choice(slow, 8'000).algorithm.algorithm == Algorithm::kPairwiseEc);  // 90,000 bytes queue
  // A link faster than its feeders need queues nothing.
  const Topology fast_link = two_switches("1Gbit");
  CHECK(TreeModel(fast_link).unpaced_queue_blocks() == Approx(0.0).margin(1e-9));
}

TEST_CASE("below 32 KiB, where rates differ, the phases run wherever they would reach what the paced shuffle reaches at that size") {
  // Hosts at 100 Mbit/s and the switches' link at 115: 16 phases, each at a host's rate, where
  // the link's 16 blocks at 115 set the limit, so the phases reach 100/115 of it (less the
  // frames' headers, which the limit does not count: 84%).
  const Topology link = two_switches("115Mbit");
  const TreeModel model(link);
  CHECK(model.phase_efficiency() == Approx(100.0 / 115).epsilon(0.04));
  CHECK(model.phase_efficiency() > 0.8);
  CHECK(model.phase_efficiency() < 0.86);
  CHECK(auto_choice(model, 14'000).algorithm.algorithm == Algorithm::kTree);  // the paced shuffle reaches 80% here
  CHECK(auto_choice(model, 20'000).algorithm.algorithm == Algorithm::kPacedShuffle);  // and 86% here
  CHECK(auto_choice(model, 256 * 1024).algorithm.algorithm == Algorithm::kPacedShuffle);
}
