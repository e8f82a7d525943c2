// The papers reproduced exactly: both Table 4s, the rotate pattern of Table 1/2, the Table 3
// mapping and the Figure 3 phase allocation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/tree.hpp"
#include "aapc/sched/verify.hpp"
#include "paths.hpp"

using namespace aapc::sched;

namespace {

using Table = std::vector<std::set<std::pair<std::string, std::string>>>;

Table phases_by_name(const Topology& t, const Schedule& s) {
  Table out;
  for (const auto& phase : s.phases) {
    std::set<std::pair<std::string, std::string>> set;
    for (const Message& m : phase) set.emplace(t.machine(m.src).name, t.machine(m.dst).name);
    out.push_back(set);
  }
  return out;
}

}  // namespace

TEST_CASE("routine generator paper: Figure 1 tree, root and Table 4 (6 machines, 9 phases)") {
  Topology t = load_topology(aapc::test::topology_path("fy-generator-fig1"));
  TreeModel model(t);
  REQUIRE(model.load() == 9);
  CHECK(t.node(model.root()).name == "s1");
  REQUIRE(model.subtrees().size() == 3);
  CHECK(model.subtrees()[0].machines == std::vector<Rank>{0, 1, 2});  // t0 = ts0
  CHECK(model.subtrees()[1].machines == std::vector<Rank>{3, 4});     // t1 = ts3
  CHECK(model.subtrees()[2].machines == std::vector<Rank>{5});        // t2 = tn5

  Schedule s = tree_schedule(model);
  // Table 4, with t0,0 = n0, t0,1 = n1, t0,2 = n2, t1,0 = n3, t1,1 = n4, t2,0 = n5.
  Table expected = {
      {{"n0", "n4"}, {"n3", "n5"}, {"n5", "n1"}, {"n1", "n0"}},
      {{"n1", "n3"}, {"n4", "n5"}, {"n5", "n2"}, {"n2", "n1"}},
      {{"n2", "n4"}, {"n5", "n0"}, {"n0", "n2"}},
      {{"n0", "n3"}, {"n3", "n2"}, {"n2", "n0"}},
      {{"n1", "n4"}, {"n3", "n0"}, {"n0", "n1"}, {"n4", "n3"}},
      {{"n2", "n3"}, {"n3", "n1"}, {"n1", "n2"}},
      {{"n0", "n5"}, {"n4", "n0"}},
      {{"n1", "n5"}, {"n4", "n1"}, {"n5", "n3"}, {"n3", "n4"}},
      {{"n2", "n5"}, {"n4", "n2"}, {"n5", "n4"}},
  };
  CHECK(phases_by_name(t, s) == expected);
  auto report = verify(t, s);
  INFO(report.summary());
  CHECK(report.ok());
}

TEST_CASE("scheduling-and-sync paper: Figure 1 tree, root and Table 4 (5 machines, 6 phases)") {
  Topology t = load_topology(aapc::test::topology_path("fyp-sync-fig1"));
  TreeModel model(t);
  REQUIRE(model.load() == 6);
  CHECK(t.node(model.root()).name == "s3");
  // (s0,s1), (s1,s2), (s2,s3) are among the bottleneck links.
  std::set<std::string> bottlenecks;
  for (int l : model.bottleneck_links()) {
    auto a = t.node(t.links()[static_cast<std::size_t>(l)].a).name, b = t.node(t.links()[static_cast<std::size_t>(l)].b).name;
    bottlenecks.insert(std::min(a, b) + "-" + std::max(a, b));
  }
  CHECK(bottlenecks.count("s0-s1") == 1);
  CHECK(bottlenecks.count("s1-s2") == 1);
  CHECK(bottlenecks.count("s2-s3") == 1);
  REQUIRE(model.subtrees().size() == 3);
  CHECK(model.subtrees()[0].machines == std::vector<Rank>{0, 1});  // T0 = {n0, n1}
  CHECK(model.subtrees()[1].machines == std::vector<Rank>{3, 4});  // T1 = {n3, n4}
  CHECK(model.subtrees()[2].machines == std::vector<Rank>{2});     // T2 = {n2}

  Schedule s = tree_schedule(model);
  // Table 4, with m0,0 = n0, m0,1 = n1, m1,0 = n3, m1,1 = n4, m2,0 = n2.
  Table expected = {
      {{"n0", "n3"}, {"n3", "n2"}, {"n2", "n1"}, {"n1", "n0"}},
      {{"n1", "n4"}, {"n4", "n2"}, {"n2", "n0"}, {"n0", "n1"}},
      {{"n1", "n3"}, {"n3", "n0"}},
      {{"n0", "n4"}, {"n3", "n1"}, {"n4", "n3"}},
      {{"n0", "n2"}, {"n4", "n1"}, {"n2", "n3"}, {"n3", "n4"}},
      {{"n1", "n2"}, {"n4", "n0"}, {"n2", "n4"}},
  };
  CHECK(phases_by_name(t, s) == expected);
  CHECK(verify(t, s).ok());
}

TEST_CASE("rotate pattern of Table 1 / Table 2 (|Mi| = 6, |Mj| = 4)") {
  auto pattern = rotate_pattern({0, 1, 2, 3, 4, 5}, {0, 1, 2, 3});
  std::vector<std::pair<int, int>> expected = {
      {0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 0}, {5, 1},  // phases 0-5
      {0, 2}, {1, 3}, {2, 0}, {3, 1}, {4, 2}, {5, 3},  // 6-11
      {1, 0}, {2, 1}, {3, 2}, {4, 3}, {5, 0}, {0, 1},  // 12-17: base sequence rotated once
      {1, 2}, {2, 3}, {3, 0}, {4, 1}, {5, 2}, {0, 3},  // 18-23
  };
  CHECK(pattern == expected);
}

TEST_CASE("rotate pattern covers every pair and keeps Lemma 6") {
  for (int mi = 1; mi <= 9; ++mi) {
    for (int mj = 1; mj <= 9; ++mj) {
      std::vector<int> s(static_cast<std::size_t>(mi)), r(static_cast<std::size_t>(mj));
      for (int i = 0; i < mi; ++i) s[static_cast<std::size_t>(i)] = i;
      for (int j = 0; j < mj; ++j) r[static_cast<std::size_t>(j)] = j;
      auto pattern = rotate_pattern(s, r);
      std::set<std::pair<int, int>> unique(pattern.begin(), pattern.end());
      CHECK(unique.size() == static_cast<std::size_t>(mi * mj));
      // Each receiver once in every |Mj| phases, each sender once in every |Mi| phases.
      for (std::size_t p = 0; p < pattern.size(); ++p) CHECK(pattern[p].second == static_cast<int>(p % static_cast<std::size_t>(mj)));
      for (std::size_t start = 0; start + static_cast<std::size_t>(mi) <= pattern.size(); start += static_cast<std::size_t>(mi)) {
        std::set<int> senders;
        for (std::size_t p = start; p < start + static_cast<std::size_t>(mi); ++p) senders.insert(pattern[p].first);
        CHECK(senders.size() == static_cast<std::size_t>(mi));
      }
    }
  }
}

TEST_CASE("Figure 3: global message phase allocation (extended ring scheduling)") {
  // Routine generator paper: |M0| = 3, |M1| = 2, |M2| = 1.
  std::vector<int> a = {3, 2, 1};
  CHECK(global_start_phase(a, 1, 2) == 0);
  CHECK(global_start_phase(a, 0, 2) == 6);
  CHECK(global_start_phase(a, 2, 0) == 0);
  CHECK(global_start_phase(a, 0, 1) == 0);
  CHECK(global_start_phase(a, 1, 0) == 3);
  CHECK(global_start_phase(a, 2, 1) == 7);
  // Scheduling-and-sync paper: |M0| = 2, |M1| = 2, |M2| = 1.
  std::vector<int> b = {2, 2, 1};
  CHECK(global_start_phase(b, 1, 2) == 0);
  CHECK(global_start_phase(b, 0, 2) == 4);
  CHECK(global_start_phase(b, 2, 0) == 0);
  // Lemma 2: for every subtree, its outgoing blocks do not overlap, nor do its incoming ones,
  // and all lie within |M0| x (|M| - |M0|) phases.
  for (const auto& sizes : {a, b, std::vector<int>{4, 4, 3, 2, 2, 1}, std::vector<int>{5, 1, 1, 1, 1, 1}}) {
    int total = 0;
    for (int x : sizes) total += x;
    int load = sizes[0] * (total - sizes[0]);
    int k = static_cast<int>(sizes.size());
    for (int i = 0; i < k; ++i) {
      std::vector<int> out(static_cast<std::size_t>(load), 0), in(static_cast<std::size_t>(load), 0);
      for (int j = 0; j < k; ++j) {
        if (i == j) continue;
        for (int dir = 0; dir < 2; ++dir) {
          int from = dir == 0 ? i : j, to = dir == 0 ? j : i;
          auto start = global_start_phase(sizes, from, to);
          auto len = sizes[static_cast<std::size_t>(from)] * sizes[static_cast<std::size_t>(to)];
          REQUIRE(start >= 0);
          REQUIRE(start + len <= load);
          for (auto p = start; p < start + len; ++p) (dir == 0 ? out : in)[static_cast<std::size_t>(p)]++;
        }
      }
      CHECK(*std::max_element(out.begin(), out.end()) <= 1);
      CHECK(*std::max_element(in.begin(), in.end()) <= 1);
    }
  }
}

TEST_CASE("Table 3: T0 receivers follow the sender mapping in the rounds that hold T0's local messages") {
  // Subtrees of 4, 3, 2 and 1 machines on one root switch.
  TopologySpec spec;
  spec.source = "table3";
  int rank = 0;
  auto machine = [&](const std::string& sw) {
    std::string name = "n" + std::to_string(rank);
    char mac[32];
    std::snprintf(mac, sizeof mac, "02:00:00:00:00:%02x", rank + 1);
    spec.nodes.push_back({name, {{"mac", mac}}});
    spec.edges.push_back({sw, name, {}});
    ++rank;
  };
  for (const char* s : {"root", "a", "b", "c"}) spec.nodes.push_back({s, {}});
  for (const char* s : {"a", "b", "c"}) spec.edges.push_back({"root", s, {}});
  for (int i = 0; i < 4; ++i) machine("a");
  for (int i = 0; i < 3; ++i) machine("b");
  for (int i = 0; i < 2; ++i) machine("c");
  machine("root");
  Topology t = Topology::from_spec(spec);
  TreeModel model(t);
  REQUIRE(model.subtrees()[0].machines.size() == 4);
  Schedule s = tree_schedule(model);
  REQUIRE(verify(t, s).ok());
  const auto& t0 = model.subtrees()[0].machines;
  auto index = [&](Rank r) { return static_cast<int>(std::find(t0.begin(), t0.end(), r) - t0.begin()); };
  const int m0 = 4;
  for (int p = 0; p < m0 * (m0 - 1); ++p) {
    int round = p / m0;
    Rank sender = -1, receiver = -1;
    for (const Message& m : s.phases[static_cast<std::size_t>(p)]) {
      bool src_in = model.subtree_of(m.src) == 0, dst_in = model.subtree_of(m.dst) == 0;
      if (src_in && !dst_in) sender = m.src;
      if (dst_in && !src_in) receiver = m.dst;
    }
    REQUIRE(sender >= 0);
    REQUIRE(receiver >= 0);
    CHECK(index(receiver) == (index(sender) + round + 1) % m0);
  }
}
