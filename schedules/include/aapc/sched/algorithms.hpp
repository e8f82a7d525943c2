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
  kPacedShuffle,  // Alg. 2's one round, every block paced at its bottleneck link's share
  kTree,          // Faraj/Yuan contention-free phases for any tree
  kBruck,         // Bruck et al. 1997 index algorithm: ceil(log2 p) combining steps, any p
  kHypercube,     // Sur/Jin/Panda 3.2.1 hypercube combining: log2 p steps; p a power of two
};

// What a paced schedule takes of each link's rate: the engine's timers wake late by tens of
// microseconds on a busy host, and a link paced at exactly its rate keeps whatever queue that
// builds, while 1% of headroom drains it. (0.97 left 2-3 points of the limit unused on
// 8-two-switch at 100 Mbit/s, with no frame resent at either.)
inline constexpr double kPacedShare = 0.99;

struct AlgorithmSpec {
  Algorithm algorithm = Algorithm::kTree;
  int group = 4;  // w for group-shuffle

  // "tree", "linear", "ring", "pairwise", "pairwise-xor", "pairwise-ec", "lp",
  // "sync-shuffle", "group-shuffle" or "group-shuffle:W", "paced-shuffle", "bruck", "hypercube".
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

// The synchronous shuffle of Tam/Wang Alg. 2 on a tree of switches, with each block paced at
// `share` (below 1: headroom for timer jitter) of the rate that keeps every link within its
// rate while all blocks are in flight at once: min over links of rate / load, the load being
// Faraj/Yuan section 3's |Mu| x |Mv| messages that cross a link each way
// (Schedule::block_rate_bps). The exchange then takes load x block / rate on the bottleneck,
// as the phases do, but no node needs to fill a link by itself (a node sends its p - 1 blocks at
// (p - 1) / load of the rate) and no hand-over is waited for. docs/design.md, "Fast links".
Schedule paced_shuffle_schedule(const TreeModel& model, double share = kPacedShare);

// Faraj/Yuan section 4: contention-free phases, exactly load() of them.
Schedule tree_schedule(const TreeModel& model);
// The same phases without the programs (what the predictor needs at thousands of machines,
// where the programs' rounds would take gigabytes).
std::vector<Phase> tree_phases(const TreeModel& model);

// The rotate pattern of section 4.3 (Table 1/2 of the two papers) for T_i -> T_j: the
// sender and receiver index at each of the |Mi| x |Mj| phases. `receivers` is the fixed
// sequence the receivers repeat (an enumeration of T_j), `senders` the base sequence.
std::vector<std::pair<int, int>> rotate_pattern(const std::vector<int>& senders, const std::vector<int>& receivers);

// Extended ring scheduling (section 4.2): the first phase of T_i -> T_j given subtree sizes
// sorted non-increasing.
std::int64_t global_start_phase(const std::vector<int>& sizes, int i, int j);

}  // namespace aapc::sched
