// Hand-over: what the captures measure of the terms aapc-sched predict adds up for a token
// (docs/scale.md, "Predicting an exchange from its plan").
#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "aapc/trace/trace.hpp"
#include "internal.hpp"

namespace aapc::trace {

using namespace detail;

namespace {

double bits_ns(double bytes, std::uint64_t bps) { return bps == 0 ? 0.0 : bytes * 8e9 / static_cast<double>(bps); }

// Where a token's one-way time goes on the tree: its frame's bits, and a full frame's, per link.
// A full frame (the MTU and the Ethernet header) on a link of `bps`.
double full_frame_ns(const sched::Topology& topo, std::uint32_t wire_extra, std::uint64_t bps) {
  return bits_ns(static_cast<double>(topo.mtu()) + static_cast<double>(engine::kEthHeaderLen) + wire_extra, bps);
}

void place(const sched::Topology& topo, std::uint32_t frame_bytes, std::uint32_t wire_extra, TokenTime& t) {
  std::vector<int> path;
  topo.path(topo.machine_node(t.from), topo.machine_node(t.to), path);
  t.links = static_cast<int>(path.size());
  for (std::size_t i = 0; i < path.size(); ++i) {
    const std::uint64_t rate = topo.links()[static_cast<std::size_t>(path[i] / 2)].rate_bps;
    t.serialised_ns += bits_ns(static_cast<double>(frame_bytes) + wire_extra, rate);
    if (i > 0) t.frames_past_first_ns += full_frame_ns(topo, wire_extra, rate);
  }
}

// The least-squares line through every token's one-way time less its own bits, against the
// full frames it crossed past its emitter's link: means, not medians, because a critical path
// adds up its hand-overs, and so their slow tail (a waiter's late poll on a busy host) too.
void fit(HandOverReport& r) {
  if (r.tokens.empty()) return;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const TokenTime& t : r.tokens) {
    const double x = t.frames_past_first_ns, y = static_cast<double>(t.one_way_ns) - t.serialised_ns;
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double var = n * sxx - sx * sx;
  // Every token crossed the same frame times (within a nanosecond each): no slope to fit.
  if (var <= n * n) {
    r.fixed_ns = sy / n;
    return;
  }
  r.fitted = true;
  r.frames_ahead = (n * sxy - sx * sy) / var;
  r.fixed_ns = (sy - r.frames_ahead * sx) / n;
  // Neither term can be negative (predict refuses them): the best line with the other at 0.
  if (r.frames_ahead < 0) {
    r.frames_ahead = 0;
    r.fixed_ns = sy / n;
  } else if (r.fixed_ns < 0) {
    r.fixed_ns = 0;
    r.frames_ahead = sxy / sxx;
  }
}

// Each block's frames as one capture saw them: first and last, and the bits before the last.
struct BlockSpan {
  std::int64_t first = 0, last = 0;
  std::uint64_t frames = 0;
  double bits_before_last = 0, last_bits = 0;  // at the node's link rate, in ns
};
using BlockSpans = std::map<std::tuple<std::uint32_t, Rank, Rank, bool>, BlockSpan>;  // exchange, src, dst, sent here

// Only a block sent (received) alone says what its link carried: the blocks of a shuffle,
// interleaved frame by frame, each take a share of it. Blocks of one exchange and direction,
// by their first frame: one is alone when neither neighbour overlaps it.
void add_block_shares(const BlockSpans& spans, HandOverReport& r) {
  std::map<std::pair<std::uint32_t, bool>, std::vector<const BlockSpan*>> by_start;
  for (const auto& [key, b] : spans) by_start[{std::get<0>(key), std::get<3>(key)}].push_back(&b);
  for (auto& [ex_tx, list] : by_start) {
    std::sort(list.begin(), list.end(), [](const BlockSpan* a, const BlockSpan* b) { return a->first < b->first; });
    std::int64_t reach = std::numeric_limits<std::int64_t>::min();  // the latest end before block i
    for (std::size_t i = 0; i < list.size(); ++i) {
      const BlockSpan& b = *list[i];
      const bool alone = reach < b.first && (i + 1 == list.size() || list[i + 1]->first > b.last);
      reach = std::max(reach, b.last);
      if (!alone || b.frames < 3 || b.last <= b.first) continue;
      (ex_tx.second ? r.sent : r.received).push_back(b.bits_before_last / static_cast<double>(b.last - b.first));
    }
  }
}

}  // namespace

HandOverReport hand_over(const Trace& trace, std::optional<std::uint32_t> exchange, std::uint32_t wire_extra_bytes) {
  const sched::Topology& topo = trace.topology();
  const auto wanted = [&](const Frame& f) { return (!exchange || f.h.exchange == *exchange) && has_exchange(f.h) && f.sound(); };
  // Each token by (exchange, from, to, id): when it left and arrived, and how often each.
  struct Ends {
    std::int64_t left = 0, arrived = 0;
    int sent = 0, received = 0;
    std::uint32_t bytes = 0;
  };
  std::map<std::tuple<std::uint32_t, Rank, Rank, std::uint32_t>, Ends> tokens;
  // Per node and exchange: DATA sent and tokens received, on the reference clock.
  std::map<std::pair<Rank, std::uint32_t>, std::vector<std::int64_t>> data_tx, sync_rx;
  HandOverReport r;
  for (const Capture& c : trace.captures()) {
    const std::uint64_t rate = machine_rate(topo, c.node);
    BlockSpans spans;
    for (const Frame& f : c.frames) {
      if (!wanted(f)) continue;
      if (f.h.type == FrameType::kSync && f.tx == (f.h.src == c.node)) {
        Ends& e = tokens[{f.h.exchange, f.h.src, f.h.dst, f.h.seq}];
        (f.tx ? e.left : e.arrived) = f.at;
        ++(f.tx ? e.sent : e.received);
        e.bytes = f.wire_len;
        if (!f.tx) sync_rx[{c.node, f.h.exchange}].push_back(f.at);
      }
      if (!f.data() || f.dummy()) continue;
      if (f.tx) data_tx[{c.node, f.h.exchange}].push_back(f.at);
      if (f.retransmitted()) continue;  // a block's resent frames are not its pace
      // Each block's frames, sent or received here: first and last, and the bits before the last.
      BlockSpan& b = spans[{f.h.exchange, f.h.src, f.h.dst, f.tx}];
      if (b.frames++ == 0) b.first = f.at;
      if (f.at >= b.last) {
        b.bits_before_last += b.last_bits;
        b.last = f.at;
        b.last_bits = bits_ns(static_cast<double>(f.wire_len) + wire_extra_bytes, rate);
      }
    }
    add_block_shares(spans, r);
  }
  for (auto& [node_ex, v] : data_tx) std::sort(v.begin(), v.end());
  for (auto& [node_ex, v] : sync_rx) std::sort(v.begin(), v.end());
  for (const auto& [key, e] : tokens) {
    const auto& [ex, from, to, id] = key;
    if (e.sent != 1 || e.received != 1 || from == to) {
      ++r.tokens_left_out;
      continue;
    }
    TokenTime t{ex, from, to, 0, e.arrived - e.left, 0, 0};
    place(topo, e.bytes, wire_extra_bytes, t);
    r.tokens.push_back(t);
    // The waiter's reaction: only where this was the last token before its next DATA frame and
    // it had sent nothing for a frame time before the token came.
    const auto& sent = data_tx[{to, ex}];
    const auto& heard = sync_rx[{to, ex}];
    const auto next = std::lower_bound(sent.begin(), sent.end(), e.arrived);
    if (next == sent.end()) continue;
    const auto later_token = std::upper_bound(heard.begin(), heard.end(), e.arrived);
    if (later_token != heard.end() && *later_token <= *next) continue;
    if (next != sent.begin() && static_cast<double>(e.arrived - *std::prev(next)) < full_frame_ns(topo, wire_extra_bytes, machine_rate(topo, to))) continue;
    r.reactions_ns.push_back(*next - e.arrived);
  }
  fit(r);
  return r;
}

}  // namespace aapc::trace
