// Per exchange and node: frames, bytes, resent, lost and waits.
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

// --- summary ------------------------------------------------------------------------------

namespace {

// What the frames of exchange `ex` in capture `c` tell of its node: counts, and the times of
// DATA sent and SYNC received (for the waits).
struct NodeFrames {
  SeenMap received;
  std::vector<std::int64_t> data_tx, sync_rx;
};

NodeFrames count_frames(const Capture& c, std::uint32_t ex, NodeSummary& s) {
  NodeFrames nf;
  SeenMap& received = nf.received;
  std::vector<std::int64_t>& data_tx = nf.data_tx;
  std::vector<std::int64_t>& sync_rx = nf.sync_rx;
  std::set<std::tuple<Rank, std::uint32_t, std::uint32_t>> placed;  // (src, epoch, frame)
  for (const auto& f : c.frames) {
    if (f.h.exchange != ex || !has_exchange(f.h)) continue;
    s.start = std::min(s.start, f.at);
    s.end = std::max(s.end, f.at);
    if (f.tx) {
      ++s.frames_sent;
      if (f.data()) {
        data_tx.push_back(f.at);
        if (f.dummy()) {
          ++s.dummy_frames_sent;
        } else {
          ++s.data_frames_sent;
          s.data_bytes_sent += f.h.payload_len;
          if (f.retransmitted()) ++s.retransmitted_frames;
        }
      } else {
        ++s.control_sent;
        if (f.h.type == FrameType::kSync) ++s.syncs_sent;
        if (f.h.type == FrameType::kNack) ++s.nacks_sent;
      }
      continue;
    }
    ++s.frames_received;
    note(received, f);
    if (!f.sound()) {
      ++s.bad_crc_frames;
      continue;
    }
    if (f.data()) {
      if (f.dummy()) continue;
      if (placed.emplace(f.h.src, f.h.epoch, f.h.seq).second) {
        ++s.data_frames_received;
        s.data_bytes_received += f.h.payload_len;
      } else {
        ++s.duplicate_frames;
      }
    } else {
      ++s.control_received;
      if (f.h.type == FrameType::kSync) ++s.syncs_received, sync_rx.push_back(f.at);
      if (f.h.type == FrameType::kNack) ++s.nacks_received;
    }
  }
  return nf;
}

// Lost: sent to `node` (by a captured peer) more often than it arrived there.
std::uint64_t lost_frames(const std::map<Rank, SeenMap>& sent, Rank node, std::uint32_t ex, const SeenMap& received) {
  std::uint64_t lost = 0;
  for (const auto& [peer, frames] : sent) {
    if (peer == node) continue;
    for (const auto& [k, seen] : frames) {
      engine::Header h;
      h.type = static_cast<FrameType>(k.type);
      h.aux = k.aux;
      if (k.dst != node || k.exchange != ex || !has_exchange(h)) continue;
      auto it = received.find(k);
      std::uint32_t got = it == received.end() ? 0 : it->second.count;
      if (seen.count > got) lost += seen.count - got;
    }
  }
  return lost;
}

// Waiting: before the first DATA frame (READY from the receivers), and gaps in sending longer
// than a few frame times that ended when a token arrived.
void waits(NodeSummary& s, NodeFrames& nf, std::int64_t gap) {
  std::vector<std::int64_t>& data_tx = nf.data_tx;
  std::vector<std::int64_t>& sync_rx = nf.sync_rx;
  std::sort(data_tx.begin(), data_tx.end());
  std::sort(sync_rx.begin(), sync_rx.end());
  if (!data_tx.empty()) s.ready_wait_ns = data_tx.front() - s.start;
  for (std::size_t i = 1; i < data_tx.size(); ++i) {
    if (data_tx[i] - data_tx[i - 1] <= gap) continue;
    auto hi = std::upper_bound(sync_rx.begin(), sync_rx.end(), data_tx[i]);
    if (hi == sync_rx.begin() || *std::prev(hi) <= data_tx[i - 1]) continue;
    s.sync_wait_ns += *std::prev(hi) - data_tx[i - 1];
  }
}

}  // namespace

std::vector<NodeSummary> summarize(const Trace& trace) {
  const auto& topo = trace.topology();
  // What each node sent, by key, to tell frames lost on the way.
  std::map<Rank, SeenMap> sent;
  for (const auto& c : trace.captures())
    for (const auto& f : c.frames)
      if (f.tx) note(sent[c.node], f);
  std::vector<NodeSummary> out;
  for (std::uint32_t ex : trace.exchanges()) {
    for (const auto& c : trace.captures()) {
      NodeSummary s;
      s.exchange = ex;
      s.node = c.node;
      s.start = kNever;
      s.end = std::numeric_limits<std::int64_t>::min();
      NodeFrames nf = count_frames(c, ex, s);
      if (s.start == kNever) s.start = s.end = 0;
      s.lost_frames += lost_frames(sent, c.node, ex, nf.received);
      waits(s, nf, 4 * frame_ns(static_cast<std::uint64_t>(topo.mtu()) + engine::kEthHeaderLen, machine_rate(topo, c.node)));
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace aapc::trace
