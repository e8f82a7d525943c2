// 10,000 random trees (2 to 64 machines; switches without machines, long chains, one switch
// with many machines), fixed seed: `tree` verifies in exactly `load` phases, and every sync
// variant verifies.
#include <catch2/catch.hpp>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/verify.hpp"
#include "paths.hpp"

using namespace aapc::sched;

namespace {

RandomTreeOptions random_options(std::mt19937_64& rng) {
  RandomTreeOptions o;
  o.machines = std::uniform_int_distribution<int>(2, 64)(rng);
  int kind = std::uniform_int_distribution<int>(0, 9)(rng);
  o.switches = std::uniform_int_distribution<int>(1, 12)(rng);
  o.shape = TreeShape::kRandom;
  if (kind == 0) o.shape = TreeShape::kChain, o.switches = std::uniform_int_distribution<int>(2, 16)(rng);
  if (kind == 1) o.shape = TreeShape::kStar;
  if (kind == 2) o.shape = TreeShape::kOneSwitch;
  o.leave_switches_empty = kind != 3;
  return o;
}

}  // namespace

TEST_CASE("tree schedules of 10,000 random trees verify in exactly load phases") {
  std::mt19937_64 rng(20261121);
  const std::vector<SyncSpec> variants = {
      {SyncKind::kDummy, 1},          {SyncKind::kSenderAll, 1},          {SyncKind::kSenderPartial, 3},
      {SyncKind::kReceiverAll, 1},    {SyncKind::kReceiverPartial, 2},    {SyncKind::kBarrierAll, 1},
      {SyncKind::kBarrierPartialNone, 4}, {SyncKind::kBarrierPartialSender, 3}, {SyncKind::kBarrierPartialReceiver, 5},
  };
  std::int64_t phases = 0, orderings = 0;
  const int trials = aapc::test::scaled(10000);
  for (int trial = 0; trial < trials; ++trial) {
    RandomTreeOptions o = random_options(rng);
    Topology t = random_tree(o, rng);
    INFO("trial " << trial << ": " << o.machines << " machines, " << o.switches << " switches, shape " << static_cast<int>(o.shape));
    Schedule s = make_schedule(t, {Algorithm::kTree, 0});
    auto report = verify(t, s);
    INFO(report.summary());
    REQUIRE(report.ok());
    REQUIRE(report.phases == report.load);
    phases += report.phases;
    // Each sync variant on a tenth of the trees (all of them on every tree would be 100,000
    // plans; the variants differ only in which orderings they keep).
    if (trial % 10 == 0) {
      const SyncSpec& spec = variants[static_cast<std::size_t>(trial / 10) % variants.size()];
      Schedule synced = plan_sync(t, s, spec);
      auto sr = verify(t, synced);
      INFO(spec.name() << ": " << sr.summary());
      REQUIRE(sr.ok());
      orderings += sr.orderings_checked;
    }
  }
  CHECK(phases > 0);
  CHECK(orderings > 0);
}

TEST_CASE("every sync variant verifies on 500 random trees") {
  std::mt19937_64 rng(4242);
  const int trials = aapc::test::scaled(500);
  for (int trial = 0; trial < trials; ++trial) {
    RandomTreeOptions o = random_options(rng);
    o.machines = std::min(o.machines, 24);
    Topology t = random_tree(o, rng);
    Schedule s = make_schedule(t, {Algorithm::kTree, 0});
    for (const auto& name : SyncSpec::names()) {
      SyncSpec spec = *SyncSpec::parse(name);
      spec.block = 1 + trial % 5;
      if (!spec.partial()) spec.block = 1;
      INFO("trial " << trial << " (" << o.machines << " machines), " << spec.name());
      Schedule synced = plan_sync(t, s, spec);
      auto report = verify(t, synced);
      INFO(report.summary());
      REQUIRE(report.ok());
    }
  }
}
