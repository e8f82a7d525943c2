// All-to-many personalized communication decomposed into partial permutations
// (Ranka, Wang, Fox: LP, GM and CGM).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "aapc/sched/schedule.hpp"

namespace aapc::sched {

// A sparse communication matrix COM: dsts[i] lists the j with COM(i, j) = 1, ascending.
// A row may contain i itself (the paper's Figure 7 generator does).
struct SparsePattern {
  int n = 0;
  std::vector<std::vector<Rank>> dsts;

  std::size_t messages() const;
  int max_degree() const;  // lower bound on the number of permutations: max in- or out-degree
  // Figure 7: COM(j, (i + j) mod n) = 1 for i < d, then rows and columns swapped at random,
  // so every row and column holds exactly d entries.
  static SparsePattern figure7(int n, int d, std::mt19937_64& rng);
  // From per-destination sizes (alltoallv): COM(i, j) = 1 when i sends j a non-empty block.
  static SparsePattern from_sizes(const std::vector<std::vector<std::uint64_t>>& sizes);
};

using Permutations = std::vector<Phase>;

// Figure 3, extended to any n: XOR rounds over the next power of two, skipping absent messages.
Permutations linear_permutation(const SparsePattern& pattern);
// Figure 4, Global Masking.
Permutations global_masking(const SparsePattern& pattern, std::mt19937_64& rng);
// Figures 5 and 6, Compact Global Masking.
Permutations compact_global_masking(const SparsePattern& pattern, std::mt19937_64& rng);

// Checks that `perms` realises `pattern`: each entry exactly once, each permutation partial
// (a node sends at most once and receives at most once). Empty string when correct.
std::string check_permutations(const SparsePattern& pattern, const Permutations& perms);

// A schedule whose phases are the permutations of `algorithm` ("cgm", "gm" or "lp"), without
// self messages; rounds of one partner each.
Schedule sparse_schedule(const SparsePattern& pattern, const std::string& algorithm, std::uint64_t seed = 1);

}  // namespace aapc::sched
