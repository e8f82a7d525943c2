// What the Engine, its exchanges and their Link share: the engine's configuration, an
// exchange's spec, its report and counters, and the frames kept for an exchange not started.
// Apart from engine.hpp so that link.hpp and exchange.hpp need not include the Engine.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aapc/result.hpp"
#include "aapc/sched/schedule.hpp"
#include "aapc/wire/descriptor.hpp"
#include "aapc/wire/wire.hpp"

namespace aapc::nic {
class ExternalRegion;
}

namespace aapc::engine {

using Clock = std::chrono::steady_clock;

// EngineConfig::stream_bytes's default, from this machine's caches (8 MiB where it knows none).
std::uint64_t default_stream_bytes();

struct EngineConfig {
  Rank rank = 0;
  std::vector<MacAddr> peers;  // MAC of every rank, ours included
  std::uint16_t ethertype = kDefaultEtherType;
  int mtu = 1500;              // bytes of Ethernet payload per frame: header + chunk
  // Pacing: a token bucket at this rate (bit/s) decides what leaves when, so that the
  // schedule rather than a switch queue orders the frames. 0 = as fast as the port takes.
  std::uint64_t pace_bps = 0;
  std::uint32_t pace_burst_bytes = 0;     // 0: half a millisecond at pace_bps (at least 4 frames)
  std::uint32_t pace_overhead_bytes = 0;  // counted per frame on top of its length (24 on a real wire)
  std::chrono::microseconds rto{20'000};        // first retransmission timeout
  // Backoff cap. At 30% loss per port direction a poll, its NACK and the frame
  // resent all arrive 12% of the time; with polls 500 ms apart a frame lost again took 4 s on
  // average, and 15 s (the stall deadline) in 2% of such recoveries.
  std::chrono::microseconds rto_max{100'000};
  // A block, token or READY is given up on after this many tries in a row without an answer,
  // and no sooner than peer_deadline after the first of them.
  int max_retries = 40;
  // A peer silent this long (no frame, not even an answer to 50 PINGs) fails the exchange and
  // is remembered dead: a daemon killed mid-exchange is known to every rank within about this.
  std::chrono::milliseconds peer_deadline{1'500};
  // The deadline of exchanges given none (Engine::default_timeout): the rate of the slowest
  // link (0: pace_bps, or 1 Gbit/s when that is 0 too), and the fixed allowance on top.
  std::uint64_t link_bps = 0;
  // (With the peer deadline twice, this is how long an exchange given no deadline may make no
  // progress: 15 s, stall_allowance.)
  std::chrono::milliseconds timeout_allowance{12'000};
  std::chrono::milliseconds linger{15'000};     // finished exchanges still answer late frames
  // And of one group, at most this many: a benchmark of tiny blocks finishes thousands a
  // second, and each holds a few KiB. An exchange that lingers stops once this many
  // later ones of its group have finished here; the peers took part in all of those, so none
  // still runs it unless it has that many collectives of the group in flight.
  std::uint32_t linger_max = 1024;
  std::uint32_t epoch = 0;                      // 0: derived from the clock (later is newer)
  // Epochs are the senders' start times in wall-clock ms. A peer's epoch is taken only if it is
  // no later than our clock plus this skew (one forged frame with a
  // far-future epoch made every real frame of its sender stale until restart). 0: no bound,
  // for engines given an epoch that is not a clock reading.
  std::chrono::milliseconds max_epoch_skew{600'000};
  // A frame that holds eager DATA for an exchange not started here is kept this long at most
  // (its sender's polls bring it again): frames forged for ids ahead must not lie in wait for
  // a later job.
  std::chrono::milliseconds early_data_expiry{2'000};
  // Exchanges running here at once, beyond which start() answers busy. Every communicator of
  // an MPI job has a leader on each machine, and each leader may run several (libaapc-mpi's
  // kMostRunning): the column communicators of a 2-D decomposition with 64 ranks a machine
  // make 64 leaders here. With 16, the 17th exchange failed. An idle running exchange costs a
  // few hundred bytes per peer and a look in each poll pass.
  std::size_t max_live_exchanges = 256;
  // The cluster key (load_cluster_key in auth.hpp). When set, every frame
  // is tagged with it and only frames tagged with it are taken; each frame's chunk is
  // kTagLen bytes smaller. Every node of a cluster must have the same key, or none.
  std::optional<FrameKey> key;
  std::uint16_t rx_burst = 32;
  // Data frames whose payload is at least this many bytes are sent without copying
  // it (SendBlock::region, on a port that can); shorter ones are copied. Measured with
  // aapc-engine-bench over net_ring (two engines on one core, median of 7 runs' ratios): 10%
  // slower than the copy at 1,456-byte payloads (MTU 1500: the second mbuf and the free
  // callback cost more than copying what is in cache anyway), 11% faster at 8,956 (MTU 9000).
  std::size_t zero_copy_min = 4096;
  // An exchange that receives at least this many bytes in all, in frames of at least
  // stream_min_chunk bytes of payload, writes the payloads into its blocks by non-temporal
  // stores, around the caches, which would not keep them for the client anyway: a cached store
  // first reads its line, so a payload byte crossed the memory bus twice. Smaller exchanges
  // write through the caches, where the client finds the bytes. The default is glibc's rule
  // for memcpy: three quarters of the last-level cache's share per CPU, and at least the
  // second-level cache (default_stream_bytes()).
  std::uint64_t stream_bytes = default_stream_bytes();
  // Measured with aapc-engine-bench (256 MiB each way, side by side with cached stores): 1.13-
  // 1.20x the payload at 8,956-byte payloads (MTU 9000), 1.06x at 4,096, 1.02x at 4,052, and
  // 0.81-0.85x at 1,456 (MTU 1500), where the stores stall on the write-combining buffers.
  std::uint32_t stream_min_chunk = 4096;
  // The two rules above, for the engine and the tools that report them: whether a DATA payload
  // of `len` bytes may go attached (where the port and a registered region allow), and whether
  // an exchange that receives `in_bytes` in frames of `chunk` bytes of payload streams them.
  bool attaches(std::size_t len) const { return len >= std::max<std::size_t>(zero_copy_min, 1) && len <= UINT16_MAX; }
  bool streams(std::uint64_t in_bytes, std::uint32_t chunk) const { return in_bytes >= stream_bytes && chunk >= stream_min_chunk; }
  // Blocks of at most this many frames are eager: sent at once, without waiting for
  // the receiver's READY (a round trip), and a receiver that has not started the exchange yet
  // keeps their frames (up to early_data_bytes in all) for its start. Larger blocks wait for
  // READY, so that a receiver never holds more than that. Every node of a cluster must use
  // the same value: a receiver sends READY only for the blocks it does not take as eager.
  std::uint32_t eager_frames = 8;
  // Acknowledgements of eager blocks and of tokens, which nobody waits for (the sender is done
  // without them and only settles, Exchange::settling), are gathered per peer for this long
  // and sent as one frame (kFlagAckList): tiny exchanges are bound by the frames they cost.
  // At most a quarter of rto, so that no sender polls for them. 0: each goes at once.
  std::chrono::microseconds ack_delay{5'000};
  std::size_t early_data_bytes = 4U << 20;
};

// Whether a block of `len` bytes in `chunk`-byte frames is eager (EngineConfig::eager_frames).
inline bool eager_block(std::uint64_t len, std::uint32_t chunk, const EngineConfig& config) {
  return len > 0 && frame_count(len, chunk) <= config.eager_frames;
}

struct SendBlock {
  const std::uint8_t* data = nullptr;
  std::uint64_t len = 0;
  // The registered memory that holds `data` (nic/extmem.hpp), or none. With one, on a port
  // that can (Port::zero_copy_tx) and without a cluster key, frames carry the payload from
  // `data` itself instead of a copy: `data` must then stay mapped and unchanged until the
  // region's in_flight() is 0, which may be after the exchange finished.
  const nic::ExternalRegion* region = nullptr;
};
struct RecvBlock {
  std::uint8_t* data = nullptr;
  std::uint64_t len = 0;
};

// One exchange as this node sees it. Buffers belong to the caller and must stay valid until
// the exchange is reported finished; the engine reads `send` and writes `recv` directly.
struct ExchangeSpec {
  // The group slot in the top 8 bits (0: the cluster-wide session), the sequence below:
  // later than every id of its slot started before on this engine.
  std::uint32_t id = 0;
  sched::Program program;   // this node's rounds and tokens
  std::uint32_t sync_count = 0;  // sync ids of the plan are below this
  // Where each token this node emits goes: (sync id, rank), sorted by id.
  std::vector<std::pair<std::uint32_t, Rank>> sync_targets;
  // Who emits each token this node waits for: (sync id, rank), sorted by id. Liveness pings go
  // only to the peers a node waits on.
  std::vector<std::pair<std::uint32_t, Rank>> sync_sources;
  std::vector<SendBlock> send;   // by destination rank (size = cluster size)
  std::vector<RecvBlock> recv;   // by source rank
  // The cluster ranks that take part (a group's members); empty: every rank. Frames of the
  // exchange's id from any other rank are dropped (DropReason::kNotMember), and its ABORTs go
  // to the members only: disjoint groups may number their collectives alike, and one group's
  // failure must not reach another's (docs/design.md, "Jobs kept apart").
  std::vector<Rank> members;
  std::uint64_t dummy_len = 0;   // size of a dummy message (0: the largest send block)
  // The whole exchange; 0: derived from its size and the link rate (default_timeout), and
  // then only while the exchange makes no progress (stall_allowance).
  std::chrono::milliseconds timeout{0};
  // What the ranks agree on at the start (descriptor.hpp): a rank whose descriptor differs
  // fails the exchange at once, here and there, naming the difference. exchange_spec() fills
  // in the plan; the caller says which collective this is.
  Descriptor descriptor;
  // Messages over the busiest link, for the derived deadline: the topology's bottleneck load
  // (sched::TreeModel::load) when it is known and larger; exchange_spec() puts the phases.
  std::uint64_t bottleneck_load = 0;
  // How far a round's sender-based tokens may run ahead of its frames (Link::drained_at).
  // Leads add up on a bottleneck link used in every phase; spread over the schedule's phases,
  // one switch buffer of them does no harm (token_slack), and holding a token costs a wake-up.
  Clock::duration token_slack{0};
  // A paced schedule's rate for each block of a round (sched::Schedule::block_rate_bps), in
  // bits per second on the wire: a round of k blocks leaves at k times this rate, below the
  // link's own pace; 0: the link's pace alone. Retransmissions are not held back by it.
  std::uint64_t block_rate_bps = 0;
  // How many bytes a paced round that ran late may send at once to catch up (0: the link
  // bucket's burst, EngineConfig::pace_burst_bytes). Every node of a paced exchange may catch up
  // at the same moment, after a host ran none of them for a while; paced_burst() gives each its
  // share of a switch buffer, so that the bursts together fit the bottleneck's queue.
  std::uint64_t paced_burst_bytes = 0;
  // A combining schedule (sched::Schedule::combine): this node's steps, one per program round,
  // and the size of every block (an alltoall's). The exchange then keeps its own staging
  // memory: round k packs step k's pieces (from `send`, or from what earlier steps brought)
  // into one message to the step's partner, and the pieces for this node are copied into
  // `recv` as their message arrives. Every send and recv block but our own must then be
  // `combine_block` bytes. exchange_spec() fills in the steps.
  std::vector<sched::CombineStep> combine;
  std::uint64_t combine_block = 0;
};

// By rank of a cluster of `n`: whether it takes part in `spec` (ExchangeSpec::members).
inline std::vector<bool> member_mask(const ExchangeSpec& spec, std::size_t n) {
  std::vector<bool> member(n, spec.members.empty());
  for (Rank m : spec.members)
    if (m >= 0 && static_cast<std::size_t>(m) < n) member[static_cast<std::size_t>(m)] = true;
  return member;
}

// A paced exchange's catch-up burst (ExchangeSpec::paced_burst_bytes) for a node sending
// `streams` blocks, against the `bottleneck_load` blocks that cross the busiest link: that share
// of the smallest switch buffer, and at least two frames of `frame_bytes` so that a node woken a
// little late keeps its rate. 64 machines on 8 leaves (63 of 448, 64 KiB buffers): 9.0 KiB; 8 on
// two switches (7 of 16): 28 KiB. The link bucket's 31 KiB at 500 Mbit/s made 64-two-level at 25
// Mbit/s resend frames; half these shares cost 8-two-switch at 500 Mbit/s 1.5-2 points.
std::uint64_t paced_burst(std::uint64_t smallest_buffer_bytes, std::size_t streams, std::uint64_t bottleneck_load, std::uint64_t frame_bytes);

// One switch buffer (the smallest of the topology's) spread over `phases` hand-overs, at the
// paced rate: 64 KiB over the 448 phases of 64 machines on two levels is 47 us at 25 Mbit/s,
// over the 16 of 8 machines on two switches 328 us at 100 Mbit/s.
Clock::duration token_slack(std::uint64_t smallest_buffer_bytes, std::size_t phases, std::uint64_t pace_bps);

// The deadline of an exchange whose caller gave none. A collective that a
// rank never joins (it exited, or called another one) otherwise hangs as long as the rank's
// daemon answers. kTimeoutFactor times the time `bottleneck_bytes` take at `link_bps` (the
// bound of the physics, with room for loss and retransmission), plus `allowance`.
inline constexpr int kTimeoutFactor = 8;
std::chrono::milliseconds derived_timeout(std::uint64_t bottleneck_bytes, std::uint64_t link_bps, std::chrono::milliseconds allowance);
// The deadline of `spec` when its timeout is 0: derived_timeout() of its bottleneck load times
// its largest block (frames and headers) at config.link_bps, with stall_allowance(config).
std::chrono::milliseconds default_timeout(const ExchangeSpec& spec, const EngineConfig& config, std::uint32_t chunk);
// How long an exchange under a derived deadline may go without progress once the deadline has
// passed: heavy loss stretches an exchange far beyond its size's time (8 machines at 30% loss
// per port direction: 30 times), but it keeps completing blocks and passing tokens, while one
// that waits for a rank that never came does not. The configured allowance plus twice the
// peer deadline, so that a dead peer is reported as such first.
std::chrono::milliseconds stall_allowance(const EngineConfig& config);

// The spec of node `me` in a planned schedule: its program, the plan's token targets, its
// descriptor's plan, and room for the buffers (send and recv sized to the cluster, empty).
ExchangeSpec exchange_spec(const sched::Schedule& schedule, Rank me, std::uint32_t id);
// The same for a group: `schedule` is planned over the group, whose rank i is
// cluster rank members[i]; `me` is our rank in the group. The spec is in cluster ranks, with
// room for `cluster_size` blocks: ranks outside the group have none and take no part.
ExchangeSpec exchange_spec(const sched::Schedule& schedule, Rank me, std::uint32_t id, const std::vector<Rank>& members, std::size_t cluster_size);

enum class ExchangeState : std::uint8_t { kRunning, kDone, kFailed };

struct RoundTime {
  std::int64_t start_ns = -1;  // since the exchange started
  std::int64_t end_ns = -1;    // when its sends were done
};

struct ExchangeCounters {
  std::uint64_t data_frames_sent = 0, data_bytes_sent = 0, retransmitted_frames = 0, dummy_frames_sent = 0;
  std::uint64_t data_frames_received = 0, data_bytes_received = 0;
  std::uint64_t control_frames_sent = 0, control_frames_received = 0;
  std::uint64_t syncs_sent = 0, syncs_resent = 0, readies_resent = 0, polls_sent = 0, pings_sent = 0;
  std::uint64_t nacks_sent = 0, nacks_received = 0;
  std::array<std::uint64_t, kDropReasons> drops{};  // frames of this exchange dropped, by reason
  std::vector<RoundTime> rounds;
  std::int64_t wait_ns = 0;  // time rounds spent waiting for tokens and READY
  std::int64_t pace_lost_ns = 0;  // a paced round's time lost to late wake-ups past its catch-up credit
  bool streamed = false;     // payloads are written around the caches (EngineConfig::stream_bytes), decided at the start
};

struct ExchangeReport {
  std::uint32_t id = 0;
  ExchangeState state = ExchangeState::kRunning;
  Errc code = Errc::kOk;
  std::string error;   // names the peer when one is at fault
  Rank peer = -1;      // the peer at fault, if any
  std::int64_t duration_ns = 0;
  // From the first sign of the exchange here (our start, or a peer's frame of it that came
  // before) to its end: from a peer that started first, to this rank's end. The slowest rank's
  // is about the cluster's time for the exchange, which a rank that started late does not see
  // in its own duration.
  std::int64_t span_ns = 0;
  ExchangeCounters counters;
};

struct EngineCounters {
  std::uint64_t frames_received = 0, bytes_received = 0, frames_sent = 0, bytes_sent = 0;
  std::uint64_t tx_refused = 0;       // offers the port did not take at once (backpressure)
  std::uint64_t alloc_failures = 0;   // no mbuf available
  std::uint64_t zero_copy_frames = 0; // sent with the payload not copied (SendBlock::region)
  std::uint64_t rx_prechecked = 0;    // received with CRC and tag checked on an I/O lcore (integrity_hook)
  std::uint64_t early_frames = 0;     // READY/SYNC kept for an exchange not started yet
  std::uint64_t early_data_frames = 0;   // eager DATA kept for an exchange not started yet
  std::uint64_t early_data_dropped = 0;  // eager DATA not kept: early_data_bytes were full
  std::uint64_t early_data_expired = 0;  // eager DATA kept past EngineConfig::early_data_expiry, dropped
  std::uint64_t acks_gathered = 0, ack_lists_sent = 0;  // acknowledgements sent in kFlagAckList frames
  std::uint64_t aborts_resent = 0;    // ABORTs of a failed exchange sent again to a member that went on (Exchange::remind)
  std::array<std::uint64_t, kDropReasons> drops{};
};

// A DATA frame of an eager block that came before its exchange started here.
struct EarlyData {
  Header h;
  Rank src = -1;
  std::vector<std::uint8_t> payload;
};

// READY, SYNC and eager DATA frames for an exchange not started yet here, kept for its start.
struct EarlyFrames {
  std::vector<bool> ready_from;           // by rank
  std::vector<std::uint64_t> ready_len;   // by rank: the block its READY expects from us
  std::vector<std::pair<std::uint32_t, Rank>> syncs;  // (sync id, the rank that sent it)
  std::vector<std::vector<std::uint8_t>> descriptor;  // by rank: the last one it sent (or empty)
  Clock::time_point first_seen{};  // when the first frame came (Exchange::report: span_ns)
  Clock::time_point first_data{};  // when `data` got its first frame (they expire: Engine::expire_early)
  std::vector<EarlyData> data;
};

}  // namespace aapc::engine
