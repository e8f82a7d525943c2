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
  //
  // A tree of switches (8-two-switch limit 350, 12-three-level limit 367):
  // - small blocks (<= kSmallBlock): a block is at most 3 frames, the bridges' queues absorb
  //   what contends, and tokens cost more than they save; the tree's phases without sync:
  //     8-two-switch   1 KiB tree 211 vs tree+sender-all 152; 2 KiB 301 vs 289; 4 KiB 319 vs 311
  //     12-three-level 1 KiB tree 230 vs 176;                  2 KiB 309 vs 257; 4 KiB 302 vs 286
  // - larger blocks: without sync, consecutive phases overlap, queues overflow and frames are
  //   resent (8-two-switch 16 KiB: tree 238 with 4518 frames resent); Faraj/Yuan/Patarasuk
  //   section 6's sender-based pair-wise tokens keep the phases apart at the lowest cost:
  //     8-two-switch   8 KiB 318 (tree 319, 9 resent), 64 KiB 331, 1 MiB 336 = 96.0%
  //     12-three-level 8 KiB 326 (tree 275),           64 KiB 349, 1 MiB 352 = 96.0%
  //   receiver-based tokens are 1-15% behind below 64 KiB (one more token round trip per
  //   phase) and equal above.
  //
  // Below 16 KiB these differences are of the size of the run-to-run noise on a 2-core box
  // (1 KiB sync-shuffle on one switch: 134 and 212 Mbit/s a minute apart); the 12-three-level
  // reruns of 2026-11-22 put pairwise (no sync) ahead at 2-4 KiB (304 and 334 vs 233 and 282),
  // which more runs should confirm before the rule changes.
  constexpr std::uint64_t kSmallBlock = 4096;
  if (topology.single_switch())
    return {{Algorithm::kSyncShuffle, 4}, {SyncKind::kNone, 1}, "one switch: synchronous shuffle, no synchronisation needed"};
  if (block_bytes <= kSmallBlock)
    return {{Algorithm::kTree, 4}, {SyncKind::kNone, 1}, "tree of switches, small blocks: contention-free phases, switch queues absorb the overlap"};
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
