// alltoallv on the wire: when a pattern runs as Ranka/Wang/Fox's partial permutations, the
// check of the ranks' sizes against each other, and the planned schedules kept by pattern.
#include <algorithm>
#include <stdexcept>

#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/sync.hpp"
#include "builders.hpp"

namespace aapc::sched {
namespace {

std::size_t idx(int x) { return static_cast<std::size_t>(x); }

std::uint64_t fnv(std::uint64_t h, std::uint64_t v) {
  for (int b = 0; b < 8; ++b) {
    h ^= (v >> (8 * b)) & 0xFF;
    h *= 1099511628211ULL;
  }
  return h;
}

std::uint64_t pattern_hash(const SparsePattern& p, const std::string& key) {
  std::uint64_t h = 14695981039346656037ULL;
  h = fnv(h, static_cast<std::uint64_t>(p.n));
  for (const auto& row : p.dsts) {
    h = fnv(h, row.size());
    for (Rank j : row) h = fnv(h, static_cast<std::uint64_t>(j));
  }
  for (char c : key) h = fnv(h, static_cast<unsigned char>(c));
  return h;
}

struct Routed {
  Message m;
  std::vector<int> edges;  // directed edges of its path
  std::int64_t key = 0;    // the largest remaining load among them
};

}  // namespace

// Greedy list scheduling: each permutation takes, most loaded path first, every message whose
// edges are all still free in it. A message's machine uplink and downlink are on its path, so
// a permutation stays partial; a busiest edge carries a message in every permutation until its
// load runs out, which is what holds the count near the bound.
Permutations link_masking(const Topology& topology, const SparsePattern& pattern) {
  std::vector<Routed> left;
  std::vector<std::int64_t> load(idx(topology.directed_edge_count()), 0);
  for (int i = 0; i < pattern.n; ++i)
    for (Rank j : pattern.dsts[idx(i)])
      if (j != i) {
        left.push_back({{i, j}, topology.path_between(i, j), 0});
        for (int e : left.back().edges) ++load[idx(e)];
      }
  Permutations perms;
  std::vector<std::uint8_t> used(load.size());
  while (!left.empty()) {
    for (Routed& r : left) {
      r.key = 0;
      for (int e : r.edges) r.key = std::max(r.key, load[idx(e)]);
    }
    std::stable_sort(left.begin(), left.end(), [](const Routed& a, const Routed& b) { return a.key > b.key; });
    std::fill(used.begin(), used.end(), 0);
    Phase perm;
    std::vector<Routed> later;
    for (Routed& r : left) {
      const bool free = std::none_of(r.edges.begin(), r.edges.end(), [&](int e) { return used[idx(e)] != 0; });
      if (!free) {
        later.push_back(std::move(r));
        continue;
      }
      for (int e : r.edges) {
        used[idx(e)] = 1;
        --load[idx(e)];
      }
      perm.push_back(r.m);
    }
    std::sort(perm.begin(), perm.end(), [](const Message& a, const Message& b) { return a.src < b.src; });
    perms.push_back(std::move(perm));
    left = std::move(later);
  }
  return perms;
}

int sparse_degree(const SparsePattern& pattern) {
  std::vector<int> in(idx(pattern.n), 0);
  int best = 0;
  for (int i = 0; i < pattern.n; ++i) {
    int out = 0;
    for (Rank j : pattern.dsts[idx(i)]) {
      if (j == i) continue;
      ++out;
      best = std::max(best, ++in[idx(j)]);
    }
    best = std::max(best, out);
  }
  return best;
}

// The dense schedule runs every phase of the topology whatever the pattern (on a tree, the
// load: |Mu| x |Mv| phases of the bottleneck, each handing tokens on), empty blocks skipped but
// the hand-overs kept; link masking runs about as many contention-free phases as the pattern's
// busiest link carries messages. Each phase costs about a block's time on its busiest link, so
// the sparse schedule wins when it has clearly fewer phases. Measured (docs/sparse.md, 64 KiB):
// 8-two-switch, 3 of 8 destinations: 5 phases against 16, 30.0 ms against the dense 34.3; 4 of 8:
// 8 against 16, 46.6 against 51.8. The line: at most three quarters of the dense phases. A full
// pattern needs at least the load, so it stays dense.
SparseVerdict sparse_verdict(const Topology& topology, const SparsePattern& pattern, std::size_t dense_phases) {
  SparseVerdict v;
  v.degree = sparse_degree(pattern);
  if (v.degree == 0) {
    v.reason = "no messages between ranks";
    return v;
  }
  // Link masking needs at least the busiest link's messages: past the line already, a dense
  // pattern is not planned (0.3 s for 128 machines' full pattern).
  const auto busiest = static_cast<std::size_t>(pattern_bound(topology, pattern, 1).messages);
  const bool past = 4 * busiest > 3 * dense_phases;
  const std::size_t phases = past ? busiest : link_masking(topology, pattern).size();
  v.sparse = 4 * phases <= 3 * dense_phases;
  v.reason = std::string(v.sparse ? "sparse: " : "dense: ") + (past ? "at least " : "") + std::to_string(phases) +
             " contention-free phases against " + std::to_string(dense_phases) + ", up to " + std::to_string(v.degree) + " peers per rank";
  return v;
}

std::string sizes_mismatch(const std::vector<std::vector<std::uint64_t>>& send, const std::vector<std::vector<std::uint64_t>>& recv) {
  const std::size_t n = send.size();
  if (recv.size() != n) return "the send and receive matrices have " + std::to_string(n) + " and " + std::to_string(recv.size()) + " rows";
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < n; ++i) {
      if (send[i].size() != n || recv[j].size() != n) return "a row of sizes does not have " + std::to_string(n) + " entries";
      if (i == j || send[i][j] == recv[j][i]) continue;
      return "rank " + std::to_string(i) + " sends rank " + std::to_string(j) + " " + std::to_string(send[i][j]) + " bytes; rank " +
             std::to_string(j) + " expects " + std::to_string(recv[j][i]) + " bytes from rank " + std::to_string(i);
    }
  }
  return {};
}

Schedule gather_schedule(int machines, Rank root) {
  Schedule s;
  s.algorithm = kGatherName;
  s.machines = machines;
  for (Rank i = 0; i < machines; ++i)
    if (i != root) s.phases.push_back({{i, root}});
  s.programs = programs_from_phases(machines, s.phases);
  return s;
}

Schedule broadcast_schedule(int machines, Rank root) {
  Schedule s;
  s.algorithm = kBroadcastName;
  s.machines = machines;
  s.packet_level = true;
  s.programs.resize(idx(machines));
  for (Rank i = 0; i < machines; ++i) s.programs[idx(i)].rank = i;
  Round round;
  for (Rank j = 0; j < machines; ++j) {
    if (j == root) continue;
    round.sends.push_back({j, static_cast<int>(s.phases.size())});
    s.phases.push_back({{root, j}});
  }
  if (!round.sends.empty()) s.programs[idx(root)].rounds.push_back(std::move(round));
  return s;
}

// The registry's builders (algorithms.def).
Schedule build_cgm_links(const BuildInput& in) {
  Schedule s;
  s.algorithm = algorithm_name(Algorithm::kCgmLinks);
  s.machines = in.pattern->n;
  s.contention_free = true;
  s.phases = link_masking(in.topology, *in.pattern);
  s.programs = programs_from_phases(s.machines, s.phases);
  return s;
}

Schedule build_sparse(const BuildInput& in) { return in.topology.single_switch() ? build_cgm(in) : build_cgm_links(in); }

Schedule planned_sparse(const Topology& topology, const SparsePattern& pattern, const std::string& algorithm,
                        const std::optional<SyncSpec>& sync) {
  if (pattern.n != topology.machine_count())
    throw std::invalid_argument("a pattern of " + std::to_string(pattern.n) + " ranks on " + std::to_string(topology.machine_count()) + " machines");
  Schedule s = pattern_schedule(topology, pattern, algorithm);
  const SyncSpec given = sync ? *sync : topology.single_switch() ? SyncSpec{} : SyncSpec{SyncKind::kSenderAll, 1};
  return plan_sync(topology, s, given);
}

PatternBound pattern_bound(const Topology& topology, const SparsePattern& pattern, std::uint64_t block, std::uint64_t rate_bps) {
  std::vector<std::int64_t> crossing(idx(topology.directed_edge_count()), 0);
  for (int i = 0; i < pattern.n; ++i)
    for (Rank j : pattern.dsts[idx(i)])
      if (j != i)
        for (int e : topology.path_between(i, j)) ++crossing[idx(e)];
  PatternBound b;
  for (int e = 0; e < topology.directed_edge_count(); ++e) {
    const std::uint64_t rate = rate_bps != 0 ? rate_bps : topology.links()[idx(e / 2)].rate_bps;
    const double t = static_cast<double>(crossing[idx(e)]) * static_cast<double>(block) * 8 / static_cast<double>(rate);
    if (crossing[idx(e)] > 0 && t > b.seconds) b = {e, crossing[idx(e)], t};
  }
  return b;
}

std::shared_ptr<const Schedule> SparsePlanCache::get(const Topology& topology, const SparsePattern& pattern, const std::string& algorithm,
                                                     const std::optional<SyncSpec>& sync) {
  const std::string key = algorithm + "+" + (sync ? sync->name() : "default");
  const std::uint64_t h = pattern_hash(pattern, key);
  for (const Entry& e : entries_) {
    if (e.hash == h && e.key == key && e.dsts == pattern.dsts) {
      ++hits_;
      return e.schedule;
    }
  }
  auto s = std::make_shared<const Schedule>(planned_sparse(topology, pattern, algorithm, sync));
  if (capacity_ == 0) return s;
  if (entries_.size() >= capacity_) entries_.pop_front();
  entries_.push_back({h, pattern.dsts, key, s});
  return s;
}

}  // namespace aapc::sched
