// The paced shuffle: Tam/Wang's synchronous shuffle (Alg. 2) carried onto a tree of switches by
// pacing each block at its bottleneck link's share of the rate.
#include <cmath>
#include <stdexcept>

#include "aapc/sched/algorithms.hpp"
#include "builders.hpp"

namespace aapc::sched {

Schedule paced_shuffle_schedule(const TreeModel& model, double share) {
  if (!(share > 0.0 && share <= 1.0)) throw std::invalid_argument("paced-shuffle: the share of the rate must be in (0, 1]");
  const int p = model.topology().machine_count();
  Schedule s = sync_shuffle_schedule(p);
  s.algorithm = algorithm_name(Algorithm::kPacedShuffle);
  // Every ordered pair's block is in flight from the start to the end of the one round, so a
  // link carries all of its load at once: Faraj/Yuan section 3's |Mu| x |Mv| blocks each way.
  // Paced at rate / load of the link that limits the exchange (the minimum over links, which
  // TreeModel keeps as the peak aggregate throughput over the number of ordered pairs), no link
  // carries more than its rate, and the exchange takes the section 3 bound over `share`.
  const double pairs = static_cast<double>(p) * static_cast<double>(p - 1);
  s.block_rate_bps = static_cast<std::uint64_t>(std::floor(share * model.peak_aggregate_bps() / pairs));
  if (s.block_rate_bps == 0) throw std::invalid_argument("paced-shuffle: the links are too slow to pace " + std::to_string(p - 1) + " blocks a node");
  // Contention-free in the rate sense (verify() checks the rates), not slot by slot: a slot of
  // Alg. 2 is a permutation, which on a tree may still cross a link twice.
  s.contention_free = false;
  return s;
}

Schedule build_paced_shuffle(const BuildInput& in) { return paced_shuffle_schedule(TreeModel(in.topology)); }

}  // namespace aapc::sched
