// An exchange's rounds (the node's program) and its data frames out.
#include "exchange.hpp"

#include <algorithm>

namespace aapc::engine {

using std::chrono::duration_cast;
using std::chrono::nanoseconds;

void Exchange::emit(std::uint32_t id, Clock::time_point now) {
  Rank to = sync_target(id);
  if (to < 0) {
    fail(Errc::kInternal, "the plan has no target for sync " + std::to_string(id), -1, now);
    return;
  }
  if (to == link_.rank()) {
    if (id < have_sync_.size()) have_sync_[id] = 1;
    return;
  }
  Pending& p = syncs_out_[id];
  p.type = FrameType::kSync;
  p.to = to;
  p.seq = id;
  p.rto = link_.config().rto;
  ++unacked_pending_;
  ++counters_.syncs_sent;
  send_pending(p, now);
}

bool Exchange::round_can_start(const sched::Round& round) const {
  for (std::uint32_t id : round.waits)
    if (id >= have_sync_.size() || have_sync_[id] == 0) return false;
  if (round.dummy) return true;
  return std::none_of(round.sends.begin(), round.sends.end(), [&](const sched::Send& send) { return awaits_ready(send.dst); });
}

bool Exchange::awaits_ready(Rank dst) const {
  if (dst == link_.rank() || ready_from_[idx(dst)]) return false;
  const int o = out_of_[idx(dst)];
  return o >= 0 && !out_[static_cast<std::size_t>(o)].eager;
}

void Exchange::start_round(Clock::time_point now) {
  const sched::Round& round = spec_.program.rounds[round_];
  counters_.wait_ns += duration_cast<nanoseconds>(now - wait_since_).count();
  counters_.rounds[round_].start_ns = since_start(now);
  last_progress_ = now;
  link_.restart_pacing(now);
  paced_next_ = now;
  streams_.clear();
  cursor_ = 0;
  if (staging_) pack_step(round_);
  const std::uint32_t chunk = link_.chunk();
  for (const auto& send : round.sends) {
    if (send.dst == link_.rank()) {
      if (round.dummy && link_.config().pace_bps > 0) {
        // A dummy message to oneself keeps the node busy for a block's wire time.
        double bits = static_cast<double>(spec_.dummy_len + (spec_.dummy_len / chunk + 1) * kDataFrameOverhead) * 8.0;
        delay_until_ = std::max(delay_until_, now + nanoseconds(static_cast<std::int64_t>(bits * 1e9 / static_cast<double>(link_.config().pace_bps))));
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
  // A round capped below its link's rate (sched::Round::rate_bps) has its last frame on its
  // slowest link until the next would have left at the cap.
  Clock::time_point drained = link_.drained_at();
  if (round.rate_bps > 0) drained = std::max(drained, paced_next_);
  drained -= spec_.token_slack;
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

bool Exchange::has_data(Clock::time_point now) const {
  if (settling_) return !resend_blocks_.empty();
  if (!running()) return false;
  return !resend_blocks_.empty() || (round_state_ == RoundState::kSending && !streams_.empty() && (!paced() || now >= paced_next_));
}

std::uint64_t Exchange::block_rate() const {
  const std::uint64_t cap = round_ < spec_.program.rounds.size() ? spec_.program.rounds[round_].rate_bps : 0;
  if (cap == 0 || spec_.block_rate_bps == 0) return std::max(cap, spec_.block_rate_bps);
  return std::min(cap, spec_.block_rate_bps);
}

Clock::time_point Exchange::paced_until() const {
  return pacing() ? paced_next_ + paced_batch_ : Clock::time_point::max();
}

void Exchange::pace_frame(std::uint32_t payload, Clock::time_point now) {
  if (!paced()) return;
  // The round's blocks each at block_rate(): k streams together at k times it. A frame's
  // bytes are counted as the link's bucket counts them (Link::send_frame).
  const EngineConfig& c = link_.config();
  const double bytes = static_cast<double>(payload + kDataFrameOverhead + (c.key ? kTagLen : 0) + c.pace_overhead_bytes);
  const double rate = static_cast<double>(block_rate()) * static_cast<double>(streams_.size());
  const auto frame = nanoseconds(static_cast<std::int64_t>(bytes * 8e9 / rate));
  // A node woken late catches up by as many bytes as the link's own bucket would let it, but by
  // no more than its share of the bottleneck's queue (paced_burst_bytes): a host that runs the
  // daemon late must not lose the rate for good, nor let the bursts of all the nodes it woke at
  // once overflow a switch. (Its share alone, 28 KiB on 8-two-switch where the link's bucket
  // holds 6 KiB at 100 Mbit/s, cost 5 points there: 89.2% against 94.2%.)
  const double link_burst = std::max(static_cast<double>(c.pace_burst_bytes), 4 * bytes);
  const double burst = spec_.paced_burst_bytes > 0 ? std::min(static_cast<double>(spec_.paced_burst_bytes), link_burst) : link_burst;
  const auto credit = nanoseconds(static_cast<std::int64_t>(burst * 8e9 / rate));
  if (now - credit > paced_next_) counters_.pace_lost_ns += (now - credit - paced_next_).count();
  paced_next_ = std::max(paced_next_, now - credit) + frame;
  // The daemon sleeps until a frame is due (Engine::next_event). Woken for every frame, eight
  // daemons on two cores spent the host's time waking: at 300 Mbit/s (a frame every 93 us at
  // 7/16 of the link) the box had 3% idle. So the frames due within kPacedWake leave together,
  // a burst of at most half the catch-up credit (the other half is left for a late wake-up)
  // and of kWakeFramesMost frames: while the engine sleeps, what arrives waits in the port's
  // ring (Engine::receive_wait_until), in a paced shuffle as many frames as it sends.
  paced_batch_ = std::clamp<Clock::duration>(kPacedWake - frame, Clock::duration::zero(), std::min<Clock::duration>(credit / 2, frame * kWakeFramesMost));
}

void Exchange::send_data(OutBlock* block, Rank dst, std::uint32_t index, std::uint64_t len, int phase, std::uint8_t flags) {
  const std::uint32_t chunk = link_.chunk();
  Header h;
  h.type = FrameType::kData;
  h.flags = flags;
  h.phase = phase < 0 ? kNoPhase : static_cast<std::uint16_t>(phase);
  h.exchange = spec_.id;
  h.dst = static_cast<std::uint16_t>(dst);
  h.seq = index;  // the block's length and the chunk are not on the wire in DATA frames
  std::uint32_t payload = frame_payload(len, chunk, index);
  h.payload_len = static_cast<std::uint16_t>(payload);
  static const std::vector<std::uint8_t> zeros(65536, 0);
  const std::uint8_t* data = block != nullptr ? block->data + static_cast<std::uint64_t>(index) * chunk : zeros.data();
  link_.send_frame(dst, h, data, payload, block != nullptr ? block->region : nullptr);
  if (block == nullptr) {
    ++counters_.dummy_frames_sent;
  } else {
    ++counters_.data_frames_sent;
    counters_.data_bytes_sent += payload;
    if ((flags & kFlagRetransmit) != 0) ++counters_.retransmitted_frames;
  }
}

bool Exchange::send_next(Clock::time_point now) {
  if (!running() && !settling_) return false;
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
    // The burst's last frame asks the receiver to answer (kFlagLast): if others of the burst
    // were lost, their NACK comes at once instead of after our next poll.
    send_data(&b, b.dst, f, b.len, b.phase, kFlagRetransmit | (b.resend.empty() || f + 1 == b.frames ? kFlagLast : 0));
    if (b.resend.empty()) {
      resend_blocks_.pop_front();
      b.poll_at = now + b.rto;  // ask again if the retransmissions are lost too
    }
    return true;
  }
  if (round_state_ != RoundState::kSending || streams_.empty() || (paced() && now < paced_next_)) return false;
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
  pace_frame(frame_payload(st.len, link_.chunk(), st.next), now);
  ++st.next;
  if (st.next == st.frames) {
    streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(cursor_));
  } else {
    ++cursor_;
  }
  if (streams_.empty()) advance(now);
  return true;
}

void Exchange::emit_due(Clock::time_point now) {
  if (!running()) return;
  while (!late_emits_.empty() && late_emits_.front().first <= now) {
    const std::uint32_t id = late_emits_.front().second;
    late_emits_.pop_front();
    emit(id, now);
  }
}

}  // namespace aapc::engine
