// Random trees whose links run at rates drawn from a list (the unit tests of pacing and of
// links of different rates).
#pragma once

#include <random>
#include <string>
#include <vector>

#include "aapc/sched/generate.hpp"
#include "aapc/sched/topology.hpp"

namespace aapc::test {

inline sched::Topology mixed_rate_tree(std::mt19937_64& rng, int most_machines, int most_switches, const std::vector<std::string>& rates,
                                       int least_machines = 2) {
  sched::RandomTreeOptions o;
  o.machines = std::uniform_int_distribution<int>(least_machines, most_machines)(rng);
  o.switches = std::uniform_int_distribution<int>(1, most_switches)(rng);
  sched::TopologySpec spec = sched::random_tree_spec(o, rng);
  for (auto& e : spec.edges) e.attrs["rate"] = rates[std::uniform_int_distribution<std::size_t>(0, rates.size() - 1)(rng)];
  return sched::Topology::from_spec(spec);
}

}  // namespace aapc::test
