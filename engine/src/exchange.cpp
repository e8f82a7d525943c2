#include "exchange.hpp"

#include <algorithm>
#include <cstring>

namespace aapc::engine {
namespace {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::nanoseconds;

bool test_bit(const std::vector<std::uint64_t>& bits, std::uint32_t i) { return ((bits[i / 64] >> (i % 64)) & 1U) != 0; }
void set_bit(std::vector<std::uint64_t>& bits, std::uint32_t i) { bits[i / 64] |= 1ULL << (i % 64); }
void clear_bit(std::vector<std::uint64_t>& bits, std::uint32_t i) { bits[i / 64] &= ~(1ULL << (i % 64)); }

std::string peer_name(const Engine& eng, Rank r) {
  return "rank " + std::to_string(r) + " (" + nic::mac_string(eng.config().peers[static_cast<std::size_t>(r)]) + ")";
}

// The rank paired with sync `id` in a list sorted by id, or -1.
Rank lookup_rank(const std::vector<std::pair<std::uint32_t, Rank>>& sorted, std::uint32_t id) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), id, [](const auto& e, std::uint32_t v) { return e.first < v; });
  return it != sorted.end() && it->first == id ? it->second : -1;
}

}  // namespace

Exchange::Exchange(Engine& engine, ExchangeSpec spec, Clock::time_point now)
    : eng_(engine), spec_(std::move(spec)), n_(engine.config().peers.size()), start_(now), next_keepalive_(now) {
  const std::uint32_t chunk = eng_.chunk();
  out_of_.assign(n_, -1);
  in_.resize(n_);
  epoch_.assign(n_, 0);
  epoch_known_.assign(n_, false);
  pinged_.assign(n_, now);
  waiting_.assign(n_, false);
  waiting_since_.assign(n_, now);
  pings_.assign(n_, 0);
  heard_seen_.assign(n_, now);
  silent_for_.assign(n_, Clock::duration::zero());
  last_keepalive_ = now;
  ready_from_.assign(n_, false);
  ready_out_.resize(n_);
  have_sync_.assign(spec_.sync_count, 0);
  const Rank me = eng_.rank();
  for (std::size_t r = 0; r < n_; ++r) {
    if (static_cast<Rank>(r) == me) continue;
    if (spec_.send[r].len > 0) {
      OutBlock b;
      b.dst = static_cast<Rank>(r);
      b.data = spec_.send[r].data;
      b.len = spec_.send[r].len;
      b.frames = frame_count(b.len, chunk);
      b.queued.assign((b.frames + 63) / 64, 0);
      b.rto = eng_.config().rto;
      out_of_[r] = static_cast<int>(out_.size());
      out_.push_back(std::move(b));
    }
    if (spec_.recv[r].len > 0) {
      InBlock& in = in_[r];
      in.data = spec_.recv[r].data;
      in.len = spec_.recv[r].len;
      in.frames = frame_count(in.len, chunk);
      in.bits.assign((in.frames + 63) / 64, 0);
      ++incomplete_blocks_;
    }
  }
  unacked_blocks_ = out_.size();
  // The phase of each block, for the frames' phase field.
  for (const auto& round : spec_.program.rounds)
    for (const auto& send : round.sends)
      if (!round.dummy && send.dst >= 0 && idx(send.dst) < n_ && out_of_[idx(send.dst)] >= 0) out_[static_cast<std::size_t>(out_of_[idx(send.dst)])].phase = send.phase;
  if (spec_.dummy_len == 0)
    for (const auto& b : out_) spec_.dummy_len = std::max(spec_.dummy_len, b.len);
  counters_.rounds.resize(spec_.program.rounds.size());
}

std::int64_t Exchange::since_start(Clock::time_point t) const { return duration_cast<nanoseconds>(t - start_).count(); }

void Exchange::begin(Clock::time_point now, const std::vector<bool>& early_ready, const std::vector<std::uint32_t>& early_syncs) {
  const Rank me = eng_.rank();
  // Our own block never leaves the node.
  if (idx(me) < spec_.send.size() && spec_.send[idx(me)].len > 0 && spec_.recv[idx(me)].data != nullptr)
    std::memcpy(spec_.recv[idx(me)].data, spec_.send[idx(me)].data, std::min(spec_.send[idx(me)].len, spec_.recv[idx(me)].len));
  for (std::size_t r = 0; r < n_ && r < early_ready.size(); ++r)
    if (early_ready[r]) ready_from_[r] = true;
  for (std::uint32_t id : early_syncs)
    if (id < have_sync_.size()) have_sync_[id] = 1;
  // READY before data: every peer that sends to us learns that the buffer is posted.
  for (std::size_t r = 0; r < n_; ++r) {
    if (in_[r].len == 0) continue;
    Pending& p = ready_out_[r];
    p.type = FrameType::kReady;
    p.to = static_cast<Rank>(r);
    p.rto = eng_.config().rto;
    ++unacked_pending_;
    send_pending(p, now);
  }
  // A block of zero bytes (alltoallv) is complete from the start: its receipt tokens go now.
  for (std::size_t r = 0; r < n_; ++r)
    if (static_cast<Rank>(r) != me && in_[r].len == 0)
      if (const auto* ids = spec_.program.emits_on_receive(static_cast<Rank>(r)))
        for (std::uint32_t id : *ids) emit(id, now);
  wait_since_ = now;
  advance(now);
}

void Exchange::ready_acked(Rank peer) {
  Pending& p = ready_out_[idx(peer)];
  if (p.to >= 0 && !p.acked) {
    p.acked = true;
    --unacked_pending_;
  }
}

// Resends an unacknowledged control frame when its timer expires; false when the exchange
// failed because the peer never answered.
bool Exchange::retry(Pending& p, Clock::time_point now) {
  if (now < p.retry_at) return true;
  if (p.tries > eng_.config().max_retries) {
    fail(Errc::kPeerSilent, "peer " + peer_name(eng_, p.to) + " did not acknowledge " + std::string(frame_type_name(p.type)) + " after " +
                                std::to_string(p.tries) + " tries",
         p.to, now);
    return false;
  }
  if (p.type == FrameType::kSync) {
    ++counters_.syncs_resent;
  } else {
    ++counters_.readies_resent;
  }
  send_pending(p, now);
  return true;
}

void Exchange::send_pending(Pending& p, Clock::time_point now) {
  eng_.send_control(p.to, p.type, spec_.id, p.seq, 0);
  ++counters_.control_frames_sent;
  p.retry_at = now + p.rto;
  p.rto = std::min(p.rto * 2, eng_.config().rto_max);
  ++p.tries;
}

Rank Exchange::sync_target(std::uint32_t id) const { return lookup_rank(spec_.sync_targets, id); }

void Exchange::waited_on(std::vector<bool>& peers) const {
  auto mark = [&](Rank r) {
    if (r >= 0 && idx(r) < n_ && r != eng_.rank()) peers[idx(r)] = true;
  };
  for (const auto& p : ready_out_)
    if (p.to >= 0 && !p.acked) mark(p.to);
  for (const auto& [id, p] : syncs_out_) mark(p.to);
  for (const auto& b : out_)
    if (b.first_done && !b.acked) mark(b.dst);
  if (round_ < spec_.program.rounds.size()) {
    if (round_state_ != RoundState::kWaiting) return;
    const sched::Round& round = spec_.program.rounds[round_];
    for (std::uint32_t id : round.waits)
      if (id >= have_sync_.size() || have_sync_[id] == 0) mark(lookup_rank(spec_.sync_sources, id));
    if (!round.dummy)
      for (const auto& send : round.sends)
        if (send.dst != eng_.rank() && spec_.send[idx(send.dst)].len > 0 && !ready_from_[idx(send.dst)]) mark(send.dst);
    return;
  }
  for (std::size_t r = 0; r < n_; ++r)
    if (in_[r].len > 0 && !in_[r].complete) mark(static_cast<Rank>(r));
}

void Exchange::emit(std::uint32_t id, Clock::time_point now) {
  Rank to = sync_target(id);
  if (to < 0) {
    fail(Errc::kInternal, "the plan has no target for sync " + std::to_string(id), -1, now);
    return;
  }
  if (to == eng_.rank()) {
    if (id < have_sync_.size()) have_sync_[id] = 1;
    return;
  }
  Pending& p = syncs_out_[id];
  p.type = FrameType::kSync;
  p.to = to;
  p.seq = id;
  p.rto = eng_.config().rto;
  ++unacked_pending_;
  ++counters_.syncs_sent;
  send_pending(p, now);
}

bool Exchange::round_can_start(const sched::Round& round) const {
  for (std::uint32_t id : round.waits)
    if (id >= have_sync_.size() || have_sync_[id] == 0) return false;
  if (round.dummy) return true;
  for (const auto& send : round.sends)
    if (send.dst != eng_.rank() && spec_.send[idx(send.dst)].len > 0 && !ready_from_[idx(send.dst)]) return false;
  return true;
}

void Exchange::start_round(Clock::time_point now) {
  const sched::Round& round = spec_.program.rounds[round_];
  counters_.wait_ns += duration_cast<nanoseconds>(now - wait_since_).count();
  counters_.rounds[round_].start_ns = since_start(now);
  eng_.restart_pacing(now);
  streams_.clear();
  cursor_ = 0;
  const std::uint32_t chunk = eng_.chunk();
  for (const auto& send : round.sends) {
    if (send.dst == eng_.rank()) {
      if (round.dummy && eng_.config().pace_bps > 0) {
        // A dummy message to oneself keeps the node busy for a block's wire time.
        double bits = static_cast<double>(spec_.dummy_len + (spec_.dummy_len / chunk + 1) * kFrameOverhead) * 8.0;
        delay_until_ = std::max(delay_until_, now + nanoseconds(static_cast<std::int64_t>(bits * 1e9 / static_cast<double>(eng_.config().pace_bps))));
        round_state_ = RoundState::kDelay;
      }
      continue;
    }
    Stream st;
    st.dst = send.dst;
    st.phase = send.phase;
    if (round.dummy) {
      st.len = spec_.dummy_len;
      st.frames = frame_count(st.len, chunk);
    } else {
      st.out = out_of_[idx(send.dst)];
      if (st.out < 0) continue;  // nothing to send to this destination
      st.len = out_[static_cast<std::size_t>(st.out)].len;
      st.frames = out_[static_cast<std::size_t>(st.out)].frames;
    }
    if (st.frames > 0) streams_.push_back(st);
  }
  if (round_state_ != RoundState::kDelay) round_state_ = RoundState::kSending;
}

void Exchange::end_round(Clock::time_point now) {
  const sched::Round& round = spec_.program.rounds[round_];
  counters_.rounds[round_].end_ns = since_start(now);
  // Sender-based tokens leave after the round's data: they are queued behind its frames.
  // (Sending them a little earlier was measured: on a link busy all the time, any lead makes
  // phases overlap, and the queue grows phase after phase until the switch drops frames.)
  // A round that caught up with a burst after a late poll leaves that burst queued
  // downstream, so its tokens wait until the burst has drained at the paced rate; otherwise
  // the bursts of 448 hand-overs add up on a bottleneck link that is never idle (64 machines).
  const Clock::time_point drained = eng_.drained_at() - spec_.token_slack;
  for (std::uint32_t id : round.emits) {
    if (drained > now) {
      late_emits_.emplace_back(drained, id);
    } else {
      emit(id, now);
    }
  }
  ++round_;
  round_state_ = RoundState::kWaiting;
  wait_since_ = now;
}

void Exchange::advance(Clock::time_point now) {
  while (running() && round_ < spec_.program.rounds.size()) {
    if (round_state_ == RoundState::kWaiting) {
      if (!round_can_start(spec_.program.rounds[round_])) break;
      start_round(now);
    }
    if (round_state_ == RoundState::kDelay) {
      if (now < delay_until_) break;
      round_state_ = streams_.empty() ? RoundState::kFinished : RoundState::kSending;
    }
    if (round_state_ == RoundState::kSending && !streams_.empty()) break;
    end_round(now);
  }
  check_done(now);
}

bool Exchange::has_data() const {
  if (!running()) return false;
  return !resend_blocks_.empty() || (round_state_ == RoundState::kSending && !streams_.empty());
}

void Exchange::send_data(OutBlock* block, Rank dst, std::uint32_t index, std::uint64_t len, int phase, std::uint8_t flags) {
  const std::uint32_t chunk = eng_.chunk();
  Header h;
  h.type = FrameType::kData;
  h.flags = flags;
  h.phase = phase < 0 ? kNoPhase : static_cast<std::uint16_t>(phase);
  h.exchange = spec_.id;
  h.dst = static_cast<std::uint16_t>(dst);
  h.seq = index;
  h.block_len = len;
  h.chunk = static_cast<std::uint16_t>(chunk);
  std::uint32_t payload = frame_payload(len, chunk, index);
  h.payload_len = static_cast<std::uint16_t>(payload);
  static const std::vector<std::uint8_t> zeros(65536, 0);
  const std::uint8_t* data = block != nullptr ? block->data + static_cast<std::uint64_t>(index) * chunk : zeros.data();
  eng_.send_frame(dst, h, data, payload);
  if (block == nullptr) {
    ++counters_.dummy_frames_sent;
  } else {
    ++counters_.data_frames_sent;
    counters_.data_bytes_sent += payload;
    if ((flags & kFlagRetransmit) != 0) ++counters_.retransmitted_frames;
  }
}

bool Exchange::send_next(Clock::time_point now) {
  if (!running()) return false;
  // Retransmissions first.
  while (!resend_blocks_.empty()) {
    OutBlock& b = out_[static_cast<std::size_t>(resend_blocks_.front())];
    if (b.resend.empty() || b.acked) {
      b.resend.clear();
      resend_blocks_.pop_front();
      continue;
    }
    std::uint32_t f = b.resend.front();
    b.resend.pop_front();
    clear_bit(b.queued, f);
    send_data(&b, b.dst, f, b.len, b.phase, kFlagRetransmit | (f + 1 == b.frames ? kFlagLast : 0));
    if (b.resend.empty()) {
      resend_blocks_.pop_front();
      b.poll_at = now + b.rto;  // ask again if the retransmissions are lost too
    }
    return true;
  }
  if (round_state_ != RoundState::kSending || streams_.empty()) return false;
  // Frame by frame across the round's destinations (Tam/Wang packet-level interleave).
  if (cursor_ >= streams_.size()) cursor_ = 0;
  Stream& st = streams_[cursor_];
  const bool last = st.next + 1 == st.frames;
  if (st.out >= 0) {
    OutBlock& b = out_[static_cast<std::size_t>(st.out)];
    send_data(&b, st.dst, st.next, st.len, st.phase, last ? kFlagLast : 0);
    b.sent = st.next + 1;
    if (last) {
      b.first_done = true;
      b.poll_at = now + b.rto;
    }
  } else {
    send_data(nullptr, st.dst, st.next, st.len, st.phase, kFlagDummy | (last ? kFlagLast : 0));
  }
  ++st.next;
  if (st.next == st.frames) {
    streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(cursor_));
  } else {
    ++cursor_;
  }
  if (streams_.empty()) advance(now);
  return true;
}

ParseContext::Expected Exchange::expect(std::uint32_t epoch, Rank src) const {
  if (state_ == ExchangeState::kFailed) return {DropReason::kNotLive, 0, 0};
  if (epoch_known_[idx(src)] && epoch_[idx(src)] != epoch) return {DropReason::kStaleEpoch, 0, 0};
  if (in_[idx(src)].len == 0) return {DropReason::kUnexpectedBlock, 0, 0};
  return {DropReason::kOk, in_[idx(src)].len, static_cast<std::uint16_t>(eng_.chunk())};
}

bool Exchange::accept_epoch(Rank src, std::uint32_t epoch) {
  if (!epoch_known_[idx(src)]) {
    epoch_known_[idx(src)] = true;
    epoch_[idx(src)] = epoch;
    return true;
  }
  return epoch_[idx(src)] == epoch;
}

void Exchange::peer_restarted(Rank src, Clock::time_point now) {
  if (running() && epoch_known_[idx(src)])
    fail(Errc::kPeerAborted, "peer " + peer_name(eng_, src) + " restarted during the exchange (new epoch)", src, now);
}

void Exchange::on_data(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  InBlock& in = in_[idx(src)];
  ready_acked(src);  // data from a peer means it has our READY
  if (in.complete || test_bit(in.bits, f.h.seq)) {
    count_drop(DropReason::kDuplicate);
    if ((f.h.flags & kFlagLast) != 0 && in.complete) eng_.send_control(src, FrameType::kAck, spec_.id, 0, static_cast<std::uint32_t>(FrameType::kData), in.len);
    return;
  }
  std::memcpy(in.data + f.offset, f.payload.data(), f.payload.size());
  set_bit(in.bits, f.h.seq);
  ++in.got;
  ++counters_.data_frames_received;
  counters_.data_bytes_received += f.payload.size();
  if (in.got == in.frames) {
    block_complete(src, now);
  } else if ((f.h.flags & kFlagLast) != 0) {
    send_nack(src, in, now);  // the sender's first pass ended with holes
  }
}

void Exchange::block_complete(Rank src, Clock::time_point now) {
  InBlock& in = in_[idx(src)];
  in.complete = true;
  --incomplete_blocks_;
  eng_.send_control(src, FrameType::kAck, spec_.id, 0, static_cast<std::uint32_t>(FrameType::kData), in.len);
  ++counters_.control_frames_sent;
  // Receiver-based tokens: emitted once the whole block is here.
  if (const auto* ids = spec_.program.emits_on_receive(src))
    for (std::uint32_t id : *ids) emit(id, now);
  advance(now);
}

void Exchange::send_nack(Rank src, InBlock& in, Clock::time_point now) {
  if (now < in.nack_at) return;  // one NACK per half RTO is enough
  in.nack_at = now + eng_.config().rto / 2;
  const std::size_t max_ranges = eng_.chunk() / 8;  // a NACK fits the frames' payload, tag included
  std::vector<std::uint8_t> payload;
  std::uint32_t ranges = 0;
  std::uint32_t f = 0;
  while (f < in.frames && ranges < max_ranges) {
    if (test_bit(in.bits, f)) {
      ++f;
      continue;
    }
    std::uint32_t first = f;
    while (f < in.frames && !test_bit(in.bits, f)) ++f;
    payload.resize(payload.size() + 8);
    put_nack_range(payload.data(), ranges, first, f - first);
    ++ranges;
  }
  eng_.send_control(src, FrameType::kNack, spec_.id, ranges, 0, in.len, payload.data(), payload.size());
  ++counters_.nacks_sent;
  ++counters_.control_frames_sent;
}

void Exchange::on_nack(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  ++counters_.nacks_received;
  int o = out_of_[idx(src)];
  if (o < 0 || out_[static_cast<std::size_t>(o)].len != f.h.block_len || !running()) {
    count_drop(DropReason::kUnexpectedBlock);
    return;
  }
  OutBlock& b = out_[static_cast<std::size_t>(o)];
  if (b.acked || f.h.chunk != eng_.chunk()) return;
  bool was_empty = b.resend.empty();
  for (std::uint32_t i = 0; i < f.h.seq; ++i) {
    auto [first, count] = nack_range(f.payload, i);
    for (std::uint32_t x = first; x < first + count; ++x) {
      // Only frames already sent once: the first pass will still bring the others.
      if (x < b.sent && !test_bit(b.queued, x)) {
        set_bit(b.queued, x);
        b.resend.push_back(x);
      }
    }
  }
  if (was_empty && !b.resend.empty()) resend_blocks_.push_back(o);
  b.poll_at = now + b.rto;
  // The receiver answers: only polls in a row that get no answer count towards giving up.
  // (At 30% loss per port direction, 41 polls in all were used up by a block that kept
  // making progress, finding 8.)
  b.polls = 0;
}

void Exchange::on_control(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  ++counters_.control_frames_received;
  switch (f.h.type) {
    case FrameType::kReady:
      if (running()) ready_from_[idx(src)] = true;
      eng_.send_control(src, FrameType::kAck, spec_.id, 0, static_cast<std::uint32_t>(FrameType::kReady));
      break;
    case FrameType::kSync:
      if (f.h.seq >= have_sync_.size()) {
        count_drop(DropReason::kBadLength);
        return;
      }
      have_sync_[f.h.seq] = 1;
      eng_.send_control(src, FrameType::kAck, spec_.id, f.h.seq, static_cast<std::uint32_t>(FrameType::kSync));
      break;
    case FrameType::kAck: {
      auto acked = static_cast<FrameType>(f.h.aux);
      if (acked == FrameType::kData) {
        int o = out_of_[idx(src)];
        if (o >= 0 && out_[static_cast<std::size_t>(o)].len == f.h.block_len && !out_[static_cast<std::size_t>(o)].acked) {
          out_[static_cast<std::size_t>(o)].acked = true;
          --unacked_blocks_;
        }
      } else if (acked == FrameType::kReady) {
        ready_acked(src);
      } else if (acked == FrameType::kSync) {
        auto it = syncs_out_.find(f.h.seq);
        if (it != syncs_out_.end() && it->second.to == src) {
          syncs_out_.erase(it);
          --unacked_pending_;
        }
      }
      break;
    }
    case FrameType::kNack:
      on_nack(f, now);
      break;
    case FrameType::kPoll: {
      InBlock& in = in_[idx(src)];
      if (in.len == 0 || in.len != f.h.block_len) {
        count_drop(DropReason::kUnexpectedBlock);
        return;
      }
      if (in.complete) {
        eng_.send_control(src, FrameType::kAck, spec_.id, 0, static_cast<std::uint32_t>(FrameType::kData), in.len);
      } else if (running()) {
        in.nack_at = Clock::time_point{};
        send_nack(src, in, now);
      }
      break;
    }
    default:
      break;
  }
  advance(now);
}

  // Liveness, for the peers this exchange waits on (waited_on): pinging every quiet peer made
  // 128 machines send more PINGs and ACKs than data frames (390,104 PINGs for 747,892 DATA
  // frames in one exchange). A peer nobody waits on is not needed: whoever needs it next waits
  // on it, finds it silent and aborts the exchange everywhere. Silence counts from when the
  // wait began.
  // Issue 15, finding 8: a waited-on peer we have not heard from for a fifth of the deadline
  // gets a PING, and another every 1/50 of the deadline while it stays silent. At 30% loss per
  // port direction a PING and its ACK both arrive only 24% of the time: the old keepalive (4
  // PINGs per deadline) declared live peers silent at 20% loss; 40 tries all fail once in
  // 60,000. Any frame of the peer counts as heard (Engine::receive). A peer is silent only
  // when nothing came from it for the whole deadline although we pinged it kMinPings times,
  // the last one long enough ago to be answered. Silence is counted in the time between runs
  // of these timers, at most a tenth of the deadline per run, so that a stall of the host (8
  // engines of the vdev fabric on a loaded 2-core machine: 12 pings in 333 ms, and the peer's
  // frames were waiting in the queues) is not charged to the peer.
bool Exchange::keepalive(Clock::time_point now) {
  if (now < next_keepalive_) return true;
  const auto& cfg = eng_.config();
  constexpr int kPingsPerDeadline = 50, kMinPings = 3;
  const auto deadline = duration_cast<Clock::duration>(cfg.peer_deadline);
  const auto quiet = deadline / 5, interval = deadline / kPingsPerDeadline;
  // Look again within a tenth of the deadline even when nobody is waited on: a wait that
  // begins meanwhile is then counted from its start.
  Clock::time_point next = now + deadline / 10;
  const auto step = std::min<Clock::duration>(now - last_keepalive_, deadline / 10);
  last_keepalive_ = now;
  std::vector<bool> waited(n_, false);
  waited_on(waited);
  for (std::size_t r = 0; r < n_; ++r) {
    if (!waited[r]) {
      waiting_[r] = false;
      continue;
    }
    if (!waiting_[r]) {
      waiting_[r] = true;
      waiting_since_[r] = now;
    }
    Clock::time_point heard = std::max(eng_.last_heard_[r], waiting_since_[r]);
    if (heard != heard_seen_[r]) {
      heard_seen_[r] = heard;
      pings_[r] = 0;
      silent_for_[r] = std::min<Clock::duration>(now - heard, step);
    } else {
      silent_for_[r] += step;
    }
    if (silent_for_[r] > deadline && pings_[r] >= kMinPings && now - pinged_[r] >= interval) {
      auto ms = duration_cast<std::chrono::milliseconds>(now - heard).count();
      fail(Errc::kPeerSilent, "peer " + peer_name(eng_, static_cast<Rank>(r)) + " silent for " + std::to_string(ms) + " ms (" +
                                  std::to_string(pings_[r]) + " pings unanswered)",
           static_cast<Rank>(r), now);
      return false;
    }
    if (silent_for_[r] <= quiet) {
      next = std::min(next, now + (quiet - silent_for_[r]) + interval / 2);
      continue;
    }
    if (now - pinged_[r] >= interval) {
      pinged_[r] = now;
      if (eng_.send_control(static_cast<Rank>(r), FrameType::kPing, spec_.id, 0, 0)) {  // no mbuf: not a try
        ++counters_.pings_sent;
        ++pings_[r];
      }
    }
    next = std::min(next, pinged_[r] + interval);
  }
  next_keepalive_ = next;
  return true;
}

void Exchange::timers(Clock::time_point now) {
  if (!running()) return;
  const auto& cfg = eng_.config();
  for (auto& p : ready_out_)
    if (p.to >= 0 && !p.acked && !retry(p, now)) return;
  for (auto& [id, p] : syncs_out_)
    if (!retry(p, now)) return;
  for (auto& b : out_) {
    if (b.acked || !b.first_done || !b.resend.empty() || now < b.poll_at) continue;
    if (b.polls > cfg.max_retries) {
      fail(Errc::kPeerSilent, "peer " + peer_name(eng_, b.dst) + " did not acknowledge its block after " + std::to_string(b.polls) + " polls",
           b.dst, now);
      return;
    }
    eng_.send_control(b.dst, FrameType::kPoll, spec_.id, 0, 0, b.len);
    ++counters_.polls_sent;
    ++counters_.control_frames_sent;
    ++b.polls;
    b.poll_at = now + b.rto;
    b.rto = std::min(b.rto * 2, cfg.rto_max);
  }
  if (!keepalive(now)) return;
  if (spec_.timeout.count() > 0 && now - start_ > spec_.timeout) {
    fail(Errc::kTimeout, "exchange " + std::to_string(spec_.id) + " did not finish within " + std::to_string(spec_.timeout.count()) + " ms", -1, now);
    return;
  }
  advance(now);
}

void Exchange::emit_due(Clock::time_point now) {
  if (!running()) return;
  while (!late_emits_.empty() && late_emits_.front().first <= now) {
    const std::uint32_t id = late_emits_.front().second;
    late_emits_.pop_front();
    emit(id, now);
  }
}

Clock::time_point Exchange::next_deadline() const {
  if (!running()) return Clock::time_point::max();
  Clock::time_point at = next_keepalive_;
  for (const auto& p : ready_out_)
    if (p.to >= 0 && !p.acked) at = std::min(at, p.retry_at);
  for (const auto& [id, p] : syncs_out_) at = std::min(at, p.retry_at);
  for (const auto& b : out_)
    if (!b.acked && b.first_done && b.resend.empty()) at = std::min(at, b.poll_at);
  if (spec_.timeout.count() > 0) at = std::min(at, start_ + spec_.timeout);
  if (round_state_ == RoundState::kDelay) at = std::min(at, delay_until_);
  return at;
}

void Exchange::check_done(Clock::time_point now) {
  if (!running() || round_ < spec_.program.rounds.size()) return;
  if (unacked_blocks_ > 0 || incomplete_blocks_ > 0 || unacked_pending_ > 0 || !late_emits_.empty()) return;
  state_ = ExchangeState::kDone;
  end_ = now;
  linger_until_ = now + eng_.config().linger;
}

void Exchange::fail(Errc code, const std::string& message, Rank peer, Clock::time_point now) {
  if (!running()) return;
  state_ = ExchangeState::kFailed;
  code_ = code;
  error_ = message;
  bad_peer_ = peer;
  end_ = now;
  linger_until_ = now + eng_.config().linger;
  streams_.clear();
  resend_blocks_.clear();
  late_emits_.clear();
  if (code == Errc::kPeerSilent && peer >= 0) eng_.peer_silent(peer, message, now);
  // Tell everyone (best effort, no acknowledgement); a peer that aborted us already knows.
  if (code != Errc::kPeerAborted) {
    std::string reason = "rank " + std::to_string(eng_.rank()) + ": " + message;
    if (reason.size() > 400) reason.resize(400);
    for (std::size_t r = 0; r < n_; ++r)
      if (static_cast<Rank>(r) != eng_.rank())
        eng_.send_control(static_cast<Rank>(r), FrameType::kAbort, spec_.id, 0, static_cast<std::uint32_t>(code), 0,
                          reinterpret_cast<const std::uint8_t*>(reason.data()), reason.size());
  }
}

ExchangeReport Exchange::report(Clock::time_point now) const {
  ExchangeReport r;
  r.id = spec_.id;
  r.state = state_;
  r.code = code_;
  r.error = error_;
  r.peer = bad_peer_;
  r.duration_ns = duration_cast<nanoseconds>((running() ? now : end_) - start_).count();
  r.counters = counters_;
  return r;
}

}  // namespace aapc::engine
