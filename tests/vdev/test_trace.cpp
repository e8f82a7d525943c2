// aapc-trace's analyses on captures of the vdev fabric: the summary counts what the engines
// counted, exactly; lost frames are resent at the right blocks; bad input gets clear errors.
#include <algorithm>
#include <catch2/catch.hpp>

#include <pcap/pcap.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/nic/capture.hpp"
#include "aapc/sched/sync.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "frames.hpp"
#include "paths.hpp"
#include "pcap_files.hpp"
#include "ring_ports.hpp"
#include "aapc/trace/trace.hpp"

using namespace aapc;
namespace fs = std::filesystem;

namespace {

struct Captured {
  sched::Topology topo;
  std::vector<std::vector<engine::ExchangeReport>> reports;  // by exchange, by rank
  std::vector<engine::EngineCounters> engines;
  std::uint64_t injected_drops = 0;
  test::ScratchDir dir;  // removed when the tests end
};

// A tree exchange with sender-based tokens and a synchronous shuffle on the 8-machine
// two-switch topology, through ports that drop 2% of frames each way, captured whole.
const Captured& lossy_run() {
  static Captured c = [] {
    Captured out{sched::load_topology(test::topology_path("8-two-switch")), {}, {}, 0, test::scratch_dir("trace-lossy")};
    auto opts = test::nodes(out.topo.machine_count());
    opts.faults = nic::FaultOptions::parse("drop=0.02,seed=11");
    opts.capture_dir = out.dir.string();
    {
      test::Fabric fabric(opts);
      std::uint32_t id = 1;
      for (const auto& [algo, sync] : std::vector<std::pair<std::string, std::string>>{{"tree", "sender-all"}, {"sync-shuffle", "none"}}) {
        auto s = sched::plan_sync(out.topo, sched::make_schedule(out.topo, *sched::AlgorithmSpec::parse(algo)), *sched::SyncSpec::parse(sync));
        auto run = test::run_exchange(fabric, s, id++, 30'000);
        test::expect_ok(run, algo + " + " + sync);
        out.reports.push_back(run.reports);
      }
      fabric.settle();
      // An exchange done here may still resend its tokens (it settles): its counters
      // as they stand now are what the captures hold.
      for (std::size_t e = 0; e < out.reports.size(); ++e)
        for (int i = 0; i < fabric.size(); ++i)
          if (auto rep = fabric.engine(i).report(static_cast<std::uint32_t>(e + 1))) out.reports[e][static_cast<std::size_t>(i)].counters = rep->counters;
      for (int i = 0; i < fabric.size(); ++i) {
        out.engines.push_back(fabric.engine(i).counters());
        out.injected_drops += fabric.faults(i)->rx_counts().dropped + fabric.faults(i)->tx_counts().dropped;
      }
    }  // the captures are flushed and closed
    return out;
  }();
  return c;
}

trace::Trace load(const Captured& c) {
  std::vector<trace::Capture> caps;
  for (int i = 0; i < c.topo.machine_count(); ++i) caps.push_back(trace::read_capture((c.dir / ("node" + std::to_string(i) + ".pcap")).string(), c.topo));
  return trace::Trace(c.topo, std::move(caps));
}

// A sealed frame of ours between two ranks of the fabric.
std::vector<std::uint8_t> frame(int src, int dst, engine::FrameType type, std::uint32_t exchange, std::uint32_t epoch, std::uint32_t seq = 0) {
  engine::Header h;
  h.type = type;
  h.exchange = exchange;
  h.epoch = epoch;
  h.seq = seq;
  return test::fabric_frame(h, src, dst);
}

bool mentions(const std::function<void()>& f, const std::string& words) {
  try {
    f();
  } catch (const trace::TraceError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(words) != std::string::npos);
    return true;
  }
  return false;
}

}  // namespace

TEST_CASE("the summary's byte and frame counts are the engines' counters, exactly") {
  const Captured& c = lossy_run();
  trace::Trace t = load(c);
  REQUIRE(t.exchanges() == std::vector<std::uint32_t>{1, 2});
  auto rows = trace::summarize(t);
  REQUIRE(rows.size() == 2 * 8);
  std::uint64_t retransmitted = 0, lost = 0;
  for (const auto& s : rows) {
    INFO("exchange " << s.exchange << " rank " << s.node);
    const auto& k = c.reports[s.exchange - 1][static_cast<std::size_t>(s.node)].counters;
    CHECK(s.data_frames_sent == k.data_frames_sent);
    CHECK(s.data_bytes_sent == k.data_bytes_sent);
    CHECK(s.retransmitted_frames == k.retransmitted_frames);
    CHECK(s.dummy_frames_sent == k.dummy_frames_sent);
    CHECK(s.data_frames_received == k.data_frames_received);
    CHECK(s.data_bytes_received == k.data_bytes_received);
    CHECK(s.syncs_sent == k.syncs_sent + k.syncs_resent);
    CHECK(s.nacks_sent == k.nacks_sent);
    CHECK(s.nacks_received == k.nacks_received);
    CHECK(s.bad_crc_frames == 0);
    CHECK(s.end > s.start);
    retransmitted += s.retransmitted_frames;
    lost += s.lost_frames;
  }
  CHECK(retransmitted > 0);  // the loss was there
  // Every frame an engine sent is in its capture; every frame dropped on the way is lost.
  std::uint64_t outside = 0;  // lost frames that belong to no exchange (PING, JOIN)
  for (const auto& cap : t.captures()) {
    std::uint64_t sent = 0;
    for (const auto& f : cap.frames) sent += f.tx ? 1 : 0;
    CHECK(sent == c.engines[static_cast<std::size_t>(cap.node)].frames_sent);
    for (const auto& f : cap.frames) outside += f.tx && (f.h.type == engine::FrameType::kPing || f.h.type == engine::FrameType::kJoin) ? 1 : 0;
  }
  CHECK(lost <= c.injected_drops);
  CHECK(lost + outside >= c.injected_drops);
}

TEST_CASE("a capture with injected loss shows the retransmissions at the right blocks") {
  const Captured& c = lossy_run();
  trace::Trace t = load(c);
  using Key = std::tuple<std::uint32_t, int, int, std::uint32_t>;  // exchange, src, dst, frame
  std::map<Key, int> trips, arrivals;
  std::set<Key> resent;
  for (const auto& cap : t.captures())
    for (const auto& f : cap.frames) {
      if (!f.data() || f.dummy()) continue;
      Key k{f.h.exchange, f.h.src, f.h.dst, f.h.seq};
      if (f.tx) ++trips[k];
      if (f.tx && f.retransmitted()) resent.insert(k);
      if (!f.tx) ++arrivals[k];
    }
  // A frame lost on the way: sent more often than it arrived.
  std::set<Key> lost;
  std::set<std::tuple<std::uint32_t, int, int>> lossy_blocks;
  for (const auto& [k, n] : trips)
    if (n > arrivals[k]) lost.insert(k), lossy_blocks.insert({std::get<0>(k), std::get<1>(k), std::get<2>(k)});
  REQUIRE(!lost.empty());
  // Every lost frame went again, and arrived in the end.
  for (const auto& k : lost) {
    INFO("exchange " << std::get<0>(k) << " " << std::get<1>(k) << "->" << std::get<2>(k) << " frame " << std::get<3>(k));
    CHECK(resent.count(k) == 1);
    CHECK(arrivals[k] >= 1);
  }
  // Only blocks that lost frames had frames resent (a lost ACK makes the sender poll, and the
  // receiver answers that it has everything: nothing is resent for it).
  for (const auto& k : resent) {
    INFO("resent: exchange " << std::get<0>(k) << " " << std::get<1>(k) << "->" << std::get<2>(k) << " frame " << std::get<3>(k));
    CHECK(lossy_blocks.count({std::get<0>(k), std::get<1>(k), std::get<2>(k)}) == 1);
  }
}

TEST_CASE("clock offsets: captures on one clock come out near zero") {
  trace::Trace t = load(lossy_run());
  for (const auto& k : t.clocks()) {
    INFO("rank " << k.node);
    CHECK(k.known);
    CHECK(std::abs(k.offset_ns) <= k.uncertainty_ns + 1000);
  }
}

TEST_CASE("bad input: clear messages, and unknown frames are counted, not fatal") {
  const Captured& c = lossy_run();
  auto dir = test::scratch_dir("trace-bad");
  SECTION("not a pcap") {
    std::ofstream(dir / "notes.pcap") << "these are not frames\n";
    CHECK(mentions([&] { trace::read_capture((dir / "notes.pcap").string(), c.topo); }, "not a pcap"));
    CHECK(mentions([&] { trace::read_capture((dir / "missing.pcap").string(), c.topo); }, "no such file"));
  }
  SECTION("a file cut in the middle of a frame: read up to the damage, with a warning") {
    // The cut falls inside the bytes of the first frame past half the file. (A cut at a fixed
    // offset fell on a frame's boundary now and then: that file reads as whole, and shorter.)
    auto whole = fs::file_size(c.dir / "node0.pcap");
    auto frames = test::read_pcap(c.dir / "node0.pcap");
    std::uintmax_t at = 24;  // past the file's header; each frame has a 16-byte header of its own
    std::size_t before = 0;
    while (before < frames.size() && (at < whole / 2 || frames[before].bytes.size() < 2)) at += 16 + frames[before++].bytes.size();
    REQUIRE(before < frames.size());
    auto cut = at + 16 + frames[before].bytes.size() / 2;
    fs::copy_file(c.dir / "node0.pcap", dir / "cut.pcap");
    fs::resize_file(dir / "cut.pcap", cut);
    auto cap = trace::read_capture((dir / "cut.pcap").string(), c.topo);
    CHECK(!cap.frames.empty());
    REQUIRE(cap.warnings.size() == 1);
    CHECK(cap.warnings[0].find("damaged after " + std::to_string(before) + " frames") != std::string::npos);
    // Cut at that frame's start instead, the file cannot tell: it reads whole, without a warning.
    fs::resize_file(dir / "cut.pcap", at);
    auto shorter = trace::read_capture((dir / "cut.pcap").string(), c.topo);
    CHECK(shorter.warnings.empty());
    CHECK(shorter.frames.size() == cap.frames.size());
  }
  SECTION("frames of other protocols are counted") {
    auto ours = frame(0, 1, engine::FrameType::kReady, 5, 77);
    auto ip = ours;
    ip[12] = 0x08, ip[13] = 0x00;  // IPv4
    test::write_pcap(dir / "n0.pcap", {ip, ours, ip});  // (named after its machine: 0 and 1 are ends of every frame)
    auto cap = trace::read_capture((dir / "n0.pcap").string(), c.topo);
    CHECK(cap.other_protocols == 2);
    CHECK(cap.frames.size() == 1);
    test::write_pcap(dir / "ip-only.pcap", {ip});
    CHECK(mentions([&] { trace::read_capture((dir / "ip-only.pcap").string(), c.topo); }, "none of them aapc frames"));
    test::write_pcap(dir / "raw.pcap", {ours}, DLT_RAW);
    CHECK(mentions([&] { trace::read_capture((dir / "raw.pcap").string(), c.topo); }, "not Ethernet"));
  }
  SECTION("captures of different runs, or two of one node") {
    using engine::FrameType;
    // Rank 0 (epochs: 0 is 77, 1 is 88) and rank 1 of another run (1 is 99), or of exchange 9.
    test::write_pcap(dir / "a.pcap", {frame(0, 1, FrameType::kReady, 5, 77), frame(1, 0, FrameType::kReady, 5, 88), frame(0, 2, FrameType::kReady, 5, 77)});
    test::write_pcap(dir / "b.pcap", {frame(1, 0, FrameType::kReady, 5, 99), frame(0, 1, FrameType::kReady, 5, 66), frame(1, 2, FrameType::kReady, 5, 99)});
    test::write_pcap(dir / "c.pcap", {frame(1, 0, FrameType::kReady, 9, 88), frame(0, 1, FrameType::kReady, 9, 77), frame(1, 2, FrameType::kReady, 9, 88)});
    auto read = [&](const char* name) { return trace::read_capture((dir / name).string(), c.topo); };
    CHECK(read("a.pcap").node == 0);
    CHECK(read("b.pcap").node == 1);
    CHECK(mentions([&] { trace::Trace(c.topo, {read("a.pcap"), read("b.pcap")}); }, "different runs"));
    CHECK(mentions([&] { trace::Trace(c.topo, {read("a.pcap"), read("c.pcap")}); }, "no exchange in common"));
    CHECK(mentions([&] { trace::Trace(c.topo, {read("a.pcap"), read("a.pcap")}); }, "both captures of"));
    // Between two machines only, the file's name tells whose capture it is.
    test::write_pcap(dir / "two.pcap", {frame(0, 1, FrameType::kReady, 5, 77), frame(1, 0, FrameType::kReady, 5, 88)});
    CHECK(mentions([&] { read("two.pcap"); }, "name the file after its machine"));
    fs::copy_file(dir / "two.pcap", dir / "n1.pcap");
    CHECK(read("n1.pcap").node == 1);
  }
}

// Traces compare the captures of different daemons on one clock (aapc-trace --same-clock), so
// a frame's stamp must be the wall clock at its burst. Found in CI: stamps extrapolated from
// the TSC at DPDK's rate (which DPDK rounds to 10 MHz when it measures it) drifted up to a
// second from their anchor, and the cluster suite's receiver-all trace then showed a block
// starting 0.55 ms before the one whose arrival released it had ended. This fails without the
// fix only on a host whose DPDK TSC rate is off by more than a few ppm (the windows are a few
// microseconds, and the old stamps drifted for a second); on the development VM DPDK's rate
// was within 0.3 ppm, and the old stamps stayed inside.
TEST_CASE("capture stamps are the wall clock at the burst, also seconds after the capture began") {
  test::start_eal();
  auto dir = test::scratch_dir("capture-clock");
  rte_ring* rx = test::ring("cclk-rx");
  rte_ring* tx = test::ring("cclk-tx");
  nic::PortOptions po;
  po.device = test::ring_port("cclk", rx, tx);
  po.mac = nic::MacAddr{{2, 0, 0, 0, 0, 9}};
  auto eth = nic::EthPort::open(po);
  auto wall_ns = [] {
    timespec t{};
    clock_gettime(CLOCK_REALTIME, &t);
    return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  };
  std::vector<std::pair<std::int64_t, std::int64_t>> windows;  // wall clock before and after each burst
  {
    nic::CapturePort cap(*eth, nic::CaptureOptions{(dir / "c.pcap").string()});
    for (int i = 0; i < 25; ++i) {  // 2.4 s: past any re-anchoring once a second
      rte_mbuf* m = rte_pktmbuf_alloc(eth->pool());
      REQUIRE(m != nullptr);
      std::memset(rte_pktmbuf_append(m, 60), i, 60);
      const std::int64_t before = wall_ns();
      REQUIRE(cap.tx_burst(&m, 1) == 1);
      windows.emplace_back(before, wall_ns());
      void* sent = nullptr;
      while (rte_ring_dequeue(tx, &sent) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(sent));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  auto frames = test::read_pcap(dir / "c.pcap");
  REQUIRE(frames.size() == windows.size());
  for (std::size_t i = 0; i < frames.size(); ++i) {
    INFO("burst " << i << ", " << (windows[i].first - windows.front().first) / 1'000'000 << " ms in: stamp " << frames[i].ns - windows[i].first
                  << " ns after the wall clock before it, window " << windows[i].second - windows[i].first << " ns");
    CHECK(frames[i].ns >= windows[i].first);
    CHECK(frames[i].ns <= windows[i].second);
  }
}

TEST_CASE("the hand-over analysis measures tokens' one-way times, frames ahead, the waiter's reaction and the blocks' share of the rate") {
  // Captures of ranks 0, 1 and 4 of 8-two-switch (100 Mbit/s links) with times chosen here:
  // tokens from 0 to 1 (two links) and to 4 (three) that take their own bits at every link,
  // plus 20 us, plus a quarter of a full frame at every link past the emitter's; rank 1 idle
  // until 7 us after its last token; a block from 1 to 0 sent at 80% of the rate and received at 90%.
  const sched::Topology topo = sched::load_topology(test::topology_path("8-two-switch"));
  auto dir = test::scratch_dir("trace-handover");
  const std::uint32_t ex = 7;
  const auto sync = [&](int to, std::uint32_t seq) { return frame(0, to, engine::FrameType::kSync, ex, 1, seq); };
  const double bit_ns = 10.0;  // at 100 Mbit/s
  const double full_frame_ns = (topo.mtu() + 14) * 8 * bit_ns;
  const double fixed_ns = 20'000, frames_ahead = 0.25;
  const auto one_way = [&](std::size_t bytes, int links) {
    return static_cast<std::int64_t>(static_cast<double>(bytes) * 8 * bit_ns * links + fixed_ns + frames_ahead * full_frame_ns * (links - 1));
  };
  std::vector<std::pair<std::int64_t, std::vector<std::uint8_t>>> n0, n1, n4;
  std::int64_t t = 1'000'000, last_in_1 = 0;
  for (std::uint32_t k = 0; k < 3; ++k, t += 1'000'000) {
    const auto to1 = sync(1, 10 + k), to4 = sync(4, 20 + k);
    n0.emplace_back(t, to1);
    n1.emplace_back(last_in_1 = t + one_way(to1.size(), 2), to1);
    n0.emplace_back(t + 500'000, to4);
    n4.emplace_back(t + 500'000 + one_way(to4.size(), 3), to4);
  }
  // A token received twice (resent) says nothing of one way: left out.
  const auto twice = sync(1, 30);
  n0.emplace_back(t, twice);
  n1.emplace_back(t + 50'000, twice);
  n1.emplace_back(t + 90'000, twice);
  const std::vector<std::uint8_t> payload(1400, 0xAB);
  engine::Header data;
  data.type = engine::FrameType::kData;
  data.exchange = ex;
  data.epoch = 1;
  const auto block_frame = [&](std::uint32_t seq) {
    data.seq = seq;
    return test::fabric_frame(data, 1, 0, payload);
  };
  const double frame_ns = static_cast<double>(block_frame(0).size()) * 8 * bit_ns;
  std::int64_t sent_at = last_in_1 + 7'000;
  for (std::uint32_t seq = 0; seq < 4; ++seq) {
    n1.emplace_back(sent_at + static_cast<std::int64_t>(seq * frame_ns / 0.8), block_frame(seq));
    n0.emplace_back(sent_at + 60'000 + static_cast<std::int64_t>(seq * frame_ns / 0.9), block_frame(seq));
  }
  for (auto* v : {&n0, &n1, &n4}) std::sort(v->begin(), v->end());
  test::write_pcap_at(dir / "n0.pcap", n0);
  test::write_pcap_at(dir / "n1.pcap", n1);
  test::write_pcap_at(dir / "n4.pcap", n4);
  std::vector<trace::Capture> caps;
  for (const char* name : {"n0.pcap", "n1.pcap", "n4.pcap"}) caps.push_back(trace::read_capture((dir / name).string(), topo));
  const trace::HandOverReport r = trace::hand_over(trace::Trace(topo, std::move(caps), true), std::nullopt);
  REQUIRE(r.tokens.size() == 6);
  CHECK(r.tokens_left_out == 1);
  for (const auto& k : r.tokens) CHECK(k.links == (k.to == 1 ? 2 : 3));
  REQUIRE(r.fitted);
  CHECK(r.fixed_ns == Approx(fixed_ns).margin(2.0));
  CHECK(r.frames_ahead == Approx(frames_ahead).margin(1e-4));
  REQUIRE(r.reactions_ns.size() == 1);
  CHECK(r.reactions_ns.front() == 7'000);
  REQUIRE(r.sent.size() == 1);
  REQUIRE(r.received.size() == 1);
  CHECK(r.sent.front() == Approx(0.8).epsilon(1e-4));
  CHECK(r.received.front() == Approx(0.9).epsilon(1e-4));
  // Tokens that all cross the same frame times cannot tell frames ahead from the fixed part.
  std::vector<trace::Capture> two;
  for (const char* name : {"n0.pcap", "n1.pcap"}) two.push_back(trace::read_capture((dir / name).string(), topo));
  const trace::HandOverReport same = trace::hand_over(trace::Trace(topo, std::move(two), true), std::nullopt);
  CHECK_FALSE(same.fitted);
  CHECK(same.frames_ahead == 0.0);
  CHECK(same.fixed_ns == Approx(fixed_ns + frames_ahead * full_frame_ns).margin(2.0));
  // Two blocks sent frame by frame in turn, as a shuffle sends them, each take a share of the
  // link: neither says what the link carried, so neither is counted.
  std::vector<std::pair<std::int64_t, std::vector<std::uint8_t>>> s1, r0, r2;
  for (std::uint32_t seq = 0; seq < 4; ++seq)
    for (int to : {0, 2}) {
      data.seq = seq;
      const auto f = test::fabric_frame(data, 1, to, payload);
      const std::int64_t at = 1'000'000 + static_cast<std::int64_t>((2 * seq + (to == 2 ? 1 : 0)) * frame_ns);
      s1.emplace_back(at, f);
      (to == 0 ? r0 : r2).emplace_back(at + 50'000, f);
    }
  const fs::path mix = dir / "shuffle";  // files named after their machines
  fs::create_directories(mix);
  test::write_pcap_at(mix / "n1.pcap", s1);
  test::write_pcap_at(mix / "n0.pcap", r0);
  test::write_pcap_at(mix / "n2.pcap", r2);
  std::vector<trace::Capture> shuffle;
  for (const char* name : {"n1.pcap", "n0.pcap", "n2.pcap"}) shuffle.push_back(trace::read_capture((mix / name).string(), topo));
  const trace::HandOverReport mixed = trace::hand_over(trace::Trace(topo, std::move(shuffle), true), std::nullopt);
  CHECK(mixed.sent.empty());
  CHECK(mixed.received.size() == 2);  // each receiver got its block alone
}
