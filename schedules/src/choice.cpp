#include "aapc/sched/choice.hpp"

namespace aapc::sched {

Choice auto_choice(const Topology& topology, std::uint64_t block_bytes) {
  // Calibrated with aapc-bench (2 cores, emulated clusters with 100 Mbit/s links, tbf, Linux
  // bridges; aggregate Mbit/s, auto's own row in parentheses where it differs):
  //
  // One switch (8-one-switch, limit 800): the synchronous shuffle of Tam/Wang (Alg. 2) needs
  // no synchronisation and was best or within noise at every size, 1 KiB to 1 MiB:
  //   1 KiB 202 (next best tree 141), 8 KiB 521 (tree 500), 64 KiB 717 (pairwise 710),
  //   1 MiB 764 (tree 763). Phased schedules pay for tokens they do not need on one switch.
  //   Interleaved at 1-8 KiB (2 sessions x 3 repetitions, ratio to the best of the same
  //   repetition, median): sync-shuffle 91-98%, every other schedule without tokens 90-99%,
  //   the order changing from run to run; the tree with tokens 65-91%.
  //
  // A tree of switches (8-two-switch limit 350, 12-three-level limit 367):
  // - small blocks (<= kSmallBlock): a block is at most 3 frames, the bridges' queues absorb
  //   what contends, and tokens cost more than they save (tree + sender-all 68-85% of the
  //   best below). Among the schedules without tokens the order changes from run to run; the
  //   group shuffle of Tam/Wang (Alg. 3, w = 4) was never below 94% of the best. aapc-bench
  //   with every schedule interleaved turn by turn, 3 sessions x 3 repetitions on 2026-11-22,
  //   each schedule's ratio to the best of the same repetition, median of the 9:
  //                    1 KiB                 2 KiB                 4 KiB
  //     8-two-switch   sync-shuffle 100      ring 99               group-shuffle 99
  //                    group-shuffle 94      group-shuffle 96      pairwise 89
  //                    tree 97, pairwise 94  pairwise 96, tree 93  tree 98, sync-shuffle 94
  //     12-three-level sync-shuffle 99       pairwise 100          pairwise 100
  //                    group-shuffle 95      group-shuffle 99      group-shuffle 94
  //                    pairwise 95, tree 92  tree 94, ring 92      tree 93, sync-shuffle 87
  //     tree + sender-all: 78, 77, 85 and 68, 70, 84.
  // - larger blocks: without sync, consecutive phases overlap, queues overflow and frames are
  //   resent (12-three-level 8 KiB: pairwise 245 with 1,781 frames resent, tree 246 with
  //   3,308; 16 KiB: tree 235 with 21,228); Faraj/Yuan/Patarasuk section 6's sender-based
  //   pair-wise tokens keep the phases apart at the lowest cost:
  //     8-two-switch   8 KiB 268 (no frame resent), 64 KiB 331, 1 MiB 336 = 96.0%
  //     12-three-level 8 KiB 298 (no frame resent), 64 KiB 349, 1 MiB 352 = 96.0%
  //   receiver-based tokens are 1-15% behind below 64 KiB (one more token round trip per
  //   phase) and equal above.
  //
  // Below 16 KiB the spread of the same schedule over three runs is often 10-50% on this
  // 2-core virtual machine (the host takes 5-20% of its time), so these are tendencies, not
  // margins; above, the figures repeat within a few percent.
  constexpr std::uint64_t kSmallBlock = 4096;
  if (topology.single_switch())
    return {{Algorithm::kSyncShuffle, 4}, {SyncKind::kNone, 1}, "one switch: synchronous shuffle, no synchronisation needed"};
  if (block_bytes <= kSmallBlock)
    return {{Algorithm::kGroupShuffle, 4}, {SyncKind::kNone, 1}, "tree of switches, small blocks: group shuffle without tokens, switch queues absorb the contention"};
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
