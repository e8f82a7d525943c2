// `auto` by measurement: where the cluster's daemons measured their tree exchanges (how fast a
// node sends a phase's block, what each phase loses to its hand-over), the tree's phases are
// weighed with it against the paced shuffle (sched::phases_reach, docs/design.md, Fast links).
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <vector>

#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/tree.hpp"
#include "paths.hpp"

using namespace aapc::sched;

namespace {

TreeModel shipped(const char* name) {
  static std::vector<std::unique_ptr<Topology>> kept;  // the model refers to its topology
  kept.push_back(std::make_unique<Topology>(load_topology(aapc::test::topology_path(name))));
  return TreeModel(*kept.back());
}

}  // namespace

TEST_CASE("a node's tree exchanges fitted, then weighed back, give the fraction of the limit they reached at each size") {
  const TreeModel model = shipped("8-two-switch");  // 100 Mbit/s, 16 phases over the switches' link
  const double best = model.best_time_s(16 * 1024);
  CHECK(best == Approx(8 * 7 * 16 * 1024 * 8 / 350e6));
  const auto one = tree_sample(model, 16 * 1024, 1.5 * best);
  REQUIRE(one);
  CHECK(one->model_s == Approx(best / 16));
  CHECK(one->took_s == Approx(1.5 * best / 16));
  CHECK_FALSE(tree_sample(model, kAnyBlockSize, best));  // alltoallv: blocks of no one size

  // Phases at 80% of their rate, each 200 us longer: exchanges of three sizes, one of them
  // slowed by a busy host, fit back to both.
  const Measured truth{0.8, 200e-6};
  std::vector<TreeSample> samples;
  for (std::uint64_t block : {4096, 16384, 65536, 65536, 262144}) {
    const double took = model.best_time_s(block) / truth.fill + 16 * truth.hand_over_s;
    samples.push_back(*tree_sample(model, block, took));
    CHECK(phases_reach(model, block, truth) == Approx(model.best_time_s(block) / took));
  }
  samples[2].took_s *= 1.5;
  const Measured fitted = fit_measured(samples);
  CHECK(fitted.fill == Approx(truth.fill));
  CHECK(fitted.hand_over_s == Approx(truth.hand_over_s));
  // One size: all of it is fill, and the phases reach there what they reached.
  const Measured one_size = fit_measured({*one, *one});
  CHECK(one_size.fill == Approx(1 / 1.5));
  CHECK(one_size.hand_over_s == 0.0);
  CHECK(phases_reach(model, 16 * 1024, one_size) == Approx(1 / 1.5));
  // Quicker than the model: never a fill above 1; none measured: the model's phases alone.
  CHECK(fit_measured({*tree_sample(model, 16 * 1024, 0.9 * best)}).fill == 1.0);
  CHECK_FALSE(fit_measured({}).known());
  CHECK(phases_reach(model, 16 * 1024) == model.phase_efficiency());
}

TEST_CASE("below 32 KiB on a tree of switches, auto runs the paced shuffle where the measured hand-over and send rate leave the phases below it") {
  const TreeModel model = shipped("8-two-switch");
  // What the daemons of 8-two-switch at 500 Mbit/s agreed on, on the 2-core VM, scaled to its
  // 100 Mbit/s: the phases crossed at 86% of their rate, and each lost 244 us at 500, 5 x 244 at
  // 100. And what they agreed on at 100 Mbit/s: 97% and 101 us.
  const Measured slow{0.86, 5 * 244e-6};
  const Measured at_100{0.97, 101e-6};
  const Measured quick{1.0, 10e-6};
  for (std::uint64_t block : {std::uint64_t{16 * 1024}, std::uint64_t{24 * 1024}}) {
    INFO(block);
    CHECK(auto_choice(model, block).algorithm.algorithm == Algorithm::kTree);  // the model alone
    CHECK(auto_choice(model, block, quick).algorithm.algorithm == Algorithm::kTree);
    CHECK(auto_choice(model, block, at_100).algorithm.algorithm == Algorithm::kTree);
    const Choice c = auto_choice(model, block, slow);
    CHECK(c.algorithm.algorithm == Algorithm::kPacedShuffle);
    CHECK_THAT(c.reason, Catch::Contains("this cluster measured"));
    CHECK(choose(model, "auto", block, slow).algorithm.algorithm == Algorithm::kPacedShuffle);
    CHECK(choose(model, "tree", block, slow).algorithm.algorithm == Algorithm::kTree);  // a schedule given is run
  }
  // At 12 KiB the paced shuffle reaches 80% (below 16 KiB): the hand-over at which the phases
  // reach that too is the boundary, the phases on its one side and the paced shuffle on the other.
  const double best = model.best_time_s(12 * 1024);
  const double boundary = (best / 0.8 - best) / 16;  // about 0.25 ms
  CHECK(auto_choice(model, 12 * 1024, {1.0, 0.95 * boundary}).algorithm.algorithm == Algorithm::kTree);
  CHECK(auto_choice(model, 12 * 1024, {1.0, 1.05 * boundary}).algorithm.algorithm == Algorithm::kPacedShuffle);
  // Small blocks whose queues absorb the contention, and tiny ones, are chosen as before.
  CHECK(auto_choice(model, 4 * 1024, slow).algorithm.algorithm == Algorithm::kPairwiseEc);
  CHECK(auto_choice(model, 8, slow).algorithm.algorithm == Algorithm::kBruck);
}

TEST_CASE("from 32 KiB on a tree of switches, auto runs the phases only where the cluster measured them clearly ahead of the paced shuffle") {
  const TreeModel model = shipped("8-two-switch");
  const Measured at_100{0.97, 101e-6};    // what the daemons of 8-two-switch agreed on at 100 Mbit/s
  const Measured slow{0.86, 5 * 244e-6};  // ... at 500 Mbit/s, scaled to 100
  for (std::uint64_t block : {std::uint64_t{32 * 1024}, std::uint64_t{64 * 1024}, std::uint64_t{1024 * 1024}}) {
    INFO(block);
    CHECK(auto_choice(model, block).algorithm.algorithm == Algorithm::kPacedShuffle);  // nothing measured: the model alone
    const Choice tree = auto_choice(model, block, at_100);
    CHECK(tree.algorithm.algorithm == Algorithm::kTree);
    CHECK(tree.sync.kind == SyncKind::kSenderAll);
    CHECK_THAT(tree.reason, Catch::Contains("this cluster measured"));
    CHECK(auto_choice(model, block, slow).algorithm.algorithm == Algorithm::kPacedShuffle);
  }
  // The paced shuffle reaches about 90% from 32 KiB, and the phases must reach 92: the hand-over
  // at which they do is the boundary, the phases on its one side and the paced shuffle on the other.
  const double best = model.best_time_s(64 * 1024);
  const double boundary = (best / 0.92 - best) / 16;  // about 0.46 ms
  CHECK(auto_choice(model, 64 * 1024, {1.0, 0.95 * boundary}).algorithm.algorithm == Algorithm::kTree);
  const Choice paced = auto_choice(model, 64 * 1024, {1.0, 1.05 * boundary});
  CHECK(paced.algorithm.algorithm == Algorithm::kPacedShuffle);
  CHECK_THAT(paced.reason, Catch::Contains("this cluster measured"));
  // An alltoallv's blocks are of no one size: the fit does not weigh them.
  CHECK(auto_choice(model, kAnyBlockSize, at_100).algorithm.algorithm == Algorithm::kPacedShuffle);
}

TEST_CASE("where many nodes share the bottleneck, the measured hand-over does not move auto to the paced shuffle, whose links would queue") {
  const TreeModel model = shipped("64-two-level");
  REQUIRE(4 * (model.machines() - 1) < model.load());
  const Measured slow{0.64, 1e-3};
  CHECK(phases_reach(model, 64 * 1024, slow) < 0.9);
  for (std::uint64_t block : {std::uint64_t{16 * 1024}, std::uint64_t{64 * 1024}}) {
    INFO(block);
    CHECK(auto_choice(model, block, slow).algorithm.algorithm == Algorithm::kTree);
  }
}

namespace {

std::size_t cell_of(Algorithm a, SyncKind k, std::uint64_t block) { return *reach_cell({a, 4}, {k, 1}, block); }  // the param ignored

}  // namespace

TEST_CASE("the schedules auto weighs are kept by octave of block size, from 512 B up to 4 MiB") {
  CHECK_FALSE(reach_cell({Algorithm::kPacedShuffle, 4}, {SyncKind::kNone, 1}, 511));
  CHECK_FALSE(reach_cell({Algorithm::kPacedShuffle, 4}, {SyncKind::kNone, 1}, 4 * 1024 * 1024));
  CHECK_FALSE(reach_cell({Algorithm::kPacedShuffle, 4}, {SyncKind::kNone, 1}, kAnyBlockSize));
  CHECK_FALSE(reach_cell({Algorithm::kTree, 4}, {SyncKind::kNone, 1}, 16 * 1024));  // not what auto runs
  CHECK_FALSE(reach_cell({Algorithm::kGroupShuffle, 4}, {SyncKind::kNone, 1}, 16 * 1024));
  // Every cell once, named as a spec and by the smallest block of its octave.
  std::vector<bool> seen(kReachCells);
  for (const Weighed& w : kWeighed)
    for (std::uint64_t block = 512; block < 4 * 1024 * 1024; block += block / 4) {
      const std::size_t c = cell_of(w.algorithm, w.sync, block);
      REQUIRE(c < kReachCells);
      seen[c] = true;
      CHECK(reach_cell_schedule(c) == format_plan_spec(w.algorithm_spec(), w.sync_spec()));
      CHECK(reach_cell_block(c) <= block);
      CHECK(block < 2 * reach_cell_block(c));
      // Below 32 KiB the numbers of daemons that kept nothing larger: a JOIN of theirs means the same.
      if (block < 32 * 1024) CHECK(c == static_cast<std::size_t>(&w - kWeighed.data()) * 6 + c % 6);
      if (block >= 32 * 1024) CHECK(c >= kWeighed.size() * 6);
    }
  CHECK(std::count(seen.begin(), seen.end(), true) == static_cast<long>(kReachCells));
  CHECK(cell_of(Algorithm::kPacedShuffle, SyncKind::kNone, 1024) == 7);
  CHECK(cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 16 * 1024) == cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 24 * 1024));
  CHECK(cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 12 * 1024) != cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 16 * 1024));
  CHECK(cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 256 * 1024) == cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 300 * 1024));
  CHECK(cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 256 * 1024) != cell_of(Algorithm::kPairwiseEc, SyncKind::kNone, 256 * 1024));
  CHECK(reach_cell_schedule(cell_of(Algorithm::kTree, SyncKind::kSenderAll, 1024)) == "tree+sender-all");
  CHECK(reach_cell_block(cell_of(Algorithm::kTree, SyncKind::kSenderAll, 3 * 1024 * 1024)) == 2 * 1024 * 1024);
  CHECK_THROWS(reach_cell_block(kReachCells));

  const TreeModel model = shipped("8-two-switch");
  CHECK(exchange_reach(model, 16 * 1024, 2 * model.best_time_s(16 * 1024)) == Approx(0.5));
  CHECK(exchange_reach(model, kAnyBlockSize, 1.0) == 0);
  CHECK(reach_together({0.5, 1.0}) == Approx(2 / 3.0));  // 3 best times in 3
  CHECK(reach_together({0.8, 0.8, 0.8, 0.1}) == Approx(4 / (3 / 0.8 + 10)));  // one held up by a resent frame counts
  CHECK(reach_together({}) == 0);
}

TEST_CASE("a JOIN lists the reaches it keeps so that a frame too small for them drops the oldest of every cell first") {
  std::array<std::size_t, kReachCells> kept{};
  kept[2] = 3;  // indexes 0 (the oldest) to 2 (the newest)
  kept[5] = 1;
  kept[9] = 2;
  using Entry = std::pair<std::size_t, std::size_t>;
  const std::vector<Entry> order = reach_listing(kept);
  CHECK(order == std::vector<Entry>{{2, 0}, {2, 1}, {9, 0}, {2, 2}, {5, 0}, {9, 1}});
  // Cut to its last 3, as a full frame cuts it: the newest of each cell remains.
  CHECK(std::vector<Entry>(order.end() - 3, order.end()) == std::vector<Entry>{{2, 2}, {5, 0}, {9, 1}});
  CHECK(reach_listing({}).empty());
}

TEST_CASE("below 32 KiB on a tree, auto runs what the cluster measured ahead at that size; an unscheduled schedule only 5% ahead of both scheduled ones") {
  const TreeModel model = shipped("8-two-switch");
  const std::uint64_t block = 16 * 1024;
  auto at = [&](std::initializer_list<std::pair<Algorithm, double>> reaches) {
    Measured m;
    for (const auto& [a, r] : reaches) m.reach[cell_of(a, a == Algorithm::kTree ? SyncKind::kSenderAll : SyncKind::kNone, block)] = r;
    return m;
  };
  auto runs = [&](const Measured& m) {
    const Choice c = auto_choice(model, block, m);
    CHECK(c.weighed);
    return c.algorithm.algorithm;
  };
  // What 8-two-switch reached at 16 KiB on the 2-core VM at 300 Mbit/s (docs/benchmarks.md):
  // the synchronous shuffle 88.7%, the paced shuffle 71.9%, the phases less.
  const Measured at_300 = at({{Algorithm::kTree, 0.55}, {Algorithm::kPacedShuffle, 0.719}, {Algorithm::kSyncShuffle, 0.887}, {Algorithm::kPairwiseEc, 0.80}});
  CHECK(runs(at_300) == Algorithm::kSyncShuffle);
  CHECK_THAT(auto_choice(model, block, at_300).reason, Catch::Contains("measured at 88%"));
  CHECK(runs(at({{Algorithm::kTree, 0.6}, {Algorithm::kPacedShuffle, 0.7}, {Algorithm::kSyncShuffle, 0.80}, {Algorithm::kPairwiseEc, 0.85}})) == Algorithm::kPairwiseEc);
  // Where nothing measured the phases, the model's (100% here) stand for them.
  CHECK(runs(at({{Algorithm::kSyncShuffle, 0.99}})) == Algorithm::kTree);
  // At 100 Mbit/s it resent thousands of frames: 65% against the phases' 77%.
  CHECK(runs(at({{Algorithm::kTree, 0.768}, {Algorithm::kPacedShuffle, 0.70}, {Algorithm::kSyncShuffle, 0.653}})) == Algorithm::kTree);
  // Less than 5% ahead of the best scheduled one: not run.
  CHECK(runs(at({{Algorithm::kTree, 0.5}, {Algorithm::kPacedShuffle, 0.72}, {Algorithm::kSyncShuffle, 0.75}})) == Algorithm::kPacedShuffle);
  CHECK(runs(at({{Algorithm::kTree, 0.5}, {Algorithm::kPacedShuffle, 0.72}, {Algorithm::kSyncShuffle, 0.76}})) == Algorithm::kSyncShuffle);
  // The phases and the paced shuffle, each by what was measured of it at this size.
  CHECK(runs(at({{Algorithm::kTree, 0.7}, {Algorithm::kPacedShuffle, 0.72}})) == Algorithm::kPacedShuffle);
  CHECK(runs(at({{Algorithm::kTree, 0.74}, {Algorithm::kPacedShuffle, 0.72}})) == Algorithm::kTree);
  // The paced shuffle measured below what the phases' fit leaves them: the fit that sent 16 KiB
  // to the paced shuffle by its 86% (0.86 and 244 us a phase at 500 Mbit/s) keeps the phases.
  Measured fit_and_paced = at({{Algorithm::kPacedShuffle, 0.4}});
  fit_and_paced.fill = 0.86;
  fit_and_paced.hand_over_s = 5 * 244e-6;
  CHECK(phases_reach(model, block, fit_and_paced) > 0.4);
  CHECK(runs(fit_and_paced) == Algorithm::kTree);
  // Another size's measures do not count here; from 32 KiB, none is weighed.
  const Measured at_8k = [&] {
    Measured m;
    m.reach[cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 8 * 1024)] = 0.99;
    return m;
  }();
  CHECK(runs(at_8k) == Algorithm::kTree);
  const Choice large = auto_choice(model, 64 * 1024, at_300);
  CHECK(large.algorithm.algorithm == Algorithm::kPacedShuffle);
  CHECK_FALSE(large.weighed);
  // Nor where many nodes share the bottleneck, nor where the queues absorb the blocks.
  const TreeModel shared = shipped("64-two-level");
  Measured shared_sync;
  shared_sync.reach[cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, block)] = 0.99;
  CHECK(auto_choice(shared, block, shared_sync).algorithm.algorithm == Algorithm::kTree);
  CHECK_FALSE(auto_choice(shared, block, shared_sync).weighed);
  CHECK_FALSE(auto_choice(model, 4 * 1024, at_300).weighed);
}

TEST_CASE("from 32 KiB on a tree, where the hosts hold the scheduled ones back, auto runs an unscheduled schedule the cluster measured 5% ahead of both") {
  const TreeModel model = shipped("8-two-switch");
  auto at = [&](std::uint64_t block, std::initializer_list<std::pair<Algorithm, double>> reaches) {
    Measured m{0.97, 101e-6, {}};  // a fit that keeps the phases ahead of the paced shuffle's 90%
    for (const auto& [a, r] : reaches) m.reach[cell_of(a, a == Algorithm::kTree ? SyncKind::kSenderAll : SyncKind::kNone, block)] = r;
    return m;
  };
  for (const std::uint64_t block : {std::uint64_t{64 * 1024}, std::uint64_t{256 * 1024}, std::uint64_t{3 * 1024 * 1024}}) {
    INFO(block);
    // What 9 machines of a generated tree reached at 1 Gbit/s on the 2-core VM: the hosts, not
    // the links, held the paced shuffle and the phases back.
    const Measured behind = at(block, {{Algorithm::kTree, 0.499}, {Algorithm::kPacedShuffle, 0.563}, {Algorithm::kSyncShuffle, 0.643}, {Algorithm::kPairwiseEc, 0.661}});
    const Choice c = auto_choice(model, block, behind);
    CHECK(c.algorithm.algorithm == Algorithm::kPairwiseEc);
    CHECK(c.sync.kind == SyncKind::kNone);
    CHECK(c.weighed);  // so the others are measured again now and then
    CHECK_THAT(c.reason, Catch::Contains("measured at 66%"));
    // Less than 5% ahead of the better scheduled one: the scheduled one, still measured against
    // them; the phases by what they reached at this size, not by the fit.
    const Choice close = auto_choice(model, block, at(block, {{Algorithm::kTree, 0.5}, {Algorithm::kPacedShuffle, 0.63}, {Algorithm::kSyncShuffle, 0.66}}));
    CHECK(close.algorithm.algorithm == Algorithm::kPacedShuffle);
    CHECK(close.weighed);
    CHECK(auto_choice(model, block, at(block, {{Algorithm::kTree, 0.66}, {Algorithm::kPacedShuffle, 0.63}})).algorithm.algorithm == Algorithm::kTree);
    // Where the hosts keep up: the phases, measured 2 points ahead, and nothing measured now and then.
    const Choice kept = auto_choice(model, block, at(block, {{Algorithm::kTree, 0.93}, {Algorithm::kPacedShuffle, 0.91}, {Algorithm::kSyncShuffle, 0.90}}));
    CHECK(kept.algorithm.algorithm == Algorithm::kTree);
    CHECK_FALSE(kept.weighed);
    // The phases unmeasured at this size stand at what their fit gives them.
    Measured slow_fit = at(block, {{Algorithm::kPacedShuffle, 0.5}});
    slow_fit.fill = 0.7;
    const double fitted = phases_reach(model, block, slow_fit);
    REQUIRE(fitted < 0.9);
    slow_fit.reach[cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, block)] = fitted * 1.04;
    CHECK(auto_choice(model, block, slow_fit).algorithm.algorithm == Algorithm::kTree);
    slow_fit.reach[cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, block)] = fitted * 1.06;
    CHECK(auto_choice(model, block, slow_fit).algorithm.algorithm == Algorithm::kSyncShuffle);
    // The paced shuffle chosen and measured below what it reaches where the hosts keep up: the
    // daemon measures the others too.
    Measured slow_paced;
    slow_paced.reach[cell_of(Algorithm::kPacedShuffle, SyncKind::kNone, block)] = 0.7;
    const Choice paced = auto_choice(model, block, slow_paced);
    CHECK(paced.algorithm.algorithm == Algorithm::kPacedShuffle);
    CHECK(paced.weighed);
    // Another size's measures do not count here.
    CHECK(auto_choice(model, 2 * block, behind).algorithm.algorithm == Algorithm::kTree);
  }
  // Beyond 4 MiB nothing is kept, and an alltoallv's blocks are of no one size.
  Measured at_2m = at(2 * 1024 * 1024, {{Algorithm::kPacedShuffle, 0.5}, {Algorithm::kSyncShuffle, 0.99}});
  at_2m.fill = 0.7;
  CHECK(auto_choice(model, 2 * 1024 * 1024, at_2m).algorithm.algorithm == Algorithm::kSyncShuffle);
  CHECK(auto_choice(model, 8 * 1024 * 1024, at_2m).algorithm.algorithm == Algorithm::kPacedShuffle);
  CHECK_FALSE(auto_choice(model, 8 * 1024 * 1024, at_2m).weighed);
  CHECK(auto_choice(model, kAnyBlockSize, Measured{0.97, 101e-6, {}}).algorithm.algorithm == Algorithm::kPacedShuffle);
  CHECK_FALSE(auto_choice(model, kAnyBlockSize, Measured{0.97, 101e-6, {}}).weighed);
  // Where many nodes share the bottleneck the unscheduled ones overflow its queues: not weighed.
  const TreeModel shared = shipped("64-two-level");
  Measured shared_sync;
  shared_sync.reach[cell_of(Algorithm::kSyncShuffle, SyncKind::kNone, 64 * 1024)] = 0.99;
  CHECK(auto_choice(shared, 64 * 1024, shared_sync).algorithm.algorithm == Algorithm::kTree);
  CHECK_FALSE(auto_choice(shared, 64 * 1024, shared_sync).weighed);
}
