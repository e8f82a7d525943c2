// Combining schedules for tiny blocks: Bruck's index algorithm (any p) and the hypercube
// algorithm of Sur/Jin/Panda (p a power of two). Both send ceil(log2 p) messages per node
// instead of p-1, each gathering about p/2 blocks, and forward blocks through intermediate
// nodes: for blocks of a few bytes the per-message cost (headers, a round trip) dominates.
#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

#include "aapc/sched/algorithms.hpp"
#include "builders.hpp"

namespace aapc::sched {
namespace {

// Where a piece held by `holder` goes at step k, or -1 when it stays.
using Route = std::function<Rank(Rank holder, const CombinePiece& piece, int k)>;
// The partners of node i at step k.
using Partner = std::function<Rank(Rank i, int k)>;

int ceil_log2(int p) {
  int s = 0;
  while ((1 << s) < p) ++s;
  return s;
}

// Moves every block (o, d), o != d, from o to d along `route`, step by step, and records what
// each node sends and receives; the programs and local tokens follow from the steps.
Schedule simulate(std::string name, int p, int steps, const Partner& to_of, const Partner& from_of, const Route& route) {
  Schedule s;
  s.algorithm = std::move(name);
  s.machines = p;
  const auto n = static_cast<std::size_t>(p);
  std::vector<std::vector<CombinePiece>> held(n);
  for (Rank o = 0; o < p; ++o)
    for (Rank d = 0; d < p; ++d)
      if (o != d) held[static_cast<std::size_t>(o)].push_back({o, d});
  s.combine.assign(n, std::vector<CombineStep>(static_cast<std::size_t>(steps)));
  for (int k = 0; k < steps; ++k) {
    std::vector<std::vector<CombinePiece>> arriving(n);
    Phase phase;
    for (Rank i = 0; i < p; ++i) {
      CombineStep& step = s.combine[static_cast<std::size_t>(i)][static_cast<std::size_t>(k)];
      step.to = to_of(i, k);
      step.from = from_of(i, k);
      auto& mine = held[static_cast<std::size_t>(i)];
      auto moves = [&](const CombinePiece& piece) { return route(i, piece, k) == step.to; };
      std::copy_if(mine.begin(), mine.end(), std::back_inserter(step.send), moves);
      mine.erase(std::remove_if(mine.begin(), mine.end(), moves), mine.end());
      std::sort(step.send.begin(), step.send.end(),
                [](const CombinePiece& a, const CombinePiece& b) { return a.dest != b.dest ? a.dest < b.dest : a.origin < b.origin; });
      auto& next = s.combine[static_cast<std::size_t>(step.to)][static_cast<std::size_t>(k)].recv;
      next = step.send;
      for (const CombinePiece& piece : step.send)
        if (piece.dest != step.to) arriving[static_cast<std::size_t>(step.to)].push_back(piece);
      phase.push_back({i, step.to});
    }
    for (std::size_t i = 0; i < n; ++i) held[i].insert(held[i].end(), arriving[i].begin(), arriving[i].end());
    s.phases.push_back(std::move(phase));
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!held[i].empty()) throw std::logic_error(s.algorithm + ": a block did not reach its destination");
  // Round k sends step k's message; round k > 0 waits until step k-1's message is here.
  s.programs.resize(n);
  for (Rank i = 0; i < p; ++i) {
    Program& prog = s.programs[static_cast<std::size_t>(i)];
    prog.rank = i;
    const auto& mine = s.combine[static_cast<std::size_t>(i)];
    for (int k = 0; k < steps; ++k) {
      Round round;
      round.sends.push_back({mine[static_cast<std::size_t>(k)].to, k});
      if (k > 0) {
        Sync sync;
        sync.id = static_cast<std::uint32_t>(s.syncs.size());
        sync.from = sync.to = i;
        sync.trigger = SyncTrigger::kAfterReceive;
        sync.after_src = mine[static_cast<std::size_t>(k - 1)].from;
        sync.to_round = k;
        round.waits.push_back(sync.id);
        prog.on_receive.push_back({sync.after_src, {sync.id}});
        s.syncs.push_back(sync);
      }
      prog.rounds.push_back(std::move(round));
    }
    std::sort(prog.on_receive.begin(), prog.on_receive.end());
    s.sync_stats.local_waits += steps > 0 ? steps - 1 : 0;
  }
  return s;
}

}  // namespace

Schedule bruck_schedule(int p) {
  if (p < 2) throw std::invalid_argument("bruck needs at least 2 machines, got " + std::to_string(p));
  // Bruck, Ho, Kipnis, Upfal, Weathersby, "Efficient algorithms for all-to-all communications
  // in multiport message-passing systems" (IEEE TPDS 1997), the index algorithm with radix 2:
  // after the local rotation, node i's block for d sits at index j = (d - i) mod p; at step k
  // node i sends to (i + 2^k) mod p, and receives from (i - 2^k) mod p, every block whose
  // index has bit k set. A block thus moves by 2^k for each bit k of (d - o) mod p and lands on
  // d after ceil(log2 p) steps; the final inverse rotation is where the engine unpacks.
  const int steps = ceil_log2(p);
  return simulate(
      algorithm_name(Algorithm::kBruck), p, steps, [p](Rank i, int k) { return (i + (1 << k)) % p; },
      [p](Rank i, int k) { return ((i - (1 << k)) % p + p) % p; },
      [p](Rank holder, const CombinePiece& piece, int k) {
        const int index = ((piece.dest - piece.origin) % p + p) % p;
        return (index >> k) & 1 ? (holder + (1 << k)) % p : -1;
      });
}

Schedule hypercube_schedule(int p) {
  if (p < 2 || (p & (p - 1)) != 0)
    throw std::invalid_argument("hypercube needs a power of two machines (a d-dimensional hypercube has 2^d nodes), got " + std::to_string(p) +
                                "; use bruck for any number");
  // Sur/Jin/Panda section 3.2.1 (Fig. 3) and 5.3 (HRWG): in step k the pairs i, i ^ 2^k exchange
  // across dimension k; every node sends, consolidated as one message, the p/2 blocks whose
  // destination lies across that dimension (bit k of holder ^ dest set), its own and those
  // received in the earlier dimensions, which it forwards.
  const int steps = ceil_log2(p);
  auto partner = [](Rank i, int k) { return i ^ (1 << k); };
  return simulate(algorithm_name(Algorithm::kHypercube), p, steps, partner, partner,
                  [](Rank holder, const CombinePiece& piece, int k) { return ((holder ^ piece.dest) >> k) & 1 ? holder ^ (1 << k) : -1; });
}

Schedule build_bruck(const BuildInput& in) { return bruck_schedule(in.topology.machine_count()); }
Schedule build_hypercube(const BuildInput& in) { return hypercube_schedule(in.topology.machine_count()); }

}  // namespace aapc::sched
