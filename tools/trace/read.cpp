// Reading captures: one pcap per node, whose node it is, and the clocks of the run.
#include "aapc/trace/trace.hpp"

#include <pcap/pcap.h>

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

}  // namespace aapc::trace
