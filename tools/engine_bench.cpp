// aapc-engine-bench: payload goodput of the engine on one core.
//
// Two engines in one process, each on a real DPDK net_ring port, the two ports cabled to each
// other (one's transmit ring is the other's receive ring). One thread polls both, so every
// byte is built, sent, received, checked and placed by the same core. Both directions carry
// a block, and the figure counts payload bytes delivered (both directions) per second.
// Then the same with the payload sent without a copy, with a cluster key (every frame tagged and verified) and
// with the capture tap on, to show what each costs; with --io-core, with an I/O lcore on a
// second core (bursts and the check of received frames there). With --memif: the two engines in two
// processes, one core each, joined by DPDK's memif.
#include <CLI/CLI.hpp>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_ring.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "aapc/core/engine.hpp"
#include "aapc/nic/capture.hpp"
#include "aapc/nic/eal.hpp"
#include "aapc/nic/eth_port.hpp"
#include "aapc/nic/extmem.hpp"
#include "aapc/nic/fault.hpp"
#include "aapc/nic/io_lcore.hpp"
#include "aapc/sched/algorithms.hpp"
#include "aapc/wire/crc.hpp"
#include "pattern.h"
#include "port_rate.hpp"

using namespace aapc;

namespace {

struct Cable {
  rte_ring* ab = nullptr;
  rte_ring* ba = nullptr;
  std::unique_ptr<nic::EthPort> a, b;
};

Cable make_cable(int serial, int mtu) {
  Cable c;
  auto ring = [&](const std::string& name) {
    rte_ring* r = rte_ring_create(name.c_str(), 4096, static_cast<int>(rte_socket_id()), RING_F_SP_ENQ | RING_F_SC_DEQ);
    if (r == nullptr) throw std::runtime_error("cannot create ring " + name);
    return r;
  };
  c.ab = ring("bench_ab" + std::to_string(serial));
  c.ba = ring("bench_ba" + std::to_string(serial));
  auto port = [&](const std::string& base, rte_ring* rx, rte_ring* tx, int rank) {
    int id = rte_eth_from_rings(base.c_str(), &rx, 1, &tx, 1, rte_socket_id());
    if (id < 0) throw std::runtime_error("rte_eth_from_rings failed");
    char name[RTE_ETH_NAME_MAX_LEN];
    rte_eth_dev_get_name_by_port(static_cast<std::uint16_t>(id), name);
    nic::PortOptions po;
    po.device = name;
    po.mtu = mtu;
    po.mac = nic::MacAddr{0x02, 0, 0, 0, 0, static_cast<std::uint8_t>(rank + 1)};
    return nic::EthPort::open(po);
  };
  c.a = port("bench_a" + std::to_string(serial), c.ba, c.ab, 0);
  c.b = port("bench_b" + std::to_string(serial), c.ab, c.ba, 1);
  return c;
}

struct Outcome {
  double seconds = 0;
  std::uint64_t payload = 0, frames = 0;
  bool ok = false;
};

// How run_once() differs from the engine's defaults.
struct RunOptions {
  bool keyed = false;                           // frames tagged with a cluster key
  const nic::ExternalRegion* region = nullptr;  // over `buf`: the send blocks are registered, payload sent without a copy
  // >= 0: an I/O lcore pinned to that CPU takes both ports' bursts and checks every received
  // frame, and with `io_seal` seals every frame sent, while the engines
  // stay on this thread.
  int io_core = -1;
  bool io_seal = false;
  bool cached = false;  // payloads written into the blocks through the caches (EngineConfig::stream_bytes)
  engine::Cipher cipher = engine::Cipher::kChaCha20Poly1305;  // with `keyed`: the tags' AEAD
};

Outcome run_once(nic::Port& pa, nic::Port& pb, std::uint64_t block, int mtu, std::uint32_t id, std::vector<std::uint8_t>& buf,
                 const RunOptions& opt = {}) {
  const auto [keyed, region, io_core, io_seal, cached, cipher] = opt;
  std::vector<nic::MacAddr> macs = {pa.mac(), pb.mac()};
  engine::EngineConfig ca;
  ca.rank = 0;
  ca.peers = macs;
  ca.mtu = mtu;
  if (keyed) ca.key = engine::FrameKey{{}, cipher};  // any key: the cost of tagging and verifying
  ca.zero_copy_min = 0;                     // with a region, every data frame attached
  if (cached) ca.stream_bytes = UINT64_MAX;
  engine::EngineConfig cb = ca;
  cb.rank = 1;
  std::optional<nic::OffloadPort> oa, ob;
  std::optional<nic::IoLcore> io;  // stopped before the ports go
  if (io_core >= 0) {
    oa.emplace(pa);
    ob.emplace(pb);
    io.emplace(nic::IoLcoreOptions{io_core, "bench-io"});
    for (nic::OffloadPort* p : {&*oa, &*ob}) {
      io->serve_rx(*p, engine::integrity_hook(ca.key ? &*ca.key : nullptr));
      io->serve_tx(*p, io_seal ? engine::seal_hook(ca.key ? &*ca.key : nullptr) : nic::FrameHook{});
    }
    io->start();
  }
  engine::Engine ea(oa ? static_cast<nic::Port&>(*oa) : pa, ca), eb(ob ? static_cast<nic::Port&>(*ob) : pb, cb);
  sched::Schedule s = sched::ring_schedule(2);
  // One buffer of four blocks: a's send, a's receive, b's send, b's receive.
  std::uint8_t* base = buf.data();
  for (int r = 0; r < 2; ++r) {
    auto spec = engine::exchange_spec(s, r, id);
    std::uint8_t* send = base + static_cast<std::size_t>(2 * r) * block;
    std::uint8_t* recv = base + static_cast<std::size_t>(2 * r + 1) * block;
    spec.send[static_cast<std::size_t>(1 - r)] = {send, block, region};
    spec.recv[static_cast<std::size_t>(1 - r)] = {recv, block};
    auto started = (r == 0 ? ea : eb).start(std::move(spec));
    if (!started) throw std::runtime_error(started.error().message());
  }
  const auto t0 = std::chrono::steady_clock::now();
  bool done_a = false, done_b = false;
  Outcome out;
  while (!(done_a && done_b)) {
    ea.poll();
    eb.poll();
    for (auto& r : ea.take_finished()) done_a = true, out.ok = r.state == engine::ExchangeState::kDone, out.frames += r.counters.data_frames_sent;
    for (auto& r : eb.take_finished()) {
      done_b = true;
      out.ok = out.ok && r.state == engine::ExchangeState::kDone;
      out.frames += r.counters.data_frames_sent;
      out.payload += r.counters.data_bytes_received;
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  while (region != nullptr && region->in_flight() > 0) {  // frames still on their way refer to buf
    ea.poll();
    eb.poll();
  }
  out.payload = 2 * block;
  // Everything arrived intact: the blocks are byte patterns, compared whole.
  out.ok = out.ok && std::equal(base, base + block, base + 3 * block) && std::equal(base + 2 * block, base + 3 * block, base + block);
  return out;
}

// Two phases, A -> B then B -> A, of one small block each: with `token`, B's round waits for
// A's sender-based token, as consecutive users of a link do in the tree's phases; without,
// both rounds run at once. The difference of the two is what a phase hand-over costs the
// engines (emit, frame, receive, parse, start the next round), with no wire in between.
sched::Schedule two_phases(bool token) {
  sched::Schedule s;
  s.algorithm = token ? "two-phases+token" : "two-phases";
  s.machines = 2;
  s.phases = {{{0, 1}}, {{1, 0}}};
  s.programs = sched::programs_from_phases(2, s.phases);
  if (token) {
    s.syncs.push_back({0, 0, 1, sched::SyncTrigger::kAfterSend, 0, -1, 0});
    s.programs[0].rounds[0].emits.push_back(0);
    s.programs[1].rounds[0].waits.push_back(0);
  }
  return s;
}

// Median and spread (10th to 90th percentile) of `n` exchanges of each kind, in turns of 100.
void handover(nic::Port& pa, nic::Port& pb, int n) {
  std::vector<nic::MacAddr> macs = {pa.mac(), pb.mac()};
  engine::EngineConfig ca;
  ca.peers = macs;
  engine::EngineConfig cb = ca;
  cb.rank = 1;
  engine::Engine ea(pa, ca), eb(pb, cb);
  const sched::Schedule plain = two_phases(false), tokened = two_phases(true);
  std::array<std::uint8_t, 64> a_send{}, a_recv{}, b_send{}, b_recv{};
  std::vector<double> us[2];
  std::uint32_t id = 1;
  auto one = [&](const sched::Schedule& s) {
    auto sa = engine::exchange_spec(s, 0, id), sb = engine::exchange_spec(s, 1, id);
    sa.send[1] = {a_send.data(), a_send.size()};
    sa.recv[1] = {a_recv.data(), a_recv.size()};
    sb.send[0] = {b_send.data(), b_send.size()};
    sb.recv[0] = {b_recv.data(), b_recv.size()};
    const auto t0 = std::chrono::steady_clock::now();
    if (!ea.start(std::move(sa)) || !eb.start(std::move(sb))) throw std::runtime_error("an exchange did not start");
    int done = 0;
    while (done < 2) {
      ea.poll();
      eb.poll();
      for (auto* e : {&ea, &eb})
        for (auto& r : e->take_finished()) {
          if (r.state != engine::ExchangeState::kDone) throw std::runtime_error("exchange failed: " + r.error);
          ++done;
        }
    }
    ++id;
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int turn = 0; turn * 100 < n; ++turn)
    for (int k = 0; k < 2; ++k)
      for (int i = 0; i < 100; ++i) us[k].push_back(one(k == 0 ? plain : tokened));
  auto pct = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
  };
  std::cout << std::fixed << std::setprecision(2) << "phase hand-over, two engines on one core, " << us[0].size() << " exchanges of each kind\n";
  for (int k = 0; k < 2; ++k)
    std::cout << "  " << std::left << std::setw(34) << (k == 0 ? "two phases at once (us)" : "two phases, token between (us)") << std::right
              << " median " << std::setw(7) << pct(us[k], 0.5) << "  p10 " << std::setw(7) << pct(us[k], 0.1) << "  p90 " << std::setw(7)
              << pct(us[k], 0.9) << "\n";
  std::cout << "  one hand-over costs the engines   median " << std::setw(7) << pct(us[1], 0.5) - pct(us[0], 0.5)
            << " us (difference of the medians)\n";
}

// What the host's memory allows a copy path: the blocks of `buf` memcpy'd, a's send into b's
// receive and b's send into a's receive (the engines copy each byte twice, into a frame and
// out of it, or once without a copy). Beyond the caches this bounds every figure. Gbit/s,
// the best of `repeat`.
double memcpy_gbps(std::vector<std::uint8_t>& buf, std::uint64_t block, int repeat) {
  double secs = 1e30;
  for (int rep = 0; rep < repeat; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(buf.data() + block, buf.data(), block);
    std::memcpy(buf.data() + 3 * block, buf.data() + 2 * block, block);
    secs = std::min(secs, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<double>(2 * block) * 8 / secs / 1e9;
}

// The configurations goodput() runs, by code: 0, no capture; -1, no capture, a cluster key;
// -2, no capture, payload sent without a copy; -3 and -4, as 0 and -1 with an I/O lcore on a
// second CPU that checks what is received; -5 and -6, that also seals what is sent; -100 - i,
// as 0 with the CRC computed by crc32c_paths()[i] instead of the fastest way; -7, as 0 with
// nothing of the blocks fetched ahead of the copies; -8 and -9, as 0 and -2 with the payloads
// written through the caches whatever the exchange's size; -10, as -1 with AES-256-GCM tags
// (-1's are ChaCha20-Poly1305's); a positive code, capture at that snap length.
struct Configs {
  Cable& cable;
  std::uint64_t block;
  int mtu;
  std::vector<std::uint8_t>& buf;
  std::string capture_dir;
  int io_core;
  std::uint32_t id = 1;

  static constexpr int kCrcPath = -100, kNoFetch = -7, kCached = -8, kZeroCopyCached = -9, kKeyGcm = -10;

  static std::string label(int code) {
    if (code <= kCrcPath) return "copied, CRC by " + std::string(engine::crc32c_paths()[static_cast<std::size_t>(kCrcPath - code)].name);
    switch (code) {
      case 0: return "no capture (payload copied)";
      case -1: return "key, chacha20-poly1305 tags";
      case kKeyGcm: return "key, aes-256-gcm tags";
      case -2: return "zero copy (payload attached)";
      case -3: return "copied, lcore checks";
      case -4: return "key, lcore checks";
      case -5: return "copied, lcore checks + seals";
      case -6: return "key, lcore checks + seals";
      case kNoFetch: return "copied, nothing fetched ahead";
      case kCached: return "copied, cached stores";
      case kZeroCopyCached: return "zero copy, cached stores";
      default: return "capture, snaplen " + std::to_string(code);
    }
  }

  Outcome run(int code, const nic::ExternalRegion& region) {
    namespace fs = std::filesystem;
    if (code <= kCrcPath || code == kNoFetch) {  // the copy path, one of the engine's copy switches turned
      if (code == kNoFetch)
        engine::fetch_ahead(false);
      else
        engine::use_crc32c_path(&engine::crc32c_paths()[static_cast<std::size_t>(kCrcPath - code)]);
      Outcome o = run_once(*cable.a, *cable.b, block, mtu, id++, buf);
      engine::fetch_ahead(true);
      engine::use_crc32c_path(nullptr);
      return o;
    }
    if (code == kKeyGcm) return run_once(*cable.a, *cable.b, block, mtu, id++, buf, {.keyed = true, .cipher = engine::Cipher::kAes256Gcm});
    if (code == kCached || code == kZeroCopyCached)
      return run_once(*cable.a, *cable.b, block, mtu, id++, buf, {.region = code == kZeroCopyCached ? &region : nullptr, .cached = true});
    if (code <= 0)
      return run_once(*cable.a, *cable.b, block, mtu, id++, buf,
                      {code == -1 || code == -4 || code == -6, code == -2 ? &region : nullptr, code <= -3 ? io_core : -1, code <= -5});
    fs::path fa = fs::path(capture_dir) / "aapc-bench-a.pcap", fb = fs::path(capture_dir) / "aapc-bench-b.pcap";
    Outcome o;
    {
      nic::CapturePort ca(*cable.a, {fa.string(), code}), cb(*cable.b, {fb.string(), code});
      o = run_once(ca, cb, block, mtu, id++, buf);
    }
    fs::remove(fa);
    fs::remove(fb);
    return o;
  }
};

// Payload goodput of one exchange each way, without capture, with a cluster key and with the
// capture tap at two snap lengths, the best of `repeat` runs each.
void goodput(Cable& cable, std::uint64_t block_mib, int mtu, int repeat, const std::string& capture_dir, int snaplen, int io_core) {
  const std::uint64_t block = block_mib << 20;
  std::vector<std::uint8_t> buf(4 * block);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::uint8_t>(i * 2654435761U >> 13);
  for (std::size_t i = 0; i < block; ++i) buf[2 * block + i] = static_cast<std::uint8_t>(i * 40503U >> 7);
  Outcome last;
  const auto crc_paths = engine::crc32c_paths();
  const engine::EngineConfig defaults;
  const auto payload = static_cast<std::uint32_t>(mtu) - engine::kDataFrameOverhead;
  const bool streamed = defaults.streams(block, payload);
  std::cout << "two engines, one core, net_ring, MTU " << mtu << ", " << block_mib << " MiB each way, best of " << repeat
            << (io_core >= 0 ? ", the I/O lcore on CPU " + std::to_string(io_core) : std::string()) << ", CRC32C by "
            << crc_paths.back().name << ", payloads written "
            << (streamed ? "around" : "through") << " the caches (around them when an exchange receives " << std::setprecision(1) << std::fixed
            << static_cast<double>(defaults.stream_bytes) / (1 << 20) << " MiB or more, in frames of " << defaults.stream_min_chunk
            << " bytes or more)\n";
  auto report = [&](const std::string& what, double secs, double base) {
    double gbps = static_cast<double>(last.payload) * 8 / secs / 1e9;
    std::cout << "  " << std::left << std::setw(30) << what << std::right << std::fixed << std::setprecision(2) << std::setw(8) << gbps
              << " Gbit/s payload  " << std::setw(6) << std::setprecision(2) << static_cast<double>(last.frames) / secs / 1e6
              << " Mframes/s  " << std::setprecision(3) << secs << " s";
    if (base > 0) std::cout << "  (" << std::showpos << std::setprecision(1) << (secs / base - 1) * 100 << std::noshowpos << "% time)";
    std::cout << "\n";
    return gbps;
  };
  // The configurations run in turns, so that a slow moment of the machine hits them all. The
  // copy through the caches, without fetching ahead and by the slower CRC paths (not the
  // table) come right after the first, for the ratio of each to it, and the zero copy through
  // the caches right after the zero copy.
  std::vector<int> snaps = {0, -2, -1, 65535, snaplen};
  if (io_core >= 0) snaps.insert(snaps.begin() + 3, {-3, -4, -5, -6});
  for (std::size_t i = 1; i + 1 < crc_paths.size(); ++i) snaps.insert(snaps.begin() + 1, Configs::kCrcPath - static_cast<int>(i));
  snaps.insert(snaps.begin() + 1, Configs::kNoFetch);
  snaps.insert(snaps.begin() + 1, Configs::kCached);
  snaps.insert(std::find(snaps.begin(), snaps.end(), -2) + 1, Configs::kZeroCopyCached);
  // The two AEADs side by side; AES-256-GCM where the CPU has AES-NI and PCLMUL.
  if (engine::aes_gcm_available()) snaps.insert(std::find(snaps.begin(), snaps.end(), -1) + 1, Configs::kKeyGcm);
  const nic::ExternalRegion region(buf.data(), buf.size());
  Configs configs{cable, block, mtu, buf, capture_dir, io_core};
  std::vector<double> best(snaps.size(), 1e30);
  std::vector<Outcome> outcome(snaps.size());
  for (int rep = 0; rep < repeat; ++rep) {
    for (std::size_t c = 0; c < snaps.size(); ++c) {
      Outcome o = configs.run(snaps[c], region);
      if (!o.ok) throw std::runtime_error("an exchange did not complete byte-exact");
      if (o.seconds < best[c]) {
        best[c] = o.seconds;
        outcome[c] = o;
      }
    }
  }
  double copied = 0, attached = 0, keyed = 0;
  for (std::size_t c = 0; c < snaps.size(); ++c) {
    last = outcome[c];
    const std::string what = Configs::label(snaps[c]);
    double g = report(what, best[c], c == 0 ? 0 : best[0]);
    if (snaps[c] == 0) copied = g;
    if (snaps[c] == -2) attached = g;
    if (snaps[c] == (engine::aes_gcm_available() ? Configs::kKeyGcm : -1)) keyed = g;
  }
  std::cout << "  memcpy of the same blocks     " << std::setw(8) << std::setprecision(2) << memcpy_gbps(buf, block, repeat)
            << " Gbit/s (one copy a byte, no frames: the host memory's ceiling for these blocks)\n";
  // The targets: 40 Gbit/s of payload per core at MTU 9000, 25 at 1500; by each way
  // of sending, the engine's own at this MTU first (EngineConfig::zero_copy_min: payloads
  // that large go without a copy where the port takes them).
  if (mtu == 1500 || mtu == 9000) {
    const int target = mtu == 9000 ? 40 : 25;
    const bool zero_copy_default = defaults.attaches(payload);
    auto verdict = [&](double g, const char* how) {
      std::cout << (g >= target ? "target met: " : "target MISSED: ") << "at least " << target << " Gbit/s of payload per core at MTU " << mtu
                << ", " << how << ": " << std::setprecision(2) << g << "\n";
    };
    if (zero_copy_default) verdict(attached, "payload sent without a copy (the engine's way at this MTU, where the port can)");
    verdict(copied, zero_copy_default ? "payload copied (ports that cannot attach it)" : "payload copied (the engine's way at this MTU)");
    // aapcd's --cipher auto: AES-256-GCM where the CPU has it.
    verdict(keyed, engine::aes_gcm_available() ? "with a cluster key, aes-256-gcm tags (aapcd's choice on this CPU)"
                                               : "with a cluster key, chacha20-poly1305 tags (this CPU has no AES-NI)");
  }
}

// The exchange between two processes, one engine and one core each, over
// memif (DPDK's shared-memory packet interface, a DPDK-native path between processes, where
// net_ring joins engines of one process only). Each process pins itself to its own CPU of
// those the process may use (both to the same where it may use one); both check every byte
// they receive. The figure is
// the payload of both directions over the slower side's time, per run; the client's times
// reach the server through a pipe.
namespace memif {

struct Side {
  bool server = false;
  std::string socket;
  int mtu = 1500;
  std::uint64_t block = 0;
  int repeat = 0;
  std::string faults;  // nic::FaultOptions on each side's port, its seed offset by the rank
  // The server writes a byte here once its port is open; the client reads it before opening
  // its own (a client that came first did not always connect: 1 run in 8).
  int ready_fd = -1;
  // Polled between the engine's polls once this side's exchanges are done: true once the
  // other side's are. Until then this side's engine answers the other's resends and pings (the
  // last acknowledgement of a block can be lost, as any frame can); a side that stopped
  // polling when its own exchanges were done left the other waiting for it (CI, both sides on
  // one CPU: "peer rank 0 silent for 5050 ms").
  std::function<bool()> peer_done;
  std::function<void()> done;  // tells the other side that this side's exchanges are done
};

// What one side measured: its seconds per exchange, and the CPUs its engine ran on.
struct SideResult {
  std::vector<double> secs;
  std::string cpus;
};

// True once a byte has come through `fd` or its writer is gone (the other side then has
// nothing more to ask of this one); never blocks.
struct Signal {
  int fd = -1;
  bool seen = false;
  bool operator()() {
    pollfd p{fd, POLLIN, 0};
    char byte = 0;
    if (!seen && ::poll(&p, 1, 0) > 0) seen = ::read(fd, &byte, 1) >= 0;
    return seen;
  }
};

// One side's run; throws when an exchange fails or is not byte-exact.
SideResult run_side(const Side& side) {
  const int rank = side.server ? 0 : 1;
  nic::EalOptions eal;
  eal.memory_mb = 1024;
  eal.program = "aapc-engine-bench";
  eal.file_prefix = std::string("aapc-bench-") + (side.server ? "server" : "client");
  // memif cannot register its multi-process handler without the EAL's shared config (which
  // aapc leaves off) and says so at error level; this benchmark is one process per side.
  // Each side on a CPU of its own among those this process may use (a job's allocation need
  // not hold CPU 0), both on the one there is where there is one.
  eal.pin_main = rank;
  eal.extra = {"--log-level=pmd.net.memif:critical"};
  nic::eal_init(eal);
  SideResult result{{}, nic::cpu_list(nic::thread_cpus())};
  nic::PortOptions po;
  po.device = "net_memif0,role=" + std::string(side.server ? "server" : "client") + ",id=0,socket-abstract=no,socket=" + side.socket;
  po.mtu = side.mtu;
  po.mac = nic::MacAddr{0x02, 0, 0, 0, 0, static_cast<std::uint8_t>(rank + 1)};
  char byte = 1;
  if (!side.server && ::read(side.ready_fd, &byte, 1) != 1) throw std::runtime_error("the memif server did not start");
  auto port = nic::EthPort::open(po);
  std::optional<nic::FaultPort> faulty;
  if (!side.faults.empty()) {
    nic::FaultOptions fo = nic::FaultOptions::parse(side.faults);
    fo.seed += static_cast<std::uint64_t>(rank);
    faulty.emplace(*port, fo);
  }
  if (side.server && ::write(side.ready_fd, &byte, 1) != 1) throw std::runtime_error("cannot tell the client to start");
  const auto connect_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (rte_eth_link link{}; rte_eth_link_get_nowait(port->port_id(), &link) != 0 || link.link_status == 0;) {
    if (std::chrono::steady_clock::now() > connect_by) throw std::runtime_error("memif did not connect within 10 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  engine::EngineConfig cfg;
  cfg.rank = rank;
  cfg.peers = {nic::MacAddr{0x02, 0, 0, 0, 0, 1}, nic::MacAddr{0x02, 0, 0, 0, 0, 2}};
  cfg.mtu = side.mtu;
  // The payload is copied into mbufs: memif copies it into its rings anyway and cannot take
  // attached payloads (nic::zero_copy_driver).
  engine::Engine e(faulty ? static_cast<nic::Port&>(*faulty) : *port, cfg);
  std::vector<std::uint8_t> out(side.block), in(side.block);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = tools::pattern(rank, 1 - rank, 0, i);
  const sched::Schedule s = sched::ring_schedule(2);
  std::vector<double>& secs = result.secs;
  for (int k = 0; k < side.repeat; ++k) {
    std::fill(in.begin(), in.end(), 0);
    auto spec = engine::exchange_spec(s, rank, static_cast<std::uint32_t>(k + 1));
    spec.send[static_cast<std::size_t>(1 - rank)] = {out.data(), out.size()};
    spec.recv[static_cast<std::size_t>(1 - rank)] = {in.data(), in.size()};
    spec.timeout = std::chrono::milliseconds(60'000);
    const auto t0 = std::chrono::steady_clock::now();
    if (auto started = e.start(std::move(spec)); !started) throw std::runtime_error(started.error().message());
    for (bool done = false; !done;) {
      e.poll();
      for (auto& r : e.take_finished()) {
        if (r.state != engine::ExchangeState::kDone) throw std::runtime_error("exchange " + std::to_string(r.id) + " failed: " + r.error);
        done = true;
      }
    }
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (std::size_t i = 0; i < in.size(); ++i)
      if (in[i] != tools::pattern(1 - rank, rank, 0, i)) throw std::runtime_error("byte " + std::to_string(i) + " received wrong");
  }
  side.done();
  while (!e.quiet() || !side.peer_done()) e.poll();
  return result;
}

// The forked client: its CPUs and times to `results_fd`, or nothing (the server then reports
// the failure).
[[noreturn]] void run_client(const Side& side, int results_fd) {
  int rc = 0;
  try {
    const SideResult r = run_side(side);
    ::dprintf(results_fd, "%s\n", r.cpus.c_str());
    for (double t : r.secs) ::dprintf(results_fd, "%.9f\n", t);
  } catch (const std::exception& e) {
    std::cerr << "aapc-engine-bench (memif client): " << e.what() << "\n";
    rc = 1;
  }
  ::close(results_fd);
  // _Exit runs no atexit handlers (the parent's are copies), so the EAL's cleanup is called
  // here: /var/run/dpdk/aapc-bench-client was left behind.
  nic::eal_cleanup();
  std::_Exit(rc);
}

int bench(std::uint64_t block_mib, int mtu, int repeat, const std::string& faults) {
  Side side;
  side.faults = faults;
  side.socket = "/tmp/aapc-engine-bench-" + std::to_string(::getpid()) + ".sock";
  side.mtu = mtu;
  side.block = block_mib << 20;
  side.repeat = repeat;
  // fds: the client's CPUs and times to the server; ready: the server's port is open, then its
  // exchanges are done; client_done: the client's exchanges are done.
  int fds[2], ready[2], client_done[2];
  if (::pipe(fds) != 0 || ::pipe(ready) != 0 || ::pipe(client_done) != 0) throw std::runtime_error("pipe failed");
  // A side that is gone (it failed, and said why) needs telling nothing: no SIGPIPE, no error.
  std::signal(SIGPIPE, SIG_IGN);
  const auto tell = [](int fd) {
    return [fd] {
      const char byte = 1;
      (void)!::write(fd, &byte, 1);
    };
  };
  const pid_t child = ::fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (child == 0) {
    ::close(fds[0]);
    ::close(ready[1]);
    ::close(client_done[0]);
    side.ready_fd = ready[0];
    side.done = tell(client_done[1]);
    side.peer_done = Signal{ready[0]};
    run_client(side, fds[1]);
  }
  ::close(fds[1]);
  ::close(ready[0]);
  ::close(client_done[1]);
  side.ready_fd = ready[1];
  side.server = true;
  side.done = tell(ready[1]);
  side.peer_done = Signal{client_done[0]};
  SideResult server_result;
  std::string error;
  try {
    server_result = run_side(side);
  } catch (const std::exception& e) {
    error = e.what();
  }
  ::close(ready[1]);  // a client still waiting to start learns that the server failed
  ::close(client_done[0]);
  std::string text;
  char chunk[4096];
  for (ssize_t n; (n = ::read(fds[0], chunk, sizeof chunk)) > 0;) text.append(chunk, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::filesystem::remove(side.socket);
  const std::vector<double>& server = server_result.secs;
  std::vector<double> client;
  std::istringstream lines(text);
  std::string client_cpus;
  lines >> client_cpus;
  for (double t; lines >> t;) client.push_back(t);
  if (!error.empty() || client.size() != server.size() || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("memif run failed" + (error.empty() ? std::string(" in the client") : ": " + error));
  std::vector<double> gbps;
  for (std::size_t k = 0; k < server.size(); ++k) gbps.push_back(2.0 * static_cast<double>(side.block) * 8 / std::max(server[k], client[k]) / 1e9);
  std::sort(gbps.begin(), gbps.end());
  const double median = gbps[gbps.size() / 2];
  std::cout << "two engines, two processes, one core each, memif, MTU " << mtu << ", " << block_mib << " MiB each way, " << repeat << " runs\n"
            << "  server on CPU " << server_result.cpus << ", client on CPU " << client_cpus << "\n"
            << std::fixed << std::setprecision(2) << "  payload, both directions   median " << median << " Gbit/s (min " << gbps.front() << ", max "
            << gbps.back() << "), over the slower side's time\n"
            << "  per core                   median " << median / 2 << " Gbit/s\n";
  return 0;
}

}  // namespace memif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-engine-bench: payload goodput of two engines on one core over net_ring (or, with --memif, in two processes over memif)"};
  std::uint64_t block_mib = 256;
  int mtu = 1500, repeat = 5, snaplen = 64;
  std::string capture_dir = "/dev/shm";
  app.add_option("--block-mib", block_mib, "block per direction, MiB")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--mtu", mtu, "MTU")->check(CLI::Range(576, 9000))->capture_default_str();
  app.add_option("--repeat", repeat, "runs per figure; the best is reported")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--capture-dir", capture_dir, "where the capture runs write their pcap files")->capture_default_str();
  app.add_option("--snaplen", snaplen, "snap length of the second capture run")->capture_default_str();
  int handovers = 0;
  app.add_option("--handover", handovers, "instead: measure what a phase hand-over (a sender-based token) costs, over this many exchanges")
      ->check(CLI::Range(100, 1'000'000));
  int io_core = -1;
  app.add_option("--io-core", io_core,
                 "also run the copy and the cluster-key figures with an I/O lcore on this CPU (not the first, where the engines run), "
                 "which takes the bursts and checks every received frame")
      ->check(CLI::Range(1, 1023));
  bool over_memif = false;
  app.add_flag("--memif", over_memif, "instead: the two engines in two processes, one core each, joined by memif");
  std::string faults;
  app.add_option("--faults", faults, "with --memif: inject faults on both ports, for tests (\"drop=0.2,seed=3\")")
      ->check([](const std::string& spec) {
        try {
          nic::FaultOptions::parse(spec);
          return std::string();
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      });
  port_rate::Options port_rate;
  port_rate::add_options(app, port_rate);
  CLI11_PARSE(app, argc, argv);
  if (port_rate.asked()) return port_rate::run(port_rate, mtu, repeat);
  if (!faults.empty() && !over_memif) {
    std::cerr << "aapc-engine-bench: --faults goes with --memif\n";
    return 2;
  }
  if (over_memif) {
    try {
      return memif::bench(block_mib, mtu, repeat, faults);
    } catch (const std::exception& e) {
      std::cerr << "aapc-engine-bench: " << e.what() << "\n";
      return 1;
    }
  }

  try {
    nic::EalOptions eal;
    eal.memory_mb = 1024;
    eal.program = "aapc-engine-bench";
    // One core: this thread, pinned to the first CPU the process may use; an I/O lcore, where
    // asked, on another.
    eal.pin_main = 0;
    nic::eal_init(eal);
    Cable cable = make_cable(0, mtu);
    if (handovers > 0) {
      handover(*cable.a, *cable.b, handovers);
      return 0;
    }
    goodput(cable, block_mib, mtu, repeat, capture_dir, snaplen, io_core);
  } catch (const std::exception& e) {
    std::cerr << "aapc-engine-bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
