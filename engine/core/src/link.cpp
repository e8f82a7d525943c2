#include "link.hpp"

#include <rte_mbuf.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "aapc/core/engine.hpp"  // seal_hook()
#include "aapc/nic/extmem.hpp"
#include "aapc/wire/crc.hpp"

namespace aapc::engine {

Link::Link(nic::Port& port, const EngineConfig& config, std::uint32_t epoch, std::uint32_t chunk)
    : port_(port),
      config_(config),
      epoch_(epoch),
      chunk_(chunk),
      mac_(config.peers[static_cast<std::size_t>(config.rank)]),
      key_(config.key ? &*config.key : nullptr),
      zero_copy_(port.zero_copy_tx() && key_ == nullptr),
      seal_flag_(port.tx_seal_flag()) {
  last_heard_.assign(config_.peers.size(), Clock::time_point{});
  dead_.resize(config_.peers.size());
  pace_last_ = Clock::now();
  tokens_ = config_.pace_burst_bytes;
  if (config_.pace_bps == 0) return;
  pace_frame_ = std::chrono::nanoseconds(static_cast<std::int64_t>(frame_bytes() * 8e9 / static_cast<double>(config_.pace_bps)));
  // Rounds held back by the bucket alone (the tree's, the shuffles') wake their engine about
  // once per kPacedWake, as paced rounds do (Exchange::pace_frame): woken for every frame sent
  // and received, eight daemons on two cores spent the host's time waking. A wake-up sends the
  // frames the bucket lets through and whole frames more, ahead of their time: they queue at
  // the port and leave at the link's rate, and the bucket counts them (drained_at still says
  // when the last one leaves). Waiting for the tokens instead would leave the link idle at each
  // round's start for the batch's time. The lead is at most half the bucket and
  // kWakeFramesMost frames (a short burst for a switch port's queue). See docs/design.md,
  // "Fast links".
  const double frame = frame_bytes();
  const double wake = static_cast<double>(config_.pace_bps) / 8e9 * static_cast<double>(std::chrono::nanoseconds(kPacedWake).count());
  const double most = std::min(static_cast<double>(config_.pace_burst_bytes) / 2, kWakeFramesMost * frame);
  lead_bytes_ = std::floor(std::max(0.0, std::min(wake, most) / frame - 1)) * frame;
}

Link::~Link() {
  for (auto* m : txq_) rte_pktmbuf_free(m);
}

namespace {

void seal_frames(rte_mbuf** frames, std::uint16_t n, std::uint64_t flag, const void* context) {
  const auto* key = static_cast<const FrameKey*>(context);
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = frames[i];
    if ((m->ol_flags & flag) == 0) continue;
    m->ol_flags &= ~flag;
    auto* p = rte_pktmbuf_mtod(m, std::uint8_t*);
    if (m->nb_segs == 1) {
      seal_marked(p, key);
    } else {  // the header, then the payload attached without a copy (build_zero_copy)
      seal_apart(p, rte_pktmbuf_mtod(m->next, const std::uint8_t*), rte_pktmbuf_data_len(m->next));
    }
  }
}

}  // namespace

nic::FrameHook seal_hook(const FrameKey* key) { return {&seal_frames, key}; }

void Link::encode_header(std::uint8_t* p, Rank dst, const Header& h) const {
  Header hh = h;
  hh.epoch = epoch_;
  hh.src = static_cast<std::uint16_t>(config_.rank);
  encode(p, config_.peers[static_cast<std::size_t>(dst)], mac_, config_.ethertype, hh);
}

rte_mbuf* Link::build_copy(Rank dst, const Header& h, const std::uint8_t* payload, std::size_t len) {
  rte_mbuf* m = rte_pktmbuf_alloc(port_.pool());
  if (m == nullptr) return nullptr;
  // No padding of short frames: NICs pad to the Ethernet minimum themselves, and without it
  // every byte of a frame is checked (a truncated frame is always caught).
  const std::size_t frame_len = frame_overhead(h.type) + frame_tail(len, key_);
  auto* p = static_cast<std::uint8_t*>(static_cast<void*>(rte_pktmbuf_append(m, static_cast<std::uint16_t>(frame_len))));
  if (p == nullptr) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  encode_header(p, dst, h);
  if (seal_flag_ != 0) {  // sealed on the I/O lcore (seal_hook): here only the copy
    if (len > 0) copy_ahead(p + frame_overhead(h.type), payload, len, Ahead::kSource);
    seal_later(p, key_, ++tag_counter_);
    m->ol_flags |= seal_flag_;
  } else if (len > 0) {
    copy_and_seal(p, payload, len, key_, ++tag_counter_);
  } else {
    seal(p, key_, ++tag_counter_);
  }
  return m;
}

// The header in an mbuf of the port's pool, the payload in one attached to the sender's
// memory (nic/extmem.hpp) and chained behind it. The CRC is computed reading the payload
// where it is.
rte_mbuf* Link::build_zero_copy(Rank dst, const Header& h, const std::uint8_t* payload, std::size_t len,
                                const nic::ExternalRegion& region) {
  rte_mbuf* m = rte_pktmbuf_alloc(port_.pool());
  if (m == nullptr) return nullptr;
  auto* p = static_cast<std::uint8_t*>(static_cast<void*>(rte_pktmbuf_append(m, static_cast<std::uint16_t>(frame_overhead(h.type)))));
  rte_mbuf* data = p != nullptr ? region.attach(payload, static_cast<std::uint16_t>(len)) : nullptr;
  if (data == nullptr) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  encode_header(p, dst, h);
  if (seal_flag_ != 0) {
    m->ol_flags |= seal_flag_;  // the I/O lcore reads the payload for the CRC (seal_hook)
  } else {
    seal_apart(p, payload, len);
  }
  if (rte_pktmbuf_chain(m, data) != 0) {
    rte_pktmbuf_free(m);
    rte_pktmbuf_free(data);
    return nullptr;
  }
  return m;
}

bool Link::send_frame(Rank dst, const Header& h, const std::uint8_t* payload, std::size_t len, const nic::ExternalRegion* region) {
  rte_mbuf* m = nullptr;
  if (zero_copy_ && region != nullptr && config_.attaches(len)) {
    m = build_zero_copy(dst, h, payload, len, *region);
    if (m != nullptr) ++counters_.zero_copy_frames;
  }
  if (m == nullptr) m = build_copy(dst, h, payload, len);  // also when no external mbuf was free
  if (m == nullptr) {
    ++counters_.alloc_failures;
    return false;
  }
  const std::size_t frame_len = rte_pktmbuf_pkt_len(m);
  txq_.push_back(m);
  counters_.bytes_sent += frame_len;
  if (config_.pace_bps > 0) {
    const double bytes = static_cast<double>(frame_len + config_.pace_overhead_bytes);
    tokens_ -= bytes;
    pace_last_start_ = std::max(pace_drained_, pace_last_);
    pace_drained_ = pace_last_start_ + std::chrono::nanoseconds(static_cast<std::int64_t>(bytes * 8e9 / static_cast<double>(config_.pace_bps)));
  }
  return true;
}

bool Link::send_control(Rank dst, FrameType type, std::uint32_t exchange, std::uint32_t seq, std::uint32_t aux, std::uint64_t block_len,
                        const std::uint8_t* payload, std::size_t len) {
  Header h;
  h.type = type;
  h.exchange = exchange;
  h.dst = static_cast<std::uint16_t>(dst);
  h.seq = seq;
  h.aux = aux;
  h.block_len = block_len;
  h.chunk = static_cast<std::uint16_t>(chunk_);
  h.payload_len = static_cast<std::uint16_t>(len);
  return send_frame(dst, h, payload, len);
}

void Link::ack_later(Rank dst, const AckEntry& entry, Clock::time_point now) {
  if (config_.ack_delay.count() <= 0) {
    send_control(dst, FrameType::kAck, entry.exchange, entry.seq, static_cast<std::uint32_t>(entry.type), entry.block_len);
    return;
  }
  if (acks_.empty()) acks_.resize(config_.peers.size());
  auto& list = acks_[static_cast<std::size_t>(dst)];
  list.push_back(entry);
  ++counters_.acks_gathered;
  acks_due_ = std::min(acks_due_, now + std::min(config_.ack_delay, config_.rto / 4));  // before any sender polls
  if (list.size() * kAckEntryLen + kAckEntryLen > control_room()) send_acks(now, true);
}

void Link::send_acks(Clock::time_point now, bool all) {
  if (acks_due_ == Clock::time_point::max() || (!all && now < acks_due_)) return;
  std::vector<std::uint8_t> payload;
  for (std::size_t r = 0; r < acks_.size(); ++r) {
    auto& list = acks_[r];
    if (list.empty()) continue;
    payload.assign(list.size() * kAckEntryLen, 0);
    for (std::size_t i = 0; i < list.size(); ++i) put_ack_entry(payload.data(), i, list[i]);
    Header h;
    h.type = FrameType::kAck;
    h.flags = kFlagAckList;
    h.exchange = list.back().exchange;
    h.dst = static_cast<std::uint16_t>(r);
    h.aux = static_cast<std::uint32_t>(FrameType::kAck);
    h.chunk = static_cast<std::uint16_t>(chunk_);
    h.payload_len = static_cast<std::uint16_t>(payload.size());
    // No mbuf: they wait for the next try (the senders poll if it never comes).
    if (!send_frame(static_cast<Rank>(r), h, payload.data(), payload.size())) return;
    ++counters_.ack_lists_sent;
    list.clear();
  }
  acks_due_ = Clock::time_point::max();
}

void Link::refill(Clock::time_point now) {
  if (config_.pace_bps == 0) return;
  double ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - pace_last_).count());
  tokens_ = std::min(static_cast<double>(config_.pace_burst_bytes), tokens_ + ns * static_cast<double>(config_.pace_bps) / 8e9);
  pace_last_ = now;
}

// Measured on the 12-machine three-level emulation: with sender-based tokens, the next user
// of the bottleneck link starts as soon as the previous one's token arrives, while the
// previous one's tail is still queued in the network. Opening with a full bucket (half a
// millisecond of frames) adds that burst to the queue at every hand-over; over 36 phases the
// queue outgrew the switch's 64 KiB and frames were lost. One frame of credit at most.
void Link::restart_pacing(Clock::time_point now) {
  if (config_.pace_bps == 0) return;
  refill(now);
  tokens_ = std::min(tokens_, frame_bytes());
}

void Link::peer_silent(Rank peer, const std::string& why, Clock::time_point now) {
  DeadPeer& d = dead_[static_cast<std::size_t>(peer)];
  if (d.dead || now - last_heard_[static_cast<std::size_t>(peer)] < config_.peer_deadline) return;
  d = {true, why, now, now};
  spdlog::warn("rank {}: peer rank {} is dead until heard from again: {}", config_.rank, peer, why);
}

Clock::time_point EngineLink::send_allowed_at() const {
  if (may_send()) return Clock::time_point::min();
  const auto wait = std::chrono::nanoseconds(static_cast<std::int64_t>(-tokens_ * 8e9 / static_cast<double>(config_.pace_bps)) + 1);
  return pace_last_ + std::chrono::duration_cast<Clock::duration>(wait);
}

void EngineLink::flush() {
  if (txq_.empty()) return;
  const auto total = static_cast<std::uint16_t>(std::min<std::size_t>(txq_.size(), 512));
  const std::uint16_t sent = port_.tx_burst(txq_.data(), total);
  counters_.frames_sent += sent;
  if (sent < total) counters_.tx_refused += total - sent;
  txq_.erase(txq_.begin(), txq_.begin() + sent);
}

void EngineLink::heard_from(Rank peer, Clock::time_point now) {
  last_heard_[static_cast<std::size_t>(peer)] = now;
  DeadPeer& d = dead_[static_cast<std::size_t>(peer)];
  if (!d.dead) return;
  d.dead = false;
  spdlog::info("rank {}: peer rank {} is heard from again", config_.rank, peer);
}

void EngineLink::probe_dead(Clock::time_point now) {
  for (std::size_t r = 0; r < dead_.size(); ++r) {
    DeadPeer& d = dead_[r];
    if (!d.dead || now < d.probe_at) continue;
    send_control(static_cast<Rank>(r), FrameType::kPing, 0, 0, 0);
    d.probe_at = now + std::chrono::duration_cast<Clock::duration>(config_.peer_deadline) / 2;
  }
}

Clock::time_point EngineLink::next_probe() const {
  Clock::time_point due = Clock::time_point::max();
  for (const DeadPeer& d : dead_)
    if (d.dead) due = std::min(due, d.probe_at);
  return due;
}

}  // namespace aapc::engine
