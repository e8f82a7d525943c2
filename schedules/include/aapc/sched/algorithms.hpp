// The schedule algorithms of the papers.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "aapc/sched/schedule.hpp"
#include "aapc/sched/topology.hpp"
#include "aapc/sched/tree.hpp"

namespace aapc::sched {

enum class Algorithm : std::uint8_t {
  kLinear,        // every node sends to 0..N-1 in order: the unscheduled baseline (Ranka's AC)
  kRing,          // shift: round k sends to i+k (Tam/Wang Alg. 1)
  kPairwise,      // XOR pairing for powers of two, edge colouring otherwise
  kPairwiseXor,   // XOR pairing; only for powers of two
  kPairwiseEc,    // edge-colouring pairing of Tam/Wang Fig. 1 for any p
  kLp,            // Ranka's linear permutation: XOR over the next power of two, idle slots
  kSyncShuffle,   // Tam/Wang Alg. 2: one round, packet-level interleave of all destinations
  kGroupShuffle,  // Tam/Wang Alg. 3: rounds of w edge-coloured partners, interleaved
  kTree,          // Faraj/Yuan contention-free phases for any tree
  kBruck,         // Bruck et al. 1997 index algorithm: ceil(log2 p) combining steps, any p
  kHypercube,     // Sur/Jin/Panda 3.2.1 hypercube combining: log2 p steps; p a power of two
};

struct AlgorithmSpec {
  Algorithm algorithm = Algorithm::kTree;
  int group = 4;  // w for group-shuffle

  // "tree", "linear", "ring", "pairwise", "pairwise-xor", "pairwise-ec", "lp",
  // "sync-shuffle", "group-shuffle" or "group-shuffle:W", "bruck", "hypercube".
  static std::optional<AlgorithmSpec> parse(std::string_view text);
  std::string name() const;
  static std::vector<std::string> names();
};

// Builds the schedule of `spec` on `topology`; throws std::invalid_argument when the algorithm
// does not apply (e.g. pairwise-xor on 6 machines).
Schedule make_schedule(const Topology& topology, const AlgorithmSpec& spec);

// The single-switch algorithms need only the number of machines.
Schedule linear_schedule(int p);
Schedule ring_schedule(int p);
Schedule pairwise_xor_schedule(int p);
Schedule pairwise_ec_schedule(int p);
Schedule lp_schedule(int p);
Schedule sync_shuffle_schedule(int p);
Schedule group_shuffle_schedule(int p, int w);

// Combining schedules for tiny blocks (Schedule::combine): few messages, each block forwarded
// through intermediate nodes. hypercube_schedule throws std::invalid_argument unless p is a
// power of two.
Schedule bruck_schedule(int p);
Schedule hypercube_schedule(int p);

// Tam/Wang Fig. 1: the partner of `me` in colour `round` of a proper edge colouring of K_p
// (p-1 colours for even p, p for odd p); -1 when `me` is idle in that colour (odd p only).
int edge_color_partner(int round, int me, int p);
int edge_color_count(int p);

// Faraj/Yuan section 4: contention-free phases, exactly load() of them.
Schedule tree_schedule(const TreeModel& model);

// The rotate pattern of section 4.3 (Table 1/2 of the two papers) for T_i -> T_j: the
// sender and receiver index at each of the |Mi| x |Mj| phases. `receivers` is the fixed
// sequence the receivers repeat (an enumeration of T_j), `senders` the base sequence.
std::vector<std::pair<int, int>> rotate_pattern(const std::vector<int>& senders, const std::vector<int>& receivers);

// Extended ring scheduling (section 4.2): the first phase of T_i -> T_j given subtree sizes
// sorted non-increasing.
std::int64_t global_start_phase(const std::vector<int>& sizes, int i, int j);

}  // namespace aapc::sched
