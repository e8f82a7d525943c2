// All-to-many: Ranka/Wang/Fox LP, GM and CGM.
#include <catch2/catch.hpp>

#include <cmath>

#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/verify.hpp"

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
