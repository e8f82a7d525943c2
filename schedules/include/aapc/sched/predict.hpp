// The time of one exchange predicted from its plan: the longest path (critical path) through
// every node's rounds and the tokens between them, with a wire model for the rounds and a
// hand-over model of named terms for the tokens.
//
// A round starts when its node's previous round has sent its last frame, when every token it
// waits for has arrived, and when every receiver of its blocks has said READY (docs/design.md,
// "One exchange"). It takes its blocks' bytes on the wire at the node's link rate (or, for a
// paced schedule, at its blocks' paced rate), each block no faster than the slowest link on its
// path. The exchange ends when the last block has
// arrived whole. For contention-free phases (Faraj/Yuan section 4) with tokens (Faraj/Yuan/
// Patarasuk section 5) this is exact up to the hand-over terms: no two blocks share a link at
// once, so a block's time on the wire is its bytes over the rate. Where blocks overlap on a link
// (the shuffles and the phases without tokens on a tree of switches) the path alone would
// undercount, and the prediction is the larger of the path and the busiest link's bytes over its
// rate: a flow model, which sees neither switch queues nor drops.
#pragma once

#include <cstdint>
#include <vector>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/frame.hpp"
#include "aapc/sched/schedule.hpp"
#include "aapc/sched/topology.hpp"

namespace aapc::sched {

// When a sender-based token leaves its sender.
enum class TokenLeaves : std::uint8_t {
  kDrained,  // when its round's last frame has left the sender (what the engine does)
  kArrived,  // when its round's blocks have arrived whole at their receivers
};

// What it costs to hand a link over: the time from the event a token reports (a round's last
// frame leaving its sender, a block complete at its receiver) to the waiting round's start.
// Each term is named so that it can be measured on its own (docs/scale.md, "Predicting an
// exchange from its plan": where each default comes from, and the emulator's).
struct HandOver {
  double per_link_s = 0.0;       // each link the token crosses: cable and PHY, fixed
  // Full frames the token queues behind at each link it crosses; a sender-based token's first
  // link holds its own round's last frame, which the round's time already counts.
  double frames_ahead = 1.0;
  // Frames a block's last frame is held at each link after its sender's own, before the next
  // link takes it: 1 where switches store and forward (hardware), 0 through shapers that pass a
  // frame at once while their bucket holds tokens (the emulator's tbf). It is what a
  // receiver-based token, and one that leaves when the blocks arrived, waits for.
  double store_forward = 1.0;
  // The token's own frame, serialised at each link it crosses: the Ethernet header, the control
  // header and at most 64 bytes of the exchange's descriptor (before the wire's extra).
  std::uint32_t token_bytes = kFrameEthHeaderBytes + kFrameControlHeaderBytes + 64;
  double per_switch_s = 0.5e-6;  // each switch it crosses: the switch's forwarding latency
  double per_nic_s = 1e-6;       // each NIC it crosses: the emitter's and the waiter's
  double engine_s = 0.2e-6;      // the two engines: build, parse and act on the token (measured)
  double lead_s = 0.0;           // sender-based tokens leave this long before their event
  TokenLeaves leaves = TokenLeaves::kDrained;
};

struct PredictOptions {
  std::uint64_t block_bytes = 65536;
  // Bytes every frame takes on the wire beyond its Ethernet header and payload: FCS, preamble
  // and inter-frame gap (24) on real Ethernet; 0 in the emulator, whose tbf shapers count only
  // the header and payload.
  std::uint32_t wire_extra_bytes = 24;
  // The share of each link's rate that the senders carry: 1 where a NIC paces in hardware; less
  // where a sender's pacing loses time to late wake-ups. aapc-trace handover measures it from
  // captures (the blocks' received share); on the emulator it came out at 100-101%.
  double link_share = 1.0;
  HandOver hand_over;
  // Keep the critical path's steps in Prediction::path (a few bytes per round on it).
  bool keep_path = true;
};

// One step of the critical path. Steps follow each other: each starts where the previous ends.
struct PathStep {
  enum class Kind : std::uint8_t {
    kReady,     // from the exchange's start to the first round's start (READY from receivers)
    kRound,     // a round sending its blocks: `node`'s round `round`
    kToken,     // a token from `node` to `peer` (for a receiver-based one, the block's delivery too)
    kDelivery,  // the last block's last frame on its way from `node` to `peer`
  };
  Kind kind = Kind::kRound;
  Rank node = -1;
  Rank peer = -1;
  std::int64_t round = -1;  // a round's index in its node's program (-1 when predicted from the phases)
  int phase = -1;           // a round's phase (its first block's)
  double start_s = 0.0;
  double end_s = 0.0;
};

struct Prediction {
  double time_s = 0.0;        // the exchange: the larger of path_s and link_bound_s
  double limit_s = 0.0;       // Faraj/Yuan section 3's bound (TreeModel::best_time_s), at the full rates
  double path_s = 0.0;        // the critical path's length in time
  double link_bound_s = 0.0;  // the busiest directed link: its blocks' bytes on the wire over its rate
  int link_bound_edge = -1;   // that directed edge
  // The critical path's time by what it was spent on (they sum to path_s): blocks on the wire,
  // tokens (from their event to the waiting round's start), and waiting (READY at the start,
  // the last block's way to its receiver).
  double data_s = 0.0;
  double hand_over_s = 0.0;
  double waiting_s = 0.0;
  std::int64_t path_rounds = 0;       // rounds on the critical path
  std::int64_t path_tokens = 0;       // tokens on it
  std::int64_t path_token_links = 0;  // links those tokens cross, all together
  std::vector<PathStep> path;         // with PredictOptions::keep_path
  // Predicted from the phases alone, without building the plan's programs and tokens.
  bool streamed = false;
  double fraction() const { return time_s > 0.0 ? limit_s / time_s : 0.0; }
};

// The lead that aapc's engine gives sender-based tokens of blocks of `block_bytes` on a tree of
// `topology` whose machines pace at `pace_bps`: one smallest switch buffer spread over the
// schedule's `phases` (the engine's token_slack), which lets the phases of a small cluster
// overlap a little, but never more than the round's last frame takes at the pace: the engine
// emits a round's tokens once it has handed that frame to the NIC and no sooner (Exchange::
// end_round; captures show it: aapc-trace handover, docs/scale.md).
double engine_token_lead_s(const Topology& topology, std::size_t phases, std::uint64_t pace_bps, std::uint64_t block_bytes);

// The prediction over a planned schedule (plan_sync's result, or make_schedule's for a schedule
// without tokens). Throws std::invalid_argument when the plan does not fit the topology or its
// tokens can never all arrive (a deadlock).
Prediction predict(const Topology& topology, const Schedule& schedule, const PredictOptions& options);

// The prediction of `algorithm` with `sync` on `topology`. The tree's phases with no tokens or
// pair-wise ones (sender-based that leave when their round drained, receiver-based; every phase
// or partial) are predicted from the phases alone, in memory linear in the messages (4,096
// machines in a few hundred megabytes); the others (dummies, barriers, sender-based tokens that
// leave on arrival, the other schedules) are planned first.
Prediction predict(const Topology& topology, const AlgorithmSpec& algorithm, const SyncSpec& sync, const PredictOptions& options);

}  // namespace aapc::sched
