// Where every rank's blocks go when an MPI communicator's all-to-all runs on aapc with several
// ranks per machine. Pure arithmetic, no MPI: the unit suite checks it.
//
// The composition of MPICH's MPIDI_Alltoall_intra_composition_alpha, with aapc as the
// inter-node step: the ranks of a machine hand their blocks to the machine's leader (through
// the MPI's shared memory, never the wire), the leaders' daemons exchange ONE machine-level
// block per pair of machines (the blocks of all of a's ranks for all of b's ranks), so the
// schedule stays machine-level and contention-free, and the leader hands each local rank its
// blocks back.
//
// Layouts, for comm ranks numbered 0..n-1 and machines 0..M-1 (the daemons' ranks):
//   send staging (leader of a): for b in machines, for i in ranks_on[a], for j in ranks_on[b]:
//       block(i -> j)                         -- machine-level block a -> b is contiguous
//   recv staging (leader of b): for a in machines, for i in ranks_on[a], for j in ranks_on[b]:
//       block(i -> j)                         -- the same bytes, as a's leader sent them
// ranks_on[m] lists the comm ranks on machine m in increasing order, which is also the
// order of the local communicator (split with the comm rank as key).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace aapc::mpi {

// Which machine each rank of a communicator is on.
struct Placement {
  std::vector<int> machine_of;           // by comm rank
  std::vector<std::vector<int>> ranks_on;  // by machine: comm ranks, increasing

  // `machine_of[r]` in 0..machines-1 for every r.
  static Placement from(const std::vector<int>& machine_of, int machines);
  int machines() const { return static_cast<int>(ranks_on.size()); }
  // Every machine has at least one rank.
  bool covers_all() const;
  // Position of comm rank r among the ranks of its machine.
  int local_index(int r) const { return local_index_[static_cast<std::size_t>(r)]; }

 private:
  std::vector<int> local_index_;
};

struct Piece {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// Per-machine counts and displacements of the machine-level exchange, in bytes.
struct MachineBlocks {
  std::vector<std::uint64_t> counts, displs;
  std::uint64_t total = 0;
  bool uniform() const;  // every count equal
};

// Bytes from comm rank i to comm rank j.
using Length = std::function<std::uint64_t(int i, int j)>;

// The order in which a rank hands its blocks to its leader: destinations machine by machine
// (increasing), ranks of a machine in increasing order.
std::vector<int> destination_order(const Placement& p);

struct LeaderLayout {
  MachineBlocks send, recv;
  // gather[k]: where local rank k's blocks land in send staging, in destination_order.
  std::vector<std::vector<Piece>> gather;
  // scatter[k]: where local rank k's blocks are in recv staging, by source comm rank 0..n-1.
  std::vector<std::vector<Piece>> scatter;
};

// The leader's layouts for machine `me`. send_len(i, j) is asked for i on `me` (from the
// senders' counts), recv_len(i, j) for j on `me` (from the receivers' counts).
LeaderLayout leader_layout(const Placement& p, int me, const Length& send_len, const Length& recv_len);

// MPI_Pack and MPI_Unpack take int counts and sizes, so a block of more than `limit` packed
// bytes goes in runs of whole elements: `count` elements of `size` bytes each, as (first
// element, elements) pairs of at most `limit` bytes. An element larger than `limit` is a run
// of its own (the MPI refuses it, and says so). Empty for no elements.
struct Run {
  std::uint64_t first = 0;
  int elements = 0;
};
std::vector<Run> element_runs(std::uint64_t count, std::uint64_t size, std::uint64_t limit = 0x7fffffff);

}  // namespace aapc::mpi
