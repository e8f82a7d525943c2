// Single-copy hand-overs between the ranks of a machine, for plans whose machine
// may use them (plan.cpp, choose_handover): every rank leaves the description of its blocks
// in a mailbox in its own memory, and the machine's leader reads it there, copies the blocks
// between the ranks' buffers and its staging (aapc/mpi/copy.hpp), and leaves the outcome in
// the same mailbox. No MPI call on either side, so a thread of the leader may do all of it
// (the progress thread, op.hpp), and the other ranks only look at their own memory.
// Not installed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "op.hpp"

namespace aapc::mpi::single_copy {

// Calls of one plan in flight on a rank at once; a rank's next call waits for its slot.
constexpr std::size_t kSlots = 32;
constexpr std::size_t kErrorBytes = 256;  // MPI_MAX_ERROR_STRING in both MPIs

struct Slot {
  // The rank's, written before `posted`: its description (Op::counts), `words` words at `at`.
  // The leader reads `posted`, and only then, in a read of its own, `words` and `at`.
  std::atomic<std::uint64_t> posted{0};  // 1 + the call described
  std::uint64_t words = 0;
  std::uint64_t at = 0;
  // The leader's, written before `over`: the outcome, an error's words if it failed.
  std::atomic<std::uint64_t> over{0};  // 1 + the call that is over
  std::uint64_t error_len = 0;
  char error[kErrorBytes] = {};
};

// One per rank and plan; its address goes to the leader when the plan is made.
struct Mailbox {
  Slot slots[kSlots];
};

// A rank's call (not the leader's): its description into its slot. False while the slot is
// taken by a call of the plan still in flight here.
bool post(Op& op);

// A rank's call: whether the leader has said that it is over; and if so, what failed (empty
// on success).
bool told(const Op& op);
std::string told_error(const Op& op);

// The leader: reads the descriptions that have come (op.described). True when every local
// rank has posted its call (a rank whose memory cannot be read counts, and fails the op);
// `moved` when one more has.
bool collect(Op& op, bool& moved);

// The leader: every local rank's blocks into staging, then (after the exchange) out of it.
void pull(Op& op);
void push(Op& op);

// The leader: the outcome (op.error, empty on success) into every other rank's mailbox.
void tell(const Op& op);

}  // namespace aapc::mpi::single_copy
