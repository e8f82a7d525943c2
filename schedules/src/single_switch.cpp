// Schedules for machines on one non-blocking switch: Tam/Wang (shift, pairwise with the edge
// colouring of Fig. 1, synchronous shuffle, group shuffle) and Ranka/Wang/Fox (AC, LP).
#include <stdexcept>
#include <string>

#include "aapc/sched/algorithms.hpp"
#include "builders.hpp"

namespace aapc::sched {
namespace {

void require_machines(int p, Algorithm algorithm) {
  if (p < 2)
    throw std::invalid_argument(std::string(algorithm_info(algorithm).name) + " needs at least 2 machines, got " + std::to_string(p));
}

Schedule phased(Algorithm algorithm, int p, std::vector<Phase> phases, bool contention_free) {
  Schedule s;
  s.algorithm = algorithm_name(algorithm);
  s.machines = p;
  s.contention_free = contention_free;
  s.phases = std::move(phases);
  s.programs = programs_from_phases(p, s.phases);
  return s;
}

}  // namespace

Schedule linear_schedule(int p) {
  require_machines(p, Algorithm::kLinear);
  // Phase k holds every node's k-th send: node i sends to 0..N-1 in order, skipping itself.
  std::vector<Phase> phases(static_cast<std::size_t>(p - 1));
  for (int i = 0; i < p; ++i)
    for (int k = 0; k < p - 1; ++k) phases[static_cast<std::size_t>(k)].push_back({i, k < i ? k : k + 1});
  return phased(Algorithm::kLinear, p, std::move(phases), false);
}

Schedule ring_schedule(int p) {
  require_machines(p, Algorithm::kRing);
  // Alg. 1: in round k, i sends to (i+k) mod p and receives from (i-k) mod p.
  std::vector<Phase> phases;
  for (int k = 1; k < p; ++k) {
    Phase phase;
    for (int i = 0; i < p; ++i) phase.push_back({i, (i + k) % p});
    phases.push_back(std::move(phase));
  }
  return phased(Algorithm::kRing, p, std::move(phases), true);
}

Schedule pairwise_xor_schedule(int p) {
  require_machines(p, Algorithm::kPairwiseXor);
  if ((p & (p - 1)) != 0)
    throw std::invalid_argument("pairwise-xor needs a power of two machines, got " + std::to_string(p) +
                                "; use pairwise-ec (edge colouring) or lp");
  std::vector<Phase> phases;
  for (int k = 1; k < p; ++k) {
    Phase phase;
    for (int i = 0; i < p; ++i) phase.push_back({i, i ^ k});
    phases.push_back(std::move(phase));
  }
  return phased(Algorithm::kPairwiseXor, p, std::move(phases), true);
}

int edge_color_count(int p) { return p % 2 == 1 ? p : p - 1; }

int edge_color_partner(int round, int me, int p) {
  // Tam/Wang Fig. 1 (EdgeColor), verbatim.
  const int chi = edge_color_count(p);
  int v = 0;
  if (me < chi) {
    v = ((round + chi - me) % chi + chi) % chi;
  } else {
    v = round % 2 == 1 ? ((round + chi) / 2) % chi : (round / 2) % chi;
  }
  if (p % 2 == 1 && v == me) return -1;  // idle for this round
  if (v == me) return chi;
  return v;
}

Schedule pairwise_ec_schedule(int p) {
  require_machines(p, Algorithm::kPairwiseEc);
  std::vector<Phase> phases;
  for (int c = 0; c < edge_color_count(p); ++c) {
    Phase phase;
    for (int i = 0; i < p; ++i)
      if (int partner = edge_color_partner(c, i, p); partner >= 0) phase.push_back({i, partner});
    phases.push_back(std::move(phase));
  }
  return phased(Algorithm::kPairwiseEc, p, std::move(phases), true);
}

Schedule lp_schedule(int p) {
  require_machines(p, Algorithm::kLp);
  // Ranka/Wang/Fox Fig. 3, extended to any n: XOR over the next power of two; a node whose
  // partner does not exist idles in that permutation.
  int q = 1;
  while (q < p) q *= 2;
  std::vector<Phase> phases;
  for (int k = 1; k < q; ++k) {
    Phase phase;
    for (int i = 0; i < p; ++i)
      if ((i ^ k) < p) phase.push_back({i, i ^ k});
    if (!phase.empty()) phases.push_back(std::move(phase));
  }
  return phased(Algorithm::kLp, p, std::move(phases), true);
}

Schedule sync_shuffle_schedule(int p) {
  require_machines(p, Algorithm::kSyncShuffle);
  // Alg. 2: one round; at packet instant i every node sends its next frame to (me+i) mod p, so
  // each slot is a permutation and no two frames of an instant share an output port.
  Schedule s;
  s.algorithm = algorithm_name(Algorithm::kSyncShuffle);
  s.machines = p;
  s.packet_level = true;
  s.contention_free = true;
  for (int k = 1; k < p; ++k) {
    Phase slot;
    for (int i = 0; i < p; ++i) slot.push_back({i, (i + k) % p});
    s.phases.push_back(std::move(slot));
  }
  s.programs.resize(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) {
    Program& prog = s.programs[static_cast<std::size_t>(i)];
    prog.rank = i;
    Round round;
    for (int k = 1; k < p; ++k) {
      round.sends.push_back({(i + k) % p, k - 1});
    }
    prog.rounds.push_back(std::move(round));
  }
  return s;
}

Schedule group_shuffle_schedule(int p, int w) {
  require_machines(p, Algorithm::kGroupShuffle);
  if (w < 1) throw std::invalid_argument("group-shuffle needs a group size w >= 1");
  // Alg. 3: ceil(chi/w) rounds; round i shuffles over the partners of colours
  // EdgeColor((i-1)w+1 .. iw). Colours are numbered 1..chi as in the algorithm (chi == 0 mod chi).
  const int chi = edge_color_count(p);
  Schedule s;
  s.algorithm = algorithm_name(Algorithm::kGroupShuffle, w);
  s.machines = p;
  s.packet_level = true;
  s.contention_free = true;
  for (int c = 1; c <= chi; ++c) {
    Phase slot;
    for (int i = 0; i < p; ++i)
      if (int partner = edge_color_partner(c % chi, i, p); partner >= 0) slot.push_back({i, partner});
    s.phases.push_back(std::move(slot));
  }
  s.programs.resize(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) {
    Program& prog = s.programs[static_cast<std::size_t>(i)];
    prog.rank = i;
    for (int first = 1; first <= chi; first += w) {
      Round round;
      for (int c = first; c < first + w && c <= chi; ++c) {
        if (int partner = edge_color_partner(c % chi, i, p); partner >= 0) {
          round.sends.push_back({partner, c - 1});
        }
      }
      if (!round.sends.empty()) prog.rounds.push_back(std::move(round));
    }
  }
  return s;
}

// The registry's builders (algorithms.def).
Schedule build_linear(const BuildInput& in) { return linear_schedule(in.topology.machine_count()); }
Schedule build_ring(const BuildInput& in) { return ring_schedule(in.topology.machine_count()); }
Schedule build_pairwise(const BuildInput& in) {
  const int p = in.topology.machine_count();
  return (p & (p - 1)) == 0 ? pairwise_xor_schedule(p) : pairwise_ec_schedule(p);
}
Schedule build_pairwise_xor(const BuildInput& in) { return pairwise_xor_schedule(in.topology.machine_count()); }
Schedule build_pairwise_ec(const BuildInput& in) { return pairwise_ec_schedule(in.topology.machine_count()); }
Schedule build_sync_shuffle(const BuildInput& in) { return sync_shuffle_schedule(in.topology.machine_count()); }
Schedule build_group_shuffle(const BuildInput& in) { return group_shuffle_schedule(in.topology.machine_count(), in.param); }

}  // namespace aapc::sched
