#include "aapc/sched/generate.hpp"

#include <stdexcept>

namespace aapc::sched {
namespace {

int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

}  // namespace

Mac generated_mac(int rank) {
  Mac mac;
  mac.bytes = {0x02, 0x00, 0x00, 0x00, static_cast<std::uint8_t>((rank + 1) >> 8), static_cast<std::uint8_t>((rank + 1) & 0xFF)};
  return mac;
}

TopologySpec random_tree_spec(const RandomTreeOptions& options, std::mt19937_64& rng) {
  if (options.machines < 2 || options.machines > 65534) throw std::invalid_argument("random tree needs 2..65534 machines");
  if (options.switches < 1) throw std::invalid_argument("random tree needs at least one switch");
  TopologySpec spec;
  spec.source = "<random tree>";
  std::string rate = std::to_string(options.rate_bps / 1000) + "kbit";
  auto link = [&](const std::string& a, const std::string& b) {
    spec.edges.push_back({a, b, {{"rate", rate}}});
  };
  for (int r = 0; r < options.machines; ++r) spec.nodes.push_back({"n" + std::to_string(r), {{"mac", generated_mac(r).str()}}});
  const int s = options.switches;
  for (int i = 0; i < s; ++i) spec.nodes.push_back({"s" + std::to_string(i), {}});
  for (int i = 1; i < s; ++i) {
    int parent = 0;
    switch (options.shape) {
      case TreeShape::kRandom: parent = uniform(rng, 0, i - 1); break;
      case TreeShape::kChain: parent = i - 1; break;
      case TreeShape::kStar:
      case TreeShape::kOneSwitch:
      case TreeShape::kTwoLevel: parent = 0; break;
    }
    link("s" + std::to_string(parent), "s" + std::to_string(i));
  }
  for (int r = 0; r < options.machines; ++r) {
    int sw = 0;
    if (options.shape == TreeShape::kTwoLevel) {
      sw = s == 1 ? 0 : 1 + static_cast<int>(static_cast<std::int64_t>(r) * (s - 1) / options.machines);
    } else if (options.shape != TreeShape::kOneSwitch) {
      // Without empty switches, the first s machines go one per switch.
      sw = (!options.leave_switches_empty && r < s) ? r : uniform(rng, 0, s - 1);
    }
    link("s" + std::to_string(sw), "n" + std::to_string(r));
  }
  return spec;
}

Topology random_tree(const RandomTreeOptions& options, std::mt19937_64& rng) {
  return Topology::from_spec(random_tree_spec(options, rng));
}

Topology single_switch_topology(int machines, std::uint64_t rate_bps) {
  RandomTreeOptions options;
  options.machines = machines;
  options.switches = 1;
  options.shape = TreeShape::kOneSwitch;
  options.rate_bps = rate_bps;
  std::mt19937_64 rng(1);
  return random_tree(options, rng);
}

}  // namespace aapc::sched
