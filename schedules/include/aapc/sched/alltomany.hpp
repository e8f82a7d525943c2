// All-to-many personalized communication decomposed into partial permutations
// (Ranka, Wang, Fox: LP, GM and CGM).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string_view>
#include <string>
#include <vector>

#include "aapc/sched/schedule.hpp"
#include "aapc/sched/topology.hpp"

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

// A schedule whose phases are the permutations of `algorithm` ("cgm", "gm" or "lp": any
// algorithm of the registry that schedules a pattern, planned as on one switch), without self
// messages; rounds of one partner each.
Schedule sparse_schedule(const SparsePattern& pattern, const std::string& algorithm, std::uint64_t seed = 1);

// The schedule of `pattern` by `algorithm`, a row of the registry (algorithms.def) whose input is
// a pattern (lp, cgm, gm, cgm-links, sparse), on `topology`, without sync; throws
// std::invalid_argument for any other name.
Schedule pattern_schedule(const Topology& topology, const SparsePattern& pattern, std::string_view algorithm, std::uint64_t seed = 1);

// --- alltoallv on the wire ---------------------------------------------------------------------

// The largest in- or out-degree of `pattern` without its self messages: what CGM's number of
// permutations approaches (Ranka/Wang/Fox section 4: about d for Figure 7's patterns).
int sparse_degree(const SparsePattern& pattern);

// Whether an alltoallv of `pattern` on `topology` runs as all-to-many permutations (link
// masking, planned_sparse's "sparse") instead of the dense schedule of `dense_phases` phases with
// empty blocks skipped; the same on every rank for the same pattern. The rule and the
// measurements behind it: sparse_plan.cpp.
struct SparseVerdict {
  bool sparse = false;
  int degree = 0;  // sparse_degree()
  std::string reason;
};
SparseVerdict sparse_verdict(const Topology& topology, const SparsePattern& pattern, std::size_t dense_phases);

// Every rank's send sizes (send[i][j]: what i sends j) against every rank's receive sizes
// (recv[j][i]: what j expects from i), self excluded: the first pair that disagrees, by receiver
// then sender, named with both sizes; empty when they all agree.
std::string sizes_mismatch(const std::vector<std::vector<std::uint64_t>>& send, const std::vector<std::vector<std::uint64_t>>& recv);

// One block from every rank to `root` (in rank order, one round each), and one from `root` to
// every rank (one round, interleaved): how the daemons agree on an alltoallv's pattern with 2(n-1)
// messages instead of n(n-1).
Schedule gather_schedule(int machines, Rank root);
Schedule broadcast_schedule(int machines, Rank root);

// Compact Global Masking extended from senders and receivers to every link of a tree: partial
// permutations in which no two messages share a directed edge (contention-free phases, as the
// tree's dense phases are), packed greedily with the messages on the most loaded links first, so
// that their number approaches the busiest edge's message count (the pattern's bound) rather than
// the degree. On one switch it is a CGM ordered by load.
Permutations link_masking(const Topology& topology, const SparsePattern& pattern);

// The all-to-many algorithm a schedule spec's algorithm part forces: a row of the registry that
// schedules only a pattern ("cgm", "gm", "cgm-links", or "sparse", planned_sparse's choice);
// nullopt for every other (dense) name.
std::optional<std::string> forced_sparse_algorithm(std::string_view algorithm);

// The all-to-many schedule `algorithm` ("cgm", "gm", "lp", "cgm-links", or "sparse": cgm on one
// switch, cgm-links on a tree) planned for `topology`: on one switch partial permutations are
// contention-free and run without tokens; on a tree of switches the phases get `sync` (default:
// sender-based tokens, plan_sync): between CGM's phases, whose messages may share a link, and
// between cgm-links's, which do not but would drift into each other.
Schedule planned_sparse(const Topology& topology, const SparsePattern& pattern, const std::string& algorithm,
                        const std::optional<SyncSpec>& sync = std::nullopt);

// The physical bound of `pattern` with blocks of `block` bytes: the directed edge whose
// messages take longest at its rate (every link at `rate_bps` when it is not 0), how many
// messages cross it, and their payload bytes' time on it.
struct PatternBound {
  int edge = -1;
  std::int64_t messages = 0;
  double seconds = 0;
};
PatternBound pattern_bound(const Topology& topology, const SparsePattern& pattern, std::uint64_t block, std::uint64_t rate_bps = 0);

// planned_sparse() results by pattern, algorithm and sync, at most `capacity` of them (the oldest
// goes first). Patterns are compared whole; the hash only finds candidates.
class SparsePlanCache {
 public:
  explicit SparsePlanCache(std::size_t capacity = 16) : capacity_(capacity) {}
  std::shared_ptr<const Schedule> get(const Topology& topology, const SparsePattern& pattern, const std::string& algorithm,
                                      const std::optional<SyncSpec>& sync = std::nullopt);
  std::size_t size() const { return entries_.size(); }
  std::size_t hits() const { return hits_; }

 private:
  struct Entry {
    std::uint64_t hash = 0;
    std::vector<std::vector<Rank>> dsts;
    std::string key;  // algorithm and sync
    std::shared_ptr<const Schedule> schedule;
  };
  std::size_t capacity_;
  std::size_t hits_ = 0;
  std::deque<Entry> entries_;
};

}  // namespace aapc::sched
