#include "aapc/trace/trace.hpp"

#include <pcap/pcap.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <unordered_map>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/sync.hpp"

namespace aapc::trace {

namespace fs = std::filesystem;
using engine::FrameType;

namespace {

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

// Frames that belong to an exchange: not the JOIN and PING of the engine, nor their ACKs.
bool has_exchange(const engine::Header& h) {
  auto engine_level = [](std::uint32_t t) { return t == static_cast<std::uint32_t>(FrameType::kJoin) || t == static_cast<std::uint32_t>(FrameType::kPing); };
  return !engine_level(static_cast<std::uint32_t>(h.type)) && !(h.type == FrameType::kAck && engine_level(h.aux));
}

std::string ranks_text(const std::vector<std::uint32_t>& ids) {
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
Key key_of(const engine::Header& h) {
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

void note(SeenMap& m, const Frame& f) {
  Seen& s = m[key_of(f.h)];
  if (s.count++ == 0) s.t = f.t;
}

// Nanoseconds a frame of `bytes` takes on a link of `bps`.
std::int64_t frame_ns(std::uint64_t bytes, std::uint64_t bps) { return bps == 0 ? 0 : static_cast<std::int64_t>(bytes * 8'000'000'000ULL / bps); }

}  // namespace

// --- reading ------------------------------------------------------------------------------

namespace {

using PcapPtr = std::unique_ptr<pcap_t, void (*)(pcap_t*)>;

PcapPtr open_capture(const std::string& path) {
  if (!fs::exists(path)) throw TraceError(path + ": no such file");
  if (fs::is_directory(path)) throw TraceError(path + ": is a directory; give the .pcap files in it");
  char err[PCAP_ERRBUF_SIZE] = {};
  PcapPtr p(pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, err), pcap_close);
  if (!p) throw TraceError(path + ": not a pcap capture (" + err + "); give the files `aapcd --capture` or `aapc-emu run --capture-dir` wrote");
  if (pcap_datalink(p.get()) != DLT_EN10MB) {
    const char* name = pcap_datalink_val_to_name(pcap_datalink(p.get()));
    throw TraceError(path + ": link type " + (name != nullptr ? name : "?") + ", not Ethernet: not a capture of aapcd");
  }
  return p;
}

// A frame of the file, with the machines its MAC addresses name.
struct RawFrame {
  Frame f;
  Rank mac_src, mac_dst;
};

// What reading the file found besides the frames.
struct ReadCounts {
  std::map<Rank, std::uint64_t> involved;  // how many frames each machine is an end of
  std::uint64_t unknown_mac = 0, read = 0;
};

// The aapc frames between machines of `topology`; the others counted in `cap` and `counts`.
std::vector<RawFrame> read_frames(pcap_t* p, const sched::Topology& topology, std::uint16_t ethertype, Capture& cap, ReadCounts& counts) {
  std::vector<RawFrame> raw;
  pcap_pkthdr* hdr = nullptr;
  const u_char* data = nullptr;
  for (;;) {
    int rc = pcap_next_ex(p, &hdr, &data);
    if (rc == PCAP_ERROR_BREAK) break;  // end of file
    if (rc != 1) {
      cap.warnings.push_back(cap.path + ": damaged after " + std::to_string(counts.read) + " frames (" + pcap_geterr(p) + "); analysing what was read");
      break;
    }
    ++counts.read;
    std::span<const std::uint8_t> bytes(data, hdr->caplen);
    auto c = engine::peek_captured(bytes, hdr->len, ethertype);
    if (c.reason == engine::DropReason::kEtherType) {
      ++cap.other_protocols;
      continue;
    }
    if (c.reason != engine::DropReason::kOk && c.reason != engine::DropReason::kBadCrc) {
      ++cap.malformed;
      continue;
    }
    sched::Mac dst_mac, src_mac;
    std::copy_n(bytes.begin(), 6, dst_mac.bytes.begin());
    std::copy_n(bytes.begin() + 6, 6, src_mac.bytes.begin());
    auto s = topology.rank_of_mac(src_mac), d = topology.rank_of_mac(dst_mac);
    if (!s || !d) {
      ++counts.unknown_mac;
      continue;
    }
    RawFrame r;
    r.f.t = static_cast<std::int64_t>(hdr->ts.tv_sec) * 1'000'000'000 + hdr->ts.tv_usec;  // nanosecond precision
    r.f.h = c.h;
    r.f.wire_len = hdr->len;
    r.f.crc = !c.crc_checked ? Crc::kUnchecked : c.reason == engine::DropReason::kOk ? Crc::kOk : Crc::kBad;
    r.mac_src = *s;
    r.mac_dst = *d;
    if (r.f.crc == Crc::kUnchecked) ++cap.truncated_frames;
    if (r.f.crc != Crc::kBad) {  // a corrupted frame may name anyone
      ++counts.involved[*s];
      if (*d != *s) ++counts.involved[*d];
    }
    raw.push_back(r);
  }
  return raw;
}

// The node whose capture this is: an end of every sound frame.
Rank owner_of(const std::string& path, const sched::Topology& topology, const std::vector<RawFrame>& raw, const std::map<Rank, std::uint64_t>& involved) {
  std::uint64_t sound = 0;
  for (const auto& r : raw) sound += r.f.crc != Crc::kBad ? 1 : 0;
  auto owner = std::max_element(involved.begin(), involved.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  if (owner == involved.end()) throw TraceError(path + ": every frame has a bad CRC; nothing to analyse");
  // Between two machines only, both are an end of every frame: the file's name decides.
  std::vector<Rank> tied;
  for (const auto& [r, n] : involved)
    if (n == owner->second) tied.push_back(r);
  if (tied.size() > 1) {
    const std::string stem = fs::path(path).stem().string();
    auto named = std::find_if(tied.begin(), tied.end(), [&](Rank r) { return topology.machine(r).name == stem; });
    if (named == tied.end())
      throw TraceError(path + ": every frame is between " + topology.machine(tied[0]).name + " and " + topology.machine(tied[1]).name +
                       ", so whose capture it is cannot be told: name the file after its machine (" + topology.machine(tied[0]).name + ".pcap)");
    owner = involved.find(*named);
  }
  if (owner->second * 2 < sound) {
    throw TraceError(path + ": most frames are between machines other than " + topology.machine(owner->first).name +
                     ": it is not the capture of one node (use the files `aapcd --capture` writes, one per node)");
  }
  return owner->first;
}

std::string hex(std::uint16_t v) {
  std::ostringstream o;
  o << std::hex << v;
  return o.str();
}

}  // namespace

Capture read_capture(const std::string& path, const sched::Topology& topology, std::uint16_t ethertype) {
  PcapPtr p = open_capture(path);
  Capture cap;
  cap.path = path;
  ReadCounts counts;
  std::vector<RawFrame> raw = read_frames(p.get(), topology, ethertype, cap, counts);
  if (counts.unknown_mac > 0)
    cap.warnings.push_back(path + ": " + std::to_string(counts.unknown_mac) + " frames between MACs that " + topology.source() +
                           " does not list (ignored; is it the topology of this run?)");
  if (raw.empty()) {
    std::string what = counts.read == 0 ? "no frames at all" : std::to_string(counts.read) + " frames, none of them aapc frames of machines in " + topology.source();
    throw TraceError(path + ": " + what + " (EtherType 0x" + hex(ethertype) + ")");
  }
  cap.node = owner_of(path, topology, raw, counts.involved);
  for (auto& r : raw) {
    if (r.mac_src != cap.node && r.mac_dst != cap.node) {
      ++cap.not_ours;  // flooded by a switch that had not learnt the destination yet
      continue;
    }
    r.f.tx = r.mac_src == cap.node;
    cap.frames.push_back(r.f);
  }
  return cap;
}

// --- the run ------------------------------------------------------------------------------

Trace::Trace(sched::Topology topology, std::vector<Capture> captures, bool same_clock) : topo_(std::move(topology)), caps_(std::move(captures)) {
  if (caps_.empty()) throw TraceError("no captures given");
  std::sort(caps_.begin(), caps_.end(), [](const Capture& a, const Capture& b) { return a.node < b.node; });
  for (std::size_t i = 1; i < caps_.size(); ++i)
    if (caps_[i].node == caps_[i - 1].node)
      throw TraceError(caps_[i - 1].path + " and " + caps_[i].path + " are both captures of " + topo_.machine(caps_[i].node).name + " (rank " +
                       std::to_string(caps_[i].node) + "): give one capture per node, of one run");
  // The same run: each node's epoch, as its own capture shows it, is what the others received.
  std::map<Rank, std::set<std::uint32_t>> own_epochs;
  for (const auto& c : caps_)
    for (const auto& f : c.frames)
      if (f.tx) own_epochs[c.node].insert(f.h.epoch);
  for (const auto& c : caps_)
    for (const auto& f : c.frames) {
      if (f.tx || !f.sound()) continue;
      auto it = own_epochs.find(f.h.src);
      if (it != own_epochs.end() && it->second.count(f.h.epoch) == 0)
        throw TraceError(c.path + " and " + capture_of(f.h.src)->path + " are of different runs: " + topo_.machine(f.h.src).name + " sent with epoch " +
                         std::to_string(*it->second.begin()) + " in its own capture, but " + c.path + " received epoch " + std::to_string(f.h.epoch) +
                         " from it; give the captures of one run");
    }
  // Exchanges every node took part in.
  std::vector<std::set<std::uint32_t>> ids(caps_.size());
  std::set<std::uint32_t> all;
  for (std::size_t i = 0; i < caps_.size(); ++i)
    for (const auto& f : caps_[i].frames)
      if (f.sound() && has_exchange(f.h)) ids[i].insert(f.h.exchange), all.insert(f.h.exchange);
  for (std::uint32_t id : all) {
    bool everywhere = std::all_of(ids.begin(), ids.end(), [&](const auto& s) { return s.count(id) != 0; });
    (everywhere ? exchanges_ : partial_).push_back(id);
  }
  if (exchanges_.empty()) {
    std::string msg = "the captures have no exchange in common:";
    for (std::size_t i = 0; i < caps_.size(); ++i)
      msg += " " + caps_[i].path + " has " + ranks_text(std::vector<std::uint32_t>(ids[i].begin(), ids[i].end())) + ";";
    throw TraceError(msg + " give the captures of one run");
  }
  if (!partial_.empty())
    warnings.push_back(std::to_string(partial_.size()) + " exchanges appear in some captures only (" + ranks_text(partial_) + "): left out");
  for (const auto& c : caps_)
    for (const auto& w : c.warnings) warnings.push_back(w);
  estimate_clocks(same_clock);
  for (auto& c : caps_) {
    const auto off = static_cast<std::int64_t>(std::llround(clocks_[static_cast<std::size_t>(&c - caps_.data())].offset_ns));
    for (auto& f : c.frames) f.at = f.t - off;
  }
}

const Capture* Trace::capture_of(Rank node) const {
  for (const auto& c : caps_)
    if (c.node == node) return &c;
  return nullptr;
}

// The NTP estimate per pair of nodes: d_ab = min(rx at b - tx at a) over control frames seen
// once at both ends, likewise d_ba; then offset_b - offset_a = (d_ab - d_ba) / 2, within
// (d_ab + d_ba) / 2. Control frames (READY, SYNC, ACK, NACK, POLL, PING) are small and often
// wait behind nothing, so the minima come close to the wire's delay. Offsets then spread from
// the reference along the pairs of smallest uncertainty.
void Trace::estimate_clocks(bool same_clock) {
  const std::size_t n = caps_.size();
  std::vector<SeenMap> tx(n), rx(n);
  std::map<Rank, std::size_t> index;
  for (std::size_t i = 0; i < n; ++i) {
    index[caps_[i].node] = i;
    for (const auto& f : caps_[i].frames) {
      if (f.data() || !f.sound()) continue;
      note(f.tx ? tx[i] : rx[i], f);
    }
  }
  // d[a][b]: smallest b.rx - a.tx.
  std::vector<std::vector<std::int64_t>> d(n, std::vector<std::int64_t>(n, kNever));
  std::vector<std::vector<std::uint64_t>> samples(n, std::vector<std::uint64_t>(n, 0));
  for (std::size_t b = 0; b < n; ++b)
    for (const auto& [k, seen] : rx[b]) {
      auto ia = index.find(k.src);
      if (ia == index.end() || seen.count != 1) continue;
      auto it = tx[ia->second].find(k);
      if (it == tx[ia->second].end() || it->second.count != 1) continue;
      std::int64_t delta = seen.t - it->second.t;
      d[ia->second][b] = std::min(d[ia->second][b], delta);
      ++samples[ia->second][b];
    }
  clocks_.assign(n, {});
  for (std::size_t i = 0; i < n; ++i) clocks_[i].node = caps_[i].node;
  clocks_[0].known = true;
  if (same_clock) {
    for (auto& c : clocks_) c.known = c.assumed = true;
    return;
  }
  for (;;) {
    double best = std::numeric_limits<double>::infinity();
    std::size_t bi = n, bk = n;
    for (std::size_t k = 0; k < n; ++k) {
      if (!clocks_[k].known) continue;
      for (std::size_t i = 0; i < n; ++i) {
        if (clocks_[i].known || d[k][i] == kNever || d[i][k] == kNever) continue;
        double u = static_cast<double>(d[k][i] + d[i][k]) / 2 + clocks_[k].uncertainty_ns;
        if (u < best) best = u, bi = i, bk = k;
      }
    }
    if (bi == n) break;
    ClockEstimate& c = clocks_[bi];
    c.known = true;
    c.offset_ns = clocks_[bk].offset_ns + static_cast<double>(d[bk][bi] - d[bi][bk]) / 2;
    c.uncertainty_ns = best;
    c.via = caps_[bk].node;
    c.samples = samples[bk][bi] + samples[bi][bk];
  }
  for (const auto& c : clocks_)
    if (!c.known)
      warnings.push_back("no control frames seen both ways between " + topo_.machine(c.node).name +
                         " and the other captured nodes: its clock is taken as the reference's");
}

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
      const std::uint64_t rate = topo.links()[static_cast<std::size_t>(topo.node(topo.machine_node(c.node)).links.front())].rate_bps;
      waits(s, nf, 4 * frame_ns(static_cast<std::uint64_t>(topo.mtu()) + engine::kEthHeaderLen, rate));
      out.push_back(s);
    }
  }
  return out;
}

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

}  // namespace

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

// --- phases -------------------------------------------------------------------------------

namespace {

struct Token {
  Rank from, to;
  std::uint32_t id;
  auto operator<=>(const Token&) const = default;
};

std::set<Token> wire_tokens(const sched::Schedule& s) {
  std::set<Token> out;
  for (const auto& y : s.syncs)
    if (y.from != y.to) out.insert({y.from, y.to, y.id});
  return out;
}

// Every sync variant, with the block sizes worth trying for the partial ones.
std::vector<sched::SyncSpec> sync_candidates() {
  std::vector<sched::SyncSpec> out;
  for (const auto& name : sched::SyncSpec::names()) {
    auto base = sched::SyncSpec::parse(name);
    if (!base) continue;
    if (!base->partial()) {
      out.push_back(*base);
      continue;
    }
    for (int bs : {2, 4, 8, 16}) {
      auto s = *base;
      s.block = bs;
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace

namespace {

// What the wire shows of an exchange: tokens (from, to, id), and the phase of every block.
struct WireView {
  std::set<Token> seen;
  std::map<std::pair<Rank, Rank>, int> block_phase;
};

WireView wire_view(const Trace& trace, std::uint32_t exchange) {
  WireView w;
  for (const auto& c : trace.captures())
    for (const auto& f : c.frames) {
      if (f.h.exchange != exchange || !f.sound()) continue;
      if (f.h.type == FrameType::kSync && (f.tx || trace.capture_of(f.h.src) == nullptr)) w.seen.insert({f.h.src, f.h.dst, f.h.seq});
      if (f.data() && !f.dummy() && f.h.phase != engine::kNoPhase) w.block_phase[{f.h.src, f.h.dst}] = f.h.phase;
    }
  if (w.block_phase.empty()) throw TraceError("exchange " + std::to_string(exchange) + " carried no data with phases (a barrier?): nothing to check");
  return w;
}

// Whether every block seen went in the phase `s` gives it.
bool phases_match(const sched::Schedule& s, const std::map<std::pair<Rank, Rank>, int>& block_phase) {
  for (std::size_t p = 0; p < s.phases.size(); ++p)
    for (const auto& m : s.phases[p]) {
      auto it = block_phase.find({m.src, m.dst});
      if (it != block_phase.end() && it->second != static_cast<int>(p)) return false;
    }
  return true;
}

// The plan of --schedule, checked against the phases on the wire.
sched::Schedule given_plan(const sched::Topology& topo, const std::string& schedule, const WireView& wire, std::uint32_t exchange, PhaseReport& rep) {
  std::optional<sched::Schedule> plan;
  std::optional<sched::AlgorithmSpec> algo;
  std::optional<sched::SyncSpec> sync;
  try {
    auto given = sched::parse_plan_spec(schedule);
    algo = given.algorithm;
    sync = given.sync.value_or(sched::SyncSpec{});  // none: a trace has no block size to choose by
  } catch (const std::invalid_argument&) {
  }
  if (!algo) throw TraceError("--schedule " + schedule + ": give ALGORITHM[+SYNC], e.g. tree+sender-all");
  try {
    plan = sched::plan_sync(topo, sched::make_schedule(topo, *algo), *sync);
  } catch (const std::exception& e) {
    throw TraceError("--schedule " + schedule + ": " + e.what());
  }
  rep.schedule = sched::format_plan_spec(*algo, *sync);
  rep.how = "given";
  if (!phases_match(*plan, wire.block_phase)) throw TraceError("--schedule " + schedule + ": the phases of the DATA frames of exchange " + std::to_string(exchange) + " are not its phases");
  return std::move(*plan);
}

// The plan of the first algorithm and sync variant whose phases and tokens the wire shows.
sched::Schedule inferred_plan(const Trace& trace, const WireView& wire, std::uint32_t exchange, PhaseReport& rep) {
  const auto& topo = trace.topology();
  std::optional<sched::Schedule> plan;
  std::vector<std::string> matches;
  for (const auto& name : sched::AlgorithmSpec::names()) {
    auto algo = sched::AlgorithmSpec::parse(name);
    if (!algo) continue;
    sched::Schedule base;
    try {
      base = sched::make_schedule(topo, *algo);
    } catch (const std::exception&) {
      continue;  // does not apply to this topology
    }
    if (base.packet_level || !phases_match(base, wire.block_phase)) continue;
    for (const auto& sync : sync_candidates()) {
      sched::Schedule s;
      try {
        s = sched::plan_sync(topo, base, sync);
      } catch (const std::exception&) {
        continue;
      }
      auto expected = wire_tokens(s);
      // Every token seen is in the plan, and every planned token between captured nodes was seen.
      bool ok = std::includes(expected.begin(), expected.end(), wire.seen.begin(), wire.seen.end());
      for (const auto& t : expected)
        if (ok && trace.capture_of(t.from) != nullptr && wire.seen.count(t) == 0) ok = false;
      if (!ok) continue;
      matches.push_back(sched::format_plan_spec(*algo, sync));
      if (!plan) plan = std::move(s);
    }
  }
  if (!plan)
    throw TraceError("exchange " + std::to_string(exchange) + ": no schedule and sync variant of aapc explains its " + std::to_string(wire.seen.size()) +
                     " tokens and phases; give --schedule ALGORITHM+SYNC");
  rep.schedule = matches.front();
  rep.how = "inferred from " + std::to_string(wire.seen.size()) + " tokens and " + std::to_string(wire.block_phase.size()) + " blocks";
  if (matches.size() > 1) {
    rep.how += "; the same tokens fit";
    for (std::size_t i = 1; i < matches.size() && i < 4; ++i) rep.how += " " + matches[i];
    if (matches.size() > 4) rep.how += " ...";
  }
  return std::move(*plan);
}

// Rounds against their tokens, on each node's own clock.
void check_rounds(const Trace& trace, const sched::Schedule& plan, std::uint32_t exchange, PhaseReport& rep) {
  std::map<std::uint32_t, const sched::Sync*> sync_by_id;
  for (const auto& y : plan.syncs) sync_by_id[y.id] = &y;
  for (const auto& c : trace.captures()) {
    const auto& prog = plan.programs.at(static_cast<std::size_t>(c.node));
    std::map<std::uint32_t, std::int64_t> token_at;                     // first arrival of each token
    std::map<std::pair<Rank, int>, std::int64_t> first_send;            // (dst, phase) -> first DATA sent
    for (const auto& f : c.frames) {
      if (f.h.exchange != exchange || !f.sound()) continue;
      if (!f.tx && f.h.type == FrameType::kSync) token_at.try_emplace(f.h.seq, f.at);
      if (f.tx && f.data()) first_send.try_emplace({f.h.dst, f.h.phase == engine::kNoPhase ? -1 : f.h.phase}, f.at);
    }
    for (std::size_t r = 0; r < prog.rounds.size(); ++r) {
      const auto& round = prog.rounds[r];
      RoundCheck rc;
      rc.node = c.node;
      rc.round = static_cast<int>(r);
      rc.phase = round.phase();
      for (std::uint32_t id : round.waits) {
        auto y = sync_by_id.find(id);
        if (y == sync_by_id.end() || y->second->from == c.node) continue;  // local ordering
        rc.waits.push_back(id);
        auto t = token_at.find(id);
        if (t == token_at.end()) {
          rc.missing_token = true;
        } else {
          rc.tokens_arrived = std::max(rc.tokens_arrived, t->second);
        }
      }
      if (rc.waits.empty()) continue;
      rc.started = kNever;
      for (const auto& s : round.sends) {
        auto it = first_send.find({s.dst, s.phase});
        if (it != first_send.end()) rc.started = std::min(rc.started, it->second);
      }
      if (rc.started == kNever) continue;  // nothing sent in this round (dummy or empty blocks)
      rep.missing_tokens += rc.missing_token ? 1 : 0;
      rep.early_rounds += rc.early() ? 1 : 0;
      rep.rounds.push_back(rc);
    }
  }
}

// Phases in time, and how much consecutive ones overlapped (and contended).
void phase_spans(const Trace& trace, std::uint32_t exchange, PhaseReport& rep) {
  auto blocks = blocks_of(trace, exchange);
  std::map<int, PhaseSpan> spans;
  for (const auto& b : blocks) {
    if (b.phase < 0 || b.dummy) continue;
    auto [it, fresh] = spans.try_emplace(b.phase, PhaseSpan{b.phase, b.start, b.end, 0, 0});
    if (!fresh) it->second.start = std::min(it->second.start, b.start), it->second.end = std::max(it->second.end, b.end);
  }
  std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> contended;
  for (const auto& c : contention_of(trace.topology(), blocks))
    if (std::abs(c.a.phase - c.b.phase) == 1) contended[std::min(c.a.phase, c.b.phase)].emplace_back(c.from, c.to);
  for (auto it = spans.begin(); it != spans.end(); ++it) {
    auto next = std::next(it);
    if (next != spans.end()) it->second.overlap_next_ns = std::max<std::int64_t>(0, it->second.end - next->second.start);
    it->second.contended_ns = covered(contended[it->first]);
    rep.phases.push_back(it->second);
  }
}

}  // namespace

PhaseReport phases(const Trace& trace, std::uint32_t exchange, const std::string& schedule) {
  PhaseReport rep;
  rep.exchange = exchange;
  const WireView wire = wire_view(trace, exchange);
  const sched::Schedule plan = schedule.empty() ? inferred_plan(trace, wire, exchange, rep) : given_plan(trace.topology(), schedule, wire, exchange, rep);
  check_rounds(trace, plan, exchange, rep);
  phase_spans(trace, exchange, rep);
  return rep;
}

}  // namespace aapc::trace
