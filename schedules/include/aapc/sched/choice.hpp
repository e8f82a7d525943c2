// The `auto` choice of schedule and sync variant, kept in one place with the measurements
// that justify it (see the comments in choice.cpp), and the barrier used between
// measured exchanges.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/schedule.hpp"
#include "aapc/sched/spec.hpp"
#include "aapc/sched/topology.hpp"
#include "aapc/sched/tree.hpp"

namespace aapc::sched {

struct Choice {
  AlgorithmSpec algorithm;
  SyncSpec sync;
  std::string reason;  // one line: why this choice
  // Chosen among kWeighed by what the cluster measured of each (the daemon runs the others now
  // and then, to measure them too).
  bool weighed = false;
};

// What `auto` weighs by their own measured exchanges, below 32 KiB on a tree of switches
// (docs/design.md, Fast links, "`auto` by measurement"): the tree's phases with sender-based
// tokens, the paced shuffle, and two unscheduled schedules that no model ranks (they lead where
// the hosts cannot send fast enough to overflow the switches' queues and lose everywhere else),
// in this order.
struct Weighed {
  Algorithm algorithm;
  SyncKind sync;
  AlgorithmSpec algorithm_spec() const { return {algorithm, 4}; }
  SyncSpec sync_spec() const { return {sync, 1}; }
};
inline constexpr std::array<Weighed, 4> kWeighed = {{{Algorithm::kTree, SyncKind::kSenderAll},
                                                    {Algorithm::kPacedShuffle, SyncKind::kNone},
                                                    {Algorithm::kSyncShuffle, SyncKind::kNone},
                                                    {Algorithm::kPairwiseEc, SyncKind::kNone}}};
// Their reaches are kept by octave of block size, from 512 B up to 4 MiB: below 32 KiB, where
// `auto` weighs all four, and from 32 KiB, where it weighs the unscheduled ones against the other
// two. The cells below 32 KiB keep the numbers that daemons which kept no others gave them (one
// schedule's octaves after another's), and those from 32 KiB come after all of them, so that a
// JOIN from such a daemon still means what it meant (wire.hpp, JoinMeasure).
// Where `auto`'s rule for large blocks on a tree begins (choice.cpp: the paced shuffle, the
// phases by their fit, and the unscheduled ones only where the hosts fall behind).
inline constexpr std::uint64_t kLargeBlockFrom = 32 * 1024;
inline constexpr std::uint64_t kReachSizeFrom = 512;
inline constexpr std::size_t kReachSmallSizes = 6;  // 512 B .. kLargeBlockFrom
static_assert((kReachSizeFrom << kReachSmallSizes) == kLargeBlockFrom, "the cells below 32 KiB are those of the small-block rule");
inline constexpr std::size_t kReachLargeSizes = 7;  // 32 KiB .. 4 MiB
inline constexpr std::size_t kReachSizes = kReachSmallSizes + kReachLargeSizes;
inline constexpr std::size_t kReachCells = kWeighed.size() * kReachSizes;
// The octave of `block_bytes` among those kept (0: from 512 B); none outside them.
std::optional<std::size_t> reach_octave(std::uint64_t block_bytes);
// The cell for `algorithm` with `sync` at blocks of `block_bytes`; none for another schedule,
// size, or parameter that the one `auto` runs does not have (a group shuffle's width).
std::optional<std::size_t> reach_cell(const AlgorithmSpec& algorithm, const SyncSpec& sync, std::uint64_t block_bytes);
inline std::optional<std::size_t> reach_cell(const Weighed& w, std::uint64_t block_bytes) { return reach_cell(w.algorithm_spec(), w.sync_spec(), block_bytes); }
// The cell's schedule ("paced-shuffle+none") and the smallest block of its octave.
std::string reach_cell_schedule(std::size_t cell);
std::uint64_t reach_cell_block(std::size_t cell);

// A block size that stands for "not the same on every rank" (alltoallv): the large-block choice.
inline constexpr std::uint64_t kAnyBlockSize = UINT64_MAX;

// What a cluster measured of its tree exchanges (docs/design.md, Fast links): the rate the
// phases' blocks crossed at, as a fraction of the rate the model gives them (a node that sends
// slower than its link, a link slower than its rate), and how long each phase took beyond its
// blocks (the hand-over: a token's way to the next sender, a wake-up, what the exchange's start
// costs a phase). The daemons agree on it when a session starts (the JOIN), so that every rank
// chooses alike. Not measured: fill 0.
// With it, what each of kWeighed reached (the best time over the time an exchange took, the
// exchanges' lowest reach a rank saw, together: reach_together) at each octave of sizes; 0: not
// measured.
struct Measured {
  double fill = 0;         // (0, 1]
  double hand_over_s = 0;  // per phase, at least 0
  std::array<double, kReachCells> reach{};
  bool known() const { return fill > 0; }  // the fit
  bool any_known() const { return known() || std::any_of(reach.begin(), reach.end(), [](double r) { return r > 0; }); }
  double reach_at(std::optional<std::size_t> cell) const { return cell ? reach[*cell] : 0; }
};

// Whether so many senders share the tree's bottleneck ((p - 1) x 4 < its load: 64-two-level,
// not 8-two-switch) that a link paced at 99% of its rate by all of them would queue, and
// unscheduled blocks would overflow it: there `auto` weighs no measure (choice.cpp).
bool shared_by_many_senders(const TreeModel& model);

// The fraction of the limit the tree's phases with tokens reach for blocks of `block_bytes`:
// the model's (TreeModel::phase_efficiency), and with `measured` known, each of the bottleneck's
// `load` phases taking its blocks' time / fill + hand_over_s.
double phases_reach(const TreeModel& model, std::uint64_t block_bytes, const Measured& measured = {});

// One tree exchange with tokens as one node saw it: the time the model gives its phases (at the
// links' rates, no hand-over) and the time it took, both per phase of the bottleneck's. Nothing
// for blocks of no one size.
struct TreeSample {
  double model_s = 0, took_s = 0;
};
std::optional<TreeSample> tree_sample(const TreeModel& model, std::uint64_t block_bytes, double took_s);

// The fill and hand-over that a node's samples show, the inverse of phases_reach(): took =
// model / fill + hand_over, fitted by Theil and Sen's estimator (the median of the slopes
// between samples, then of the intercepts; one exchange that a busy host slowed does not move
// it). Where the samples are of one block size, all of it is fill: the phases reach at that
// size what they reached. A fill is at most 1, a hand-over at least 0.
Measured fit_measured(const std::vector<TreeSample>& samples);

// The fraction of the limit an exchange of blocks of `block_bytes` that took `took_s` reached.
double exchange_reach(const TreeModel& model, std::uint64_t block_bytes, double took_s);
// The order in which a node lists the reaches it keeps (kept[c] of cell c, each cell's newest
// last) so that a frame with too little room for all of them, cut from the front, loses the
// oldest of every cell first: by age, the oldest first, the cells in turn at each age. Each
// entry is (cell, index among that cell's kept).
std::vector<std::pair<std::size_t, std::size_t>> reach_listing(const std::array<std::size_t, kReachCells>& kept);
// What exchanges of one size that reached `samples` reach together: their best times over the
// time they took, the harmonic mean, so that one held up by a resent frame counts as what it
// took (0 for none).
double reach_together(const std::vector<double>& samples);

// What `auto` runs for blocks of `block_bytes` on `topology`; the daemon, which keeps the
// tree model of its topology, calls the second form once per exchange, with what its cluster
// measured.
Choice auto_choice(const Topology& topology, std::uint64_t block_bytes);
Choice auto_choice(const TreeModel& model, std::uint64_t block_bytes, const Measured& measured = {});

// A spec of spec.hpp read: "+" separates, and where a user may type the old spellings,
// "ALGORITHM:SYNC" (aapc-bench --configs) and "ALGORITHM/SYNC" are taken when the part after
// the separator is a sync variant ("group-shuffle:4" stays one algorithm).
SpecText read_spec(std::string_view text);

// A spec parsed; a part left out or "auto" is nullopt. Throws std::invalid_argument that
// names the part not understood ("unknown schedule 'x'", "unknown sync variant 'y'").
struct PlanSpec {
  std::optional<AlgorithmSpec> algorithm;
  std::optional<SyncSpec> sync;
};
PlanSpec parse_plan_spec(std::string_view text);
std::string format_plan_spec(const AlgorithmSpec& algorithm, const SyncSpec& sync);

// What runs for `spec` (the policy in one place): "auto" is auto_choice() for the block size
// (a sync variant given is checked, then ignored: auto picks its own); a named schedule without
// a sync variant gets its row's (default_sync: the tree's phases sender-based tokens, the others
// none). Throws std::invalid_argument like parse_plan_spec(), for
// every algorithm alike ("unknown sync variant 'often'" after "auto" as after "ring").
Choice choose(const TreeModel& model, std::string_view spec, std::uint64_t block_bytes, const Measured& measured = {});

// A dissemination barrier made of tokens only: ceil(log_radix N) rounds without data, each node
// sending radix - 1 tokens per round; its algorithm is "barrier:RADIX". Throws
// std::invalid_argument for a radix below 2.
Schedule barrier_schedule(int machines, int radix = 2);
// The radix that costs the barrier of `machines` the least (the model in choice.cpp); with
// `wanted` > 0 (aapcd --barrier-radix), that radix, at least 2 and at most `machines`.
int barrier_radix(int machines, int wanted = 0);

}  // namespace aapc::sched
