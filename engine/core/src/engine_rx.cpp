// The engine's receive path: epochs, the frames the engine answers itself, and the hand-off
// of the others to their exchange.
#include <rte_mbuf.h>
#include <sodium.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <span>

#include "aapc/core/engine.hpp"
#include "aapc/wire/crc.hpp"
#include "aapc/wire/serial.hpp"
#include "exchange.hpp"
#include "link.hpp"

namespace aapc::engine {
namespace {

// A frame's bytes as parse() takes them. A header segment followed by one payload segment
// (as a payload sent without a copy arrives over net_ring) is read where it is, so
// that the payload is written once, into the block; other chained frames are linearized
// (and so is that one with a cluster key: the tag covers header and payload as one run).
// False when a chained frame cannot be.
bool frame_parts(rte_mbuf* m, bool keyed, std::span<const std::uint8_t>& head, std::span<const std::uint8_t>& tail) {
  head = {rte_pktmbuf_mtod(m, const std::uint8_t*), rte_pktmbuf_data_len(m)};
  if (m->nb_segs == 2 && !keyed && frame_header_len(head) == head.size()) {
    tail = {rte_pktmbuf_mtod(m->next, const std::uint8_t*), rte_pktmbuf_data_len(m->next)};
    return true;
  }
  if (m->nb_segs > 1 && rte_pktmbuf_linearize(m) != 0) return false;
  head = {rte_pktmbuf_mtod(m, const std::uint8_t*), rte_pktmbuf_data_len(m)};
  tail = {};  // parse() finds where the header ends
  return true;
}

void check_integrity(rte_mbuf** frames, std::uint16_t n, std::uint64_t flag, const void* context) {
  const auto* key = static_cast<const FrameKey*>(context);
  for (std::uint16_t i = 0; i < n; ++i) {
    std::span<const std::uint8_t> head, tail;
    if (frame_parts(frames[i], key != nullptr, head, tail) && integrity_holds(head, tail, key)) frames[i]->ol_flags |= flag;
  }
}

}  // namespace

nic::FrameHook integrity_hook(const FrameKey* key) { return {&check_integrity, key}; }

DropReason Engine::note_epoch(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  const std::uint32_t epoch = f.h.epoch;
  auto i = static_cast<std::size_t>(src);
  if (peer_epoch_known_[i] && epoch == peer_epoch_[i]) return DropReason::kOk;
  // An epoch is its sender's start time, so none can lie ahead of our
  // clock by more than the skew between the clocks. A frame that claims one is forged (or
  // from a badly set clock) and must not make the real incarnation's frames look stale.
  // Epochs are 32-bit milliseconds, compared as serial numbers (24.8 days each way).
  auto plausible = [&](std::uint32_t e) {
    return config_.max_epoch_skew.count() <= 0 || !later(e, clock_epoch() + static_cast<std::uint32_t>(config_.max_epoch_skew.count()));
  };
  if (!plausible(epoch)) return DropReason::kFutureEpoch;
  if (!peer_epoch_known_[i]) {
    peer_epoch_known_[i] = true;
    peer_epoch_[i] = epoch;
    return DropReason::kOk;
  }
  // A later epoch means the peer restarted. A known epoch that no longer looks plausible (a
  // daemon up for longer than the serial-number range) gives way to any plausible one.
  if (!later(epoch, peer_epoch_[i]) && plausible(peer_epoch_[i])) return DropReason::kStaleEpoch;  // an earlier incarnation
  if (!restart_confirmed(f, now)) return DropReason::kUnconfirmedEpoch;
  peer_epoch_[i] = epoch;
  for (auto& [id, ex] : exchanges_) ex->peer_restarted(src, now);
  if (on_peer_restart) on_peer_restart(src);
  return DropReason::kOk;
}

// Without a cluster key any host on the segment can write a frame with a later epoch, which
// would make every real frame of its sender look stale: two nodes split until a restart. So a
// later epoch is taken only once the machine at the sender's MAC answers a challenge with it:
// a PING carrying a random nonce, whose ACK echoes the nonce (Engine::handle). A forger would
// have to see frames the switch sends to another port. A real restart costs one round trip.
// With a key, frames are authentic and the epoch is taken at once.
bool Engine::restart_confirmed(const Parsed& f, Clock::time_point now) {
  if (key != nullptr) return true;
  EpochChallenge& c = epoch_challenge_[static_cast<std::size_t>(f.src_rank)];
  if (f.h.type == FrameType::kAck && f.h.aux == static_cast<std::uint32_t>(FrameType::kPing) && c.nonce != 0 && f.h.seq == c.nonce &&
      f.h.epoch == c.epoch) {
    c = {};
    return true;
  }
  if (c.nonce == 0 || c.epoch != f.h.epoch || now - c.sent >= config_.rto) {  // at most one challenge per rto
    c = {f.h.epoch, randombytes_random() | 1U, now};
    link_->send_control(f.src_rank, FrameType::kPing, 0, c.nonce, 0);
  }
  return false;
}

bool Engine::alive_epoch(const Parsed& f) const {
  return f.src_rank >= 0 && peer_epoch_known_[static_cast<std::size_t>(f.src_rank)] && peer_epoch_[static_cast<std::size_t>(f.src_rank)] == f.h.epoch;
}

// An ABORT counts only for the exchange it names, and only while that
// exchange runs here. (One forged ABORT with a stale id used to fail every running exchange
// from that id on, and the next two through aborted_by_.)
void Engine::on_abort(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  std::string reason = "aborted by peer rank " + std::to_string(src);
  if (f.payload.size() > 0) reason += ": " + std::string(f.payload.begin(), f.payload.end());
  Exchange* ex = find(f.h.exchange);
  if (ex != nullptr && !ex->member(src)) {  // another group's, or forged
    link_->count_drop(DropReason::kNotMember);
    return;
  }
  if (id_slot(f.h.exchange) != kWorldSlot && f.h.aux == static_cast<std::uint32_t>(Errc::kAborted) && f.h.seq == kAbortEndsSession)
    note_left(src, f.h.exchange, reason);
  // The sender found a peer silent (Exchange::fail): remembered here too, so that our next
  // collectives with it fail at once. Hearing from that peer again undoes it (Link::heard_from).
  const auto silent = static_cast<Rank>(f.h.seq) - 1;
  if (f.h.aux == static_cast<std::uint32_t>(Errc::kPeerSilent) && silent >= 0 && static_cast<std::size_t>(silent) < config_.peers.size() &&
      silent != config_.rank && silent != src && (ex == nullptr || ex->member(silent)))
    link_->peer_silent(silent, "rank " + std::to_string(src) + " found it silent", now);
  if (ex != nullptr && ex->running() && ex->accept_epoch(src, f.h.epoch)) {
    // A collective called differently on some rank (a descriptor or block that differs) is
    // the callers' error on every rank, whoever found it first: the others may hear of it
    // only through this ABORT, now that eager blocks go without READY.
    const bool mismatch = f.h.aux == static_cast<std::uint32_t>(Errc::kInvalidArgument);
    ex->fail(mismatch ? Errc::kInvalidArgument : Errc::kPeerAborted, reason, src, now, false);
  } else if (ex != nullptr && ex->settling() && ex->accept_epoch(src, f.h.epoch)) {
    ex->abandon(src);  // done here; that peer will acknowledge nothing more of it
  } else if (ex == nullptr && after_last_started(f.h.exchange)) {
    // An exchange this node has not started yet, which the peer will never start
    // (abort_unstarted): starting exactly that id fails at once, for a peer deadline. A later
    // id's ABORT (its session's end, after it could not start this one) leaves a recent one in
    // place: the later ids are answered by the peer's closed slot.
    AbortedBy& by = aborted_by_[static_cast<std::size_t>(src)][id_slot(f.h.exchange)];
    if (!(by.active && now - by.when < config_.peer_deadline && later_id(f.h.exchange, by.exchange))) by = {f.h.exchange, now, reason, true};
    // The peer's session is over (its client went): a proposal it made for the cluster's ids
    // is void, and the next join waits for its next one. Except, while we join:
    // - one made for another owner: that peer's session most likely ended on meeting ours, and
    //   its JOIN and this ABORT may have landed together; the join's refusal names that owner
    //   (join_owner_mismatch), not a client that went away;
    // - one that this ABORT's id has passed: the peer agreed with us already and went on (it
    //   could not start the session's first collective, and its client left). Our join
    //   completes with it, and that collective fails at once (aborted_by_), not at the deadline.
    const auto s = static_cast<std::size_t>(src);
    const bool went_on = joining_ && peer_proposal_[s] && later_id(f.h.exchange, *peer_proposal_[s]);
    if (id_slot(f.h.exchange) == kWorldSlot && f.h.aux == static_cast<std::uint32_t>(Errc::kAborted) && f.h.seq == kAbortEndsSession &&
        !(joining_ && peer_proposal_[s] && peer_owner_[s] != owner_) && !went_on) {
      spend_proposal(s);
      if (joining_) join_left_[s] = true;
    }
  } else {
    link_->count_drop(DropReason::kNotLive);
  }
}

// Acknowledgements gathered by the peer (Link::ack_later), each for its own exchange.
void Engine::on_ack_list(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  bool used = false;
  for (std::size_t i = 0; i < f.payload.size() / kAckEntryLen; ++i) {
    const AckEntry e = ack_entry(f.payload, i);
    Exchange* ex = find(e.exchange);
    if (ex == nullptr || !ex->member(src) || !ex->accept_epoch(src, f.h.epoch)) continue;
    ex->on_acks(src, e, now);
    used = true;
  }
  if (!used) link_->count_drop(DropReason::kNotLive);  // for exchanges gone from here, or a replay
}

void Engine::handle(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  if (f.h.type == FrameType::kPing) {
    link_->send_control(src, FrameType::kAck, f.h.exchange, f.h.seq, static_cast<std::uint32_t>(FrameType::kPing));  // echoes a challenge's nonce
    // A keepalive names the exchange that waits on us: if it failed here, the ABORT went astray.
    if (Exchange* ex = find(f.h.exchange); ex != nullptr && ex->accept_epoch(src, f.h.epoch)) ex->remind(src, now);
    return;
  }
  if (f.h.type == FrameType::kAck && f.h.aux == static_cast<std::uint32_t>(FrameType::kPing)) return;
  if (f.h.type == FrameType::kJoin) {
    on_join(f);
    return;
  }
  if (f.h.type == FrameType::kAck && f.h.aux == static_cast<std::uint32_t>(FrameType::kJoin)) {
    if (f.h.seq == proposal_) join_acked_[static_cast<std::size_t>(src)] = true;
    return;
  }
  if (f.h.type == FrameType::kAbort) {
    on_abort(f, now);
    return;
  }
  if (f.h.type == FrameType::kAck && (f.h.flags & kFlagAckList) != 0) {
    on_ack_list(f, now);
    return;
  }
  auto& by = aborted_by_[static_cast<std::size_t>(src)];
  if (auto ab = by.find(id_slot(f.h.exchange)); ab != by.end() && ab->second.active && later_id(f.h.exchange, ab->second.exchange)) ab->second.active = false;
  Exchange* ex = find(f.h.exchange);
  if (ex == nullptr && answer_done(f)) return;
  if (ex == nullptr && answer_closed(f, now)) return;
  if (ex == nullptr) {
    const bool keep = f.h.type == FrameType::kReady || f.h.type == FrameType::kSync || f.h.type == FrameType::kData;
    if (!keep || !may_keep_early(f.h.exchange)) {
      link_->count_drop(DropReason::kNotLive);
    } else if (f.h.type == FrameType::kData) {
      keep_early_data(f);
    } else {
      keep_early(f);
    }
    return;
  }
  if (!ex->member(src)) {  // another group's, which may use this id on other machines, or forged
    link_->count_drop(DropReason::kNotMember);
    return;
  }
  if (!ex->accept_epoch(src, f.h.epoch)) {
    ex->count_drop(DropReason::kStaleEpoch);
    return;
  }
  ex->remind(src, now);  // failed here: the peer missed our ABORT
  if (f.h.type == FrameType::kData) {
    ex->on_data(f, now);
  } else {
    ex->on_control(f, now);
  }
}

// The peer's member of our group in the id's slot left the group (its client closed it or went
// away: Daemon's close_group, or answer_closed). Said of an earlier group in the slot (an id
// before our group's first) it is void.
void Engine::note_left(Rank src, std::uint32_t id, const std::string& reason) {
  const std::uint32_t slot = id_slot(id);
  if (auto first = slot_first_.find(slot); first != slot_first_.end() && later_id(first->second, id)) return;
  auto& left = left_[static_cast<std::size_t>(src)];
  if (auto it = left.find(slot); it != left.end() && !later_id(it->second.from, id)) return;  // it left before that already
  left[slot] = {id, reason};
}

// A poll, token or READY of an exchange that completed here and is forgotten (its linger over,
// or linger_max later ones lingering): everything it waited for arrived, so each is answered
// as received. At 30% loss every ACK of a block, token or READY can be lost within the linger
// time, and the sender, done and settling, goes on resending to a peer that answers other
// frames: it would give up only after its own linger time.
bool Engine::answer_done(const Parsed& f) {
  const FrameType t = f.h.type;
  if (t != FrameType::kPoll && t != FrameType::kSync && t != FrameType::kReady) return false;
  if (std::find(done_ids_.begin(), done_ids_.end(), f.h.exchange) == done_ids_.end()) return false;
  const FrameType acked = t == FrameType::kPoll ? FrameType::kData : t;
  link_->send_control(f.src_rank, FrameType::kAck, f.h.exchange, t == FrameType::kSync ? f.h.seq : 0, static_cast<std::uint32_t>(acked),
                      t == FrameType::kPoll ? f.h.block_len : 0);
  return true;
}

bool Engine::answer_closed(const Parsed& f, Clock::time_point now) {
  auto it = closed_.find(id_slot(f.h.exchange));
  if (it == closed_.end() || later_id(it->second.from, f.h.exchange)) return false;
  ClosedSlot& c = it->second;
  const Rank src = f.src_rank;
  if (!c.members.empty() && std::find(c.members.begin(), c.members.end(), src) == c.members.end()) return false;
  auto& [id, when] = c.answered[static_cast<std::size_t>(src)];
  if (id != f.h.exchange || now - when >= config_.rto) {
    id = f.h.exchange;
    when = now;
    // A group's slot closes when its client left the group, which can never go on without us
    // (kAbortEndsSession: note_left).
    link_->send_control(src, FrameType::kAbort, f.h.exchange, id_slot(f.h.exchange) != kWorldSlot ? kAbortEndsSession : 0,
                        static_cast<std::uint32_t>(Errc::kAborted), 0, reinterpret_cast<const std::uint8_t*>(c.reason.data()),
                        std::min<std::size_t>(c.reason.size(), link_->control_room()));
  }
  link_->count_drop(DropReason::kNotLive);
  return true;
}

EarlyFrames& Engine::early_entry(std::uint32_t id) {
  if (early_.count(id) == 0 && early_.size() >= kMaxEarly) erase_early(early_.find(farthest_early()->first));  // may_keep_early() let a nearer one in
  EarlyFrames& e = early_[id];
  if (e.ready_from.empty()) {
    e.first_seen = Clock::now();
    e.ready_from.assign(config_.peers.size(), false);
    e.ready_len.assign(config_.peers.size(), 0);
    e.descriptor.resize(config_.peers.size());
  }
  return e;
}

// A peer started an exchange we have not started yet: its READY, tokens and descriptor are
// kept for our start. The ACK carries no descriptor: ours is not known yet.
void Engine::keep_early(const Parsed& f) {
  const auto src = static_cast<std::size_t>(f.src_rank);
  EarlyFrames& e = early_entry(f.h.exchange);
  if (f.h.type == FrameType::kReady) {
    e.ready_from[src] = true;
    e.ready_len[src] = f.h.block_len;
  } else {
    e.syncs.emplace_back(f.h.seq, f.src_rank);
  }
  if (!f.payload.empty()) e.descriptor[src].assign(f.payload.begin(), f.payload.end());
  ++link_->counters().early_frames;
  link_->send_control(f.src_rank, FrameType::kAck, f.h.exchange, f.h.seq, static_cast<std::uint32_t>(f.h.type));
}

// A frame of an eager block, sent without waiting for our READY, came before we
// started its exchange: kept (without an ACK) for the start, which checks it against the
// posted block. Only eager blocks come early; what does not fit is dropped, and its sender's
// poll brings it again.
void Engine::keep_early_data(const Parsed& f) {
  if (f.h.seq >= config_.eager_frames) {  // not of an eager block
    link_->count_drop(DropReason::kNotLive);
    return;
  }
  if (early_data_bytes_ + f.payload.size() > config_.early_data_bytes) {
    ++link_->counters().early_data_dropped;
    link_->count_drop(DropReason::kNotLive);
    return;
  }
  EarlyFrames& e = early_entry(f.h.exchange);
  if (e.data.empty()) e.first_data = Clock::now();
  e.data.push_back({f.h, f.src_rank, std::vector<std::uint8_t>(f.payload.begin(), f.payload.end())});
  early_data_bytes_ += f.payload.size();
  ++link_->counters().early_data_frames;
}

void Engine::receive(Clock::time_point now) {
  const std::uint16_t got = port_.rx_burst(rx_.data(), static_cast<std::uint16_t>(rx_.size()));
  for (std::uint16_t i = 0; i < got; ++i) {
    rte_mbuf* m = rx_[i];
    std::span<const std::uint8_t> head, tail;
    if (!frame_parts(m, key != nullptr, head, tail)) {
      link_->count_drop(DropReason::kBadLength);
      continue;
    }
    ++link_->counters().frames_received;
    link_->counters().bytes_received += rte_pktmbuf_pkt_len(m);
    const bool prechecked = rx_verified_ != 0 && (m->ol_flags & rx_verified_) != 0;
    link_->counters().rx_prechecked += prechecked ? 1 : 0;
    Parsed f = parse(head, tail, *this, prechecked);
    if (f.reason == DropReason::kOk) f.reason = note_epoch(f, now);
    if (f.reason != DropReason::kOk) {
      // A frame of the peer's current incarnation that is merely of no use (a duplicate, for a
      // finished exchange, dummy traffic) still shows that the peer is alive.
      const bool alive = (f.reason == DropReason::kDummy || f.reason == DropReason::kNotLive || f.reason == DropReason::kDuplicate) && alive_epoch(f);
      if (alive) link_->heard_from(f.src_rank, now);
      // Reasons found after the CRC matched can be charged to the exchange.
      Exchange* ex = f.reason >= DropReason::kRankMismatch && f.reason != DropReason::kNotLive ? find(f.h.exchange) : nullptr;
      if (ex != nullptr) {
        ex->count_drop(f.reason);
        // A DATA frame tells its block's length only at the end of the first pass (wire.hpp).
        if (f.reason == DropReason::kUnexpectedBlock && f.h.type == FrameType::kData && f.h.block_len != 0 && alive_epoch(f))
          ex->unexpected_data(f.src_rank, f.h.block_len, now);
      } else {
        link_->count_drop(f.reason);
      }
      if (f.reason != DropReason::kDummy && f.reason != DropReason::kEtherType && now - last_log_ > std::chrono::seconds(1)) {
        last_log_ = now;
        spdlog::warn("rank {}: dropped a frame ({}); {} dropped so far for that reason{}", config_.rank, drop_reason_name(f.reason),
                     link_->counters().drops[static_cast<std::size_t>(f.reason)],
                     f.reason != DropReason::kBadAuth ? ""
                     : key != nullptr ? " (not tagged with our cluster key: a forgery, or a node with another key or none)"
                                      : " (tagged with a cluster key, and this node has none: give every node the same key)");
      }
      continue;
    }
    link_->heard_from(f.src_rank, now);
    ++handled_;
    handle(f, now);
  }
  // The burst's payloads streamed into their blocks are fenced once, before the mbufs go: an
  // attached one's release is a locked instruction, which would wait for them frame by frame.
  stream_fence();
  rte_pktmbuf_free_bulk(rx_.data(), got);
}

}  // namespace aapc::engine
