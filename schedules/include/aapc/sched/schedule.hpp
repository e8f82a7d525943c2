// Schedules: phases of messages, and for every machine the program of rounds that the engine
// executes (docs/design.md, "One exchange").
//
// A Schedule is plain data. `phases` is what the papers tabulate (every ordered pair of
// machines exactly once); `programs` is what each node does: rounds whose destinations are
// sent interleaved frame by frame, the sync tokens a round waits for before it starts, the
// tokens it emits when its sends are done, and the tokens a node emits when a block has been
// completely received. Receiving is never scheduled.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "aapc/sched/topology.hpp"

namespace aapc::sched {

struct Message {
  Rank src = -1;
  Rank dst = -1;
  friend bool operator==(const Message&, const Message&) = default;
};

using Phase = std::vector<Message>;

enum class SyncTrigger : std::uint8_t {
  kAfterSend,     // emitted when the emitter's round `from_round` has sent all its frames
  kAfterReceive,  // emitted when the emitter has received the whole block from `after_src`
};

// One synchronisation token. `from` emits it, `to` waits for it before starting `to_round`.
// `from == to` is a local dependency (no frame on the wire).
struct Sync {
  std::uint32_t id = 0;
  Rank from = -1;
  Rank to = -1;
  SyncTrigger trigger = SyncTrigger::kAfterSend;
  int from_round = -1;  // kAfterSend
  Rank after_src = -1;  // kAfterReceive
  int to_round = -1;
};

// One destination of a round and the phase (or packet slot) its message belongs to.
struct Send {
  Rank dst = -1;
  int phase = -1;
};

struct Round {
  std::vector<Send> sends;  // blocks sent interleaved frame by frame, in this order
  bool dummy = false;       // Faraj/Yuan section 5 'dummy': keeps an idle machine busy
  std::vector<std::uint32_t> waits;  // sync ids to receive before the round starts
  std::vector<std::uint32_t> emits;  // sync ids (kAfterSend) to emit when its sends are done
  // The most bits per second on the wire, headers included, at which each of its blocks may
  // leave (0: no cap, the node's link alone paces the round): the slowest link on a block's
  // path, where the node's link would otherwise feed it faster (cap_round_rates).
  std::uint64_t rate_bps = 0;
  int phase() const { return sends.empty() ? -1 : sends.front().phase; }
};

struct Program {
  Rank rank = -1;
  std::vector<Round> rounds;
  // Sync ids (kAfterReceive) emitted once the block from `first` is complete; sorted by source.
  std::vector<std::pair<Rank, std::vector<std::uint32_t>>> on_receive;
  const std::vector<std::uint32_t>* emits_on_receive(Rank src) const;
};

// The synchronisation variants of Faraj/Yuan/Patarasuk section 5 (Table 5).
enum class SyncKind : std::uint8_t {
  kNone,                   // no-sync: phases only order each node's sends
  kDummy,                  // no-sync plus dummy messages for idle machines
  kSenderAll,              // pair-wise, sender-based, every phase
  kSenderPartial,          // pair-wise, sender-based, between blocks of `block` phases
  kReceiverAll,            // pair-wise, receiver-based, every phase
  kReceiverPartial,        // pair-wise, receiver-based, between blocks
  kBarrierAll,             // a barrier between phases
  kBarrierPartialNone,     // a barrier between blocks, nothing inside
  kBarrierPartialSender,   // a barrier between blocks, sender all inside
  kBarrierPartialReceiver  // a barrier between blocks, receiver all inside
};

struct SyncSpec {
  SyncKind kind = SyncKind::kNone;
  int block = 1;  // bs, for the partial variants

  // "none", "dummy", "sender-all", "sender-partial:4" (also "sender-partial(4)"),
  // "receiver-all", "receiver-partial:4", "barrier-all", "barrier-partial-none:4",
  // "barrier-partial-sender:4", "barrier-partial-receiver:4".
  static std::optional<SyncSpec> parse(std::string_view text);
  std::string name() const;
  bool partial() const;
  static std::vector<std::string> names();
};

// Combining schedules (Bruck's index algorithm, Sur/Jin/Panda's hypercube): a block no longer
// travels straight from its origin to its destination; each step gathers the blocks that
// cross one "dimension" into one message to one partner, which forwards them at later steps.
//
// One original block origin -> dest, as a piece of a step's message.
struct CombinePiece {
  Rank origin = -1;
  Rank dest = -1;
  friend bool operator==(const CombinePiece&, const CombinePiece&) = default;
};

// One step of a node: one message out to `to` and one in from `from`. `send` lists the pieces
// of the message in order (block k of the message is send[k]); `recv` lists what arrives from
// `from`, in its order. Each piece sent is the node's own block or one received at an earlier
// step; a piece received whose dest is the node is delivered there.
struct CombineStep {
  Rank to = -1;
  Rank from = -1;
  std::vector<CombinePiece> send;
  std::vector<CombinePiece> recv;
};

// How many synchronisations a plan needed, before and after removing redundant ones.
struct SyncStats {
  std::int64_t contending_pairs = 0;  // the paper's dependence graph: contending pairs to order (0 in a part)
  std::int64_t consecutive_pairs = 0; // of those, consecutive users of a directed edge
  std::int64_t tokens = 0;            // kept syncs that travel as frames
  std::int64_t local_waits = 0;       // kept syncs with from == to
  std::int64_t barrier_tokens = 0;    // of the tokens, those implementing barriers
  std::int64_t barriers = 0;
  std::int64_t dummy_messages = 0;
};

struct Schedule {
  std::string algorithm;
  int machines = 0;
  // Phases are packet-level slots interleaved inside rounds (synchronous and group shuffle):
  // at any instant, each node sends the frame of one slot.
  bool packet_level = false;
  // Every phase is claimed free of contention (no two messages share a directed edge).
  bool contention_free = false;
  std::vector<Phase> phases;
  std::vector<Program> programs;
  SyncSpec sync;
  std::vector<Sync> syncs;
  SyncStats sync_stats;
  // Combining schedules only (empty for the others): every node's steps, by rank. Program
  // round k sends step k's message; round k > 0 waits for a local token emitted when step
  // k-1's message has arrived, so that a step starts only once what it forwards is there.
  // `phases` then holds the messages of each step (node -> partner), not the blocks.
  std::vector<std::vector<CombineStep>> combine;
  // Paced schedules only (0 for the others): bits per second on the wire, headers included, at
  // which the engine sends each block of a round, so that a round of k blocks leaves at k times
  // this rate. The schedule promises that no link carries more than its rate even when every
  // block that crosses it is in flight at once (verify() checks it).
  std::uint64_t block_rate_bps = 0;
  // One node's part of a plan (plan_sync_part()): `programs` holds that node's program alone
  // (the others are empty), and `syncs` only the syncs it emits or waits for, with the ids of
  // the whole plan, whose count is `part_sync_total`. -1 for a whole plan.
  Rank part = -1;
  std::size_t part_sync_total = 0;

  std::size_t message_count() const;
  // The syncs of the whole plan, ids 0..sync_total()-1, whether this is the whole or a part.
  std::size_t sync_total() const { return part < 0 ? syncs.size() : part_sync_total; }
  bool combining() const { return !combine.empty(); }
};

// Caps every round whose blocks, sharing the sender's link equally, would leave faster than a
// slower link on one of their paths can carry them (Round::rate_bps): a tree whose links differ
// in rate would otherwise queue each such block at its slowest link, and contention-free phases
// would overflow the switches there. Every plan gets this (plan_sync); combining schedules and
// rounds that need no cap are left as they are.
void cap_round_rates(const Topology& topology, Schedule& schedule);

// Bits per second on the wire at which each block of `round` leaves a node whose link runs at
// `own_bps`: an equal share of the link, at most the paced rate (Schedule::block_rate_bps) and
// the round's cap (Round::rate_bps).
double block_rate(const Schedule& schedule, const Round& round, double own_bps);

// Programs of one destination per round, in phase order: what every phased algorithm runs.
// `only` >= 0: that node's rounds alone, every other program empty but for its rank.
std::vector<Program> programs_from_phases(int machines, const std::vector<Phase>& phases, Rank only = -1);

}  // namespace aapc::sched
