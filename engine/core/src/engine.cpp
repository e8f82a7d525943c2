#include "aapc/core/engine.hpp"

#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <algorithm>
#include <thread>

#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "aapc/wire/crc.hpp"
#include "aapc/wire/serial.hpp"
#include "exchange.hpp"
#include "link.hpp"

namespace aapc::engine {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

constexpr std::size_t kTxTarget = 32;      // frames built ahead of the port
constexpr unsigned kMinFreeMbufs = 128;    // leave room for control frames and receive
constexpr auto kTimerPeriod = std::chrono::microseconds(500);
constexpr std::size_t kMaxDoneIds = 256;   // completed exchanges remembered past their linger

std::size_t early_payload(const EarlyFrames& e) {
  std::size_t bytes = 0;
  for (const auto& d : e.data) bytes += d.payload.size();
  return bytes;
}

}  // namespace

std::uint64_t default_stream_bytes() {
  static const std::uint64_t bytes = [] {  // once: the CPU count is read from sysfs
    const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE), cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    const std::uint64_t share = l3 > 0 && cpus > 0 ? static_cast<std::uint64_t>(l3 / cpus) * 3 / 4 : 0;
    const std::uint64_t b = std::max<std::uint64_t>(share, l2 > 0 ? static_cast<std::uint64_t>(l2) : 0);
    return b > 0 ? b : std::uint64_t{8} << 20;
  }();
  return bytes;
}

ExchangeSpec exchange_spec(const sched::Schedule& schedule, Rank me, std::uint32_t id) {
  ExchangeSpec spec;
  spec.id = id;
  spec.program = schedule.programs.at(static_cast<std::size_t>(me));
  spec.sync_count = static_cast<std::uint32_t>(schedule.sync_total());
  for (const auto& s : schedule.syncs) {
    if (s.from == me) spec.sync_targets.emplace_back(s.id, s.to);
    if (s.to == me && s.from != me) spec.sync_sources.emplace_back(s.id, s.from);
  }
  std::sort(spec.sync_targets.begin(), spec.sync_targets.end());
  std::sort(spec.sync_sources.begin(), spec.sync_sources.end());
  spec.send.resize(static_cast<std::size_t>(schedule.machines));
  spec.recv.resize(static_cast<std::size_t>(schedule.machines));
  spec.descriptor.plan = schedule.algorithm + "+" + schedule.sync.name();
  spec.bottleneck_load = schedule.phases.size();
  spec.block_rate_bps = schedule.block_rate_bps;
  // A combining schedule's phases are its steps; the exchange sizes the deadline by its
  // steps' messages (staging), so bottleneck_load stays the number of steps.
  if (schedule.combining()) spec.combine = schedule.combine.at(static_cast<std::size_t>(me));
  return spec;
}

ExchangeSpec exchange_spec(const sched::Schedule& schedule, Rank me, std::uint32_t id, const std::vector<Rank>& members, std::size_t cluster_size) {
  ExchangeSpec spec = exchange_spec(schedule, me, id);
  auto cluster = [&](Rank& r) { r = members.at(static_cast<std::size_t>(r)); };
  cluster(spec.program.rank);
  for (auto& round : spec.program.rounds)
    for (auto& send : round.sends) cluster(send.dst);
  for (auto& entry : spec.program.on_receive) cluster(entry.first);
  for (auto& target : spec.sync_targets) cluster(target.second);
  for (auto& source : spec.sync_sources) cluster(source.second);
  // Sorted as exchange_spec sorts them (on_receive by source, is looked up by it): members need not be in order.
  std::sort(spec.program.on_receive.begin(), spec.program.on_receive.end());
  std::sort(spec.sync_targets.begin(), spec.sync_targets.end());
  std::sort(spec.sync_sources.begin(), spec.sync_sources.end());
  for (auto& step : spec.combine) {
    cluster(step.to);
    cluster(step.from);
    for (auto* pieces : {&step.send, &step.recv})
      for (auto& piece : *pieces) {
        cluster(piece.origin);
        cluster(piece.dest);
      }
  }
  spec.send.assign(cluster_size, {});
  spec.recv.assign(cluster_size, {});
  spec.members = members;
  return spec;
}

std::chrono::milliseconds derived_timeout(std::uint64_t bottleneck_bytes, std::uint64_t link_bps, std::chrono::milliseconds allowance) {
  const double rate = link_bps > 0 ? static_cast<double>(link_bps) : 1e9;
  const double wire_ms = static_cast<double>(bottleneck_bytes) * 8e3 / rate;
  return std::chrono::milliseconds(static_cast<std::int64_t>(kTimeoutFactor * wire_ms)) + allowance;
}

std::chrono::milliseconds default_timeout(const ExchangeSpec& spec, const EngineConfig& config, std::uint32_t chunk) {
  std::uint64_t block = 0;
  for (const auto& b : spec.send) block = std::max(block, b.len);
  for (const auto& b : spec.recv) block = std::max(block, b.len);
  // The bytes of a block on the wire: every frame has its headers (and tag).
  const std::uint64_t frame = chunk + kDataFrameOverhead + (config.key ? kTagLen : 0);
  const std::uint64_t wire = frame_count(block, chunk) * frame;
  const std::uint64_t rate = config.link_bps != 0 ? config.link_bps : config.pace_bps;
  return derived_timeout(spec.bottleneck_load * wire, rate, stall_allowance(config));
}

std::uint32_t job_tag(const std::string& job) {
  if (job.empty()) return 0;
  std::uint32_t h = 2166136261U;
  for (unsigned char ch : job) h = (h ^ ch) * 16777619U;
  return h == 0 ? 1 : h;
}

std::chrono::milliseconds stall_allowance(const EngineConfig& config) { return config.timeout_allowance + 2 * config.peer_deadline; }

std::uint64_t paced_burst(std::uint64_t smallest_buffer_bytes, std::size_t streams, std::uint64_t bottleneck_load, std::uint64_t frame_bytes) {
  const std::uint64_t share = bottleneck_load > 0 ? smallest_buffer_bytes * streams / bottleneck_load : 0;
  return std::max(share, 2 * frame_bytes);
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
  // Control frames, whose header is the longer one, keep at least 64 bytes of payload room.
  if (config_.mtu < static_cast<int>(kHeaderLen) + 64 || config_.mtu - static_cast<int>(kDataHeaderLen) > 65535)
    throw std::invalid_argument("engine MTU must be between " + std::to_string(kHeaderLen + 64) + " and " + std::to_string(65535 + kDataHeaderLen));
  // With a key, the tag after the payload must fit the MTU too.
  chunk_ = static_cast<std::uint32_t>(config_.mtu) - static_cast<std::uint32_t>(kDataHeaderLen) - (config_.key ? static_cast<std::uint32_t>(kTagLen) : 0U);
  epoch_ = config_.epoch != 0 ? config_.epoch : clock_epoch();
  for (std::size_t r = 0; r < n; ++r) mac_index_.emplace_back(config_.peers[r], static_cast<Rank>(r));
  std::sort(mac_index_.begin(), mac_index_.end());
  for (std::size_t i = 1; i < mac_index_.size(); ++i)
    if (mac_index_[i].first == mac_index_[i - 1].first) throw std::invalid_argument("two ranks share the MAC " + nic::mac_string(mac_index_[i].first));
  peer_epoch_.assign(n, 0);
  peer_epoch_known_.assign(n, false);
  epoch_challenge_.assign(n, {});
  aborted_by_.resize(n);
  left_.resize(n);
  last_started_.resize(kSlots);
  newest_lingering_.resize(kSlots);
  peer_proposal_.resize(n);
  peer_owner_.assign(n, {});
  peer_measure_.assign(n, {});
  peer_round_.assign(n, {});
  spent_round_.assign(n, std::nullopt);
  join_acked_.assign(n, true);
  ethertype = config_.ethertype;
  my_mac = config_.peers[static_cast<std::size_t>(config_.rank)];
  my_rank = config_.rank;
  key = config_.key ? &*config_.key : nullptr;
  rx_.resize(config_.rx_burst);
  rx_verified_ = port_.rx_verified_flag();
  if (config_.pace_burst_bytes == 0) {
    // Half a millisecond of the rate (at least four frames): a poll that comes late can
    // catch up without losing the link's time, and a switch port still sees a short burst.
    config_.pace_burst_bytes = static_cast<std::uint32_t>(
        std::max<std::uint64_t>(4ULL * (static_cast<std::uint64_t>(config_.mtu) + kEthHeaderLen), config_.pace_bps / 8 / 2000));
  }
  link_ = std::make_unique<EngineLink>(port_, config_, epoch_, chunk_);
}

Engine::~Engine() = default;

const EngineCounters& Engine::counters() const { return link_->counters(); }

bool Engine::peer_dead(Rank peer) const { return link_->dead(peer).dead; }

Rank Engine::rank_of(const MacAddr& mac) const {
  auto it = std::lower_bound(mac_index_.begin(), mac_index_.end(), mac, [](const auto& e, const MacAddr& m) { return e.first < m; });
  return it != mac_index_.end() && it->first == mac ? it->second : -1;
}

Exchange* Engine::in_loop(std::uint32_t id) const {
  for (Exchange* ex : active_)
    if (ex->id() == id) return ex;
  return nullptr;
}

Exchange* Engine::find(std::uint32_t id) const {
  // Nearly every frame is for one of the few exchanges in the poll loop; thousands more may
  // linger (a benchmark of tiny blocks), whose tree each frame would otherwise descend.
  if (Exchange* ex = in_loop(id)) return ex;
  auto it = exchanges_.find(id);
  return it == exchanges_.end() ? nullptr : it->second.get();
}

ParseContext::Expected Engine::expect_data(std::uint32_t exchange, std::uint32_t epoch, Rank src) const {
  Exchange* ex = find(exchange);
  if (ex != nullptr) return ex->expect(epoch, src);
  // Eager frames of an exchange not started here yet are kept (keep_early_data).
  if (may_keep_early(exchange)) return {DropReason::kOk, 0, chunk_, true};
  return {DropReason::kNotLive, 0, 0};
}

std::uint8_t* Engine::place_at(std::uint32_t exchange, Rank src, std::uint32_t seq) const {
  Exchange* ex = find(exchange);
  return ex != nullptr ? ex->place_at(src, seq) : nullptr;
}

std::map<std::uint32_t, EarlyFrames>::iterator Engine::erase_early(std::map<std::uint32_t, EarlyFrames>::iterator it) {
  early_data_bytes_ -= std::min(early_data_bytes_, early_payload(it->second));
  return early_.erase(it);
}

std::uint32_t Engine::ahead(std::uint32_t id) const {
  const auto& last = last_started_[id_slot(id)];
  return last ? id_distance(id, *last) : 0;
}

bool Engine::after_last_started(std::uint32_t id) const {
  const auto& last = last_started_[id_slot(id)];
  return !last || later_id(id, *last);
}

bool Engine::may_keep_early(std::uint32_t id) const {
  if (!after_last_started(id)) return false;
  if (early_.size() < kMaxEarly || early_.count(id) != 0) return true;
  return ahead(farthest_early()->first) > ahead(id);
}

std::map<std::uint32_t, EarlyFrames>::const_iterator Engine::farthest_early() const {
  return std::max_element(early_.begin(), early_.end(), [&](const auto& a, const auto& b) { return ahead(a.first) < ahead(b.first); });
}

Result<void> Engine::start(ExchangeSpec spec) {
  const std::size_t n = config_.peers.size();
  if (!after_last_started(spec.id))
    return invalid_spec(
        spec, "ids must grow; the last exchange of its group slot started here was " + std::to_string(*last_started_[id_slot(spec.id)]));
  const auto running = static_cast<std::size_t>(std::count_if(active_.begin(), active_.end(), [](const Exchange* ex) { return ex->running(); }));
  if (running >= config_.max_live_exchanges)
    return Error(Errc::kBusy, "exchange " + std::to_string(spec.id) + ": " + std::to_string(running) +
                                  " exchanges are already running here, the limit (aapcd --max-exchanges)");
  if (spec.send.size() != n || spec.recv.size() != n)
    return invalid_spec(spec, "send and recv need one block per rank (" + std::to_string(n) + ")");
  if (spec.program.rank != config_.rank) return invalid_spec(spec, "the program is for rank " + std::to_string(spec.program.rank));
  for (std::size_t r = 0; r < n; ++r) {
    if (spec.send[r].len > 0 && spec.send[r].data == nullptr)
      return invalid_spec(spec, "send block " + std::to_string(r) + " has no buffer");
    if (spec.recv[r].len > 0 && spec.recv[r].data == nullptr)
      return invalid_spec(spec, "recv block " + std::to_string(r) + " has no buffer");
    if (spec.send[r].len > static_cast<std::uint64_t>(chunk_) * 0xFFFFFFF0ULL || spec.recv[r].len > static_cast<std::uint64_t>(chunk_) * 0xFFFFFFF0ULL)
      return invalid_spec(spec, "block " + std::to_string(r) + " is too large");
  }
  auto bad_sync = [&](std::uint32_t id) { return id >= spec.sync_count; };
  for (const auto& round : spec.program.rounds) {
    for (const auto& send : round.sends)
      if (send.dst < 0 || static_cast<std::size_t>(send.dst) >= n)
        return invalid_spec(spec, "a round sends to rank " + std::to_string(send.dst));
    if (std::any_of(round.waits.begin(), round.waits.end(), bad_sync) || std::any_of(round.emits.begin(), round.emits.end(), bad_sync))
      return invalid_spec(spec, "a round names a sync beyond sync_count");
  }
  for (const auto& [src, ids] : spec.program.on_receive)
    if (src < 0 || static_cast<std::size_t>(src) >= n || std::any_of(ids.begin(), ids.end(), bad_sync))
      return invalid_spec(spec, "on_receive is malformed");
  if (auto combine = check_combine(spec, config_.rank); !combine) return combine.error();

  const auto now = Clock::now();
  const std::vector<bool> member = member_mask(spec, n);  // once: a find per rank would cost n x members
  for (std::size_t r = 0; r < n; ++r) {
    const auto& d = link_->dead(static_cast<Rank>(r));
    const bool involved = spec.send[r].len > 0 || spec.recv[r].len > 0 ||
                          std::any_of(spec.sync_targets.begin(), spec.sync_targets.end(), [&](const auto& t) { return t.second == static_cast<Rank>(r); });
    if (d.dead && involved)
      return Error(Errc::kPeerSilent, "exchange " + std::to_string(spec.id) + ": peer rank " + std::to_string(r) + " (" + nic::mac_string(config_.peers[r]) +
                                          ") has not been heard from since it was found silent " +
                                          std::to_string(duration_cast<milliseconds>(now - d.since).count()) + " ms ago (" + d.why + ")");
    if (!member[r]) continue;  // another group's ABORT of this id says nothing about ours
    auto by = aborted_by_[r].find(id_slot(spec.id));
    const AbortedBy& ab = by != aborted_by_[r].end() ? by->second : AbortedBy{};
    if (ab.active && now - ab.when < config_.peer_deadline && ab.exchange == spec.id)
      return Error(Errc::kPeerAborted, "exchange " + std::to_string(spec.id) + ": rank " + std::to_string(r) + " aborted exchange " +
                                           std::to_string(ab.exchange) + " a moment ago (" + ab.reason + ")");
    if (auto left = left_[r].find(id_slot(spec.id)); left != left_[r].end() && !later_id(left->second.from, spec.id))
      return Error(Errc::kPeerAborted, "exchange " + std::to_string(spec.id) + ": rank " + std::to_string(r) + " left group slot " +
                                           std::to_string(id_slot(spec.id)) + " before exchange " + std::to_string(left->second.from) + " (" +
                                           left->second.reason + "); a group goes on only with every member: close it and open a new one");
  }
  const std::uint32_t id = spec.id;
  auto ex = std::make_unique<Exchange>(*link_, std::move(spec), now);
  Exchange* raw = ex.get();
  exchanges_[id] = std::move(ex);
  active_.push_back(raw);
  last_started_[id_slot(id)] = id;
  EarlyFrames early;
  if (auto it = early_.find(id); it != early_.end()) {
    early_data_bytes_ -= std::min(early_data_bytes_, early_payload(it->second));
    early = std::move(it->second);
    early_.erase(it);
  }
  // Early entries for ids now in the past can never start.
  for (auto it = early_.begin(); it != early_.end();) it = id_slot(it->first) != id_slot(id) || later_id(it->first, id) ? std::next(it) : erase_early(it);
  raw->begin(now, early);
  // The eager frames kept for it may have been streamed into its blocks (outside receive(),
  // which fences its own): the client, told later that its exchange is done, must see them.
  stream_fence();
  return {};
}

void Engine::announce() {
  for (std::size_t r = 0; r < config_.peers.size(); ++r)
    if (static_cast<Rank>(r) != config_.rank) link_->send_control(static_cast<Rank>(r), FrameType::kPing, 0, 0, 0);
}

void Engine::abort_unstarted(std::uint32_t id, const std::string& reason, const std::vector<Rank>& ranks, bool ends_session) {
  for (std::size_t r = 0; r < config_.peers.size(); ++r)
    if (static_cast<Rank>(r) != config_.rank && (ranks.empty() || std::find(ranks.begin(), ranks.end(), static_cast<Rank>(r)) != ranks.end()))
      link_->send_control(static_cast<Rank>(r), FrameType::kAbort, id, ends_session ? kAbortEndsSession : 0, static_cast<std::uint32_t>(Errc::kAborted), 0,
                          reinterpret_cast<const std::uint8_t*>(reason.data()), reason.size());
}

void Engine::reopen_slot(std::uint32_t slot, std::uint32_t first) {
  closed_.erase(slot);
  if (slot == kWorldSlot) return;
  for (auto& by_slot : left_) by_slot.erase(slot);
  slot_first_[slot] = first;
}

void Engine::close_slot(std::uint32_t slot, std::uint32_t from, const std::string& reason, const std::vector<Rank>& members) {
  ClosedSlot& c = closed_[slot];
  c.from = from;
  c.reason = reason;
  c.members = members;
  c.answered.assign(config_.peers.size(), {0, Clock::time_point{}});
}

void Engine::timers(Clock::time_point now) {
  join_timers(now);
  // Dead peers are probed: a peer that was only cut off answers once it is back, and the
  // exchanges that involve it may start again.
  link_->probe_dead(now);
  for (Exchange* ex : active_) ex->timers(now);
  while (!lingering_.empty() && now > lingering_.front().first) {
    end_linger(lingering_.front().second);  // (gone already when linger_max ended it)
    lingering_.pop_front();
  }
  // Early entries' READYs and tokens do not expire with time (they go when a later exchange
  // starts, or to make room for a nearer one): they were acknowledged, so nobody sends them
  // again. At 30% loss per port direction an exchange takes 30 s, and a rank started the
  // next one more than linger (15 s) before a slower peer did; that peer's entry expired and
  // both waited for each other until the stall deadline. Their eager DATA was not
  // acknowledged, so its sender polls and sends it again: it expires.
  expire_early_data(now);
}

void Engine::expire_early_data(Clock::time_point now) {
  for (auto& [id, e] : early_) {
    if (e.data.empty() || now - e.first_data < config_.early_data_expiry) continue;
    early_data_bytes_ -= std::min(early_data_bytes_, early_payload(e));
    link_->counters().early_data_expired += e.data.size();
    std::vector<EarlyData>().swap(e.data);
  }
}

void Engine::end_linger(std::uint32_t id) {
  auto it = exchanges_.find(id);
  if (it == exchanges_.end()) return;
  if (it->second->state() == ExchangeState::kDone) {
    done_ids_.push_back(id);
    if (done_ids_.size() > kMaxDoneIds) done_ids_.pop_front();
  }
  exchanges_.erase(it);
}

void Engine::bound_linger(std::uint32_t id) {
  const std::uint32_t max = config_.linger_max;
  if (max == 0) return;
  std::optional<std::uint32_t>& newest = newest_lingering_[id_slot(id)];
  if (newest && !later_id(id, *newest)) {
    // It settled after later ones started to linger (a loss, or nonblocking calls).
    if (id_distance(*newest, id) >= max) end_linger(id);
    return;
  }
  // Those linger_max or more behind `id`, from where the last call stopped: the exchanges of
  // the group that lingered before it (after *newest, none has). One in the steady state.
  if (newest) {
    const std::uint64_t behind = id_distance(id, *newest);  // >= 1
    for (std::uint64_t k = std::max<std::uint64_t>(behind, max); k < behind + max && k <= kSeqMask; ++k) {
      const std::uint32_t old = make_id(id_slot(id), id_seq(id) - static_cast<std::uint32_t>(k));
      // One still in the poll loop ends when it leaves it (above).
      if (in_loop(old) == nullptr) end_linger(old);
    }
  }
  newest = id;
}

void Engine::transmit(Clock::time_point now) {
  link_->refill(now);
  ready_.clear();  // kept between polls: the loop polls many times a frame
  for (Exchange* ex : active_)
    if (ex->has_data(now)) ready_.push_back(ex);
  if (ready_.empty() || link_->queued() >= kTxTarget || !link_->may_send()) return;
  // Leave mbufs for control frames and for receiving; checked once per pass that may send:
  // the count visits every lcore's cache of the pool (RTE_MAX_LCORE of them), and counted on
  // every pass it took 3.2% of the box's time at 1 KiB blocks on 8-one-switch (2.3% now).
  const unsigned avail = rte_mempool_avail_count(port_.pool());
  const std::size_t budget = avail > kMinFreeMbufs ? std::min<std::size_t>(avail - kMinFreeMbufs, kTxTarget) : 0;
  std::size_t built = 0;
  while (link_->queued() < kTxTarget && built < budget) {
    if (!link_->may_send_ahead()) break;
    ++built;
    bool sent = false;
    for (std::size_t k = 0; k < ready_.size() && !sent; ++k) {
      Exchange* ex = ready_[(rr_ + k) % ready_.size()];
      sent = ex->send_next(now);
    }
    if (!sent) break;
    ++rr_;
  }
}

bool Engine::poll() {
  const auto now = Clock::now();
  const std::uint64_t before_rx = handled_, before_tx = link_->counters().frames_sent;
  receive(now);
  for (Exchange* ex : active_) ex->emit_due(now);
  if (now >= next_timers_) {
    timers(now);
    next_timers_ = now + kTimerPeriod;
  }
  transmit(now);
  link_->send_acks(now);
  link_->flush();
  for (auto it = active_.begin(); it != active_.end();) {
    Exchange* ex = *it;
    if (ex->running()) {
      ++it;
      continue;
    }
    if (!ex->reported()) {
      finished_.push_back(ex->report(now));
      ex->mark_reported();
    }
    if (ex->settling()) {  // reported, and still resending what waits for an acknowledgement
      ++it;
      continue;
    }
    lingering_.emplace_back(ex->linger_until(), ex->id());
    it = active_.erase(it);
    bound_linger(ex->id());
  }
  // Work means frames of ours handled or sent; frames dropped (our own, looped back by
  // af_packet, or other protocols) do not keep the loop spinning.
  return handled_ != before_rx || link_->counters().frames_sent != before_tx;
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
  if (link_->queued() > 0) return now;  // the port pushed back: offer them again
  // Timers run at most once per kTimerPeriod, but an engine with nothing due sleeps until its
  // earliest deadline: on 64 emulated machines sharing two cores, waking every idle engine at
  // the timer period took more CPU than the nodes that were sending (README, "Scale").
  Clock::time_point due = joining_ && join_sending_ ? join_retry_ : Clock::time_point::max();
  if (!lingering_.empty()) due = std::min(due, lingering_.front().first);
  due = std::min(due, link_->acks_due());
  due = std::min(due, link_->next_probe());
  Clock::time_point token = Clock::time_point::max();
  for (const Exchange* ex : active_) {
    due = std::min(due, ex->next_deadline());
    token = std::min(token, ex->next_emit());
    token = std::min(token, ex->paced_until());  // a paced round's next frame: a sleep shorter than a timer period
  }
  // Held-back tokens go at their time, not at the next timer period: someone waits for them.
  Clock::time_point at = std::min(std::max(due, next_timers_), token);
  if (std::any_of(active_.begin(), active_.end(), [now](const Exchange* ex) { return ex->has_data(now); })) {
    if (link_->may_send()) return now;
    at = std::min(at, link_->send_allowed_at());
  }
  return std::max(at, now);
}

Clock::time_point Engine::receive_wait_until(Clock::time_point now) const {
  // Woken by every frame as well as by every frame it sent, eight daemons pacing on two cores
  // left the host 3% idle at 300 Mbit/s (15% with their sends batched, 32% with this too).
  if (active_.empty() || link_->queued() > 0) return now;
  if (std::all_of(active_.begin(), active_.end(), [](const Exchange* ex) { return ex->pacing(); })) return now + kPacedWake;
  // Every round held back by the link's own bucket, none waiting for anything: what arrives
  // waits for the next batch's wake-up (Engine::transmit), before which none of them ends.
  if (!link_->sends_ahead() || link_->may_send() || !std::all_of(active_.begin(), active_.end(), [now](const Exchange* ex) { return ex->has_data(now); }))
    return now;
  return link_->send_allowed_at();
}

bool Engine::quiet() const {
  if (link_->queued() > 0 || link_->acks_due() != Clock::time_point::max()) return false;
  return std::none_of(active_.begin(), active_.end(), [](const Exchange* ex) { return ex->running() || ex->settling(); });
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
