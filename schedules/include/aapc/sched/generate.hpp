// Topology generators for tests, benchmarks and `aapc-sched generate`.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "aapc/sched/topology.hpp"

namespace aapc::sched {

enum class TreeShape : std::uint8_t {
  kRandom,     // each switch hangs off a random earlier switch
  kChain,      // switches in a line
  kStar,       // one switch in the middle
  kOneSwitch,  // a single switch (other switches, if any, hang off it without machines)
  kTwoLevel,   // s0 a root without machines, s1.. leaves under it holding the machines in rank
               // order, as evenly as they divide (a two-level fat tree; the scale tables' trees)
};

struct RandomTreeOptions {
  int machines = 8;
  int switches = 2;
  TreeShape shape = TreeShape::kRandom;
  bool leave_switches_empty = true;  // machines land on random switches, some may get none
  std::uint64_t rate_bps = kDefaultRateBps;
};

// MAC of rank r in generated topologies: 02:00:00:00:hh:ll with hhll = r + 1.
Mac generated_mac(int rank);

TopologySpec random_tree_spec(const RandomTreeOptions& options, std::mt19937_64& rng);
Topology random_tree(const RandomTreeOptions& options, std::mt19937_64& rng);
// `machines` machines on one switch.
Topology single_switch_topology(int machines, std::uint64_t rate_bps = kDefaultRateBps);

}  // namespace aapc::sched
