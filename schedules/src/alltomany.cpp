#include "aapc/sched/alltomany.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "aapc/sched/generate.hpp"
#include "builders.hpp"

namespace aapc::sched {
namespace {

std::size_t idx(int x) { return static_cast<std::size_t>(x); }

int random_start(std::mt19937_64& rng, int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); }

}  // namespace

std::size_t SparsePattern::messages() const {
  std::size_t total = 0;
  for (const auto& row : dsts) total += row.size();
  return total;
}

int SparsePattern::max_degree() const {
  std::vector<int> in(idx(n), 0);
  int best = 0;
  for (const auto& row : dsts) {
    best = std::max(best, static_cast<int>(row.size()));
    for (Rank j : row) best = std::max(best, ++in[idx(j)]);
  }
  return best;
}

SparsePattern SparsePattern::figure7(int n, int d, std::mt19937_64& rng) {
  if (n < 1 || d < 0 || d > n) throw std::invalid_argument("figure7 needs 0 <= d <= n");
  std::vector<std::vector<std::uint8_t>> com(idx(n), std::vector<std::uint8_t>(idx(n), 0));
  for (int i = 0; i < d; ++i) {
    int k = i;
    for (int j = 0; j < n; ++j) {
      com[idx(j)][idx(k)] = 1;
      k = (k + 1) % n;
    }
  }
  // "ManyTimes" random row and column switches.
  std::vector<int> row(idx(n)), col(idx(n));
  std::iota(row.begin(), row.end(), 0);
  std::iota(col.begin(), col.end(), 0);
  for (int t = 0; t < 4 * n; ++t) {
    std::swap(row[idx(random_start(rng, n))], row[idx(random_start(rng, n))]);
    std::swap(col[idx(random_start(rng, n))], col[idx(random_start(rng, n))]);
  }
  SparsePattern p;
  p.n = n;
  p.dsts.resize(idx(n));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j)
      if (com[idx(row[idx(i)])][idx(col[idx(j)])] != 0) p.dsts[idx(i)].push_back(j);
  }
  return p;
}

SparsePattern SparsePattern::from_sizes(const std::vector<std::vector<std::uint64_t>>& sizes) {
  SparsePattern p;
  p.n = static_cast<int>(sizes.size());
  p.dsts.resize(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i].size() != sizes.size()) throw std::invalid_argument("size matrix must be square");
    for (std::size_t j = 0; j < sizes[i].size(); ++j)
      if (i != j && sizes[i][j] > 0) p.dsts[i].push_back(static_cast<Rank>(j));
  }
  return p;
}

Permutations linear_permutation(const SparsePattern& pattern) {
  const int n = pattern.n;
  std::vector<std::vector<std::uint8_t>> com(idx(n), std::vector<std::uint8_t>(idx(n), 0));
  for (int i = 0; i < n; ++i)
    for (Rank j : pattern.dsts[idx(i)]) com[idx(i)][idx(j)] = 1;
  int q = 1;
  while (q < n) q *= 2;
  Permutations perms;
  Phase self;
  for (int i = 0; i < n; ++i)
    if (com[idx(i)][idx(i)] != 0) self.push_back({i, i});
  if (!self.empty()) perms.push_back(std::move(self));
  for (int k = 1; k < q; ++k) {
    Phase perm;
    for (int i = 0; i < n; ++i) {
      int j = i ^ k;
      if (j < n && com[idx(i)][idx(j)] != 0) perm.push_back({i, j});
    }
    if (!perm.empty()) perms.push_back(std::move(perm));
  }
  return perms;
}

Permutations global_masking(const SparsePattern& pattern, std::mt19937_64& rng) {
  const int n = pattern.n;
  std::vector<std::vector<std::uint8_t>> com(idx(n), std::vector<std::uint8_t>(idx(n), 0));
  std::size_t remaining = 0;
  for (int i = 0; i < n; ++i)
    for (Rank j : pattern.dsts[idx(i)]) {
      com[idx(i)][idx(j)] = 1;
      ++remaining;
    }
  Permutations perms;
  std::vector<int> recvl(idx(n));
  while (remaining > 0) {
    std::fill(recvl.begin(), recvl.end(), -1);  // step 1
    int x = random_start(rng, n);               // step 2
    Phase perm;
    for (int k = 0; k < n; ++k) {  // step 3
      // (a) along row x, the first y with COM(x, y) = 1 and recvl(y) = -1.
      for (int y = 0; y < n; ++y) {
        if (com[idx(x)][idx(y)] != 0 && recvl[idx(y)] == -1) {
          recvl[idx(y)] = x;
          com[idx(x)][idx(y)] = 0;
          perm.push_back({x, y});
          break;
        }
      }
      x = (x + 1) % n;  // (b)
    }
    remaining -= perm.size();
    std::sort(perm.begin(), perm.end(), [](const Message& a, const Message& b) { return a.src < b.src; });
    perms.push_back(std::move(perm));
  }
  return perms;
}

Permutations compact_global_masking(const SparsePattern& pattern, std::mt19937_64& rng) {
  const int n = pattern.n;
  // Figure 5: CCOM holds the useful entries of each row first, randomly swapped; pvt(i) is
  // the last active column of row i.
  std::vector<std::vector<int>> ccom(idx(n));
  std::vector<int> pvt(idx(n));
  std::size_t remaining = 0;
  for (int i = 0; i < n; ++i) {
    ccom[idx(i)].assign(pattern.dsts[idx(i)].begin(), pattern.dsts[idx(i)].end());
    std::shuffle(ccom[idx(i)].begin(), ccom[idx(i)].end(), rng);  // Random_Swap
    pvt[idx(i)] = static_cast<int>(ccom[idx(i)].size()) - 1;
    remaining += ccom[idx(i)].size();
  }
  Permutations perms;
  std::vector<int> recvl(idx(n));
  while (remaining > 0) {
    std::fill(recvl.begin(), recvl.end(), -1);  // 2(a)
    int x = random_start(rng, n);               // 2(b)
    Phase perm;
    for (int k = 0; k < n; ++k) {  // 2(c)
      auto& row = ccom[idx(x)];
      int& last = pvt[idx(x)];
      for (int z = 0; z <= last; ++z) {  // i. the first entry whose receiver is still free
        int y = row[idx(z)];
        if (recvl[idx(y)] == -1) {
          recvl[idx(y)] = x;  // ii. and compact the row
          perm.push_back({x, y});
          row[idx(z)] = row[idx(last)];
          row[idx(last)] = -1;
          --last;
          break;
        }
      }
      x = (x + 1) % n;  // iii.
    }
    remaining -= perm.size();
    std::sort(perm.begin(), perm.end(), [](const Message& a, const Message& b) { return a.src < b.src; });
    perms.push_back(std::move(perm));
  }
  return perms;
}

std::string check_permutations(const SparsePattern& pattern, const Permutations& perms) {
  const int n = pattern.n;
  std::vector<std::vector<int>> count(idx(n), std::vector<int>(idx(n), 0));
  for (std::size_t p = 0; p < perms.size(); ++p) {
    std::vector<bool> sends(idx(n), false), receives(idx(n), false);
    for (const Message& m : perms[p]) {
      if (m.src < 0 || m.src >= n || m.dst < 0 || m.dst >= n) return "permutation " + std::to_string(p) + " names no node";
      if (sends[idx(m.src)] || receives[idx(m.dst)])
        return "permutation " + std::to_string(p) + " is not partial: " + std::to_string(m.src) + "->" + std::to_string(m.dst);
      sends[idx(m.src)] = receives[idx(m.dst)] = true;
      ++count[idx(m.src)][idx(m.dst)];
    }
  }
  for (int i = 0; i < n; ++i) {
    std::vector<int> expect(idx(n), 0);
    for (Rank j : pattern.dsts[idx(i)]) expect[idx(j)] = 1;
    for (int j = 0; j < n; ++j)
      if (count[idx(i)][idx(j)] != expect[idx(j)])
        return std::to_string(i) + "->" + std::to_string(j) + " appears " + std::to_string(count[idx(i)][idx(j)]) + " times, expected " +
               std::to_string(expect[idx(j)]);
  }
  return {};
}

namespace {

// Permutations of `in.pattern` as a schedule of one partner per round, without self messages.
// Contention-free on one switch only: in a partial permutation a node sends and receives at most
// once (Ranka/Wang/Fox), but on a tree two of its messages may share a link.
Schedule permutation_schedule(Algorithm algorithm, const BuildInput& in, Permutations perms) {
  const SparsePattern& pattern = *in.pattern;
  Schedule s;
  s.algorithm = algorithm_name(algorithm);
  s.machines = pattern.n;
  s.contention_free = in.topology.single_switch();
  for (auto& perm : perms) {
    perm.erase(std::remove_if(perm.begin(), perm.end(), [](const Message& m) { return m.src == m.dst; }), perm.end());
    if (!perm.empty()) s.phases.push_back(std::move(perm));
  }
  s.programs = programs_from_phases(pattern.n, s.phases);
  return s;
}

}  // namespace

// The registry's builders (algorithms.def). lp schedules every pair (single_switch.cpp) or,
// given one, a pattern.
Schedule build_cgm(const BuildInput& in) {
  std::mt19937_64 rng(in.seed);
  return permutation_schedule(Algorithm::kCgm, in, compact_global_masking(*in.pattern, rng));
}

Schedule build_gm(const BuildInput& in) {
  std::mt19937_64 rng(in.seed);
  return permutation_schedule(Algorithm::kGm, in, global_masking(*in.pattern, rng));
}

Schedule build_lp(const BuildInput& in) {
  if (in.pattern == nullptr) return lp_schedule(in.topology.machine_count());
  return permutation_schedule(Algorithm::kLp, in, linear_permutation(*in.pattern));
}

Schedule sparse_schedule(const SparsePattern& pattern, const std::string& algorithm, std::uint64_t seed) {
  return pattern_schedule(single_switch_topology(pattern.n), pattern, algorithm, seed);
}

}  // namespace aapc::sched
