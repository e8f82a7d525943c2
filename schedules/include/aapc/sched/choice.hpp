// The `auto` choice of schedule and sync variant, kept in one place with the measurements
// that justify it (see the comments in choice.cpp), and the barrier used between
// measured exchanges.
#pragma once

#include <cstdint>
#include <string>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/schedule.hpp"
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

// A dissemination barrier made of tokens only: ceil(log2 N) rounds without data.
Schedule barrier_schedule(int machines);

}  // namespace aapc::sched
