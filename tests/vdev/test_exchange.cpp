// Exchanges on real DPDK net_ring ports through the in-process fabric: every algorithm and
// sync variant, byte-exact.
#include <catch2/catch.hpp>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/verify.hpp"
#include "fabric.hpp"
#include "paths.hpp"

using namespace aapc;
using namespace aapc::sched;

namespace {

Schedule planned(const Topology& t, const std::string& algo, const std::string& sync) {
  Schedule s = make_schedule(t, *AlgorithmSpec::parse(algo));
  return plan_sync(t, s, *SyncSpec::parse(sync));
}

void expect_ok(const test::ExchangeRun& run, const std::string& what) {
  INFO(what);
  REQUIRE(run.finished);
  for (std::size_t r = 0; r < run.reports.size(); ++r) {
    INFO("rank " << r << ": " << run.reports[r].error);
    REQUIRE(run.reports[r].state == engine::ExchangeState::kDone);
  }
  INFO(run.first_mismatch);
  REQUIRE(run.byte_exact);
}

}  // namespace

TEST_CASE("two nodes exchange one block each way") {
  test::Fabric fabric(test::nodes(2));
  Topology t = single_switch_topology(2);
  auto run = test::run_exchange(fabric, planned(t, "ring", "none"), 1, 10'000);
  expect_ok(run, "ring p=2");
  CHECK(run.reports[0].counters.data_bytes_sent == 10'000);
  CHECK(run.reports[1].counters.data_bytes_received == 10'000);
}

TEST_CASE("every algorithm, p = 2..16, blocks of 1 byte, a frame minus one, one frame, and odd sizes") {
  for (int p = 2; p <= 16; ++p) {
    test::Fabric fabric(test::nodes(p));
    Topology t = single_switch_topology(p);
    const std::uint64_t chunk = fabric.engine(0).chunk();
    std::uint32_t id = 1;
    std::vector<std::string> algorithms = {"tree", "linear", "ring", "pairwise", "pairwise-ec", "lp", "sync-shuffle", "group-shuffle:3"};
    for (const auto& algo : algorithms) {
      for (std::uint64_t block : {std::uint64_t{1}, chunk - 1, chunk, 3 * chunk + 17}) {
        auto run = test::run_exchange(fabric, planned(t, algo, "none"), id++, block);
        expect_ok(run, "p=" + std::to_string(p) + " " + algo + " block " + std::to_string(block));
      }
    }
  }
}

TEST_CASE("every sync variant on tree schedules of several clusters") {
  for (const char* name : {"fy-generator-fig1", "fyp-sync-fig1", "8-two-switch", "12-three-level"}) {
    Topology t = sched::load_topology(test::topology_path(name));
    test::Fabric fabric(test::nodes(t.machine_count()));
    std::uint32_t id = 1;
    for (const auto& sync : SyncSpec::names()) {
      for (std::uint64_t block : {std::uint64_t{700}, std::uint64_t{5000}}) {
        auto run = test::run_exchange(fabric, planned(t, "tree", sync), id++, block);
        expect_ok(run, std::string(name) + " " + sync + " block " + std::to_string(block));
      }
    }
  }
}

TEST_CASE("1 MiB blocks") {
  Topology t = sched::load_topology(test::topology_path("8-two-switch"));
  test::Fabric fabric(test::nodes(8));
  std::uint32_t id = 1;
  for (const auto& [algo, sync] : std::vector<std::pair<std::string, std::string>>{{"tree", "sender-all"}, {"sync-shuffle", "none"}, {"pairwise", "receiver-all"}}) {
    auto run = test::run_exchange(fabric, planned(t, algo, sync), id++, 1 << 20);
    expect_ok(run, algo + " " + sync);
    std::uint64_t received = 0;
    for (const auto& r : run.reports) received += r.counters.data_bytes_received;
    CHECK(received == 8ULL * 7 * (1 << 20));
  }
}
