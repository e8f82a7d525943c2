// Recovery and liveness: control frames resent until acknowledged, polls for unacknowledged
// blocks, keepalives to the peers waited on, the exchange's deadline.
#include "exchange.hpp"

#include <algorithm>

namespace aapc::engine {

using std::chrono::duration_cast;

void Exchange::ready_acked(Rank peer) {
  Pending& p = ready_out_[idx(peer)];
  if (p.to >= 0 && !p.acked) {
    p.acked = true;
    --unacked_pending_;
  }
}

// Only a silent peer is given up: max_retries tries in a row unanswered over the peer deadline,
// and nothing at all heard from the peer for that deadline. A peer that answers anything else
// is alive, and its answers to this frame were lost: at 30% loss per port direction a frame
// and its answer both arrive 24% of the time, and 41 tries all fail once in 77,000 chains. An
// exchange runs hundreds of such chains (tokens, READYs, polls), and a cluster test of four
// exchanges on 8 machines failed so about once in a hundred runs ("did not acknowledge SYNC
// after 41 tries in 3944 ms": the peer had answered 14 of its tries, and pings meanwhile).
// The exchange's own deadline bounds the tries to a live peer; a settling one, already
// reported done, gives up on it after the linger time.
bool Exchange::given_up(Rank peer, int tries, Clock::time_point since, Clock::time_point now) const {
  const auto& cfg = link_.config();
  if (tries <= cfg.max_retries || now - since < cfg.peer_deadline) return false;
  if (now - std::max(link_.last_heard(peer), since) >= cfg.peer_deadline) return true;
  return settling_ && now - since >= cfg.linger;
}

// Resends an unacknowledged control frame when its timer expires; false when the exchange
// failed because the peer never answered.
bool Exchange::retry(Pending& p, Clock::time_point now) {
  if (now < p.retry_at) return true;
  if (given_up(p.to, p.tries, p.first_try, now)) {
    fail(Errc::kPeerSilent, "peer " + peer_name(link_, p.to) + " did not acknowledge " + std::string(frame_type_name(p.type)) + " after " +
                                std::to_string(p.tries) + " tries in " + std::to_string(ms_between(p.first_try, now)) + " ms",
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

void Exchange::post_ready(Rank src, Clock::time_point now) {
  Pending& p = ready_out_[idx(src)];
  if (p.to >= 0) {
    if (p.acked) send_pending(p, now);  // asked again: the sender may have missed what it said
    return;
  }
  p.type = FrameType::kReady;
  p.to = src;
  p.rto = link_.config().rto;
  ++unacked_pending_;
  send_pending(p, now);
}

void Exchange::late_readies(Clock::time_point now) {
  if (now < start_ + link_.config().rto) return;
  for (std::size_t r = 0; r < n_; ++r)
    if (owes_late_ready(r)) post_ready(static_cast<Rank>(r), now);
}

void Exchange::send_pending(Pending& p, Clock::time_point now) {
  // READY says which block it expects; both carry our descriptor.
  const std::uint64_t expected = p.type == FrameType::kReady ? in_[idx(p.to)].len : 0;
  link_.send_control(p.to, p.type, spec_.id, p.seq, 0, expected, descriptor_.data(), descriptor_.size());
  ++counters_.control_frames_sent;
  if (p.tries == 0) p.first_try = now;
  p.retry_at = now + p.rto;
  p.rto = std::min(p.rto * 2, link_.config().rto_max);
  ++p.tries;
}

Rank Exchange::sync_target(std::uint32_t id) const { return lookup_rank(spec_.sync_targets, id); }

void Exchange::waited_on(std::vector<std::uint8_t>& why) const {
  auto mark = [&](Rank r, Awaited what) {
    if (r >= 0 && idx(r) < n_ && r != link_.rank()) why[idx(r)] |= what;
  };
  for (const auto& p : ready_out_)
    if (p.to >= 0 && !p.acked) mark(p.to, kAckOfReady);
  for (const auto& [id, p] : syncs_out_) mark(p.to, kAckOfToken);
  for (const auto& b : out_)
    if (b.first_done && !b.acked) mark(b.dst, kAckOfBlock);
  // A block begun and not finished: its sender is sending it now, whatever our own rounds
  // are doing. A paced shuffle's node sends for the whole exchange and would otherwise wait
  // on nobody until its last frame left: a daemon killed mid-stream was found silent only a
  // deadline after that (2.8 s for 1 MB blocks on 8-two-switch, where 1.5 s is the deadline).
  for (std::size_t r = 0; r < n_; ++r)
    if (in_[r].got > 0 && !in_[r].complete) mark(static_cast<Rank>(r), kItsBlock);
  if (round_ < spec_.program.rounds.size()) {
    if (round_state_ != RoundState::kWaiting) return;
    const sched::Round& round = spec_.program.rounds[round_];
    for (std::uint32_t id : round.waits)
      if (id >= have_sync_.size() || have_sync_[id] == 0) mark(lookup_rank(spec_.sync_sources, id), kToken);
    if (!round.dummy)
      for (const auto& send : round.sends)
        if (awaits_ready(send.dst)) mark(send.dst, kItsReady);
    return;
  }
  for (std::size_t r = 0; r < n_; ++r)
    if (in_[r].len > 0 && !in_[r].complete) mark(static_cast<Rank>(r), kItsBlock);
}

// Liveness, for the peers this exchange waits on (waited_on): pinging every quiet peer made
// 128 machines send more PINGs and ACKs than data frames (390,104 PINGs for 747,892 DATA
// frames in one exchange). A peer nobody waits on is not needed: whoever needs it next waits
// on it, finds it silent and aborts the exchange everywhere. Silence counts from when the
// wait began.
// A waited-on peer we have not heard from for a fifth of the deadline
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
  const auto& cfg = link_.config();
  constexpr int kPingsPerDeadline = 50, kMinPings = 3;
  const auto deadline = duration_cast<Clock::duration>(cfg.peer_deadline);
  const auto quiet = deadline / 5, interval = deadline / kPingsPerDeadline;
  // Look again within a tenth of the deadline even when nobody is waited on: a wait that
  // begins meanwhile is then counted from its start.
  Clock::time_point next = now + deadline / 10;
  const auto step = std::min<Clock::duration>(now - last_keepalive_, deadline / 10);
  last_keepalive_ = now;
  std::vector<std::uint8_t> waited(n_, 0);
  waited_on(waited);
  for (std::size_t r = 0; r < n_; ++r) {
    if (waited[r] == 0) {
      waiting_[r] = false;
      continue;
    }
    if (!waiting_[r]) {
      waiting_[r] = true;
      waiting_since_[r] = now;
    }
    Clock::time_point heard = std::max(link_.last_heard(static_cast<Rank>(r)), waiting_since_[r]);
    if (heard != heard_seen_[r]) {
      heard_seen_[r] = heard;
      pings_[r] = 0;
      silent_for_[r] = std::min<Clock::duration>(now - heard, step);
    } else {
      silent_for_[r] += step;
    }
    if (silent_for_[r] > deadline && pings_[r] >= kMinPings && now - pinged_[r] >= interval) {
      fail(Errc::kPeerSilent, "peer " + peer_name(link_, static_cast<Rank>(r)) + " silent for " + std::to_string(ms_between(heard, now)) + " ms (" +
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
      if (link_.send_control(static_cast<Rank>(r), FrameType::kPing, spec_.id, 0, 0)) {  // no mbuf: not a try
        ++counters_.pings_sent;
        ++pings_[r];
      }
    }
    next = std::min(next, pinged_[r] + interval);
  }
  next_keepalive_ = next;
  return true;
}

// Resends what waits for an acknowledgement (READY, tokens) and polls the blocks sent; false
// when a peer never answered: the exchange failed (or, settling, gave up).
bool Exchange::resend_due(Clock::time_point now) {
  const auto& cfg = link_.config();
  for (auto& p : ready_out_)
    if (p.to >= 0 && !p.acked && !retry(p, now)) return false;
  for (auto& [id, p] : syncs_out_)
    if (!retry(p, now)) return false;
  for (auto& b : out_) {
    if (b.acked || !b.first_done || !b.resend.empty() || now < b.poll_at) continue;
    if (given_up(b.dst, b.polls, b.unanswered_since, now)) {
      fail(Errc::kPeerSilent, "peer " + peer_name(link_, b.dst) + " did not acknowledge its block after " + std::to_string(b.polls) + " polls in " +
                                  std::to_string(ms_between(b.unanswered_since, now)) + " ms",
           b.dst, now);
      return false;
    }
    if (b.polls == 0) b.unanswered_since = now;
    link_.send_control(b.dst, FrameType::kPoll, spec_.id, 0, 0, b.len);
    ++counters_.polls_sent;
    ++counters_.control_frames_sent;
    ++b.polls;
    b.poll_at = now + b.rto;
    b.rto = std::min(b.rto * 2, cfg.rto_max);
  }
  return true;
}

void Exchange::timers(Clock::time_point now) {
  if (settling_) {
    // Reported done already: a peer that never acknowledges is its own exchange's failure.
    if (!resend_due(now)) settling_ = false;
    return;
  }
  if (!running()) return;
  late_readies(now);
  if (!resend_due(now)) return;
  if (!keepalive(now)) return;
  if (now >= deadline_at()) {
    std::string why = "exchange " + std::to_string(spec_.id) + " did not finish within " + std::to_string(deadline_.count()) + " ms";
    if (soft_deadline_)
      why += " (the deadline derived from its size and the link rate; Options::timeout sets one) and made no progress for " +
             std::to_string(ms_between(last_progress_, now)) + " ms";
    fail(Errc::kTimeout, why + waiting_for(), -1, now);
    return;
  }
  advance(now);
}

Clock::time_point Exchange::next_deadline() const {
  if (!running() && !settling_) return Clock::time_point::max();
  Clock::time_point at = running() ? next_keepalive_ : Clock::time_point::max();
  for (const auto& p : ready_out_)
    if (p.to >= 0 && !p.acked) at = std::min(at, p.retry_at);
  for (const auto& [id, p] : syncs_out_) at = std::min(at, p.retry_at);
  for (std::size_t r = 0; r < n_; ++r)
    if (owes_late_ready(r)) at = std::min(at, start_ + link_.config().rto);
  for (const auto& b : out_)
    if (!b.acked && b.first_done && b.resend.empty()) at = std::min(at, b.poll_at);
  if (!running()) return at;
  at = std::min(at, deadline_at());
  if (round_state_ == RoundState::kDelay) at = std::min(at, delay_until_);
  return at;
}

Clock::time_point Exchange::deadline_at() const {
  const Clock::time_point hard = start_ + deadline_;
  return soft_deadline_ ? std::max(hard, last_progress_ + stall_) : hard;
}

}  // namespace aapc::engine
