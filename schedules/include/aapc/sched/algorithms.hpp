// The schedule algorithms of the papers, and their registry (algorithms.def): one row per
// algorithm that the parser, names(), the tools' --help and the docs read.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "aapc/sched/schedule.hpp"
#include "aapc/sched/topology.hpp"
#include "aapc/sched/tree.hpp"

namespace aapc::sched {

struct SparsePattern;  // alltomany.hpp

// The algorithms of the registry (algorithms.def), one enumerator per row.
enum class Algorithm : std::uint8_t {
#define AAPC_ALGORITHM(ID, NAME, PARAM, DEFAULT, KIND, INPUT, SYNC, BUILDER, DESCRIPTION) ID,
#include "aapc/sched/algorithms.def"
#undef AAPC_ALGORITHM
};

// Where an algorithm's phases are free of contention (docs/design.md, "Schedules and the papers").
enum class AlgorithmKind : std::uint8_t {
  kSwitch,     // on one switch; on a tree of switches an unscheduled baseline (contention_free false)
  kTree,       // on any tree of switches
  kPaced,      // every link within its rate by pacing, not phase by phase (docs/design.md, Fast links)
  kCombining,  // blocks combined into few messages forwarded through other nodes: alltoall only
};

// What an algorithm schedules.
enum class AlgorithmInput : std::uint8_t {
  kDense,    // every ordered pair's block (alltoall; an alltoallv skips its empty blocks)
  kPattern,  // an alltoallv's pattern of non-empty blocks, as partial permutations: alltoallv only
  kEither,   // either
};

// What a builder gets: the topology, the parameter (the row's default when a spec gives none),
// and for an alltoallv's decomposition its pattern (nullptr: every pair) and a random seed.
struct BuildInput {
  const Topology& topology;
  int param = 0;
  const SparsePattern* pattern = nullptr;
  std::uint64_t seed = 1;
  // false: the phases alone, for the sync planner, which makes the programs it keeps itself
  // (plan_part). A builder may still make them; the tree's does not (at 4,096 machines its
  // 16.8 million rounds took 1.9 GB, all of them thrown away).
  bool programs = true;
};

// One row of the registry (algorithms.def).
struct AlgorithmInfo {
  Algorithm id;
  std::string_view name;
  std::string_view param;  // the letter of its one integer parameter ("W"), empty for none
  int param_default;
  AlgorithmKind kind;
  AlgorithmInput input;
  std::string_view sync;  // the sync variant of a spec that names none; empty for a pattern's row
  Schedule (*build)(const BuildInput&);
  std::string_view description;

  // NAME, or NAME[:W] for an algorithm with a parameter.
  std::string usage() const;
};

// Every row, in the registry's order.
std::span<const AlgorithmInfo> algorithms();
// The row of `name` (without a parameter); nullptr when there is none.
const AlgorithmInfo* find_algorithm(std::string_view name);
// Whether the algorithm `name` (without a parameter) takes one. Read from the rows here, inline,
// so that libaapc's client asks it without linking the schedules library.
inline bool takes_parameter(std::string_view name) {
#define AAPC_ALGORITHM(id, row_name, param, ...) \
  if (name == (row_name)) return std::string_view(param).size() != 0;
#include "aapc/sched/algorithms.def"
#undef AAPC_ALGORITHM
  return false;
}
const AlgorithmInfo& algorithm_info(Algorithm id);
// The name a schedule built by the row `id` carries (Schedule::algorithm): the row's NAME, and
// for a row that takes a parameter NAME:PARAM ("group-shuffle:4"; `param` is ignored for the
// others). Builders name their schedules with it, so that a name is written once, in its row.
std::string algorithm_name(Algorithm id, int param = 0);
// NAME:PARAM, the one form of a schedule's name with its parameter ("group-shuffle:4",
// "barrier:2").
std::string name_with_param(std::string_view name, int param);

// The names of the schedules that are not rows of the registry: no spec names them (the parser
// refuses them, algorithm_of gives nullopt), the daemons build them for themselves. A gather and
// a broadcast agree on an alltoallv's pattern (gather_schedule, broadcast_schedule), a barrier
// is a collective of its own (barrier_schedule, named NAME:RADIX).
inline constexpr std::string_view kGatherName = "gather";
inline constexpr std::string_view kBroadcastName = "broadcast";
inline constexpr std::string_view kBarrierName = "barrier";

// The dense row a schedule's name (Schedule::algorithm: "tree", "group-shuffle:4") or a spec's
// algorithm part names; nullopt for any other name ("barrier:2", "gather", "cgm", "auto").
std::optional<Algorithm> algorithm_of(std::string_view name);
// The usages of the algorithms a spec may name, joined with ", ", as --help lists them: with
// kDense those that schedule every pair (make_schedule), with kPattern those that schedule only
// an alltoallv's pattern (planned_sparse, which the daemon runs for them).
std::string algorithm_usages(AlgorithmInput input);
// The registry as the Markdown table in docs/guide.md (unit test "the docs list the registry's
// algorithms").
std::string algorithms_markdown();

// What a paced schedule takes of each link's rate: the engine's timers wake late by tens of
// microseconds on a busy host, and a link paced at exactly its rate keeps whatever queue that
// builds, while 1% of headroom drains it. (0.97 left 2-3 points of the limit unused on
// 8-two-switch at 100 Mbit/s, with no frame resent at either.)
inline constexpr double kPacedShare = 0.99;

// A dense algorithm of the registry and its parameter.
struct AlgorithmSpec {
  Algorithm algorithm = Algorithm::kTree;
  int param = 4;  // the row's parameter (group-shuffle's W); ignored by an algorithm without one

  // "NAME" or "NAME:P" (also "NAME(P)", "NAME=P") for a row that takes a parameter and does not
  // need an alltoallv's pattern (AlgorithmInput kDense, kEither); nullopt for anything else.
  static std::optional<AlgorithmSpec> parse(std::string_view text);
  std::string name() const;
  // Every dense algorithm, with its default parameter ("group-shuffle:4").
  static std::vector<std::string> names();
};

// The sync variant that runs with `algorithm` when a spec names none (the row's SYNC): the
// tree's phases get sender-based tokens (Faraj/Yuan's best for large messages), the others none.
SyncSpec default_sync(Algorithm algorithm);

// Builds the schedule of `spec` on `topology` (the row's builder); throws std::invalid_argument
// when the algorithm does not apply (e.g. pairwise-xor on 6 machines) or needs a pattern.
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

// Faraj/Yuan section 4: contention-free phases, exactly load() of them; without the programs
// where `programs` is false (BuildInput::programs).
Schedule tree_schedule(const TreeModel& model, bool programs = true);
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
