// Traces: what exchanges did on the wire, from the pcap captures of their daemons (one file
// per node, written by the engine's capture tap, `aapcd --capture`) and the topology.
//
// Everything here reads captures and computes; printing and plotting are aapc-trace's.
// Times are nanoseconds. Each capture has its node's clock; the clock offsets between nodes
// are estimated from control frames seen at both ends (the NTP way: the smallest delay each
// way, half the difference), and every frame also gets a time on the reference clock (rank
// of the first capture), `at`, that the analyses use.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "aapc/sched/schedule.hpp"
#include "aapc/sched/topology.hpp"
#include "aapc/wire/wire.hpp"

namespace aapc::trace {

using sched::Rank;

// Input that cannot be analysed: the message says what and what to do.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Crc : std::uint8_t { kOk, kBad, kUnchecked };

struct Frame {
  std::int64_t t = 0;   // capture timestamp, the node's clock
  std::int64_t at = 0;  // the same on the reference clock
  bool tx = false;      // sent by the capture's node (else received)
  engine::Header h;
  std::uint32_t wire_len = 0;
  Crc crc = Crc::kUnchecked;
  bool sound() const { return crc != Crc::kBad; }
  bool data() const { return h.type == engine::FrameType::kData; }
  bool dummy() const { return (h.flags & engine::kFlagDummy) != 0; }
  bool retransmitted() const { return (h.flags & engine::kFlagRetransmit) != 0; }
};

struct Capture {
  std::string path;
  Rank node = -1;
  std::vector<Frame> frames;        // of our EtherType with a readable header, in file order
  std::uint64_t other_protocols = 0;  // frames of other EtherTypes: counted, not analysed
  std::uint64_t malformed = 0;      // our EtherType, unreadable header (bad magic, lengths...)
  std::uint64_t truncated_frames = 0;  // cut by the snap length: CRC not checked
  std::uint64_t not_ours = 0;       // between other machines (flooded by a switch): left out
  std::vector<std::string> warnings;
};

// Reads one node's capture. Throws TraceError when the file is missing, is not a pcap, is not
// Ethernet, holds none of our frames, or holds frames of machines the topology does not know.
// A file truncated mid-record is read up to the damage, with a warning.
Capture read_capture(const std::string& path, const sched::Topology& topology, std::uint16_t ethertype = engine::kDefaultEtherType);

struct ClockEstimate {
  Rank node = -1;
  bool known = false;        // false: no frames seen both ways with a node of known offset
  bool assumed = false;      // one host's clock (same_clock): 0 by assumption
  double offset_ns = 0;      // this node's clock minus the reference clock
  double uncertainty_ns = 0; // half the smallest round trip: the offset is within this
  Rank via = -1;             // the node it was measured against
  std::uint64_t samples = 0; // control frames matched both ways
};

// The captures of one run, validated together, with clock offsets.
class Trace {
 public:
  // Throws TraceError when two captures are of the same node, or when the captures have no
  // exchange in common (they are of different runs). `same_clock`: the captures were taken on
  // one host (an emulated cluster), so no offsets are estimated.
  Trace(sched::Topology topology, std::vector<Capture> captures, bool same_clock = false);

  const sched::Topology& topology() const { return topo_; }
  const std::vector<Capture>& captures() const { return caps_; }
  const Capture* capture_of(Rank node) const;
  const std::vector<ClockEstimate>& clocks() const { return clocks_; }
  Rank reference() const { return caps_.front().node; }
  // Exchange ids seen in every capture (collectives involve every node), in order.
  const std::vector<std::uint32_t>& exchanges() const { return exchanges_; }
  std::vector<std::string> warnings;

 private:
  void estimate_clocks(bool same_clock);
  sched::Topology topo_;
  std::vector<Capture> caps_;
  std::vector<ClockEstimate> clocks_;
  std::vector<std::uint32_t> exchanges_, partial_;  // partial_: in some captures only, left out (warnings says so)
};

// --- summary ------------------------------------------------------------------------------

struct NodeSummary {
  std::uint32_t exchange = 0;
  Rank node = -1;
  std::int64_t start = 0, end = 0;  // reference clock: first and last frame of the exchange here
  std::uint64_t frames_sent = 0, frames_received = 0;
  std::uint64_t data_frames_sent = 0, data_bytes_sent = 0;  // first sends and retransmissions
  std::uint64_t retransmitted_frames = 0, dummy_frames_sent = 0;
  std::uint64_t data_frames_received = 0, data_bytes_received = 0;  // sound and new: placed
  std::uint64_t duplicate_frames = 0;  // sound DATA received again
  std::uint64_t bad_crc_frames = 0;    // received with a bad CRC (the engine drops them)
  std::uint64_t lost_frames = 0;       // sent here by a peer (in its capture), never arrived
  std::uint64_t syncs_sent = 0, syncs_received = 0;
  std::uint64_t control_sent = 0, control_received = 0;  // every type but DATA
  std::uint64_t nacks_sent = 0, nacks_received = 0;
  std::int64_t ready_wait_ns = 0;  // from the start to the first DATA sent, waiting on READY
  std::int64_t sync_wait_ns = 0;   // idle gaps in sending that ended when a token arrived
  double seconds() const { return static_cast<double>(end - start) / 1e9; }
  double goodput_bps() const { return end > start ? static_cast<double>(data_bytes_received) * 8e9 / static_cast<double>(end - start) : 0; }
};

// Per exchange and node, in that order.
std::vector<NodeSummary> summarize(const Trace& trace);

// --- links --------------------------------------------------------------------------------

struct Block {
  std::uint32_t exchange = 0;
  Rank src = -1, dst = -1;
  int phase = -1;  // from the DATA frames; -1 when none
  bool dummy = false;
  std::int64_t start = 0, end = 0;  // first frame leaves src .. last frame reaches dst
  std::uint64_t bytes = 0;          // frame bytes on the wire, every transmission
};

struct Contention {
  int edge = -1;  // directed edge of the topology
  std::int64_t from = 0, to = 0;
  Block a, b;     // a started first
  std::int64_t ns() const { return to - from; }
};

struct LinkLoad {
  int edge = -1;
  std::uint64_t rate_bps = 0;
  std::uint64_t bytes = 0;           // frame bytes carried (every frame whose path crosses it)
  std::vector<double> utilisation;   // per bin, of the link's rate
  double mean_utilisation = 0;       // over the whole window
  std::int64_t contended_ns = 0;     // time two blocks of different senders shared it
};

struct LinkReport {
  std::int64_t t0 = 0, t1 = 0, bin_ns = 0;
  std::vector<Block> blocks;
  std::vector<LinkLoad> links;  // every directed edge with traffic, busiest first
  std::vector<Contention> contention;  // longest first
};

// The load of every directed link over time, and every interval where two blocks of different
// senders used the same directed link at once (block level: a block occupies each link of its
// path from its first frame's departure to its last frame's arrival). `exchange`: one, or all.
LinkReport links(const Trace& trace, std::optional<std::uint32_t> exchange, std::int64_t bin_ns);

// --- phases -------------------------------------------------------------------------------

struct RoundCheck {
  Rank node = -1;
  int round = -1;
  int phase = -1;
  std::int64_t started = 0;        // first DATA frame of the round sent (reference clock)
  std::int64_t tokens_arrived = 0; // last awaited token received (reference clock)
  std::vector<std::uint32_t> waits;
  bool missing_token = false;      // a token it waited for is not in the capture
  bool early() const { return !missing_token && started < tokens_arrived; }
};

struct PhaseSpan {
  int phase = -1;
  std::int64_t start = 0, end = 0;  // first departure .. last arrival of its blocks
  std::int64_t overlap_next_ns = 0; // with the next phase
  std::int64_t contended_ns = 0;    // of that, time blocks of both phases shared a link
};

struct PhaseReport {
  std::uint32_t exchange = 0;
  std::string schedule;  // as given or as inferred from the tokens on the wire
  std::string how;       // "given" or why it was inferred
  std::vector<RoundCheck> rounds;  // every round that waited for tokens
  std::vector<PhaseSpan> phases;
  std::uint64_t early_rounds = 0, missing_tokens = 0;
};

// For phased schedules: whether every round started after the tokens it waited for, and how
// much consecutive phases overlapped. `schedule` is "ALGORITHM+SYNC" (e.g. "tree+sender-all");
// empty: inferred from the SYNC frames of the exchange (the plans of every algorithm and sync
// variant are compared with them). Throws TraceError when no plan matches.
PhaseReport phases(const Trace& trace, std::uint32_t exchange, const std::string& schedule);

// --- hand-over ----------------------------------------------------------------------------

// One token seen leaving its emitter and arriving at its waiter, each once.
struct TokenTime {
  std::uint32_t exchange = 0;
  Rank from = -1, to = -1;
  int links = 0;                 // links of the tree it crossed
  std::int64_t one_way_ns = 0;   // leaving the emitter's engine to reaching the waiter's
  double serialised_ns = 0;      // its own frame's bits at every link it crossed
  double frames_past_first_ns = 0;  // a full frame's time at every link past the emitter's own
};

// What the captures measure of aapc-sched predict's hand-over terms (aapc/sched/predict.hpp):
// the tokens' one-way times, the waiters' reaction, and how much of their links' rate the
// senders' pacing kept.
struct HandOverReport {
  std::vector<TokenTime> tokens;
  std::uint64_t tokens_left_out = 0;  // sent or received more than once, or at one end only
  // One-way time less the token's own serialisation, fitted by least squares (means, as a
  // critical path adds them up): fixed_ns + frames_ahead x (a full frame at every link past the
  // emitter's). fitted is false when every token crossed the same frame times, so the two
  // cannot be told apart (fixed_ns is then their mean and frames_ahead 0).
  bool fitted = false;
  double fixed_ns = 0, frames_ahead = 0;
  // A waiter that sat idle: from the last token it received to its next DATA frame.
  std::vector<std::int64_t> reactions_ns;
  // Each block of three frames or more, as its sender sent it (its receiver received it): its
  // frames but the last at the node's link rate, over the time from its first frame to its
  // last; what arrives is what predict's --link-share stands for.
  std::vector<double> sent, received;
};

// `exchange`: one, or all. `wire_extra_bytes`: what a frame takes on the wire beyond its
// captured length (0 on the emulator, whose shapers count the frame alone; 24 on Ethernet).
HandOverReport hand_over(const Trace& trace, std::optional<std::uint32_t> exchange, std::uint32_t wire_extra_bytes = 0);

}  // namespace aapc::trace
