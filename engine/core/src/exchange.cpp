// One exchange: its setup, its end (done or failed) and its report. The rounds and the
// data out are in exchange_send.cpp, the frames received in exchange_receive.cpp, recovery and
// liveness in exchange_liveness.cpp.
#include "exchange.hpp"

#include <algorithm>
#include <cstring>

namespace aapc::engine {

using std::chrono::duration_cast;
using std::chrono::nanoseconds;

Exchange::Exchange(Link& link, ExchangeSpec spec, Clock::time_point now)
    : link_(link), spec_(std::move(spec)), n_(link.config().peers.size()), start_(now), next_keepalive_(now), seen_from_(now) {
  const std::uint32_t chunk = link_.chunk();
  member_ = member_mask(spec_, n_);
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
  if (!spec_.combine.empty()) stage_combine();
  const Rank me = link_.rank();
  std::uint64_t in_bytes = 0;
  for (std::size_t r = 0; r < n_; ++r) {
    if (static_cast<Rank>(r) == me) continue;
    if (spec_.send[r].len > 0) {
      OutBlock b;
      b.dst = static_cast<Rank>(r);
      b.data = spec_.send[r].data;
      b.region = spec_.send[r].region;
      b.len = spec_.send[r].len;
      b.frames = frame_count(b.len, chunk);
      b.queued.assign((b.frames + 63) / 64, 0);
      b.rto = link_.config().rto;
      b.eager = eager_block(b.len, chunk, link_.config());
      out_of_[r] = static_cast<int>(out_.size());
      out_.push_back(std::move(b));
    }
    if (spec_.recv[r].len > 0) {
      InBlock& in = in_[r];
      in.data = spec_.recv[r].data;
      in.len = spec_.recv[r].len;
      in.frames = frame_count(in.len, chunk);
      in.bits.assign((in.frames + 63) / 64, 0);
      in.eager = eager_block(in.len, chunk, link_.config());
      in_bytes += in.len;
      ++incomplete_blocks_;
    }
  }
  unacked_blocks_ = out_.size();
  // A combining exchange reads what it receives again (its staging), so it keeps it in cache.
  counters_.streamed = !staging_ && link_.config().streams(in_bytes, chunk);
  // The phase of each block, for the frames' phase field.
  for (const auto& round : spec_.program.rounds)
    for (const auto& send : round.sends)
      if (!round.dummy && send.dst >= 0 && idx(send.dst) < n_ && out_of_[idx(send.dst)] >= 0) out_[static_cast<std::size_t>(out_of_[idx(send.dst)])].phase = send.phase;
  if (spec_.dummy_len == 0)
    for (const auto& b : out_) spec_.dummy_len = std::max(spec_.dummy_len, b.len);
  if (spec_.combine.empty()) copy_eager_blocks();  // a combining exchange's messages are its own already
  counters_.rounds.resize(spec_.program.rounds.size());
  descriptor_ = encode_descriptor(spec_.descriptor, std::min<std::size_t>(link_.control_room(), kMaxDescriptor));
  soft_deadline_ = spec_.timeout.count() <= 0;
  deadline_ = soft_deadline_ ? default_timeout(spec_, link_.config(), chunk) : spec_.timeout;
  stall_ = stall_allowance(link_.config());
  last_progress_ = now;
}

std::int64_t Exchange::since_start(Clock::time_point t) const { return duration_cast<nanoseconds>(t - start_).count(); }

void Exchange::begin(Clock::time_point now, const EarlyFrames& early) {
  const Rank me = link_.rank();
  seen_from_ = early.first_seen != Clock::time_point{} ? std::min(start_, early.first_seen) : start_;
  if (!early_agrees(early, now)) return;
  // Our own block never leaves the node.
  if (idx(me) < spec_.send.size() && spec_.send[idx(me)].len > 0 && spec_.recv[idx(me)].data != nullptr)
    std::memcpy(spec_.recv[idx(me)].data, spec_.send[idx(me)].data, std::min(spec_.send[idx(me)].len, spec_.recv[idx(me)].len));
  // Only members' frames count (ExchangeSpec::members): another group may use this id.
  for (std::size_t r = 0; r < n_ && r < early.ready_from.size(); ++r)
    if (early.ready_from[r] && member_[r]) ready_from_[r] = true;
  for (auto [id, src] : early.syncs)
    if (id < have_sync_.size() && member(src)) have_sync_[id] = 1;
  // READY before data: every peer that sends to us learns that the buffer is posted. Eager
  // blocks come without one: a round trip saved.
  for (std::size_t r = 0; r < n_; ++r)
    if (in_[r].len > 0 && !in_[r].eager) post_ready(static_cast<Rank>(r), now);
  // A block of zero bytes (alltoallv) is complete from the start: its receipt tokens go now.
  for (std::size_t r = 0; r < n_; ++r)
    if (static_cast<Rank>(r) != me && in_[r].len == 0)
      if (const auto* ids = spec_.program.emits_on_receive(static_cast<Rank>(r)))
        for (std::uint32_t id : *ids) emit(id, now);
  wait_since_ = now;
  replay_early(early, now);
  advance(now);
}

void Exchange::replay_early(const EarlyFrames& early, Clock::time_point now) {
  for (const EarlyData& d : early.data) {
    if (!running()) return;
    if (!member(d.src)) {
      count_drop(DropReason::kNotMember);
      continue;
    }
    if (!accept_epoch(d.src, d.h.epoch)) {
      count_drop(DropReason::kStaleEpoch);
      continue;
    }
    Parsed f;
    f.h = d.h;
    if (data_fits(f.h, in_[idx(d.src)].len, link_.chunk()) != DropReason::kOk) {
      count_drop(DropReason::kUnexpectedBlock);
      if (f.h.block_len != 0) unexpected_data(d.src, f.h.block_len, now);  // else its polls or last frame will tell
      continue;
    }
    f.src_rank = d.src;
    f.payload = d.payload;
    f.offset = static_cast<std::uint64_t>(d.h.seq) * link_.chunk();
    on_data(f, now);
  }
}

void Exchange::unexpected_data(Rank src, std::uint64_t len, Clock::time_point now) {
  if (!running()) return;
  // Every peer that sends to us learns what we run and expect (a READY) before our ABORT: a
  // mismatch is seldom with one peer only, and each of them names it from its side.
  post_ready(src, now);
  for (std::size_t r = 0; r < n_; ++r)
    if (in_[r].len > 0 && static_cast<Rank>(r) != src) post_ready(static_cast<Rank>(r), now);
  // An alltoall's block size is its descriptor's: say it as the descriptors would.
  const std::string what = spec_.descriptor.kind == Collective::kAlltoall
                               ? descriptor_difference({Collective::kAlltoall, len, spec_.descriptor.plan}, spec_.descriptor)
                               : "sends a " + std::to_string(len) + "-byte block to this rank, which expects " + std::to_string(in_[idx(src)].len) + " bytes";
  fail(Errc::kInvalidArgument, "rank " + std::to_string(src) + " " + what, src, now);
}

ParseContext::Expected Exchange::expect(std::uint32_t epoch, Rank src) const {
  if (state_ == ExchangeState::kFailed) return {DropReason::kNotLive, 0, 0};
  if (epoch_known_[idx(src)] && epoch_[idx(src)] != epoch) return {DropReason::kStaleEpoch, 0, 0};
  if (in_[idx(src)].len == 0) return {DropReason::kUnexpectedBlock, 0, link_.chunk()};
  return {DropReason::kOk, in_[idx(src)].len, link_.chunk(), false, counters_.streamed};
}

std::uint8_t* Exchange::place_at(Rank src, std::uint32_t seq) const {
  const InBlock& in = in_[idx(src)];
  if (!running() || in.complete || seq >= in.frames || test_bit(in.bits, seq)) return nullptr;
  return in.data + static_cast<std::uint64_t>(seq) * link_.chunk();
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
    fail(Errc::kPeerAborted, "peer " + peer_name(link_, src) + " restarted during the exchange (new epoch)", src, now);
}

void Exchange::copy_eager_blocks() {
  std::size_t bytes = 0;
  for (const auto& b : out_)
    if (b.eager) bytes += b.len;
  eager_copy_.resize(bytes);
  std::size_t at = 0;
  for (auto& b : out_) {
    if (!b.eager) continue;
    std::memcpy(eager_copy_.data() + at, b.data, b.len);
    b.data = eager_copy_.data() + at;
    b.region = nullptr;
    at += b.len;
  }
}

void Exchange::abandon(Rank peer) {
  for (auto& b : out_) {
    if (b.dst != peer || b.acked) continue;
    b.acked = true;
    b.resend.clear();
    --unacked_blocks_;
  }
  for (auto it = syncs_out_.begin(); it != syncs_out_.end();) {
    if (it->second.to == peer) {
      it = syncs_out_.erase(it);
      --unacked_pending_;
    } else {
      ++it;
    }
  }
  settle_check();
}

void Exchange::settle_check() {
  if (settling_ && unacked_blocks_ == 0 && unacked_pending_ == 0) settling_ = false;
  // Nothing is resent once every block is acknowledged: a lingering exchange (linger, 15 s)
  // must not hold on to its copy (64 machines, 8 KiB blocks: 512 KiB an exchange).
  // (Only once every round has sent its frames: an ACK, replayed or forged, may come early.)
  if (unacked_blocks_ == 0 && round_ >= spec_.program.rounds.size() && !eager_copy_.empty()) std::vector<std::uint8_t>().swap(eager_copy_);
}

void Exchange::check_done(Clock::time_point now) {
  settle_check();
  if (!running() || round_ < spec_.program.rounds.size()) return;
  if (incomplete_blocks_ > 0 || !late_emits_.empty()) return;
  // Done here once every block is in and every round has run: what still waits
  // for an acknowledgement is resent while settling, from our own copy of the eager blocks and
  // of the tokens; blocks that go from the caller's memory must be acknowledged first. (Every
  // READY is answered by now: its sender's block is here.)
  if (std::any_of(out_.begin(), out_.end(), [](const OutBlock& b) { return !b.acked && !b.eager; })) return;
  if (std::any_of(ready_out_.begin(), ready_out_.end(), [](const Pending& p) { return p.to >= 0 && !p.acked; })) return;
  state_ = ExchangeState::kDone;
  end_ = now;
  linger_until_ = now + link_.config().linger;
  settling_ = unacked_blocks_ > 0 || unacked_pending_ > 0;
}

void Exchange::fail(Errc code, const std::string& message, Rank peer, Clock::time_point now, bool tell) {
  if (!running()) return;
  state_ = ExchangeState::kFailed;
  code_ = code;
  error_ = message;
  bad_peer_ = peer;
  end_ = now;
  linger_until_ = now + link_.config().linger;
  streams_.clear();
  resend_blocks_.clear();
  late_emits_.clear();
  std::vector<std::uint8_t>().swap(eager_copy_);  // nothing is sent any more
  if (code == Errc::kPeerSilent && peer >= 0) link_.peer_silent(peer, message, now);
  // Tell the members (best effort, no acknowledgement); a peer that aborted us already knows.
  // One that missed it is told again when it next sends us a frame of this exchange (remind).
  told_at_.assign(n_, now);
  if (tell && code != Errc::kPeerAborted)
    for (std::size_t r = 0; r < n_; ++r)
      if (static_cast<Rank>(r) != link_.rank() && member_[r]) send_abort(static_cast<Rank>(r));
}

void Exchange::send_abort(Rank to) {
  // A peer of ours that aborted is not named: its own ABORT said so, or our reminder says it
  // with the reason that came to us.
  std::string reason = code_ == Errc::kPeerAborted ? error_ : "rank " + std::to_string(link_.rank()) + ": " + error_;
  if (reason.size() > 400) reason.resize(400);
  if (reason.size() > link_.control_room()) reason.resize(link_.control_room());
  // A peer found silent is named (its rank + 1) so that every member remembers it dead, not
  // only those whose own exchange gave up on it (Engine::on_abort).
  const auto silent_peer = code_ == Errc::kPeerSilent && bad_peer_ >= 0 ? static_cast<std::uint32_t>(bad_peer_) + 1 : 0;
  link_.send_control(to, FrameType::kAbort, spec_.id, silent_peer, static_cast<std::uint32_t>(code_), 0, reinterpret_cast<const std::uint8_t*>(reason.data()),
                     reason.size());
}

// An ABORT is one frame, sent once: a member that lost it went on waiting for us, answered
// (our PINGs' ACKs, a failed exchange's ACKs of its READY and polls) as if we were still in the
// exchange, until its own stall deadline (15 s at 30% loss). Any frame of this exchange from a
// member says it has not heard, and gets the ABORT again, at most once per RTO.
void Exchange::abort_again(Rank src, Clock::time_point now) {
  if (!member(src) || src == link_.rank()) return;
  Clock::time_point& told = told_at_[idx(src)];
  if (now - told < link_.config().rto) return;
  told = now;
  link_.count_abort_resent();
  send_abort(src);
}

ExchangeReport Exchange::report(Clock::time_point now) const {
  ExchangeReport r;
  r.id = spec_.id;
  r.state = state_;
  r.code = code_;
  r.error = error_;
  r.peer = bad_peer_;
  r.duration_ns = duration_cast<nanoseconds>((running() ? now : end_) - start_).count();
  r.span_ns = duration_cast<nanoseconds>((running() ? now : end_) - seen_from_).count();
  r.counters = counters_;
  return r;
}

}  // namespace aapc::engine
