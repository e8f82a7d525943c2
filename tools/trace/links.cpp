// Links: blocks on the links of their paths, loads, and contention.
#include "aapc/trace/trace.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/sync.hpp"
#include "internal.hpp"

namespace aapc::trace {

namespace fs = std::filesystem;
using engine::FrameType;
using namespace detail;

// --- links --------------------------------------------------------------------------------

namespace {

bool in_scope(std::uint32_t id, const std::optional<std::uint32_t>& exchange, const Trace& trace) {
  if (exchange) return id == *exchange;
  const auto& ex = trace.exchanges();
  return std::binary_search(ex.begin(), ex.end(), id);
}

// Every (exchange, src, dst) with DATA frames: from its first frame's departure (sender's
// capture) to its last frame's arrival (receiver's capture); an end without a capture is
// estimated from the other and the path's frame times.
}  // namespace

namespace detail {

std::vector<Block> blocks_of(const Trace& trace, const std::optional<std::uint32_t>& exchange) {
  const auto& topo = trace.topology();
  std::map<std::tuple<std::uint32_t, Rank, Rank>, Block> by;
  std::map<std::tuple<std::uint32_t, Rank, Rank>, std::pair<std::int64_t, std::int64_t>> tx, rx;  // min tx, max rx
  for (const auto& c : trace.captures())
    for (const auto& f : c.frames) {
      if (!f.data() || !in_scope(f.h.exchange, exchange, trace)) continue;
      auto key = std::make_tuple(f.h.exchange, static_cast<Rank>(f.h.src), static_cast<Rank>(f.h.dst));
      Block& b = by[key];
      b.exchange = f.h.exchange;
      b.src = f.h.src;
      b.dst = f.h.dst;
      if (b.phase < 0 && f.h.phase != engine::kNoPhase) b.phase = f.h.phase;
      b.dummy = f.dummy();
      auto& t = (f.tx ? tx : rx).try_emplace(key, kNever, std::numeric_limits<std::int64_t>::min()).first->second;
      t.first = std::min(t.first, f.at);
      t.second = std::max(t.second, f.at);
      if (f.tx || trace.capture_of(f.h.src) == nullptr) b.bytes += f.wire_len;
    }
  std::vector<Block> out;
  for (auto& [key, b] : by) {
    std::int64_t hop = 0;
    for (int e : topo.path_between(b.src, b.dst))
      hop += frame_ns(static_cast<std::uint64_t>(topo.mtu()) + engine::kEthHeaderLen, topo.links()[static_cast<std::size_t>(e / 2)].rate_bps);
    auto t = tx.find(key);
    auto r = rx.find(key);
    b.start = t != tx.end() ? t->second.first : r->second.first - hop;
    b.end = r != rx.end() ? r->second.second : t->second.second + hop;
    out.push_back(b);
  }
  return out;
}

// Pairs of blocks of different senders on the same directed edge at once.
std::vector<Contention> contention_of(const sched::Topology& topo, const std::vector<Block>& blocks) {
  std::vector<std::vector<const Block*>> on(static_cast<std::size_t>(topo.directed_edge_count()));
  for (const auto& b : blocks)
    for (int e : topo.path_between(b.src, b.dst)) on[static_cast<std::size_t>(e)].push_back(&b);
  std::vector<Contention> out;
  for (std::size_t e = 0; e < on.size(); ++e) {
    auto& v = on[e];
    std::sort(v.begin(), v.end(), [](const Block* a, const Block* b) { return a->start < b->start; });
    for (std::size_t i = 0; i < v.size(); ++i)
      for (std::size_t j = i + 1; j < v.size() && v[j]->start < v[i]->end; ++j) {
        if (v[i]->src == v[j]->src) continue;  // a sender's own blocks take turns on its links
        Contention c;
        c.edge = static_cast<int>(e);
        c.from = v[j]->start;
        c.to = std::min(v[i]->end, v[j]->end);
        c.a = *v[i];
        c.b = *v[j];
        if (c.to > c.from) out.push_back(c);
      }
  }
  std::sort(out.begin(), out.end(), [](const Contention& a, const Contention& b) { return a.ns() > b.ns(); });
  return out;
}

// Length of the union of intervals.
std::int64_t covered(std::vector<std::pair<std::int64_t, std::int64_t>> v) {
  std::sort(v.begin(), v.end());
  std::int64_t total = 0, lo = 0, hi = std::numeric_limits<std::int64_t>::min();
  for (auto [a, b] : v) {
    if (a > hi) {
      if (hi > lo) total += hi - lo;
      lo = a;
      hi = b;
    } else {
      hi = std::max(hi, b);
    }
  }
  if (hi > lo) total += hi - lo;
  return total;
}

}  // namespace detail

LinkReport links(const Trace& trace, std::optional<std::uint32_t> exchange, std::int64_t bin_ns) {
  const auto& topo = trace.topology();
  LinkReport rep;
  rep.blocks = blocks_of(trace, exchange);
  rep.t0 = kNever;
  rep.t1 = std::numeric_limits<std::int64_t>::min();
  // Every frame once: at its sender when captured there, else where it arrived.
  struct Use {
    std::int64_t at;
    std::uint32_t bytes;
    Rank src, dst;
  };
  std::vector<Use> uses;
  for (const auto& c : trace.captures())
    for (const auto& f : c.frames) {
      if (!has_exchange(f.h) || !in_scope(f.h.exchange, exchange, trace)) continue;
      if (!f.tx && trace.capture_of(f.h.src) != nullptr) continue;
      uses.push_back({f.at, f.wire_len, static_cast<Rank>(f.h.src), static_cast<Rank>(f.h.dst)});
      rep.t0 = std::min(rep.t0, f.at);
      rep.t1 = std::max(rep.t1, f.at);
    }
  for (const auto& b : rep.blocks) rep.t0 = std::min(rep.t0, b.start), rep.t1 = std::max(rep.t1, b.end);
  if (uses.empty()) {
    rep.t0 = rep.t1 = 0;
    return rep;
  }
  rep.bin_ns = std::max<std::int64_t>(bin_ns, (rep.t1 - rep.t0) / 100'000 + 1);
  const auto bins = static_cast<std::size_t>((rep.t1 - rep.t0) / rep.bin_ns + 1);
  std::vector<LinkLoad> load(static_cast<std::size_t>(topo.directed_edge_count()));
  std::vector<int> path;
  for (const auto& u : uses) {
    topo.path(topo.machine_node(u.src), topo.machine_node(u.dst), path);
    const auto bin = static_cast<std::size_t>((u.at - rep.t0) / rep.bin_ns);
    for (int e : path) {
      LinkLoad& l = load[static_cast<std::size_t>(e)];
      if (l.utilisation.empty()) l.utilisation.assign(bins, 0);
      l.bytes += u.bytes;
      l.utilisation[bin] += u.bytes;
    }
  }
  rep.contention = contention_of(topo, rep.blocks);
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> contended(load.size());
  for (const auto& c : rep.contention) contended[static_cast<std::size_t>(c.edge)].emplace_back(c.from, c.to);
  const double window = static_cast<double>(rep.t1 - rep.t0 + rep.bin_ns) / 1e9;
  for (std::size_t e = 0; e < load.size(); ++e) {
    LinkLoad& l = load[e];
    if (l.bytes == 0) continue;
    l.edge = static_cast<int>(e);
    l.rate_bps = topo.links()[e / 2].rate_bps;
    const double per_bin = static_cast<double>(l.rate_bps) * static_cast<double>(rep.bin_ns) / 8e9;
    for (double& b : l.utilisation) b /= per_bin;
    l.mean_utilisation = static_cast<double>(l.bytes) * 8 / (static_cast<double>(l.rate_bps) * window);
    l.contended_ns = covered(contended[e]);
    rep.links.push_back(std::move(l));
  }
  std::sort(rep.links.begin(), rep.links.end(), [](const LinkLoad& a, const LinkLoad& b) { return a.mean_utilisation > b.mean_utilisation; });
  return rep;
}

}  // namespace aapc::trace
