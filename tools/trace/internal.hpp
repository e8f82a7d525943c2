// What the parts of the trace library share (not installed): frames matched across
// captures, and blocks on links (links.cpp, used by phases.cpp too).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "aapc/trace/trace.hpp"

namespace aapc::trace::detail {

using engine::FrameType;


inline constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

// Frames that belong to an exchange: not the JOIN and PING of the engine, nor their ACKs.
inline bool has_exchange(const engine::Header& h) {
  auto engine_level = [](std::uint32_t t) { return t == static_cast<std::uint32_t>(FrameType::kJoin) || t == static_cast<std::uint32_t>(FrameType::kPing); };
  return !engine_level(static_cast<std::uint32_t>(h.type)) && !(h.type == FrameType::kAck && engine_level(h.aux));
}

inline std::string ranks_text(const std::vector<std::uint32_t>& ids) {
  if (ids.empty()) return "none";
  std::ostringstream o;
  o << ids.front();
  if (ids.size() > 1) o << ".." << ids.back() << " (" << ids.size() << ")";
  return o.str();
}

// A frame as both ends see it: what matches a frame sent in one capture with the same frame
// received in another.
struct Key {
  std::uint16_t src = 0, dst = 0;
  std::uint8_t type = 0, flags = 0;
  std::uint32_t exchange = 0, epoch = 0, seq = 0, aux = 0;
  std::uint64_t block_len = 0;
  bool operator==(const Key&) const = default;
};
inline Key key_of(const engine::Header& h) {
  return {h.src, h.dst, static_cast<std::uint8_t>(h.type), h.flags, h.exchange, h.epoch, h.seq, h.aux, h.block_len};
}
struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::uint64_t x = (static_cast<std::uint64_t>(k.src) << 48) ^ (static_cast<std::uint64_t>(k.dst) << 32) ^ (static_cast<std::uint64_t>(k.type) << 24) ^
                      (static_cast<std::uint64_t>(k.flags) << 16) ^ k.exchange;
    x = x * 0x9E3779B97F4A7C15ULL ^ (static_cast<std::uint64_t>(k.epoch) << 32 | k.seq);
    x = x * 0x9E3779B97F4A7C15ULL ^ (static_cast<std::uint64_t>(k.aux) << 32) ^ k.block_len;
    return static_cast<std::size_t>(x ^ (x >> 29));
  }
};
struct Seen {
  std::int64_t t = 0;  // first time, capture clock
  std::uint32_t count = 0;
};
using SeenMap = std::unordered_map<Key, Seen, KeyHash>;

inline void note(SeenMap& m, const Frame& f) {
  Seen& s = m[key_of(f.h)];
  if (s.count++ == 0) s.t = f.t;
}

// The rate of a machine's link.
inline std::uint64_t machine_rate(const sched::Topology& topo, Rank machine) {
  return topo.links()[static_cast<std::size_t>(topo.node(topo.machine_node(machine)).links.front())].rate_bps;
}

// Nanoseconds a frame of `bytes` takes on a link of `bps`.
inline std::int64_t frame_ns(std::uint64_t bytes, std::uint64_t bps) { return bps == 0 ? 0 : static_cast<std::int64_t>(bytes * 8'000'000'000ULL / bps); }


// The blocks of `exchange` (all when nullopt) as the captures show them.
std::vector<Block> blocks_of(const Trace& trace, const std::optional<std::uint32_t>& exchange);
// Every interval two blocks of different senders shared a directed link.
std::vector<Contention> contention_of(const sched::Topology& topo, const std::vector<Block>& blocks);
// Nanoseconds covered by the union of the intervals.
std::int64_t covered(std::vector<std::pair<std::int64_t, std::int64_t>> v);

}  // namespace aapc::trace::detail
