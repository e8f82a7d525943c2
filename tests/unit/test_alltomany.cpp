// All-to-many: Ranka/Wang/Fox LP, GM and CGM.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/verify.hpp"
#include "paths.hpp"

using namespace aapc::sched;

TEST_CASE("Figure 7 generator: every row and column has d entries") {
  std::mt19937_64 rng(1);
  for (int d : {1, 4, 31}) {
    auto pattern = SparsePattern::figure7(32, d, rng);
    std::vector<int> column(32, 0);
    for (const auto& row : pattern.dsts) {
      CHECK(static_cast<int>(row.size()) == d);
      for (Rank j : row) column[static_cast<std::size_t>(j)]++;
    }
    for (int c : column) CHECK(c == d);
  }
}

TEST_CASE("LP, GM and CGM decompose into disjoint partial permutations") {
  std::mt19937_64 rng(5);
  for (int n : {7, 32, 64}) {
    for (int d : {1, 3, 8, n - 1}) {
      if (d > n) continue;
      INFO("n=" << n << " d=" << d);
      auto pattern = SparsePattern::figure7(n, d, rng);
      auto lp = linear_permutation(pattern);
      CHECK(check_permutations(pattern, lp).empty());
      auto gm = global_masking(pattern, rng);
      CHECK(check_permutations(pattern, gm).empty());
      auto cgm = compact_global_masking(pattern, rng);
      CHECK(check_permutations(pattern, cgm).empty());
      CHECK(static_cast<int>(cgm.size()) >= pattern.max_degree());
      CHECK(static_cast<int>(gm.size()) >= pattern.max_degree());
    }
  }
}

TEST_CASE("CGM with the Figure 7 generator matches Table 4 within 5%") {
  // Table 4 of Ranka/Wang/Fox: mean number of permutations generated.
  struct Row {
    int n, d;
    double perms;
    int samples;
  };
  const Row rows[] = {
      {32, 2, 3.0, 300},   {32, 4, 5.6, 300},    {32, 8, 10.2, 300},   {32, 16, 18.5, 300},  {32, 31, 34.2, 300},
      {128, 4, 6.0, 100},  {128, 16, 19.5, 100}, {128, 32, 36.3, 100}, {128, 64, 68.8, 50},  {128, 127, 132.4, 20},
      {512, 8, 11.1, 20},  {512, 32, 37.1, 20},  {512, 128, 135.4, 5},
  };
  std::mt19937_64 rng(1994);
  for (const Row& row : rows) {
    double sum = 0;
    for (int i = 0; i < row.samples; ++i) {
      auto pattern = SparsePattern::figure7(row.n, row.d, rng);
      sum += static_cast<double>(compact_global_masking(pattern, rng).size());
    }
    double mean = sum / row.samples;
    INFO("n=" << row.n << " d=" << row.d << ": mean " << mean << " permutations, Table 4 says " << row.perms);
    CHECK(std::abs(mean - row.perms) <= 0.05 * row.perms);
  }
}

TEST_CASE("sparse schedules from per-destination sizes") {
  std::vector<std::vector<std::uint64_t>> sizes(6, std::vector<std::uint64_t>(6, 0));
  sizes[0][3] = 100;
  sizes[3][0] = 5;
  sizes[1][2] = 7;
  sizes[2][1] = 7;
  sizes[4][5] = 1;
  sizes[5][5] = 9;  // to self: not a message
  auto pattern = SparsePattern::from_sizes(sizes);
  CHECK(pattern.messages() == 5);
  for (const char* algo : {"cgm", "gm", "lp"}) {
    Schedule s = sparse_schedule(pattern, algo);
    CHECK(s.message_count() == 5);
    std::mt19937_64 rng(1);
    CHECK(check_permutations(pattern, s.phases).empty());
  }
  CHECK_THROWS(sparse_schedule(pattern, "magic"));
}

// --- alltoallv on the wire ------------------------------------------------

namespace {

SparsePattern ring_of(int n, int d) {
  SparsePattern p;
  p.n = n;
  p.dsts.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    for (int k = 1; k <= d; ++k) p.dsts[static_cast<std::size_t>(i)].push_back((i + k) % n);
  for (auto& row : p.dsts) std::sort(row.begin(), row.end());
  return p;
}

// The verifier knows complete exchanges: a sparse schedule passes when its only errors are the
// pairs the pattern leaves out, one each ("is never sent"); its sync plan is checked in full.
bool verify_sparse(const Topology& t, const SparsePattern& p, const Schedule& s) {
  const VerifyReport r = verify(t, s);
  std::int64_t absent = static_cast<std::int64_t>(p.n) * (p.n - 1);
  for (int i = 0; i < p.n; ++i)
    for (Rank j : p.dsts[static_cast<std::size_t>(i)]) absent -= j != i ? 1 : 0;
  for (const auto& e : r.errors)
    if (e.find("is never sent") == std::string::npos) return false;
  return r.error_count == absent;
}

}  // namespace

TEST_CASE("the sparse rule: link masking's phases at most three quarters of the dense schedule's, self messages not counted") {
  const Topology two = load_topology(aapc::test::topology_path("8-two-switch"));    // load 16
  const Topology big = load_topology(aapc::test::topology_path("64-two-level"));    // load 448
  CHECK(sparse_verdict(two, ring_of(8, 3), 16).sparse);
  CHECK(sparse_verdict(big, ring_of(64, 4), 448).sparse);
  CHECK(sparse_verdict(big, ring_of(64, 31), 448).sparse);
  CHECK_FALSE(sparse_verdict(two, ring_of(8, 7), 16).sparse);  // the full pattern: at least the load
  CHECK_FALSE(sparse_verdict(big, ring_of(64, 63), 448).sparse);
  CHECK_THAT(sparse_verdict(big, ring_of(64, 63), 448).reason, Catch::Contains("at least 448 contention-free phases"));  // not planned
  CHECK_FALSE(sparse_verdict(two, ring_of(8, 0), 16).sparse);  // nothing to send: the dense path
  CHECK_FALSE(sparse_verdict(two, ring_of(8, 3), 6).sparse);   // the line: 3/4 of the dense phases
  // One rank receiving from everyone: 7 phases of 16 still wins.
  SparsePattern hot = ring_of(8, 1);
  for (int i = 2; i < 8; ++i) hot.dsts[static_cast<std::size_t>(i)].insert(hot.dsts[static_cast<std::size_t>(i)].begin(), 0);
  CHECK(sparse_degree(hot) == 7);
  CHECK(sparse_verdict(two, hot, 16).sparse);
  // Self messages are copies, not messages.
  SparsePattern self = ring_of(8, 3);
  for (int i = 0; i < 8; ++i) self.dsts[static_cast<std::size_t>(i)].push_back(i);
  CHECK(sparse_degree(self) == 3);
  CHECK_THAT(sparse_verdict(two, self, 16).reason, Catch::Contains("up to 3 peers per rank"));
}

TEST_CASE("alltoallv sizes: a rank's send size against its peer's receive size, named with both") {
  std::vector<std::vector<std::uint64_t>> send(4, std::vector<std::uint64_t>(4, 10)), recv = send;
  CHECK(sizes_mismatch(send, recv).empty());
  send[2][2] = 99;  // to self: the engine copies min(send, recv), nothing to agree on
  CHECK(sizes_mismatch(send, recv).empty());
  send[1][0] = 200;
  send[3][2] = 7;
  CHECK(sizes_mismatch(send, recv) == "rank 1 sends rank 0 200 bytes; rank 0 expects 10 bytes from rank 1");
  send[1][0] = 10;
  CHECK(sizes_mismatch(send, recv) == "rank 3 sends rank 2 7 bytes; rank 2 expects 10 bytes from rank 3");
  recv[2].pop_back();
  CHECK_THAT(sizes_mismatch(send, recv), Catch::Contains("does not have 4 entries"));
}

TEST_CASE("gather and broadcast: one block to the root from each rank, one from the root to each") {
  const Schedule g = gather_schedule(5, 0), b = broadcast_schedule(5, 0);
  CHECK(g.message_count() == 4);
  CHECK(b.message_count() == 4);
  CHECK(g.programs[0].rounds.empty());
  for (int i = 1; i < 5; ++i) {
    REQUIRE(g.programs[static_cast<std::size_t>(i)].rounds.size() == 1);
    CHECK(g.programs[static_cast<std::size_t>(i)].rounds[0].sends[0].dst == 0);
    CHECK(b.programs[static_cast<std::size_t>(i)].rounds.empty());
  }
  REQUIRE(b.programs[0].rounds.size() == 1);
  CHECK(b.programs[0].rounds[0].sends.size() == 4);
}

TEST_CASE("schedule names that force the all-to-many decomposition") {
  CHECK(forced_sparse_algorithm("cgm") == std::optional<std::string>("cgm"));
  CHECK(forced_sparse_algorithm("sparse") == std::optional<std::string>("sparse"));
  CHECK(forced_sparse_algorithm("cgm-links") == std::optional<std::string>("cgm-links"));
  CHECK(forced_sparse_algorithm("gm") == std::optional<std::string>("gm"));
  CHECK_FALSE(forced_sparse_algorithm("auto"));
  CHECK_FALSE(forced_sparse_algorithm("tree"));
}

TEST_CASE("planned CGM: no tokens on one switch, sender tokens on a tree, fewer phases than the dense schedule") {
  std::mt19937_64 rng(14);
  const Topology one = single_switch_topology(8);
  const SparsePattern p8 = SparsePattern::figure7(8, 3, rng);
  const Schedule s1 = planned_sparse(one, p8, "cgm");
  CHECK(s1.syncs.empty());
  CHECK(s1.contention_free);
  CHECK(verify_sparse(one, p8, s1));
  const Topology three = load_topology(aapc::test::topology_path("12-three-level"));
  const SparsePattern p12 = SparsePattern::figure7(12, 4, rng);
  const Schedule s3 = planned_sparse(three, p12, "cgm");
  CHECK(s3.sync.kind == SyncKind::kSenderAll);
  CHECK_FALSE(s3.syncs.empty());
  CHECK(verify_sparse(three, p12, s3));
  CHECK(s3.phases.size() < 36);  // the tree's load: the dense schedule's phases
  CHECK(static_cast<int>(s3.phases.size()) >= sparse_degree(p12));
  CHECK(planned_sparse(three, p12, "cgm", SyncSpec{}).syncs.empty());
  CHECK_THROWS(planned_sparse(one, p12, "cgm"));  // 12 ranks on 8 machines
}

TEST_CASE("the physical bound of a pattern: the busiest directed edge's messages at its rate") {
  const Topology two = load_topology(aapc::test::topology_path("8-two-switch"));
  SparsePattern p;
  p.n = 8;
  p.dsts.resize(8);
  // Every machine of the first switch sends to one of the second: 4 messages on one edge.
  const Rank a = 0;
  const Rank far = two.switch_of(a) == two.switch_of(7) ? 0 : 7;
  for (Rank i = 0; i < 8; ++i)
    if (two.switch_of(i) == two.switch_of(a) && i != far) p.dsts[static_cast<std::size_t>(i)].push_back(far);
  const PatternBound b = pattern_bound(two, p, 65536, 25'000'000);
  CHECK(b.messages == static_cast<std::int64_t>(p.messages()));
  CHECK(b.seconds == Approx(static_cast<double>(p.messages()) * 65536 * 8 / 25e6));
}

TEST_CASE("planned sparse schedules are kept by pattern, at most the capacity") {
  const Topology t = load_topology(aapc::test::topology_path("12-three-level"));
  SparsePlanCache cache(2);
  const auto a = cache.get(t, ring_of(12, 2), "cgm");
  CHECK(cache.get(t, ring_of(12, 2), "cgm") == a);
  CHECK(cache.hits() == 1);
  const auto b = cache.get(t, ring_of(12, 3), "cgm");
  CHECK(b != a);
  CHECK(cache.get(t, ring_of(12, 2), "gm") != a);  // another algorithm: another entry
  CHECK(cache.size() == 2);
  CHECK(cache.get(t, ring_of(12, 2), "cgm") != a);  // evicted, planned anew
  CHECK(cache.hits() == 1);
}

TEST_CASE("link masking: contention-free partial permutations, about as many as the busiest edge's messages") {
  std::mt19937_64 rng(14);
  for (const char* name : {"12-three-level", "64-two-level", "64-three-level", "8-two-switch"}) {
    const Topology t = load_topology(aapc::test::topology_path(name));
    for (int d : {2, 4, 8}) {
      SparsePattern p = SparsePattern::figure7(t.machine_count(), d, rng);
      for (int i = 0; i < p.n; ++i) std::erase(p.dsts[static_cast<std::size_t>(i)], i);
      const Permutations perms = link_masking(t, p);
      INFO(name << " d=" << d << ": " << perms.size() << " permutations");
      CHECK(check_permutations(p, perms).empty());
      const PatternBound b = pattern_bound(t, p, 1);
      CHECK(static_cast<std::int64_t>(perms.size()) >= b.messages);
      CHECK(static_cast<double>(perms.size()) <= 1.25 * static_cast<double>(b.messages) + 1);
      const Schedule s = planned_sparse(t, p, "sparse");
      CHECK(s.algorithm == "cgm-links");
      CHECK(s.contention_free);
      CHECK(verify_sparse(t, p, s));  // with the contention check of every phase
    }
  }
}
