// One exchange inside the engine (not installed): rounds, blocks, tokens, recovery. It sees
// the engine that runs it only through a Link (link.hpp).
#pragma once

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "aapc/core/types.hpp"
#include "link.hpp"

namespace aapc::engine {

// A first-in, first-out queue that holds no memory while it has never been used. An
// exchange has one per block it sends and two of its own, and most stay empty; a std::deque
// allocates 576 bytes when it is made. On 8 machines they were 3.6 KiB of the 8.4 KiB that
// each finished exchange held while it lingered (EngineConfig::linger), and a benchmark of
// tiny blocks finishes thousands a second.
template <class T>
class Fifo {
 public:
  bool empty() const { return head_ == items_.size(); }
  const T& front() const { return items_[head_]; }
  void push_back(T v) { items_.push_back(std::move(v)); }
  template <class... A>
  void emplace_back(A&&... a) {
    items_.emplace_back(std::forward<A>(a)...);
  }
  void pop_front() {
    if (++head_ == items_.size()) {
      clear();
    } else if (head_ >= 64 && head_ * 2 >= items_.size()) {  // never drained: drop what was taken
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  void clear() {
    items_.clear();
    head_ = 0;
  }

 private:
  std::vector<T> items_;
  std::size_t head_ = 0;
};

// Bit sets of frames (received, queued for resending).
inline bool test_bit(const std::vector<std::uint64_t>& bits, std::uint32_t i) { return ((bits[i / 64] >> (i % 64)) & 1U) != 0; }
inline void set_bit(std::vector<std::uint64_t>& bits, std::uint32_t i) { bits[i / 64] |= 1ULL << (i % 64); }
inline void clear_bit(std::vector<std::uint64_t>& bits, std::uint32_t i) { bits[i / 64] &= ~(1ULL << (i % 64)); }

// "rank 3 (02:00:00:00:00:03)", for error messages.
inline std::string peer_name(const Link& link, Rank r) {
  return "rank " + std::to_string(r) + " (" + nic::mac_string(link.config().peers[static_cast<std::size_t>(r)]) + ")";
}

// The rank paired with sync `id` in a list sorted by id, or -1.
inline Rank lookup_rank(const std::vector<std::pair<std::uint32_t, Rank>>& sorted, std::uint32_t id) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), id, [](const auto& e, std::uint32_t v) { return e.first < v; });
  return it != sorted.end() && it->first == id ? it->second : -1;
}

// Why the engine refuses `spec`: kInvalidArgument, "exchange ID: " and `what`.
inline Error invalid_spec(const ExchangeSpec& spec, const std::string& what) {
  return Error(Errc::kInvalidArgument, "exchange " + std::to_string(spec.id) + ": " + what);
}

// Whether `spec` can run on rank `me` as a combining exchange (ExchangeSpec::combine), which it
// can also when it is none; else invalid_spec() and why: the checks that keep staging in bounds
// (exchange_combine.cpp).
Result<void> check_combine(const ExchangeSpec& spec, Rank me);

class Exchange {
 public:
  Exchange(Link& link, ExchangeSpec spec, Clock::time_point now);

  std::uint32_t id() const { return spec_.id; }
  // Whether rank `r` takes part (ExchangeSpec::members).
  bool member(Rank r) const { return r >= 0 && static_cast<std::size_t>(r) < member_.size() && member_[static_cast<std::size_t>(r)]; }
  ExchangeState state() const { return state_; }
  bool running() const { return state_ == ExchangeState::kRunning; }
  // Done here (every block in, every round run), and reported so, while eager blocks
  // and tokens of ours still wait for their acknowledgement: they are resent from the
  // exchange's own copy until acknowledged, or given up after the retries.
  bool settling() const { return settling_; }
  // A paced round with frames left to send: it waits for nothing that it receives.
  bool pacing() const { return paced() && running() && round_state_ == RoundState::kSending && !streams_.empty(); }
  // A settling exchange stops resending to `peer`, which aborted it.
  void abandon(Rank peer);
  bool reported() const { return reported_; }
  void mark_reported() { reported_ = true; }
  Clock::time_point linger_until() const { return linger_until_; }
  ExchangeReport report(Clock::time_point now) const;

  // Called once right after construction: checks what came early, posts READY, copies the
  // block to ourselves.
  void begin(Clock::time_point now, const EarlyFrames& early);
  // Sends one data frame (retransmissions first) if any is due; false when nothing to send.
  bool send_next(Clock::time_point now);
  bool has_data(Clock::time_point now) const;
  // While a paced round (ExchangeSpec::block_rate_bps) holds its next frame back: when the
  // engine should wake to send it, with the frames due by then (pace_frame); otherwise the end
  // of time.
  Clock::time_point paced_until() const;
  void timers(Clock::time_point now);
  // The earliest time timers() has something to do (a retransmission, a poll, a keepalive,
  // the deadline, the end of a dummy delay); a sleeping engine need not wake before it.
  Clock::time_point next_deadline() const;
  // Sender-based tokens held back until the round's frames have drained (Link::drained_at).
  void emit_due(Clock::time_point now);
  Clock::time_point next_emit() const { return late_emits_.empty() ? Clock::time_point::max() : late_emits_.front().first; }
  // Ends the exchange with an error; unless `tell` is false (it came from a peer's ABORT), the
  // peers get an ABORT that says why.
  void fail(Errc code, const std::string& message, Rank peer, Clock::time_point now, bool tell = true);
  // A frame of this exchange from member `src` after it failed here: `src` missed our ABORT,
  // which it gets again (at most once per RTO).
  // (Called for every frame of the exchange: the test stays inline.)
  void remind(Rank src, Clock::time_point now) {
    if (state_ == ExchangeState::kFailed) abort_again(src, now);
  }

  // Frames for this exchange (already validated by parse()).
  void on_data(const Parsed& f, Clock::time_point now);
  void on_control(const Parsed& f, Clock::time_point now);
  // One acknowledgement of a kFlagAckList ACK.
  void on_acks(Rank src, const AckEntry& e, Clock::time_point now);
  // Epoch bookkeeping: false when the frame comes from another incarnation of the peer.
  bool accept_epoch(Rank src, std::uint32_t epoch);
  void peer_restarted(Rank src, Clock::time_point now);
  ParseContext::Expected expect(std::uint32_t epoch, Rank src) const;
  // Where frame `seq` of the block from `src` goes, while it is not in yet (ParseContext::place_at).
  std::uint8_t* place_at(Rank src, std::uint32_t seq) const;
  // Counts a dropped frame of this exchange, here and in the engine's totals.
  void count_drop(DropReason reason) {
    ++counters_.drops[static_cast<std::size_t>(reason)];
    link_.count_drop(reason);
  }
  // DATA from `src` for a block of `len` bytes where another length (or none) is
  // posted here. A sender of an eager block has had no READY that says what we expect: it and
  // every other peer that sends to us get one (each running one names the mismatch from its
  // side), and the exchange fails naming both lengths.
  void unexpected_data(Rank src, std::uint64_t len, Clock::time_point now);

 private:
  struct OutBlock {
    Rank dst = -1;
    const std::uint8_t* data = nullptr;
    const nic::ExternalRegion* region = nullptr;  // SendBlock::region
    std::uint64_t len = 0;
    std::uint32_t frames = 0;
    int phase = -1;
    std::uint32_t sent = 0;   // frames sent once so far
    bool first_done = false;  // every frame sent once
    bool acked = false;
    std::vector<std::uint64_t> queued;  // frames waiting in `resend`
    Fifo<std::uint32_t> resend;
    Clock::time_point poll_at{};
    std::chrono::microseconds rto{};
    int polls = 0;                     // in a row without an answer
    Clock::time_point unanswered_since{};  // the first of them
    bool eager = false;  // sent without waiting for READY (eager_block)
  };
  struct InBlock {
    std::uint8_t* data = nullptr;
    std::uint64_t len = 0;
    std::uint32_t frames = 0;
    std::uint32_t got = 0;
    std::vector<std::uint64_t> bits;
    bool complete = false;
    bool eager = false;  // its sender does not wait for our READY (eager_block)
  };
  // A control frame that needs an ACK: READY (to a sender) or SYNC (to a waiter).
  struct Pending {
    FrameType type = FrameType::kSync;
    Rank to = -1;
    std::uint32_t seq = 0;
    Clock::time_point retry_at{};
    std::chrono::microseconds rto{};
    int tries = 0;
    Clock::time_point first_try{};
    bool acked = false;
  };
  // A stream of a round: a block's first transmission, or dummy traffic.
  struct Stream {
    int out = -1;      // index into out_, or -1 for dummy frames
    Rank dst = -1;
    std::uint32_t next = 0;
    std::uint32_t frames = 0;
    std::uint64_t len = 0;
    int phase = -1;
  };
  enum class RoundState : std::uint8_t { kWaiting, kSending, kDelay, kFinished };

  std::size_t idx(Rank r) const { return static_cast<std::size_t>(r); }
  std::int64_t since_start(Clock::time_point t) const;
  void advance(Clock::time_point now);
  bool round_can_start(const sched::Round& round) const;
  void start_round(Clock::time_point now);
  void end_round(Clock::time_point now);
  void emit(std::uint32_t sync_id, Clock::time_point now);
  void send_pending(Pending& p, Clock::time_point now);
  // Our ABORT to member `to`: the failure's code and reason (fail, remind).
  void send_abort(Rank to);
  void abort_again(Rank src, Clock::time_point now);  // remind's work, once failed
  // Our READY to `src` (posted once, resent until acknowledged; sent again if asked again).
  void post_ready(Rank src, Clock::time_point now);
  // A round may send to `dst` only once its READY came, unless the block is eager.
  bool awaits_ready(Rank dst) const;
  // Eager blocks still missing rto after the start get a READY after all: a sender that takes
  // the block for a larger one waits for it, and learns what we expect (exchange_liveness.cpp).
  void late_readies(Clock::time_point now);
  bool owes_late_ready(std::size_t r) const { return in_[r].eager && !in_[r].complete && ready_out_[r].to < 0; }
  // The eager frames that came before our start (Engine::keep_early_data).
  void replay_early(const EarlyFrames& early, Clock::time_point now);
  // exchange_agree.cpp: true when `theirs` (a descriptor from `src`, or
  // nothing) describes this exchange; else the exchange fails, naming the difference, and
  // `src` gets our descriptor (an ACK of `type`) so that it names it from its side.
  bool agrees(Rank src, std::span<const std::uint8_t> theirs, FrameType type, Clock::time_point now);
  // True when the block `src` expects from us (its READY) is the one we send; else fails.
  bool expects_ours(Rank src, std::uint64_t expected, Clock::time_point now);
  // What came before our start, checked like the frames themselves.
  bool early_agrees(const EarlyFrames& early, Clock::time_point now);
  // Sends an ACK of `type` that carries our descriptor.
  void ack(Rank dst, FrameType type, std::uint32_t seq);
  void tell_descriptor(Rank except);
  static constexpr std::uint32_t kNoToken = 0xFFFFFFFF;  // a sync id no plan has
  // "...; still waiting for rank 3 (02:...)": whom the exchange waits on now.
  std::string waiting_for() const;
  void ready_acked(Rank peer);
  bool retry(Pending& p, Clock::time_point now);
  // Whether a frame to `peer` tried `tries` times since `since` without an answer is given up
  // (exchange_liveness.cpp).
  bool given_up(Rank peer, int tries, Clock::time_point since, Clock::time_point now) const;
  static std::int64_t ms_between(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
  }
  void send_nack(Rank src, InBlock& in);
  void on_nack(const Parsed& f, Clock::time_point now);
  void on_ack(Rank src, FrameType acked, std::uint32_t seq, std::uint64_t block_len, Clock::time_point now);
  // Liveness of the peers waited on (timers()); false when the exchange failed.
  bool keepalive(Clock::time_point now);
  void send_data(OutBlock* block, Rank dst, std::uint32_t index, std::uint64_t len, int phase, std::uint8_t flags);
  // The rate on the wire of each block of the current round: the paced schedule's
  // (ExchangeSpec::block_rate_bps), capped by the round's (sched::Round::rate_bps, where a
  // slower link lies on a block's path); 0: the link's own pace alone.
  std::uint64_t block_rate() const;
  bool paced() const { return block_rate() > 0; }
  // A first-pass frame of `payload` bytes left a paced round: when the next may (paced_next_).
  void pace_frame(std::uint32_t payload, Clock::time_point now);
  void block_complete(Rank src, Clock::time_point now);
  void check_done(Clock::time_point now);
  // Eager blocks go from a copy: the caller may reuse its buffer once the exchange is done here.
  void copy_eager_blocks();
  // Ends settling once everything is acknowledged, and lets go of the eager copy once every
  // block is.
  void settle_check();
  // Resends unacknowledged READY and tokens, polls blocks sent (timers()); false when a peer
  // never answered.
  bool resend_due(Clock::time_point now);
  Rank sync_target(std::uint32_t id) const;
  // What this node waits for from each peer now, as Awaited bits (0: nothing): the READY or
  // tokens of the round it would start, acknowledgements of what it sent, and, once its
  // rounds are done, the blocks still missing. waiting_for() names them in errors.
  enum Awaited : std::uint8_t {
    kAckOfReady = 1,   // it has not acknowledged our READY
    kAckOfToken = 2,   // ... a token we emitted to it
    kAckOfBlock = 4,   // ... our block to it
    kToken = 8,        // the round waits for its token
    kItsReady = 16,    // the round waits for its READY, to send it our block
    kItsBlock = 32,    // its block to us is incomplete
  };
  void waited_on(std::vector<std::uint8_t>& why) const;

  // A combining exchange (exchange_combine.cpp): each step's message out and in lives in
  // staging; spec_.send/recv of the step partners point there, so that the rest of the
  // exchange sends and receives it as one block per peer.
  struct Staging {
    std::vector<std::vector<std::uint8_t>> out, in;      // by step
    std::vector<std::vector<const std::uint8_t*>> from;  // by step, by piece: where it is packed from
    std::vector<RecvBlock> recv;                         // the caller's receive blocks, by source
    std::vector<int> step_from;                          // by rank: the step whose message it sends us, or -1
  };
  void stage_combine();
  void pack_step(std::size_t step);  // a round starts: its message is assembled
  void unpack_from(Rank src);        // a step's message is complete: our blocks to the caller

  Link& link_;
  ExchangeSpec spec_;
  std::optional<Staging> staging_;
  std::size_t n_;
  std::vector<bool> member_;  // by rank
  ExchangeState state_ = ExchangeState::kRunning;
  bool settling_ = false, reported_ = false;
  std::vector<std::uint8_t> eager_copy_;  // the eager blocks' bytes (copy_eager_blocks)
  Errc code_ = Errc::kOk;
  std::string error_;
  std::vector<Clock::time_point> told_at_;  // by rank: when our ABORT last went (remind)
  Rank bad_peer_ = -1;
  Clock::time_point start_, end_, linger_until_, next_keepalive_;
  Clock::time_point seen_from_;  // start_, or a peer's earlier frame of the exchange (report(): span_ns)
  // The deadline: the caller's (hard), or derived from the size (soft: it fails the exchange
  // only once nothing progressed for stall_, ExchangeSpec::timeout).
  std::chrono::milliseconds deadline_{0}, stall_{0};
  bool soft_deadline_ = false;
  Clock::time_point last_progress_;  // a new frame, token or READY, a block done, a round begun
  Clock::time_point deadline_at() const;
  std::vector<OutBlock> out_;
  std::vector<int> out_of_;  // rank -> index into out_
  std::vector<InBlock> in_;
  std::vector<std::uint32_t> epoch_;
  std::vector<bool> epoch_known_;
  std::vector<Clock::time_point> pinged_;
  std::vector<bool> waiting_;                    // by peer: waited on at the last keepalive
  std::vector<Clock::time_point> waiting_since_;  // by peer: since when
  // Keepalive PINGs sent to each peer since it was last heard (heard_seen_).
  std::vector<int> pings_;
  std::vector<Clock::time_point> heard_seen_;
  // How long each peer has been silent while this engine was running its timers: a host that
  // did not run us for a while must not charge that time to the peers.
  std::vector<Clock::duration> silent_for_;
  Clock::time_point last_keepalive_{};
  std::vector<std::uint8_t> have_sync_;
  std::vector<std::uint8_t> descriptor_;  // spec_.descriptor as READY and SYNC carry it
  // Control frames awaiting their ACK: our READY to each peer (by rank; `to` < 0 when none
  // is outstanding), and the tokens we emitted (by sync id; removed when acknowledged).
  std::vector<Pending> ready_out_;
  std::unordered_map<std::uint32_t, Pending> syncs_out_;
  std::vector<bool> ready_from_;
  Fifo<int> resend_blocks_;   // out_ indices with frames to resend
  Fifo<std::pair<Clock::time_point, std::uint32_t>> late_emits_;  // (when, sync id), by time
  std::size_t round_ = 0;
  RoundState round_state_ = RoundState::kWaiting;
  Clock::time_point wait_since_, delay_until_;
  std::vector<Stream> streams_;
  std::size_t cursor_ = 0;
  Clock::time_point paced_next_{};  // a paced round's next first-pass frame leaves no earlier
  Clock::duration paced_batch_{};   // ... and the engine need not wake for it before paced_batch_ later (pace_frame)
  std::size_t unacked_blocks_ = 0, incomplete_blocks_ = 0, unacked_pending_ = 0;
  ExchangeCounters counters_;
};

}  // namespace aapc::engine
