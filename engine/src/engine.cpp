#include "aapc/engine/engine.hpp"

#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "exchange.hpp"

namespace aapc::engine {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

constexpr std::size_t kTxTarget = 32;      // frames built ahead of the port
constexpr unsigned kMinFreeMbufs = 128;    // leave room for control frames and receive
constexpr std::size_t kMaxEarly = 64;      // exchanges not started yet whose READY/SYNC we keep
constexpr auto kTimerPeriod = std::chrono::microseconds(500);
constexpr std::size_t kMaxDoneIds = 256;   // completed exchanges remembered past their linger

std::uint32_t clock_epoch() {
  // Milliseconds of wall-clock time: a restarted daemon gets a later epoch.
  auto ms = duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto e = static_cast<std::uint32_t>(ms);
  return e == 0 ? 1 : e;
}

// Serial-number comparison (RFC 1982): is a later than b?
bool later(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) > 0; }

}  // namespace

ExchangeSpec exchange_spec(const sched::Schedule& schedule, Rank me, std::uint32_t id) {
  ExchangeSpec spec;
  spec.id = id;
  spec.program = schedule.programs.at(static_cast<std::size_t>(me));
  spec.sync_count = static_cast<std::uint32_t>(schedule.syncs.size());
  for (const auto& s : schedule.syncs) {
    if (s.from == me) spec.sync_targets.emplace_back(s.id, s.to);
    if (s.to == me && s.from != me) spec.sync_sources.emplace_back(s.id, s.from);
  }
  std::sort(spec.sync_targets.begin(), spec.sync_targets.end());
  std::sort(spec.sync_sources.begin(), spec.sync_sources.end());
  spec.send.resize(static_cast<std::size_t>(schedule.machines));
  spec.recv.resize(static_cast<std::size_t>(schedule.machines));
  return spec;
}

Clock::duration token_slack(std::uint64_t smallest_buffer_bytes, std::size_t phases, std::uint64_t pace_bps) {
  if (pace_bps == 0 || phases == 0) return Clock::duration::zero();
  const double bytes = static_cast<double>(smallest_buffer_bytes) / static_cast<double>(phases);
  return std::chrono::nanoseconds(static_cast<std::int64_t>(bytes * 8e9 / static_cast<double>(pace_bps)));
}

Engine::Engine(nic::Port& port, EngineConfig config) : port_(port), config_(std::move(config)) {
  const std::size_t n = config_.peers.size();
  if (n < 2 || n > kMaxRanks) throw std::invalid_argument("engine needs 2 to 65535 peers");
  if (config_.rank < 0 || static_cast<std::size_t>(config_.rank) >= n) throw std::invalid_argument("engine rank out of range");
  if (config_.mtu < static_cast<int>(kHeaderLen) + 64 || config_.mtu - static_cast<int>(kHeaderLen) > 65535)
    throw std::invalid_argument("engine MTU must be between " + std::to_string(kHeaderLen + 64) + " and 65579");
  // With a key, the tag after the payload must fit the MTU too.
  chunk_ = static_cast<std::uint32_t>(config_.mtu) - static_cast<std::uint32_t>(kHeaderLen) - (config_.key ? static_cast<std::uint32_t>(kTagLen) : 0U);
  epoch_ = config_.epoch != 0 ? config_.epoch : clock_epoch();
  mac_ = config_.peers[static_cast<std::size_t>(config_.rank)];
  for (std::size_t r = 0; r < n; ++r) mac_index_.emplace_back(config_.peers[r], static_cast<Rank>(r));
  std::sort(mac_index_.begin(), mac_index_.end());
  for (std::size_t i = 1; i < mac_index_.size(); ++i)
    if (mac_index_[i].first == mac_index_[i - 1].first) throw std::invalid_argument("two ranks share the MAC " + nic::mac_string(mac_index_[i].first));
  peer_epoch_.assign(n, 0);
  peer_epoch_known_.assign(n, false);
  aborted_by_.resize(n);
  dead_.resize(n);
  peer_proposal_.resize(n);
  join_acked_.assign(n, true);
  last_heard_.assign(n, Clock::time_point{});
  ethertype = config_.ethertype;
  my_mac = mac_;
  my_rank = config_.rank;
  key = config_.key ? &*config_.key : nullptr;
  rx_.resize(config_.rx_burst);
  pace_last_ = Clock::now();
  if (config_.pace_burst_bytes == 0) {
    // Half a millisecond of the rate (at least four frames): a poll that comes late can
    // catch up without losing the link's time, and a switch port still sees a short burst.
    config_.pace_burst_bytes = static_cast<std::uint32_t>(
        std::max<std::uint64_t>(4ULL * (static_cast<std::uint64_t>(config_.mtu) + kEthHeaderLen), config_.pace_bps / 8 / 2000));
  }
  tokens_ = config_.pace_burst_bytes;
  if (config_.pace_bps > 0)
    pace_frame_ = std::chrono::nanoseconds(static_cast<std::int64_t>(
        static_cast<double>(static_cast<std::uint64_t>(config_.mtu) + kEthHeaderLen + config_.pace_overhead_bytes) * 8e9 /
        static_cast<double>(config_.pace_bps)));
}

Engine::~Engine() {
  for (auto* m : txq_) rte_pktmbuf_free(m);
}

Rank Engine::rank_of(const MacAddr& mac) const {
  auto it = std::lower_bound(mac_index_.begin(), mac_index_.end(), mac, [](const auto& e, const MacAddr& m) { return e.first < m; });
  return it != mac_index_.end() && it->first == mac ? it->second : -1;
}

Exchange* Engine::find(std::uint32_t id) const {
  auto it = exchanges_.find(id);
  return it == exchanges_.end() ? nullptr : it->second.get();
}

ParseContext::Expected Engine::expect_data(std::uint32_t exchange, std::uint32_t epoch, Rank src) const {
  Exchange* ex = find(exchange);
  if (ex == nullptr) return {DropReason::kNotLive, 0, 0};
  return ex->expect(epoch, src);
}

Result<void> Engine::start(ExchangeSpec spec) {
  const std::size_t n = config_.peers.size();
  auto invalid = [&](const std::string& what) { return Error(Errc::kInvalidArgument, "exchange " + std::to_string(spec.id) + ": " + what); };
  if (started_any_ && !later(spec.id, last_started_))
    return invalid("ids must grow; the last exchange started here was " + std::to_string(last_started_));
  const auto running = static_cast<std::size_t>(std::count_if(active_.begin(), active_.end(), [](const Exchange* ex) { return ex->running(); }));
  if (running >= config_.max_live_exchanges)
    return Error(Errc::kBusy, "exchange " + std::to_string(spec.id) + ": " + std::to_string(running) + " exchanges are already running");
  if (spec.send.size() != n || spec.recv.size() != n) return invalid("send and recv need one block per rank (" + std::to_string(n) + ")");
  if (spec.program.rank != config_.rank) return invalid("the program is for rank " + std::to_string(spec.program.rank));
  for (std::size_t r = 0; r < n; ++r) {
    if (spec.send[r].len > 0 && spec.send[r].data == nullptr) return invalid("send block " + std::to_string(r) + " has no buffer");
    if (spec.recv[r].len > 0 && spec.recv[r].data == nullptr) return invalid("recv block " + std::to_string(r) + " has no buffer");
    if (spec.send[r].len > static_cast<std::uint64_t>(chunk_) * 0xFFFFFFF0ULL || spec.recv[r].len > static_cast<std::uint64_t>(chunk_) * 0xFFFFFFF0ULL)
      return invalid("block " + std::to_string(r) + " is too large");
  }
  auto bad_sync = [&](std::uint32_t id) { return id >= spec.sync_count; };
  for (const auto& round : spec.program.rounds) {
    for (const auto& send : round.sends)
      if (send.dst < 0 || static_cast<std::size_t>(send.dst) >= n) return invalid("a round sends to rank " + std::to_string(send.dst));
    if (std::any_of(round.waits.begin(), round.waits.end(), bad_sync) || std::any_of(round.emits.begin(), round.emits.end(), bad_sync))
      return invalid("a round names a sync beyond sync_count");
  }
  for (const auto& [src, ids] : spec.program.on_receive)
    if (src < 0 || static_cast<std::size_t>(src) >= n || std::any_of(ids.begin(), ids.end(), bad_sync)) return invalid("on_receive is malformed");

  const auto now = Clock::now();
  for (std::size_t r = 0; r < n; ++r) {
    const Dead& d = dead_[r];
    const bool involved = spec.send[r].len > 0 || spec.recv[r].len > 0 ||
                          std::any_of(spec.sync_targets.begin(), spec.sync_targets.end(), [&](const auto& t) { return t.second == static_cast<Rank>(r); });
    if (d.dead && involved)
      return Error(Errc::kPeerSilent, "exchange " + std::to_string(spec.id) + ": peer rank " + std::to_string(r) + " (" + nic::mac_string(config_.peers[r]) +
                                          ") has not been heard from since it was found silent " +
                                          std::to_string(duration_cast<milliseconds>(now - d.since).count()) + " ms ago (" + d.why + ")");
    AbortedBy& ab = aborted_by_[r];
    if (ab.active && now - ab.when < config_.peer_deadline && ab.exchange == spec.id)
      return Error(Errc::kPeerAborted, "exchange " + std::to_string(spec.id) + ": rank " + std::to_string(r) + " aborted exchange " +
                                           std::to_string(ab.exchange) + " a moment ago (" + ab.reason + ")");
  }
  const std::uint32_t id = spec.id;
  auto ex = std::make_unique<Exchange>(*this, std::move(spec), now);
  Exchange* raw = ex.get();
  exchanges_[id] = std::move(ex);
  active_.push_back(raw);
  last_started_ = id;
  started_any_ = true;
  std::vector<bool> early_ready;
  std::vector<std::uint32_t> early_syncs;
  if (auto it = early_.find(id); it != early_.end()) {
    early_ready = std::move(it->second.ready_from);
    early_syncs = std::move(it->second.syncs);
    early_.erase(it);
  }
  // Early entries for ids now in the past can never start.
  for (auto it = early_.begin(); it != early_.end();) it = later(it->first, id) ? std::next(it) : early_.erase(it);
  raw->begin(now, early_ready, early_syncs);
  return {};
}

bool Engine::send_frame(Rank dst, const Header& h, const std::uint8_t* payload, std::size_t len) {
  rte_mbuf* m = rte_pktmbuf_alloc(port_.pool());
  if (m == nullptr) {
    ++counters_.alloc_failures;
    return false;
  }
  // No padding of short frames: NICs pad to the Ethernet minimum themselves, and without it
  // every byte of a frame is checked (a truncated frame is always caught).
  const std::size_t frame_len = kFrameOverhead + frame_tail(len, key);
  auto* p = static_cast<std::uint8_t*>(static_cast<void*>(rte_pktmbuf_append(m, static_cast<std::uint16_t>(frame_len))));
  if (p == nullptr) {
    rte_pktmbuf_free(m);
    ++counters_.alloc_failures;
    return false;
  }
  Header hh = h;
  hh.epoch = epoch_;
  hh.src = static_cast<std::uint16_t>(config_.rank);
  encode(p, config_.peers[static_cast<std::size_t>(dst)], mac_, config_.ethertype, hh);
  if (len > 0) {
    copy_and_seal(p, payload, len, key, ++tag_counter_);
  } else {
    seal(p, key, ++tag_counter_);
  }
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

bool Engine::send_control(Rank dst, FrameType type, std::uint32_t exchange, std::uint32_t seq, std::uint32_t aux, std::uint64_t block_len,
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

DropReason Engine::note_epoch(Rank src, std::uint32_t epoch) {
  auto i = static_cast<std::size_t>(src);
  if (peer_epoch_known_[i] && epoch == peer_epoch_[i]) return DropReason::kOk;
  // Issue 15, finding 5: an epoch is its sender's start time, so none can lie ahead of our
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
  peer_epoch_[i] = epoch;
  const auto now = Clock::now();
  for (auto& [id, ex] : exchanges_) ex->peer_restarted(src, now);
  if (on_peer_restart) on_peer_restart(src);
  return DropReason::kOk;
}

void Engine::announce() {
  for (std::size_t r = 0; r < config_.peers.size(); ++r)
    if (static_cast<Rank>(r) != config_.rank) send_control(static_cast<Rank>(r), FrameType::kPing, 0, 0, 0);
}

void Engine::abort_unstarted(std::uint32_t id, const std::string& reason) {
  for (std::size_t r = 0; r < config_.peers.size(); ++r)
    if (static_cast<Rank>(r) != config_.rank)
      send_control(static_cast<Rank>(r), FrameType::kAbort, id, 0, static_cast<std::uint32_t>(Errc::kAborted), 0,
                   reinterpret_cast<const std::uint8_t*>(reason.data()), reason.size());
}

void Engine::start_join(std::uint32_t proposal) {
  joining_ = true;
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
  for (std::size_t r = 0; r < config_.peers.size(); ++r) {
    if (join_acked_[r]) continue;
    all = false;
    send_control(static_cast<Rank>(r), FrameType::kJoin, 0, proposal_, 0);
  }
  join_sending_ = !all;
  join_retry_ = now + join_rto_;
  join_rto_ = std::min(join_rto_ * 2, config_.rto_max);
}

std::optional<Result<std::uint32_t>> Engine::join_result() {
  if (!joining_) return std::nullopt;
  std::uint32_t agreed = proposal_;
  for (std::size_t r = 0; r < config_.peers.size(); ++r) {
    if (static_cast<Rank>(r) == config_.rank) continue;
    if (!peer_proposal_[r]) {
      // A peer that does not even acknowledge our JOIN is down; one that acknowledges waits
      // for its own clients (a collective: we wait too).
      if (!join_acked_[r] && Clock::now() - join_since_ > config_.peer_deadline) {
        joining_ = false;
        return Result<std::uint32_t>(Error(Errc::kPeerSilent, "peer rank " + std::to_string(r) + " (" + nic::mac_string(config_.peers[r]) +
                                                                  ") did not answer while the cluster agreed on the next exchange"));
      }
      return std::nullopt;
    }
    if (later(*peer_proposal_[r], agreed)) agreed = *peer_proposal_[r];
  }
  joining_ = false;
  for (auto& p : peer_proposal_) p.reset();
  for (auto& ab : aborted_by_) ab.active = false;  // a new session, agreed by everyone
  return Result<std::uint32_t>(agreed);
}

void Engine::handle(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  if (f.h.type == FrameType::kPing) {
    send_control(src, FrameType::kAck, f.h.exchange, 0, static_cast<std::uint32_t>(FrameType::kPing));
    return;
  }
  if (f.h.type == FrameType::kAck && f.h.aux == static_cast<std::uint32_t>(FrameType::kPing)) return;
  if (f.h.type == FrameType::kJoin) {
    peer_proposal_[static_cast<std::size_t>(src)] = f.h.seq;
    send_control(src, FrameType::kAck, 0, f.h.seq, static_cast<std::uint32_t>(FrameType::kJoin));
    return;
  }
  if (f.h.type == FrameType::kAck && f.h.aux == static_cast<std::uint32_t>(FrameType::kJoin)) {
    if (f.h.seq == proposal_) join_acked_[static_cast<std::size_t>(src)] = true;
    return;
  }
  if (f.h.type == FrameType::kAbort) {
    // Issue 15, finding 5: an ABORT counts only for the exchange it names, and only while that
    // exchange runs here. (One forged ABORT with a stale id used to fail every running
    // exchange from that id on, and the next two through aborted_by_.)
    std::string reason = "aborted by peer rank " + std::to_string(src);
    if (f.payload.size() > 0) reason += ": " + std::string(f.payload.begin(), f.payload.end());
    Exchange* ex = find(f.h.exchange);
    if (ex != nullptr && ex->running() && ex->accept_epoch(src, f.h.epoch)) {
      ex->fail(Errc::kPeerAborted, reason, src, now);
    } else if (ex == nullptr && (!started_any_ || later(f.h.exchange, last_started_))) {
      // An exchange this node has not started yet, which the peer will never start
      // (abort_unstarted): starting exactly that id fails at once, for a peer deadline.
      aborted_by_[static_cast<std::size_t>(src)] = {f.h.exchange, now, reason, true};
    } else {
      ++counters_.drops[static_cast<std::size_t>(DropReason::kNotLive)];
    }
    return;
  }
  if (auto& ab = aborted_by_[static_cast<std::size_t>(src)]; ab.active && later(f.h.exchange, ab.exchange)) ab.active = false;
  Exchange* ex = find(f.h.exchange);
  if (ex == nullptr && f.h.type == FrameType::kPoll && std::find(done_ids_.begin(), done_ids_.end(), f.h.exchange) != done_ids_.end()) {
    // Finding 8: at 30% loss the ACKs of a block could all be lost within the linger time;
    // the exchange completed here, so every block of it arrived.
    send_control(src, FrameType::kAck, f.h.exchange, 0, static_cast<std::uint32_t>(FrameType::kData), f.h.block_len);
    return;
  }
  if (ex == nullptr) {
    const bool future = !started_any_ || later(f.h.exchange, last_started_);
    const bool keep = f.h.type == FrameType::kReady || f.h.type == FrameType::kSync;
    if (!future || !keep || (early_.size() >= kMaxEarly && early_.count(f.h.exchange) == 0)) {
      ++counters_.drops[static_cast<std::size_t>(DropReason::kNotLive)];
      return;
    }
    // A peer started an exchange we have not started yet: keep its READY and tokens.
    Early& e = early_[f.h.exchange];
    e.seen = now;
    if (e.ready_from.empty()) e.ready_from.assign(config_.peers.size(), false);
    if (f.h.type == FrameType::kReady) {
      e.ready_from[static_cast<std::size_t>(src)] = true;
    } else {
      e.syncs.push_back(f.h.seq);
    }
    ++counters_.early_frames;
    send_control(src, FrameType::kAck, f.h.exchange, f.h.seq, static_cast<std::uint32_t>(f.h.type));
    return;
  }
  if (!ex->accept_epoch(src, f.h.epoch)) {
    ex->count_drop(DropReason::kStaleEpoch);
    return;
  }
  if (f.h.type == FrameType::kData) {
    ex->on_data(f, now);
  } else {
    ex->on_control(f, now);
  }
}

void Engine::receive(Clock::time_point now) {
  const std::uint16_t got = port_.rx_burst(rx_.data(), static_cast<std::uint16_t>(rx_.size()));
  for (std::uint16_t i = 0; i < got; ++i) {
    rte_mbuf* m = rx_[i];
    if (m->nb_segs > 1 && rte_pktmbuf_linearize(m) != 0) {
      ++counters_.drops[static_cast<std::size_t>(DropReason::kBadLength)];
      rte_pktmbuf_free(m);
      continue;
    }
    ++counters_.frames_received;
    counters_.bytes_received += rte_pktmbuf_data_len(m);
    std::span<const std::uint8_t> frame(rte_pktmbuf_mtod(m, const std::uint8_t*), rte_pktmbuf_data_len(m));
    Parsed f = parse(frame, *this);
    if (f.reason == DropReason::kOk) f.reason = note_epoch(f.src_rank, f.h.epoch);
    if (f.reason != DropReason::kOk) {
      // A frame of the peer's current incarnation that is merely of no use (a duplicate, for a
      // finished exchange, dummy traffic) still shows that the peer is alive (finding 8).
      const bool alive = f.src_rank >= 0 && (f.reason == DropReason::kDummy || f.reason == DropReason::kNotLive || f.reason == DropReason::kDuplicate) &&
                         peer_epoch_known_[static_cast<std::size_t>(f.src_rank)] && peer_epoch_[static_cast<std::size_t>(f.src_rank)] == f.h.epoch;
      if (alive) heard_from(f.src_rank, now);
      // Reasons found after the CRC matched can be charged to the exchange.
      Exchange* ex = f.reason >= DropReason::kRankMismatch && f.reason != DropReason::kNotLive ? find(f.h.exchange) : nullptr;
      if (ex != nullptr) {
        ex->count_drop(f.reason);
      } else {
        ++counters_.drops[static_cast<std::size_t>(f.reason)];
      }
      if (f.reason != DropReason::kDummy && f.reason != DropReason::kEtherType && now - last_log_ > std::chrono::seconds(1)) {
        last_log_ = now;
        spdlog::warn("rank {}: dropped a frame ({}); {} dropped so far for that reason{}", config_.rank, drop_reason_name(f.reason),
                     counters_.drops[static_cast<std::size_t>(f.reason)],
                     f.reason != DropReason::kBadAuth ? ""
                     : key != nullptr ? " (not tagged with our cluster key: a forgery, or a node with another key or none)"
                                      : " (tagged with a cluster key, and this node has none: give every node the same key)");
      }
      rte_pktmbuf_free(m);
      continue;
    }
    heard_from(f.src_rank, now);
    ++handled_;
    handle(f, now);
    rte_pktmbuf_free(m);
  }
}

void Engine::peer_silent(Rank peer, const std::string& why, Clock::time_point now) {
  Dead& d = dead_[static_cast<std::size_t>(peer)];
  if (d.dead || now - last_heard_[static_cast<std::size_t>(peer)] < config_.peer_deadline) return;
  d = {true, why, now, now};
  spdlog::warn("rank {}: peer rank {} is dead until heard from again: {}", config_.rank, peer, why);
}

void Engine::heard_from(Rank peer, Clock::time_point now) {
  last_heard_[static_cast<std::size_t>(peer)] = now;
  Dead& d = dead_[static_cast<std::size_t>(peer)];
  if (!d.dead) return;
  d.dead = false;
  spdlog::info("rank {}: peer rank {} is heard from again", config_.rank, peer);
}

void Engine::timers(Clock::time_point now) {
  join_timers(now);
  // Dead peers are probed: a peer that was only cut off answers once it is back, and the
  // exchanges that involve it may start again.
  for (std::size_t r = 0; r < dead_.size(); ++r) {
    Dead& d = dead_[r];
    if (!d.dead || now < d.probe_at) continue;
    send_control(static_cast<Rank>(r), FrameType::kPing, 0, 0, 0);
    d.probe_at = now + duration_cast<Clock::duration>(config_.peer_deadline) / 2;
  }
  for (Exchange* ex : active_) ex->timers(now);
  while (!lingering_.empty() && now > lingering_.front().first) {
    if (Exchange* ex = find(lingering_.front().second); ex != nullptr && ex->state() == ExchangeState::kDone) {
      done_ids_.push_back(ex->id());
      if (done_ids_.size() > kMaxDoneIds) done_ids_.pop_front();
    }
    exchanges_.erase(lingering_.front().second);
    lingering_.pop_front();
  }
  for (auto it = early_.begin(); it != early_.end();) it = now - it->second.seen > config_.linger ? early_.erase(it) : std::next(it);
}

void Engine::refill(Clock::time_point now) {
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
void Engine::restart_pacing(Clock::time_point now) {
  if (config_.pace_bps == 0) return;
  refill(now);
  tokens_ = std::min(tokens_, static_cast<double>(config_.mtu + kEthHeaderLen + config_.pace_overhead_bytes));
}

void Engine::transmit(Clock::time_point now) {
  refill(now);
  std::vector<Exchange*> ready;
  for (Exchange* ex : active_)
    if (ex->has_data()) ready.push_back(ex);
  if (ready.empty()) return;
  // Leave mbufs for control frames and for receiving; checked once per pass.
  const unsigned avail = rte_mempool_avail_count(port_.pool());
  const std::size_t budget = avail > kMinFreeMbufs ? std::min<std::size_t>(avail - kMinFreeMbufs, kTxTarget) : 0;
  std::size_t built = 0;
  while (txq_.size() < kTxTarget && built < budget) {
    if (config_.pace_bps > 0 && tokens_ <= 0) break;
    ++built;
    bool sent = false;
    for (std::size_t k = 0; k < ready.size() && !sent; ++k) {
      Exchange* ex = ready[(rr_ + k) % ready.size()];
      sent = ex->send_next(now);
    }
    if (!sent) break;
    ++rr_;
  }
}

void Engine::flush() {
  if (txq_.empty()) return;
  const auto total = static_cast<std::uint16_t>(std::min<std::size_t>(txq_.size(), 512));
  const std::uint16_t sent = port_.tx_burst(txq_.data(), total);
  counters_.frames_sent += sent;
  if (sent < total) counters_.tx_refused += total - sent;
  txq_.erase(txq_.begin(), txq_.begin() + sent);
}

bool Engine::poll() {
  const auto now = Clock::now();
  const std::uint64_t before_rx = handled_, before_tx = counters_.frames_sent;
  receive(now);
  for (Exchange* ex : active_) ex->emit_due(now);
  if (now >= next_timers_) {
    timers(now);
    next_timers_ = now + kTimerPeriod;
  }
  transmit(now);
  flush();
  for (auto it = active_.begin(); it != active_.end();) {
    Exchange* ex = *it;
    if (ex->running()) {
      ++it;
      continue;
    }
    finished_.push_back(ex->report(now));
    lingering_.emplace_back(ex->linger_until(), ex->id());
    it = active_.erase(it);
  }
  // Work means frames of ours handled or sent; frames dropped (our own, looped back by
  // af_packet, or other protocols) do not keep the loop spinning.
  return handled_ != before_rx || counters_.frames_sent != before_tx;
}

void Engine::abort(std::uint32_t id, const std::string& reason) {
  if (Exchange* ex = find(id)) ex->fail(Errc::kAborted, reason, -1, Clock::now());
}

std::optional<ExchangeReport> Engine::report(std::uint32_t id) const {
  Exchange* ex = find(id);
  if (ex == nullptr) return std::nullopt;
  return ex->report(Clock::now());
}

std::vector<ExchangeReport> Engine::take_finished() {
  std::vector<ExchangeReport> out;
  out.swap(finished_);
  return out;
}

Clock::time_point Engine::next_event(Clock::time_point now) const {
  if (!txq_.empty()) return now;  // the port pushed back: offer them again
  // Timers run at most once per kTimerPeriod, but an engine with nothing due sleeps until its
  // earliest deadline: on 64 emulated machines sharing two cores, waking every idle engine at
  // the timer period took more CPU than the nodes that were sending (README, "Scale").
  Clock::time_point due = joining_ && join_sending_ ? join_retry_ : Clock::time_point::max();
  if (!lingering_.empty()) due = std::min(due, lingering_.front().first);
  for (const Dead& d : dead_)
    if (d.dead) due = std::min(due, d.probe_at);
  Clock::time_point token = Clock::time_point::max();
  for (const Exchange* ex : active_) {
    due = std::min(due, ex->next_deadline());
    token = std::min(token, ex->next_emit());
  }
  // Held-back tokens go at their time, not at the next timer period: someone waits for them.
  Clock::time_point at = std::min(std::max(due, next_timers_), token);
  if (std::any_of(active_.begin(), active_.end(), [](const Exchange* ex) { return ex->has_data(); })) {
    if (config_.pace_bps == 0 || tokens_ > 0) return now;
    const auto refill = std::chrono::nanoseconds(static_cast<std::int64_t>(-tokens_ * 8e9 / static_cast<double>(config_.pace_bps)) + 1);
    at = std::min(at, pace_last_ + std::chrono::duration_cast<Clock::duration>(refill));
  }
  return std::max(at, now);
}

bool Engine::quiet() const {
  if (!txq_.empty()) return false;
  return std::none_of(active_.begin(), active_.end(), [](const Exchange* ex) { return ex->running(); });
}

void Idler::idle() {
  ++idle_;
  if (idle_ < 32) return;  // keep polling: more frames are likely on their way
  if (idle_ < 128) {
#if defined(__x86_64__)
    for (int i = 0; i < 16; ++i) _mm_pause();
#endif
    return;
  }
  std::this_thread::sleep_for(idle_ < 1024 ? std::chrono::microseconds(20) : std::chrono::microseconds(200));
}

}  // namespace aapc::engine
