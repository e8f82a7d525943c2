// Exchanges on real DPDK net_ring ports through the in-process fabric: every algorithm and
// sync variant, byte-exact.
#include <catch2/catch.hpp>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/verify.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "paths.hpp"

using namespace aapc;
using namespace aapc::sched;

namespace {

using test::planned;

using test::expect_ok;

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
    std::vector<std::string> algorithms = {"tree", "linear", "ring", "pairwise", "pairwise-ec", "lp", "sync-shuffle", "paced-shuffle", "group-shuffle:3"};
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

TEST_CASE("several exchanges live at once, each byte-exact") {
  Topology t = sched::load_topology(test::topology_path("8-one-switch"));
  test::Fabric fabric(test::nodes(8));
  Schedule a = planned(t, "tree", "sender-all"), b = planned(t, "sync-shuffle", "none");
  // Start both on every node before polling, then run them together.
  std::vector<std::vector<std::uint8_t>> bufs;
  auto post = [&](const Schedule& s, std::uint32_t id, int me, std::uint64_t block) {
    auto spec = engine::exchange_spec(s, me, id);
    for (int p = 0; p < 8; ++p) {
      bufs.emplace_back(block);
      for (std::uint64_t k = 0; k < block; ++k) bufs.back()[k] = test::pattern(me, p, id, k);
      spec.send[static_cast<std::size_t>(p)] = {bufs.back().data(), block};
      bufs.emplace_back(block, 0);
      spec.recv[static_cast<std::size_t>(p)] = {bufs.back().data(), block};
    }
    return spec;
  };
  bufs.reserve(8 * 2 * 8 * 2);
  for (int me = 0; me < 8; ++me) {
    REQUIRE(fabric.engine(me).start(post(a, 1, me, 30'000)));
    REQUIRE(fabric.engine(me).start(post(b, 2, me, 20'000)));
  }
  int finished = 0;
  bool ok = true;
  REQUIRE(fabric.run_until(
      [&] {
        for (int me = 0; me < 8; ++me)
          for (auto& r : fabric.engine(me).take_finished()) {
            ++finished;
            ok = ok && r.state == engine::ExchangeState::kDone;
            CHECK(r.counters.rounds.size() >= 1);
            for (const auto& rt : r.counters.rounds) CHECK((rt.start_ns >= 0 && rt.end_ns >= rt.start_ns));
          }
        return finished == 16;
      },
      std::chrono::milliseconds(20'000)));
  CHECK(ok);
  // Receive buffers: for each node and exchange, block p at index 2*p+1 of its 16 buffers.
  std::size_t at = 0;
  for (int me = 0; me < 8; ++me) {
    for (std::uint32_t id : {1U, 2U}) {
      for (int p = 0; p < 8; ++p) {
        const auto& got = bufs[at + 2 * static_cast<std::size_t>(p) + 1];
        if (p == me) continue;
        bool exact = true;
        for (std::uint64_t k = 0; k < got.size(); ++k) exact = exact && got[k] == test::pattern(p, me, id, k);
        INFO("node " << me << " exchange " << id << " from " << p);
        CHECK(exact);
      }
      at += 16;
    }
  }
}

TEST_CASE("pacing holds the engine to the link rate") {
  auto opts = test::nodes(2);
  const std::uint64_t rate = 200'000'000;
  opts.tune = [&](engine::EngineConfig& c) { c.pace_bps = rate; };
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(2);
  const std::uint64_t block = 2 << 20;
  auto run = test::run_exchange(fabric, planned(t, "ring", "none"), 1, block);
  expect_ok(run, "paced");
  // 2 MiB plus headers at 200 Mbit/s: at least 84 ms, and not much more.
  double wire_s = static_cast<double>(block + (block / fabric.engine(0).chunk() + 1) * engine::kDataFrameOverhead) * 8 / static_cast<double>(rate);
  double took = std::chrono::duration<double>(run.elapsed).count();
  CHECK(took >= wire_s * 0.95);
  CHECK(took <= wire_s * 1.5);
}

TEST_CASE("a congested switch drops frames; the engines recover") {
  auto opts = test::nodes(6);
  opts.port_rate_bps = 500'000'000;
  opts.queue_limit = 24;
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(6);
  // Linear: everyone sends to node 0 first, so its switch port overflows.
  auto run = test::run_exchange(fabric, planned(t, "linear", "none"), 1, 200'000);
  expect_ok(run, "congested");
  CHECK(fabric.switch_drops() > 0);
  std::uint64_t resent = 0;
  for (const auto& r : run.reports) resent += r.counters.retransmitted_frames;
  CHECK(resent > 0);
}

TEST_CASE("every sync variant for p = 2..16") {
  for (int p = 2; p <= 16; ++p) {
    test::Fabric fabric(test::nodes(p));
    Topology t = single_switch_topology(p);
    std::uint32_t id = 1;
    for (const auto& sync : SyncSpec::names()) {
      for (const char* algo : {"tree", "pairwise"}) {
        auto run = test::run_exchange(fabric, planned(t, algo, sync), id++, 2000 + static_cast<std::uint64_t>(p));
        expect_ok(run, "p=" + std::to_string(p) + " " + algo + " " + sync);
      }
    }
  }
}

TEST_CASE("all-to-many: sparse per-destination sizes scheduled by CGM, GM and LP") {
  const int n = 10;
  std::mt19937_64 rng(3);
  std::vector<std::vector<std::uint64_t>> sizes(n, std::vector<std::uint64_t>(n, 0));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j && rng() % 3 == 0) sizes[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = 1 + rng() % 9000;
  auto pattern = SparsePattern::from_sizes(sizes);
  test::Fabric fabric(test::nodes(n));
  std::uint32_t id = 1;
  for (const char* algo : {"cgm", "gm", "lp"}) {
    Schedule s = sparse_schedule(pattern, algo);
    auto run = test::run_exchange(fabric, s, id++, 0, std::chrono::milliseconds(20'000), &sizes);
    expect_ok(run, algo);
    std::uint64_t expected = 0, received = 0;
    for (const auto& row : sizes)
      for (auto x : row) expected += x;
    for (const auto& r : run.reports) received += r.counters.data_bytes_received;
    CHECK(received == expected);
  }
}
