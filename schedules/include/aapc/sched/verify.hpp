// The verifier: checks a schedule against the definitions of the papers, independently of
// how it was built.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aapc/sched/schedule.hpp"
#include "aapc/sched/topology.hpp"

namespace aapc::sched {

struct VerifyReport {
  std::vector<std::string> errors;  // empty when the schedule is correct (at most a few listed)
  std::int64_t error_count = 0;
  std::int64_t messages = 0;
  std::int64_t phases = 0;
  std::int64_t load = 0;
  std::int64_t orderings_checked = 0;  // contending pairs whose order the sync plan was checked for
  bool ok() const { return error_count == 0; }
  std::string summary() const;  // one line
};

// Checks that:
// - every ordered pair of distinct machines is sent exactly once;
// - a contention-free schedule has no two messages of a phase on one directed edge, and on
//   one switch every phase (packet slot) is a partial permutation;
// - `tree` has exactly `load` phases;
// - the programs send exactly the messages of the phases, in phase order;
// - the sync plan is well formed and deadlock-free, and orders every two contending messages
//   of different phases (of different blocks, for the partial variants) as the variant
//   promises: sender-based tokens order the end of a send before the next start, receiver
//   and barrier ones the end of a receipt.
// A combining schedule (Schedule::combine) is checked instead for: one distinct partner out and
// in per step, each message sent being the one its partner expects; every node sending only
// blocks it holds (its own, or received at an earlier step); every block reaching its
// destination exactly once; and programs whose round k waits for step k-1's message.
VerifyReport verify(const Topology& topology, const Schedule& schedule);

}  // namespace aapc::sched
