#include "aapc/sched/choice.hpp"

namespace aapc::sched {

Choice auto_choice(const Topology& topology, std::uint64_t block_bytes) {
  // Provisional rules (issue 5 calibrates them from aapc-bench sweeps):
  // - on one switch, packet-level interleave (Tam/Wang's synchronous shuffle) keeps every
  //   port busy without any synchronisation;
  // - on a tree of switches, the contention-free phases of Faraj/Yuan with sender-based
  //   pair-wise tokens, which their section 6 finds best for large messages.
  (void)block_bytes;
  if (topology.single_switch())
    return {{Algorithm::kSyncShuffle, 4}, {SyncKind::kNone, 1}, "one switch: synchronous shuffle, no synchronisation needed"};
  return {{Algorithm::kTree, 4}, {SyncKind::kSenderAll, 1}, "tree of switches: contention-free phases with sender-based tokens"};
}

Schedule barrier_schedule(int machines) {
  // Round s: i signals i + 2^s and waits for i - 2^(s-1) (the token of the previous round);
  // after the last round every node has heard, transitively, from every other.
  Schedule s;
  s.algorithm = "barrier";
  s.machines = machines;
  s.programs.resize(static_cast<std::size_t>(machines));
  int stages = 0;
  while ((1 << stages) < machines) ++stages;
  for (int i = 0; i < machines; ++i) {
    s.programs[static_cast<std::size_t>(i)].rank = i;
    s.programs[static_cast<std::size_t>(i)].rounds.resize(static_cast<std::size_t>(stages + 1));
  }
  for (int st = 0; st < stages; ++st) {
    for (int i = 0; i < machines; ++i) {
      int to = (i + (1 << st)) % machines;
      Sync sync;
      sync.id = static_cast<std::uint32_t>(s.syncs.size());
      sync.from = i;
      sync.to = to;
      sync.trigger = SyncTrigger::kAfterSend;
      sync.from_round = st;
      sync.to_round = st + 1;
      s.programs[static_cast<std::size_t>(i)].rounds[static_cast<std::size_t>(st)].emits.push_back(sync.id);
      s.programs[static_cast<std::size_t>(to)].rounds[static_cast<std::size_t>(st + 1)].waits.push_back(sync.id);
      s.syncs.push_back(sync);
    }
  }
  return s;
}

}  // namespace aapc::sched
