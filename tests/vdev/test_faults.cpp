// Loss, duplication, reordering, corruption and truncation, alone and mixed: every exchange
// still byte-exact, and the counters account for what was injected.
#include <catch2/catch.hpp>

#include <rte_mbuf.h>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "paths.hpp"
#include "recording_port.hpp"

using namespace aapc;
using namespace aapc::sched;
using engine::DropReason;

namespace {

struct Totals {
  std::uint64_t sent = 0, received = 0, retransmitted = 0, switch_drops = 0;
  std::array<std::uint64_t, engine::kDropReasons> drops{};
  nic::FaultCounts injected;
  std::uint64_t drop(DropReason r) const { return drops[static_cast<std::size_t>(r)]; }
};

Totals totals(test::Fabric& fabric, const std::vector<engine::ExchangeReport>& reports) {
  Totals t;
  for (int i = 0; i < fabric.size(); ++i) {
    const auto& c = fabric.engine(i).counters();
    t.sent += c.frames_sent;
    t.received += c.frames_received;
    for (int d = 0; d < engine::kDropReasons; ++d) t.drops[static_cast<std::size_t>(d)] += c.drops[static_cast<std::size_t>(d)];
    for (const nic::FaultCounts* f : {&fabric.faults(i)->rx_counts(), &fabric.faults(i)->tx_counts()}) {
      t.injected.dropped += f->dropped;
      t.injected.duplicated += f->duplicated;
      t.injected.reordered += f->reordered;
      t.injected.corrupted += f->corrupted;
      t.injected.truncated += f->truncated;
    }
  }
  for (const auto& r : reports) t.retransmitted += r.counters.retransmitted_frames;
  t.switch_drops = fabric.switch_drops();
  return t;
}

// Runs a few exchanges through faulty ports and checks what can be checked for any fault mix.
Totals run_with_faults(const std::string& spec, const std::string& topology = "8-two-switch", std::uint64_t block = 20'000) {
  Topology t = load_topology(test::topology_path(topology));
  auto opts = test::nodes(t.machine_count());
  opts.faults = nic::FaultOptions::parse(spec);
  test::Fabric fabric(opts);
  std::vector<engine::ExchangeReport> all;
  std::uint32_t id = 1;
  for (const auto& [algo, sync] : std::vector<std::pair<std::string, std::string>>{
           {"tree", "sender-all"}, {"sync-shuffle", "none"}, {"tree", "receiver-all"}, {"group-shuffle:3", "none"}}) {
    Schedule s = plan_sync(t, make_schedule(t, *AlgorithmSpec::parse(algo)), *SyncSpec::parse(sync));
    auto run = test::run_exchange(fabric, s, id++, block);
    test::expect_ok(run, spec + ": " + algo + " + " + sync);
    all.insert(all.end(), run.reports.begin(), run.reports.end());
  }
  fabric.settle();
  Totals tot = totals(fabric, all);
  // Frames are conserved: everything sent (plus duplicates) was received, dropped by the
  // injector, or dropped by the switch.
  CHECK(tot.sent + tot.injected.duplicated == tot.received + tot.injected.dropped + fabric.switch_drops());
  return tot;
}

}  // namespace

TEST_CASE("loss 0.1%, 1% and 5%: byte-exact, recovered by retransmission") {
  for (const char* spec : {"drop=0.001,seed=1", "drop=0.01,seed=2", "drop=0.05,seed=3"}) {
    Totals t = run_with_faults(spec);
    INFO(spec);
    CHECK(t.injected.dropped > 0);
    CHECK(t.retransmitted > 0);
    CHECK(t.drop(DropReason::kBadCrc) == 0);
  }
}

TEST_CASE("duplication: duplicates are harmless and counted") {
  Totals t = run_with_faults("dup=0.02,seed=4");
  CHECK(t.injected.duplicated > 0);
  CHECK(t.drop(DropReason::kDuplicate) > 0);
  CHECK(t.drop(DropReason::kDuplicate) <= t.injected.duplicated);
  CHECK(t.injected.dropped == 0);
}

TEST_CASE("reordering") {
  Totals t = run_with_faults("reorder=0.05,depth=5,seed=5");
  CHECK(t.injected.reordered > 0);
}

TEST_CASE("corruption: every corrupted frame is caught") {
  // One direction: a frame hit on the way out and again on the way in counts twice but
  // is dropped once.
  Totals t = run_with_faults("corrupt=0.01:tx,seed=6");
  CHECK(t.injected.corrupted > 0);
  // A flipped bit in the header fields checked before the CRC shows as that field's error.
  CHECK(t.drop(DropReason::kBadCrc) + t.drop(DropReason::kBadMagic) + t.drop(DropReason::kBadVersion) + t.drop(DropReason::kBadType) +
            t.drop(DropReason::kBadLength) ==
        t.injected.corrupted);
  CHECK(t.drop(DropReason::kBadCrc) > t.injected.corrupted / 2);
  CHECK(t.retransmitted > 0);
}

TEST_CASE("truncation: every truncated frame is caught") {
  Totals t = run_with_faults("truncate=0.01:rx,seed=7");
  CHECK(t.injected.truncated > 0);
  std::string counts;
  for (int d = 1; d < engine::kDropReasons; ++d)
    if (t.drops[static_cast<std::size_t>(d)] > 0)
      counts += std::string(engine::drop_reason_name(static_cast<DropReason>(d))) + "=" + std::to_string(t.drops[static_cast<std::size_t>(d)]) + " ";
  INFO("drops: " << counts << " switch=" << t.switch_drops);
  // (A frame cut below its destination MAC never gets past the switch.)
  CHECK(t.drop(DropReason::kRunt) + t.drop(DropReason::kBadLength) + t.drop(DropReason::kEtherType) + t.switch_drops == t.injected.truncated);
}

TEST_CASE("everything at once, in both directions and one direction only") {
  Totals both = run_with_faults("drop=0.01,dup=0.005,reorder=0.01,corrupt=0.005,truncate=0.005,seed=8", "12-three-level");
  CHECK(both.injected.total() > 0);
  Totals rx = run_with_faults("drop=0.02:rx,corrupt=0.01:tx,seed=9", "12-three-level", 3000);
  CHECK(rx.injected.dropped > 0);
}

namespace {

std::vector<std::vector<std::uint8_t>> through_faults(rte_mempool* pool, const std::string& spec) {
  test::RecordingPort sink(pool);
  nic::FaultPort faults(sink, nic::FaultOptions::parse(spec));
  for (int i = 0; i < 2000; ++i) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    REQUIRE(m != nullptr);
    auto* p = reinterpret_cast<std::uint8_t*>(rte_pktmbuf_append(m, 200));
    for (int k = 0; k < 200; ++k) p[k] = static_cast<std::uint8_t>(i * 7 + k);
    REQUIRE(faults.tx_burst(&m, 1) == 1);
  }
  rte_mbuf* none = nullptr;
  for (int k = 0; k < 10; ++k) faults.rx_burst(&none, 0);  // lets held-back frames go
  return sink.frames;
}

}  // namespace

TEST_CASE("the fault injector is deterministic for a seed") {
  test::start_eal();
  rte_mempool* pool = rte_pktmbuf_pool_create("fault_det", 8191, 0, 0, 2048, 0);
  REQUIRE(pool != nullptr);
  const std::string spec = "drop=0.05,dup=0.05,reorder=0.05,corrupt=0.05,truncate=0.05,seed=11";
  auto a = through_faults(pool, spec);
  auto b = through_faults(pool, spec);
  auto c = through_faults(pool, "drop=0.05,dup=0.05,reorder=0.05,corrupt=0.05,truncate=0.05,seed=12");
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a.size() != 2000);  // something happened
  rte_mempool_free(pool);
}

TEST_CASE("fault spec parsing") {
  auto o = nic::FaultOptions::parse("drop=0.01:rx,dup=0.5,seed=42,depth=7");
  CHECK(o.drop.rate == 0.01);
  CHECK(o.drop.direction == nic::Direction::kRx);
  CHECK(o.duplicate.direction == nic::Direction::kBoth);
  CHECK(o.seed == 42);
  CHECK(o.reorder_depth == 7);
  CHECK_THROWS_AS(nic::FaultOptions::parse("drop=2"), nic::NicError);
  CHECK_THROWS_AS(nic::FaultOptions::parse("lose=0.1"), nic::NicError);
  CHECK_THROWS_AS(nic::FaultOptions::parse("drop=0.1:up"), nic::NicError);
}
