// The predictor (schedules/src/predict.cpp): the longest path through a plan's rounds and
// tokens. Analytic cases on one switch, the hand-over terms one at a time, the walk over the
// phases alone against the walk over the planned tokens on shipped and random trees with mixed
// rates, every sync variant, the paced shuffle, and a plan whose tokens deadlock. How long it
// takes at 1,024 and 4,096 machines is aapc-sched-bench's to say, not a test's.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/predict.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/tree.hpp"
#include "mixed_trees.hpp"
#include "paths.hpp"

using namespace aapc::sched;

namespace {

// Every hand-over term at zero: a token costs nothing.
PredictOptions free_hand_over(std::uint64_t block) {
  PredictOptions o;
  o.block_bytes = block;
  o.hand_over = HandOver{0.0, 0.0, 1.0, 0, 0.0, 0.0, 0.0, 0.0, TokenLeaves::kDrained};
  return o;
}

// A block's bits on the wire, spelled out: frames of 1,470 bytes of it at MTU 1500, each with
// 14 + 30 bytes of headers and 24 of FCS, preamble and gap.
double wire_bits(std::uint64_t block) {
  const std::uint64_t frames = (block + 1469) / 1470;
  return 8.0 * static_cast<double>(block + frames * (14 + 30 + 24));
}

Prediction planned(const Topology& t, const std::string& algo, const std::string& sync, const PredictOptions& o) {
  return predict(t, plan_sync(t, make_schedule(t, *AlgorithmSpec::parse(algo)), *SyncSpec::parse(sync)), o);
}

Topology mixed_rate_tree(std::mt19937_64& rng) {
  static const std::vector<std::string> kRates = {"100Mbit", "1Gbit", "10Gbit", "100Gbit"};
  return aapc::test::mixed_rate_tree(rng, 24, 6, kRates, 3);
}

}  // namespace

TEST_CASE("on one switch with free hand-overs the tree's phases take the analytic time") {
  // 8 machines at 10 Gbit/s: 7 phases, every node sends in each, and a block's last frame then
  // takes one frame time (1,538 bytes) from the switch to its receiver.
  const Topology t = single_switch_topology(8, 10'000'000'000ULL);
  const std::uint64_t block = 64 * 1024;
  const Prediction p = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), free_hand_over(block));
  const double expected = 7.0 * wire_bits(block) / 1e10 + 1538.0 * 8.0 / 1e10;
  CHECK(p.time_s == Approx(expected).epsilon(1e-12));
  CHECK(p.limit_s == Approx(7.0 * 8.0 * block / 1e10).epsilon(1e-12));
  CHECK(p.hand_over_s == Approx(0.0).margin(1e-12));
}

TEST_CASE("with free hand-overs the critical path is the bottleneck's phases of data") {
  for (const char* name : {"8-two-switch", "12-three-level", "64-two-level"}) {
    const Topology t = load_topology(aapc::test::topology_path(name));
    const std::int64_t load = TreeModel(t).load();
    const Prediction p = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), free_hand_over(256 * 1024));
    INFO(name);
    CHECK(p.path_rounds == load);
    CHECK(p.hand_over_s == Approx(0.0).margin(1e-12));
    CHECK(p.data_s == Approx(static_cast<double>(load) * wire_bits(256 * 1024) / static_cast<double>(t.links().front().rate_bps)).epsilon(1e-12));
    CHECK(p.data_s + p.hand_over_s + p.waiting_s == Approx(p.path_s).epsilon(1e-12));
  }
}

TEST_CASE("a per-link term lengthens the hand-overs on the critical path by the term times the links its tokens cross") {
  const Topology t = load_topology(aapc::test::topology_path("12-three-level"));
  PredictOptions o;
  o.block_bytes = 64 * 1024;
  const Prediction base = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o);
  o.hand_over.per_link_s = 1e-9;
  const Prediction more = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o);
  REQUIRE(more.path_tokens == base.path_tokens);
  REQUIRE(more.path_token_links > more.path_tokens);  // on three levels some tokens cross more than two links
  CHECK(more.hand_over_s - base.hand_over_s == Approx(1e-9 * static_cast<double>(more.path_token_links)).epsilon(1e-6));
  CHECK(more.path_s > base.path_s);
}

TEST_CASE("each hand-over term makes the exchange longer, and earlier tokens make it shorter") {
  const Topology t = load_topology(aapc::test::topology_path("8-two-switch"));
  PredictOptions o;
  o.block_bytes = 16 * 1024;
  const auto time = [&](const PredictOptions& x) { return predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), x).time_s; };
  const double base = time(o);
  PredictOptions x = o;
  x.hand_over.per_switch_s += 1e-6;
  CHECK(time(x) > base);
  x = o;
  x.hand_over.per_nic_s += 1e-6;
  CHECK(time(x) > base);
  x = o;
  x.hand_over.engine_s += 1e-6;
  CHECK(time(x) > base);
  x = o;
  x.hand_over.frames_ahead += 1.0;
  CHECK(time(x) > base);
  x = o;
  x.hand_over.leaves = TokenLeaves::kArrived;
  CHECK(time(x) > base);
  x = o;
  x.hand_over.lead_s = 2e-6;
  CHECK(time(x) < base);
}

TEST_CASE("a block's last frame held at each link lengthens receiver-based hand-overs only") {
  const Topology t = load_topology(aapc::test::topology_path("12-three-level"));
  PredictOptions o;
  o.block_bytes = 64 * 1024;
  const auto time = [&](const char* sync, double store_forward) {
    PredictOptions x = o;
    x.hand_over.store_forward = store_forward;
    return predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse(sync), x).time_s;
  };
  // Sender-based tokens wait for no block: only the exchange's last block arrives later, by at
  // most its frame stored at each link of the longest path (6 links, 1,514 bytes at 100 Mbit/s).
  const double frame_s = 1514 * 8 / 100e6;
  const double sender = time("sender-all", 1.0) - time("sender-all", 0.0);
  const double receiver = time("receiver-all", 1.0) - time("receiver-all", 0.0);
  CHECK(sender > 0.0);
  CHECK(sender <= 6 * frame_s);
  CHECK(receiver > 20 * sender);  // every hand-over waits for it
  CHECK(time("receiver-all", 0.5) < time("receiver-all", 1.0));
  CHECK(time("receiver-all", 0.0) < time("receiver-all", 0.5));
  o.hand_over.store_forward = -1.0;
  CHECK_THROWS_AS(predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("receiver-all"), o), std::invalid_argument);
}

TEST_CASE("the walk over the tree's phases alone finds the planned tokens' longest path") {
  std::mt19937_64 rng(38);
  std::vector<Topology> trees;
  for (const char* name : {"8-two-switch", "12-three-level", "64-three-level"}) trees.push_back(load_topology(aapc::test::topology_path(name)));
  for (int i = 0; i < 60; ++i) trees.push_back(mixed_rate_tree(rng));
  for (const Topology& t : trees) {
    for (const char* sync : {"sender-all", "none", "sender-partial:3", "receiver-all", "receiver-partial:2"}) {
      for (double lead : {0.0, 2e-6}) {
        PredictOptions o;
        o.block_bytes = 64 * 1024;
        o.hand_over.lead_s = lead;
        // Receiver-based tokens leave on arrival whatever the option says.
        if (sync[0] == 'r' && lead > 0.0) o.hand_over.leaves = TokenLeaves::kArrived;
        const Prediction fast = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse(sync), o);
        const Prediction slow = planned(t, "tree", sync, o);
        INFO(t.machine_count() << " machines, " << sync);
        CHECK(fast.streamed);
        CHECK_FALSE(slow.streamed);
        CHECK(fast.time_s == Approx(slow.time_s).epsilon(1e-12));
        CHECK(fast.path_s == Approx(slow.path_s).epsilon(1e-12));
        CHECK(fast.path_rounds == slow.path_rounds);
        CHECK(fast.path_tokens == slow.path_tokens);
      }
    }
  }
}

TEST_CASE("contention-free phases with tokens never beat their busiest link, and no prediction beats the limit") {
  std::mt19937_64 rng(4096);
  for (int i = 0; i < 40; ++i) {
    const Topology t = mixed_rate_tree(rng);
    // Variants that order every two phases that share a link (the partial ones without a
    // barrier let the phases of a block overlap on purpose).
    for (const char* sync : {"sender-all", "receiver-all", "barrier-all", "barrier-partial-sender:2", "barrier-partial-receiver:2"}) {
      PredictOptions o;
      o.block_bytes = 16 * 1024;
      const Prediction p = planned(t, "tree", sync, o);
      INFO(t.machine_count() << " machines, " << sync);
      CHECK(p.path_s >= p.link_bound_s);
      CHECK(p.fraction() > 0.0);
      CHECK(p.fraction() < 1470.0 / 1538.0);  // the payload's share of a frame on the wire
    }
  }
}

TEST_CASE("every sync variant and the shuffles are predicted on three levels") {
  const Topology t = load_topology(aapc::test::topology_path("12-three-level"));
  PredictOptions o;
  o.block_bytes = 64 * 1024;
  for (const std::string& sync : SyncSpec::names()) {
    const Prediction p = planned(t, "tree", sync, o);
    INFO(sync);
    CHECK(p.time_s >= p.limit_s);
    CHECK(p.data_s + p.hand_over_s + p.waiting_s == Approx(p.path_s).epsilon(1e-12));
  }
  // Blocks overlap on the tree's links: the busiest link decides, not the path.
  for (const char* algo : {"sync-shuffle", "group-shuffle", "pairwise", "ring"}) {
    const Prediction p = planned(t, algo, "none", o);
    INFO(algo);
    CHECK(p.time_s == p.link_bound_s);
    CHECK(p.path_s < p.link_bound_s);
  }
}

TEST_CASE("the paced shuffle's one round lasts a block's wire time at its paced rate") {
  const Topology t = load_topology(aapc::test::topology_path("12-three-level"));
  const Schedule s = make_schedule(t, *AlgorithmSpec::parse("paced-shuffle"));
  REQUIRE(s.block_rate_bps > 0);
  PredictOptions o;
  o.block_bytes = 256 * 1024;
  const Prediction p = predict(t, s, o);
  CHECK(p.path_rounds == 1);
  CHECK(p.path_tokens == 0);
  CHECK(p.data_s == Approx(wire_bits(o.block_bytes) / static_cast<double>(s.block_rate_bps)).epsilon(1e-12));
  CHECK(p.time_s == p.path_s);
}

TEST_CASE("combining schedules send a step's blocks as one message") {
  const Topology t = single_switch_topology(8, 1'000'000'000ULL);
  PredictOptions o;
  o.block_bytes = 1024;
  const Prediction p = planned(t, "bruck", "none", o);
  CHECK(p.path_rounds == 3);  // ceil(log2 8) steps, each after the previous one's message arrived
  CHECK(p.time_s > 3.0 * wire_bits(4 * 1024) / 1e9);  // each step forwards half the blocks: 4 of them
}

TEST_CASE("a plan whose tokens wait for each other is refused") {
  const Topology t = single_switch_topology(2);
  Schedule s = make_schedule(t, *AlgorithmSpec::parse("pairwise"));
  REQUIRE(s.programs.size() == 2);
  // Each machine's only round waits for a token that the other's only round emits.
  s.syncs = {Sync{0, 0, 1, SyncTrigger::kAfterSend, 0, -1, 0}, Sync{1, 1, 0, SyncTrigger::kAfterSend, 0, -1, 0}};
  s.programs[0].rounds[0].emits = {0};
  s.programs[1].rounds[0].waits = {0};
  s.programs[1].rounds[0].emits = {1};
  s.programs[0].rounds[0].waits = {1};
  CHECK_THROWS_WITH(predict(t, s, PredictOptions{}), Catch::Contains("deadlock"));
}

TEST_CASE("a block of no bytes, a negative hand-over term or a plan for another cluster is refused") {
  const Topology t = load_topology(aapc::test::topology_path("8-two-switch"));
  PredictOptions o;
  o.block_bytes = 0;
  CHECK_THROWS_WITH(predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o), Catch::Contains("block size"));
  o.block_bytes = 1024;
  o.hand_over.per_nic_s = -1e-6;
  CHECK_THROWS_WITH(predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o), Catch::Contains("at least 0"));
  const Schedule other = make_schedule(single_switch_topology(4), *AlgorithmSpec::parse("pairwise"));
  CHECK_THROWS_WITH(predict(t, other, PredictOptions{}), Catch::Contains("4 machines"));
}

TEST_CASE("a share of the links' rate stretches the data by its inverse") {
  const Topology t = load_topology(aapc::test::topology_path("12-three-level"));
  PredictOptions o = free_hand_over(64 * 1024);
  const Prediction full = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o);
  o.link_share = 0.5;
  const Prediction half = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o);
  CHECK(half.data_s == Approx(2.0 * full.data_s).epsilon(1e-12));
  CHECK(half.limit_s == full.limit_s);  // the limit stays that of the full rates
  o.link_share = 0.0;
  CHECK_THROWS_WITH(predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o), Catch::Contains("share"));
}

TEST_CASE("the engine's token lead is one smallest switch buffer spread over the phases, within the round's last frame") {
  // 8-two-switch: switch ports of 64 KiB (the default), 16 phases, 100 Mbit/s: 4 KiB of slack.
  const Topology t = load_topology(aapc::test::topology_path("8-two-switch"));
  const double slack = 65536.0 * 8.0 / 16.0 / 1e8;
  // At MTU 1500 a block's last frame is shorter than the slack: the token leaves with it. 64 KiB
  // is 44 frames of 1,470 bytes and one of 856; 3 x 1,470 bytes end with a whole frame.
  CHECK(engine_token_lead_s(t, 16, 100'000'000, 65536) == Approx((856.0 + 14 + 30) * 8.0 / 1e8).epsilon(1e-12));
  CHECK(engine_token_lead_s(t, 16, 100'000'000, 1470 * 3) == Approx((1470.0 + 14 + 30) * 8.0 / 1e8).epsilon(1e-12));
  // At MTU 9000 a whole last frame (8,970 bytes of the block) takes longer than the slack.
  const Topology jumbo = load_topology(aapc::test::topology_path("8-two-switch-jumbo"));
  CHECK(engine_token_lead_s(jumbo, 16, 100'000'000, 8970 * 2) == Approx(slack).epsilon(1e-12));
  CHECK(engine_token_lead_s(t, 0, 100'000'000, 65536) == 0.0);
}

TEST_CASE("a sender-based token waits for frames ahead only past its own link") {
  // On one switch every token crosses two links: its emitter's, where the frame ahead is the
  // round's own last one, and the waiter's, where one more frame ahead costs a frame time.
  const Topology t = single_switch_topology(6, 1'000'000'000ULL);
  PredictOptions o = free_hand_over(16 * 1024);
  const Prediction none = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o);
  o.hand_over.frames_ahead = 1.0;
  const Prediction one = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), o);
  REQUIRE(one.path_tokens > 0);
  const double frame_s = (1500.0 + 14.0 + 24.0) * 8.0 / 1e9;
  CHECK(one.hand_over_s - none.hand_over_s == Approx(static_cast<double>(one.path_tokens) * frame_s).epsilon(1e-9));
}
