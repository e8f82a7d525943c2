// Single-copy hand-overs between the ranks of a machine: see single_copy.hpp.
#include "single_copy.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "aapc/mpi/bell.hpp"
#include "aapc/mpi/copy.hpp"

namespace aapc::mpi::single_copy {

namespace {

Slot& slot_of(const Op& op) { return op.plan->mailbox->slots[op.call % kSlots]; }

// Where local rank k's slot for `op` is, in k's memory.
std::uint64_t slot_at(const Op& op, int k) {
  return op.plan->mailboxes[static_cast<std::size_t>(k)] + (op.call % kSlots) * sizeof(Slot);
}

int pid_of(const Op& op, int k) { return op.plan->pids[static_cast<std::size_t>(k)]; }

std::string hex(std::uint64_t address) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

std::string comm_rank(const Op& op, int k) {
  const Plan& p = *op.plan;
  return std::to_string(p.place.ranks_on[static_cast<std::size_t>(p.machine)][static_cast<std::size_t>(k)]);
}

std::string failed(const Op& op, const std::string& why) {
  return "a hand-over between the ranks of machine " + std::to_string(op.plan->machine) + " failed: " + why;
}

// Reads (or writes) `len` bytes at `offset` into local rank k's slot for `op`.
std::string slot_io(const Op& op, int k, bool write, std::size_t offset, void* here, std::size_t len) {
  return copy_pieces(pid_of(op, k), write, static_cast<std::uint8_t*>(here), {{0, len}}, slot_at(op, k) + offset, {{0, len}});
}

// Where local rank k's blocks are in its own memory, from its description (describe() in
// op.cpp): its send blocks in destination order, or its receive blocks by source rank.
std::vector<Piece> theirs(const Op& op, int k, bool receive) {
  const Plan& p = *op.plan;
  const std::size_t n = p.place.machine_of.size(), stride = op.counts.size();
  const std::uint64_t* d = &op.all_counts[static_cast<std::size_t>(k) * stride];
  auto piece = [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    if (op.alltoall) return Piece{ur * d[receive ? 1 : 0], d[receive ? 1 : 0]};
    return Piece{d[(receive ? 3 : 2) * n + ur], d[(receive ? 1 : 0) * n + ur]};
  };
  std::vector<Piece> out;
  out.reserve(n);
  if (receive)
    for (std::size_t r = 0; r < n; ++r) out.push_back(piece(static_cast<int>(r)));
  else
    for (int r : destination_order(p.place)) out.push_back(piece(r));
  return out;
}

std::uint64_t base_of(const Op& op, int k, bool receive) {
  const std::size_t stride = op.counts.size();
  return op.all_counts[static_cast<std::size_t>(k) * stride + stride - (receive ? 1 : 2)];
}

}  // namespace

bool post(Op& op) {
  Slot& s = slot_of(op);
  if (s.posted.load(std::memory_order_relaxed) != s.over.load(std::memory_order_acquire)) return false;
  s.words = op.counts.size();
  s.at = reinterpret_cast<std::uint64_t>(op.counts.data());
  s.error_len = 0;  // the leader writes it only when this call fails: not an earlier call's words
  s.posted.store(op.call + 1ULL, std::memory_order_release);
  bell::ring(op.plan->leader_pid);  // a leader waiting for its ranks' descriptions looks now
  return true;
}

bool told(const Op& op) { return slot_of(op).over.load(std::memory_order_acquire) == op.call + 1ULL; }

std::string told_error(const Op& op) {
  const Slot& s = slot_of(op);
  return {s.error, std::min<std::size_t>(s.error_len, kErrorBytes)};
}

bool collect(Op& op, bool& moved) {
  const Plan& p = *op.plan;
  const std::size_t stride = op.counts.size();
  bool all = true;
  // Every rank's, even after one failed: the outcome goes into each rank's slot only once the
  // rank has posted there (else its post would wait for a slot that looks taken, or wipe the
  // outcome's words).
  for (int k = 0; k < p.local_size; ++k) {
    if (op.described[static_cast<std::size_t>(k)] != 0) continue;
    // `posted` alone first, then what was written before it, in a second read: one read of
    // the three words may load them in any order (the kernel copies with fast string moves,
    // whose loads x86 does not keep in address order), and a new `posted` with the `at` of
    // the slot's previous call read the freed description of that call (IMB-MPI1 at three
    // ranks a machine, under a load average of 24: "rank 2 called the all-to-all with
    // 23050210856-byte blocks").
    std::uint64_t posted = 0;
    struct {
      std::uint64_t words, at;
    } head{};
    std::string why = slot_io(op, k, false, offsetof(Slot, posted), &posted, sizeof posted);
    if (why.empty() && posted != op.call + 1ULL) {
      all = false;  // not called yet there
      continue;
    }
    if (why.empty()) why = slot_io(op, k, false, offsetof(Slot, words), &head, sizeof head);
    if (!why.empty()) why = "rank " + comm_rank(op, k) + "'s mailbox: " + why;
    if (why.empty() && head.words != stride)  // an erroneous program: another call there
      why = "rank " + comm_rank(op, k) + " described its blocks in " + std::to_string(head.words) + " words, rank " + comm_rank(op, p.leader_rank) +
            " in " + std::to_string(stride) + " (a different all-to-all?)";
    if (why.empty() && op.error.empty())
      if (const std::string e = copy_pieces(pid_of(op, k), false, reinterpret_cast<std::uint8_t*>(&op.all_counts[static_cast<std::size_t>(k) * stride]),
                                            {{0, stride * 8}}, head.at, {{0, stride * 8}});
          !e.empty())
        why = "rank " + comm_rank(op, k) + "'s description of call " + std::to_string(op.call) + " (" + std::to_string(stride) + " words at " + hex(head.at) + "): " + e;
    if (!why.empty() && op.error.empty()) op.error = failed(op, why);
    op.described[static_cast<std::size_t>(k)] = 1;
    moved = true;
  }
  return all;
}

// An MPI_Alltoall's local ranks must all have the leader's block length: the layout is made
// from it, and a rank with longer blocks (an erroneous program) is named rather than read past.
void pull(Op& op) {
  const Plan& p = *op.plan;
  const std::uint64_t block = op.sb.by_rank.front().length;
  for (int k = 0; k < p.local_size && op.error.empty(); ++k) {
    const std::uint64_t* d = &op.all_counts[static_cast<std::size_t>(k) * op.counts.size()];
    if (op.alltoall && (d[0] != block || d[1] != block)) {
      op.error = failed(op, "rank " + comm_rank(op, k) + " called the all-to-all with " + std::to_string(d[0]) + "-byte blocks to send and " +
                                std::to_string(d[1]) + " to receive, rank " + comm_rank(op, p.leader_rank) + " with " + std::to_string(block));
      break;
    }
    const std::string why =
        copy_pieces(pid_of(op, k), false, op.stage_send.data(), op.layout->gather[static_cast<std::size_t>(k)], base_of(op, k, false), theirs(op, k, false));
    if (!why.empty()) op.error = failed(op, "rank " + comm_rank(op, k) + "'s send blocks at " + hex(base_of(op, k, false)) + ": " + why);
  }
}

void push(Op& op) {
  const Plan& p = *op.plan;
  for (int k = 0; k < p.local_size && op.error.empty(); ++k) {
    const std::string why =
        copy_pieces(pid_of(op, k), true, op.stage_recv.data(), op.layout->scatter[static_cast<std::size_t>(k)], base_of(op, k, true), theirs(op, k, true));
    if (!why.empty()) op.error = failed(op, "rank " + comm_rank(op, k) + "'s receive blocks at " + hex(base_of(op, k, true)) + ": " + why);
  }
}

// The error's words first, then `over`, in two writes: the rank may read the words as soon
// as it sees `over`. A rank whose memory cannot be reached any more (gone) is not told.
void tell(const Op& op) {
  const Plan& p = *op.plan;
  std::uint64_t over = op.call + 1ULL;
  for (int k = 0; k < p.local_size; ++k) {
    if (k == p.leader_rank) continue;
    if (!op.error.empty()) {
      struct {
        std::uint64_t len;
        char text[kErrorBytes];
      } words{};
      words.len = std::min(op.error.size(), kErrorBytes);
      std::memcpy(words.text, op.error.data(), words.len);
      (void)slot_io(op, k, true, offsetof(Slot, error_len), &words, sizeof words);
    }
    (void)slot_io(op, k, true, offsetof(Slot, over), &over, sizeof over);
    bell::ring(pid_of(op, k));  // the rank waits for that word
  }
}

}  // namespace aapc::mpi::single_copy
