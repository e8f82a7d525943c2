// Combining exchanges (Bruck's index algorithm, Sur/Jin/Panda's hypercube) on real DPDK
// net_ring ports through the in-process fabric: every block forwarded through intermediate
// engines and checked byte by byte, with loss too.
#include <catch2/catch.hpp>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "checks.hpp"
#include "fabric.hpp"

using namespace aapc;
using namespace aapc::sched;

namespace {

using test::expect_ok;
using test::planned;

std::uint64_t steps_of(int p) {
  std::uint64_t s = 0;
  while ((1 << s) < p) ++s;
  return s;
}

}  // namespace

TEST_CASE("bruck on 5 and 8 engines, hypercube on 8: every byte forwarded right") {
  for (int p : {5, 8}) {
    test::Fabric fabric(test::nodes(p));
    Topology t = single_switch_topology(p);
    const std::uint64_t chunk = fabric.engine(0).chunk();
    std::vector<std::string> algorithms{"bruck"};
    if (p == 8) algorithms.emplace_back("hypercube");
    std::uint32_t id = 1;
    for (const auto& algo : algorithms) {
      // One byte, a tiny block, a message of several frames, and blocks split over frames.
      for (std::uint64_t block : {std::uint64_t{1}, std::uint64_t{8}, chunk / 3 + 1, chunk + 3}) {
        auto run = test::run_exchange(fabric, planned(t, algo, "none"), id++, block);
        expect_ok(run, "p=" + std::to_string(p) + " " + algo + " block " + std::to_string(block));
        for (const auto& rep : run.reports) {
          // One message per step, each gathering about half of the blocks: with 8-byte blocks
          // ceil(log2 p) frames in all instead of p-1.
          if (block <= 8) CHECK(rep.counters.data_frames_sent == steps_of(p));
          CHECK(rep.counters.rounds.size() == steps_of(p));
        }
      }
    }
  }
}

TEST_CASE("combining exchanges recover from lost, duplicated and reordered frames") {
  auto opts = test::nodes(8);
  opts.faults = nic::FaultOptions::parse("drop=0.05,dup=0.02,reorder=0.05,depth=3,seed=11");
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(8);
  std::uint32_t id = 1;
  for (const char* algo : {"bruck", "hypercube"})
    for (std::uint64_t block : {std::uint64_t{8}, std::uint64_t{700}}) {
      auto run = test::run_exchange(fabric, planned(t, algo, "none"), id++, block);
      expect_ok(run, std::string(algo) + " with faults, block " + std::to_string(block));
    }
}

TEST_CASE("an engine refuses a combining schedule whose blocks differ in size") {
  test::Fabric fabric(test::nodes(5));
  Topology t = single_switch_topology(5);
  std::vector<std::vector<std::uint64_t>> sizes(5, std::vector<std::uint64_t>(5, 16));
  sizes[0][3] = 17;
  CHECK_THROWS_WITH(test::run_exchange(fabric, planned(t, "bruck", "none"), 1, 16, std::chrono::milliseconds(5'000), &sizes),
                    Catch::Contains("needs every block to be 16 bytes"));
}

TEST_CASE("an engine refuses combining steps that would send a block it does not hold yet") {
  test::Fabric fabric(test::nodes(8));
  Topology t = single_switch_topology(8);
  Schedule s = planned(t, "bruck", "none");
  // Rank 0 forwards, at step 0, a block that reaches it only at step 0 (from rank 7).
  const CombinePiece forwarded = s.combine[0][0].recv.front();
  s.combine[0][0].send.push_back(forwarded);
  CHECK_THROWS_WITH(test::run_exchange(fabric, s, 1, 8, std::chrono::milliseconds(5'000)), Catch::Contains("does not hold then"));
  // The same steps as planned run.
  expect_ok(test::run_exchange(fabric, planned(t, "bruck", "none"), 2, 8), "bruck after a refused start");
}
