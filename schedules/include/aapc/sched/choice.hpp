// The `auto` choice of schedule and sync variant, kept in one place with the measurements
// that justify it (see the comments in choice.cpp), and the barrier used between
// measured exchanges.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

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
};

// A block size that stands for "not the same on every rank" (alltoallv): the large-block choice.
inline constexpr std::uint64_t kAnyBlockSize = UINT64_MAX;

// What `auto` runs for blocks of `block_bytes` on `topology`; the daemon, which keeps the
// tree model of its topology, calls the second form once per exchange.
Choice auto_choice(const Topology& topology, std::uint64_t block_bytes);
Choice auto_choice(const TreeModel& model, std::uint64_t block_bytes);

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
Choice choose(const TreeModel& model, std::string_view spec, std::uint64_t block_bytes);

// A dissemination barrier made of tokens only: ceil(log_radix N) rounds without data, each node
// sending radix - 1 tokens per round; its algorithm is "barrier:RADIX". Throws
// std::invalid_argument for a radix below 2.
Schedule barrier_schedule(int machines, int radix = 2);
// The radix that costs the barrier of `machines` the least (the model in choice.cpp); with
// `wanted` > 0 (aapcd --barrier-radix), that radix, at least 2 and at most `machines`.
int barrier_radix(int machines, int wanted = 0);

}  // namespace aapc::sched
