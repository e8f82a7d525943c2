#include "aapc/nic/fault.hpp"

#include <rte_ether.h>
#include <rte_mbuf.h>

#include <sstream>

namespace aapc::nic {
namespace {

constexpr std::size_t kTxQueueLimit = 1024;
constexpr int kQuietCalls = 4;  // held frames leave after this many bursts without traffic

bool covers(Direction d, Direction lane) { return (static_cast<int>(d) & static_cast<int>(lane)) != 0; }

// A chained frame copied whole into one mbuf of its pool (the original freed), or the frame
// itself when no copy was to be had. A chained frame may carry the sender's own memory (a
// payload sent without a copy, extmem.hpp): faults that change bytes change a copy.
rte_mbuf* flattened(rte_mbuf* m) {
  if (rte_pktmbuf_is_contiguous(m)) return m;
  rte_mbuf* copy = rte_pktmbuf_copy(m, m->pool, 0, UINT32_MAX);
  if (copy == nullptr) return m;
  if (!rte_pktmbuf_is_contiguous(copy)) {
    rte_pktmbuf_free(copy);
    return m;
  }
  rte_pktmbuf_free(m);
  return copy;
}

}  // namespace

FaultOptions FaultOptions::parse(const std::string& spec) {
  FaultOptions o;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) throw NicError("fault spec '" + item + "': expected name=rate[:rx|:tx]");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    Direction dir = Direction::kBoth;
    if (auto colon = value.find(':'); colon != std::string::npos) {
      std::string d = value.substr(colon + 1);
      value = value.substr(0, colon);
      if (d == "rx") {
        dir = Direction::kRx;
      } else if (d == "tx") {
        dir = Direction::kTx;
      } else if (d != "both") {
        throw NicError("fault spec '" + item + "': direction must be rx, tx or both");
      }
    }
    double rate = 0;
    try {
      std::size_t used = 0;
      rate = std::stod(value, &used);
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::exception&) {
      throw NicError("fault spec '" + item + "': '" + value + "' is not a number");
    }
    if (key == "seed") {
      o.seed = static_cast<std::uint64_t>(rate);
      continue;
    }
    if (key == "depth") {
      o.reorder_depth = static_cast<int>(rate);
      continue;
    }
    if (rate < 0 || rate > 1) throw NicError("fault spec '" + item + "': a rate is between 0 and 1");
    Fault f{rate, dir};
    if (key == "drop" || key == "loss") {
      o.drop = f;
    } else if (key == "dup" || key == "duplicate") {
      o.duplicate = f;
    } else if (key == "reorder") {
      o.reorder = f;
    } else if (key == "corrupt") {
      o.corrupt = f;
    } else if (key == "truncate") {
      o.truncate = f;
    } else {
      throw NicError("fault spec '" + item + "': unknown fault (drop, dup, reorder, corrupt, truncate, seed, depth)");
    }
  }
  return o;
}

bool FaultOptions::any() const {
  return drop.rate > 0 || duplicate.rate > 0 || reorder.rate > 0 || corrupt.rate > 0 || truncate.rate > 0;
}

FaultPort::FaultPort(Port& inner, const FaultOptions& options) : PortDecorator(inner, "+faults"), options_(options) {
  // Separate streams per direction: what happens on receive does not depend on how sends
  // interleave with it.
  lanes_[0].rng.seed(options.seed * 2 + 1);
  lanes_[1].rng.seed(options.seed * 2 + 2);
}

FaultPort::~FaultPort() {
  for (auto& lane : lanes_)
    for (auto& h : lane.held) rte_pktmbuf_free(h.frame);
  for (auto* m : rx_ready_) rte_pktmbuf_free(m);
  for (auto* m : tx_queue_) rte_pktmbuf_free(m);
}

bool FaultPort::hits(Lane& lane, const Fault& fault, Direction dir) {
  // One draw per fault kind and frame, whatever the rates, so that a seed replays the same
  // decisions.
  double x = std::uniform_real_distribution<double>(0.0, 1.0)(lane.rng);
  return covers(fault.direction, dir) && x < fault.rate;
}

void FaultPort::apply(int index, rte_mbuf** in, std::uint16_t n, std::vector<rte_mbuf*>& out) {
  Lane& lane = lanes_[static_cast<std::size_t>(index)];
  FaultCounts& count = counts_[static_cast<std::size_t>(index)];
  const Direction dir = index == 0 ? Direction::kRx : Direction::kTx;
  auto pass = [&](rte_mbuf* m) {
    out.push_back(m);
    // Frames held back for reordering leave after enough later frames went by.
    for (auto it = lane.held.begin(); it != lane.held.end();) {
      if (--it->after <= 0) {
        out.push_back(it->frame);
        it = lane.held.erase(it);
      } else {
        ++it;
      }
    }
  };
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = in[i];
    bool drop = hits(lane, options_.drop, dir);
    bool dup = hits(lane, options_.duplicate, dir);
    bool reorder = hits(lane, options_.reorder, dir);
    bool corrupt = hits(lane, options_.corrupt, dir);
    bool truncate = hits(lane, options_.truncate, dir);
    std::uint64_t r1 = lane.rng(), r2 = lane.rng();
    if (drop) {
      rte_pktmbuf_free(m);
      ++count.dropped;
      continue;
    }
    // Corruption past the Ethernet header: what reaches a host with a good FCS. (Of a chained
    // frame that could not be copied, only its first segment, never the sender's memory.)
    if (corrupt || truncate) m = flattened(m);
    const std::uint32_t len = rte_pktmbuf_data_len(m);
    if (corrupt && len > RTE_ETHER_HDR_LEN) {
      auto* data = rte_pktmbuf_mtod(m, std::uint8_t*);
      std::uint32_t at = RTE_ETHER_HDR_LEN + static_cast<std::uint32_t>(r1 % (len - RTE_ETHER_HDR_LEN));
      data[at] ^= static_cast<std::uint8_t>(1U << (r2 % 8));
      ++count.corrupted;
    }
    if (truncate && len > 1) {
      auto cut = static_cast<std::uint16_t>(1 + r2 % (len - 1));
      rte_pktmbuf_trim(m, cut);
      ++count.truncated;
    }
    if (dup) {
      if (rte_mbuf* copy = rte_pktmbuf_copy(m, m->pool, 0, UINT32_MAX); copy != nullptr) {
        pass(copy);
        ++count.duplicated;
      }
    }
    if (reorder) {
      lane.held.push_back({m, options_.reorder_depth});
      ++count.reordered;
      continue;
    }
    pass(m);
  }
  // When the line goes quiet, held frames are let go (late, but not lost).
  if (n == 0 && !lane.held.empty() && ++lane.quiet_calls >= kQuietCalls) {
    for (auto& h : lane.held) out.push_back(h.frame);
    lane.held.clear();
  }
  if (n > 0) lane.quiet_calls = 0;
}

void FaultPort::flush_tx() {
  while (!tx_queue_.empty()) {
    scratch_.assign(tx_queue_.begin(), tx_queue_.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(tx_queue_.size(), 64)));
    std::uint16_t sent = inner_.tx_burst(scratch_.data(), static_cast<std::uint16_t>(scratch_.size()));
    tx_queue_.erase(tx_queue_.begin(), tx_queue_.begin() + sent);
    if (sent < scratch_.size()) break;
  }
}

std::uint16_t FaultPort::rx_burst(rte_mbuf** pkts, std::uint16_t n) {
  // The caller polls receive all the time but sends only when it has something: queued and
  // held-back frames of the send side move on here too.
  tx_out_.clear();
  apply(1, nullptr, 0, tx_out_);
  tx_queue_.insert(tx_queue_.end(), tx_out_.begin(), tx_out_.end());
  flush_tx();
  if (rx_ready_.size() < n) {
    scratch_.resize(n);
    std::uint16_t got = inner_.rx_burst(scratch_.data(), n);
    apply(0, scratch_.data(), got, rx_ready_);
  }
  auto take = static_cast<std::uint16_t>(std::min<std::size_t>(n, rx_ready_.size()));
  std::copy(rx_ready_.begin(), rx_ready_.begin() + take, pkts);
  rx_ready_.erase(rx_ready_.begin(), rx_ready_.begin() + take);
  return take;
}

std::uint16_t FaultPort::tx_burst(rte_mbuf** pkts, std::uint16_t n) {
  // Frames are taken into a queue of our own (faults applied) and flushed as far as the
  // inner port takes them; a full queue is backpressure to the caller.
  auto room = static_cast<std::uint16_t>(tx_queue_.size() >= kTxQueueLimit ? 0 : std::min<std::size_t>(n, kTxQueueLimit - tx_queue_.size()));
  tx_out_.clear();
  apply(1, pkts, room, tx_out_);
  tx_queue_.insert(tx_queue_.end(), tx_out_.begin(), tx_out_.end());
  flush_tx();
  return room;
}

}  // namespace aapc::nic
