// The staging layouts of aapc/mpi/layout.hpp.
#include "aapc/mpi/layout.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace aapc::mpi {

Placement Placement::from(const std::vector<int>& machine_of, int machines) {
  Placement p;
  p.machine_of = machine_of;
  p.ranks_on.assign(static_cast<std::size_t>(machines), {});
  p.local_index_.resize(machine_of.size());
  for (std::size_t r = 0; r < machine_of.size(); ++r) {
    const int m = machine_of[r];
    if (m < 0 || m >= machines) throw std::out_of_range("rank " + std::to_string(r) + " is on machine " + std::to_string(m));
    auto& on = p.ranks_on[static_cast<std::size_t>(m)];
    p.local_index_[r] = static_cast<int>(on.size());
    on.push_back(static_cast<int>(r));
  }
  return p;
}

bool Placement::covers_all() const {
  return std::none_of(ranks_on.begin(), ranks_on.end(), [](const auto& on) { return on.empty(); });
}

bool MachineBlocks::uniform() const {
  return std::all_of(counts.begin(), counts.end(), [&](std::uint64_t c) { return c == counts.front(); });
}

std::vector<int> destination_order(const Placement& p) {
  std::vector<int> order;
  order.reserve(p.machine_of.size());
  for (const auto& on : p.ranks_on) order.insert(order.end(), on.begin(), on.end());
  return order;
}

namespace {

// Machine-level blocks, machine by machine: for the `sender` side, block me -> b holds
// block(i -> j) for i on me, j on b; for the receiver side, block a -> me holds block(i -> j)
// for i on a, j on me. `place(k, peer, offset, length)` is told where each rank block lands,
// k being the local rank's index on `me` and peer the other end.
MachineBlocks machine_blocks(const Placement& p, int me, bool sender, const Length& len,
                             const std::function<void(int k, int peer, std::uint64_t offset, std::uint64_t length)>& place) {
  MachineBlocks mb;
  const auto& mine = p.ranks_on[static_cast<std::size_t>(me)];
  for (const auto& theirs : p.ranks_on) {
    mb.displs.push_back(mb.total);
    std::uint64_t count = 0;
    // Both sides order by source rank, then destination rank.
    const auto& sources = sender ? mine : theirs;
    const auto& dests = sender ? theirs : mine;
    for (int i : sources)
      for (int j : dests) {
        const std::uint64_t l = len(i, j);
        place(sender ? p.local_index(i) : p.local_index(j), sender ? j : i, mb.total + count, l);
        count += l;
      }
    mb.counts.push_back(count);
    mb.total += count;
  }
  return mb;
}

}  // namespace

LeaderLayout leader_layout(const Placement& p, int me, const Length& send_len, const Length& recv_len) {
  const std::size_t local = p.ranks_on.at(static_cast<std::size_t>(me)).size();
  const std::size_t n = p.machine_of.size();
  LeaderLayout out;
  // gather[k] is filled in destination_order, which is the order machine_blocks visits the
  // destinations of one source (machines increasing, ranks increasing), so append.
  out.gather.assign(local, {});
  out.send = machine_blocks(p, me, true, send_len, [&](int k, int, std::uint64_t off, std::uint64_t l) {
    out.gather[static_cast<std::size_t>(k)].push_back({off, l});
  });
  out.scatter.assign(local, std::vector<Piece>(n));
  out.recv = machine_blocks(p, me, false, recv_len, [&](int k, int i, std::uint64_t off, std::uint64_t l) {
    out.scatter[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = {off, l};
  });
  return out;
}

std::vector<Run> element_runs(std::uint64_t count, std::uint64_t size, std::uint64_t limit) {
  const std::uint64_t per = std::clamp<std::uint64_t>(size == 0 ? limit : limit / size, 1, 0x7fffffff);
  std::vector<Run> runs;
  for (std::uint64_t first = 0; first < count; first += per) runs.push_back({first, static_cast<int>(std::min(per, count - first))});
  return runs;
}

}  // namespace aapc::mpi
