// Agreeing on the next exchange id at the start of a session (Engine::start_join).
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "aapc/core/engine.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/wire/serial.hpp"
#include "link.hpp"

namespace aapc::engine {

void Engine::start_join(std::uint32_t proposal, std::chrono::milliseconds deadline, JoinOwner owner, JoinMeasure measured) {
  joining_ = true;
  owner_ = owner;
  measure_ = std::move(measured);
  // What fits one frame, the newest last (a frame of MTU 1500 holds 200 reaches).
  const std::size_t room = (link_->control_room() - kJoinFitLen) / kReachSampleLen;
  if (measure_.reaches.size() > room) measure_.reaches.erase(measure_.reaches.begin(), measure_.reaches.end() - static_cast<std::ptrdiff_t>(room));
  ++join_round_;
  join_left_.assign(config_.peers.size(), false);
  reopen_slot(kWorldSlot);  // a new session: this node starts the cluster's collectives again
  join_deadline_ = deadline;
  join_sending_ = true;
  proposal_ = proposal;
  join_since_ = Clock::now();
  join_rto_ = config_.rto;
  std::fill(join_acked_.begin(), join_acked_.end(), false);
  join_acked_[static_cast<std::size_t>(config_.rank)] = true;
  join_retry_ = Clock::time_point{};  // send at once
  join_timers(join_since_);
}

void Engine::join_timers(Clock::time_point now) {
  if (!join_sending_ || now < join_retry_) return;
  bool all = true;
  std::vector<std::uint8_t> measure(measure_.length());
  put_join_measure(measure.data(), measure_);
  const std::size_t measure_len = measure_.known() ? measure.size() : 0;
  for (std::size_t r = 0; r < config_.peers.size(); ++r) {
    if (join_acked_[r]) continue;
    all = false;
    link_->send_control(static_cast<Rank>(r), FrameType::kJoin, owner_.job, proposal_, owner_.uid, join_round_, measure.data(), measure_len);
  }
  join_sending_ = !all;
  join_retry_ = now + join_rto_;
  join_rto_ = std::min(join_rto_ * 2, config_.rto_max);
}

void Engine::spend_proposal(std::size_t peer) {
  if (peer_proposal_[peer]) spent_round_[peer] = peer_round_[peer];
  peer_proposal_[peer].reset();
}

// A JOIN's proposal, unless it is a copy of one spent already: a peer resends its JOIN until
// we acknowledge it, and a copy that came after our join completed was taken for the peer's
// next session. The next join then agreed without that peer (at 30% loss per port direction,
// twice in 136 sessions of 8 machines): it started the session's first exchange while the
// peer's slot was still closed, and the peer answered it with the ABORT of its ended session.
void Engine::on_join(const Parsed& f) {
  const auto s = static_cast<std::size_t>(f.src_rank);
  link_->send_control(f.src_rank, FrameType::kAck, 0, f.h.seq, static_cast<std::uint32_t>(FrameType::kJoin));
  const JoinRound round{f.h.epoch, f.h.block_len};
  if (spent_round_[s] && spent_round_[s]->epoch == round.epoch && round.round <= spent_round_[s]->round) return;
  peer_proposal_[s] = f.h.seq;
  peer_owner_[s] = {f.h.aux, f.h.exchange};
  peer_measure_[s] = join_measure(f.payload);
  peer_round_[s] = round;
}

// The slowest fill and the longest hand-over of the ranks that measured one; and for each cell,
// over its exchanges, what the lowest reach any rank saw of each gives together (JoinMeasure). Every
// rank computes it from the same proposals, so every rank chooses its schedules alike.
AgreedMeasure Engine::agree_measure() const {
  AgreedMeasure agreed;
  std::map<std::pair<std::uint8_t, std::uint32_t>, std::uint16_t> lowest;  // (cell, exchange) -> reach
  for (std::size_t r = 0; r < peer_measure_.size(); ++r) {
    const JoinMeasure& m = static_cast<Rank>(r) == config_.rank ? measure_ : peer_measure_[r];
    if (m.fill_ppm > 0) agreed.fill_ppm = agreed.fill_ppm == 0 ? m.fill_ppm : std::min(agreed.fill_ppm, m.fill_ppm);
    agreed.hand_over_ns = std::max(agreed.hand_over_ns, m.hand_over_ns);  // 0 where not measured
    for (const ReachSample& s : m.reaches) {
      auto [at, fresh] = lowest.try_emplace({s.cell, s.exchange}, s.reach);
      if (!fresh) at->second = std::min(at->second, s.reach);
    }
  }
  std::array<std::vector<double>, kJoinReachCells> by_cell;
  for (const auto& [cell_exchange, reach] : lowest) by_cell[cell_exchange.first].push_back(reach);
  for (std::size_t c = 0; c < kJoinReachCells; ++c) agreed.reach[c] = static_cast<std::uint16_t>(std::lround(sched::reach_together(by_cell[c])));
  return agreed;
}

// A peer that proposed for another owner fails the join at once, before we wait for anyone.
std::optional<Error> Engine::join_owner_mismatch() {
  for (std::size_t r = 0; r < config_.peers.size(); ++r) {
    if (static_cast<Rank>(r) == config_.rank || !peer_proposal_[r] || peer_owner_[r] == owner_) continue;
    const JoinOwner theirs = peer_owner_[r];
    // Their proposals are spent: the next join waits for new ones (the peers' next clients).
    for (std::size_t q = 0; q < peer_proposal_.size(); ++q)
      if (peer_owner_[q] != owner_) spend_proposal(q);
    const std::string whose = theirs.uid != owner_.uid ? "another user (uid " + std::to_string(theirs.uid) + "; this one's is uid " + std::to_string(owner_.uid) + ")"
                                                       : "another job of uid " + std::to_string(theirs.uid) + " (its $AAPC_JOB or launcher's job differs)";
    return Error(Errc::kBusy, "rank " + std::to_string(r) + " (" + nic::mac_string(config_.peers[r]) + ") runs the collectives of " + whose +
                                  ": a machine's rank is held by the first client that starts a collective there, until it exits; wait for "
                                  "that job, or run in a group (Client::open_group)");
  }
  return std::nullopt;
}

std::optional<Result<std::uint32_t>> Engine::join_result() {
  if (!joining_) return std::nullopt;
  if (auto mismatch = join_owner_mismatch()) {
    joining_ = false;
    return Result<std::uint32_t>(*mismatch);
  }
  // A peer that does not even acknowledge our JOIN is down; one that acknowledges waits for its
  // own clients (a collective: we wait too), up to the deadline (a rank
  // whose client exited before its first collective hung the others). At the deadline the one
  // named is a peer that never called, before one whose client went away meanwhile (that
  // client failed for a reason of its own, often the absent one).
  const auto waited = Clock::now() - join_since_;
  std::uint32_t agreed = proposal_;
  int absent = -1, left = -1;
  for (std::size_t r = 0; r < config_.peers.size(); ++r) {
    if (static_cast<Rank>(r) == config_.rank) continue;
    if (peer_proposal_[r]) {
      if (later_id(*peer_proposal_[r], agreed)) agreed = *peer_proposal_[r];  // the session's slot only
      continue;
    }
    if (!join_acked_[r] && waited > config_.peer_deadline) {
      joining_ = false;
      return Result<std::uint32_t>(Error(Errc::kPeerSilent, "peer rank " + std::to_string(r) + " (" + nic::mac_string(config_.peers[r]) +
                                                                ") did not answer while the cluster agreed on the next exchange"));
    }
    int& first = join_left_[r] ? left : absent;
    if (first < 0) first = static_cast<int>(r);
  }
  if (absent >= 0 || left >= 0) {
    if (join_deadline_.count() <= 0 || waited <= join_deadline_) return std::nullopt;
    joining_ = false;
    const auto r = static_cast<std::size_t>(absent >= 0 ? absent : left);
    const std::string who = "rank " + std::to_string(r) + " (" + nic::mac_string(config_.peers[r]) + ")";
    if (absent < 0)
      return Result<std::uint32_t>(Error(Errc::kPeerAborted, who + ": its client went away while the cluster agreed on the next exchange"));
    return Result<std::uint32_t>(Error(Errc::kTimeout, who + " did not call the collective within " + std::to_string(join_deadline_.count()) +
                                                           " ms: its daemon answers, but no client there started one (it exited, or has not "
                                                           "called it yet)"));
  }
  joining_ = false;
  agreed_measure_ = agree_measure();
  for (std::size_t r = 0; r < peer_proposal_.size(); ++r) spend_proposal(r);
  // A new session, agreed by everyone: earlier ABORTs are void. One of an id of this session
  // stays: a peer that finished the join first may already have refused its first collective.
  for (auto& by : aborted_by_)
    if (later_id(agreed, by[kWorldSlot].exchange)) by[kWorldSlot].active = false;
  return Result<std::uint32_t>(agreed);
}

}  // namespace aapc::engine
