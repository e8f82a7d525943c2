// Jumbo frames (MTU 9000): exchanges byte-exact over net_ring and net_pcap with 9014-byte
// frames, and net_af_packet with its ring sized for them (on the loopback interface of a
// network namespace of this test's own, so the host's interfaces are not touched).
#include <catch2/catch.hpp>
#include <net/if.h>
#include <rte_mbuf.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "skip.hpp"
#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/wire/wire.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "loopback.hpp"
#include "pcap_files.hpp"

using namespace aapc;
using namespace aapc::sched;

namespace {

constexpr int kJumbo = 9000;
constexpr std::uint32_t kJumboFrame = kJumbo + 14;

// The frames of a capture, by length on the wire.
std::uint32_t longest(const std::vector<test::PcapFrame>& frames) {
  std::uint32_t n = 0;
  for (const auto& f : frames) n = std::max(n, f.len);
  return n;
}

}  // namespace

TEST_CASE("MTU 9000 over net_ring: exchanges byte-exact, data frames of 9014 bytes") {
  auto dir = test::scratch_dir("jumbo-ring");
  const int p = 4;
  {
    auto opts = test::nodes(p);
    opts.mtu = kJumbo;
    opts.capture_dir = dir.string();
    test::Fabric fabric(opts);
    const std::uint64_t chunk = fabric.engine(0).chunk();
    REQUIRE(chunk == kJumbo - engine::kDataHeaderLen);  // the payload per frame follows the MTU
    Topology t = single_switch_topology(p);
    std::uint32_t id = 1;
    for (std::uint64_t block : {std::uint64_t{1}, chunk - 1, chunk, 3 * chunk + 17, std::uint64_t{256} * 1024})
      for (const char* algo : {"ring", "pairwise", "sync-shuffle"})
        test::expect_ok(test::run_exchange(fabric, test::planned(t, algo, "none"), id++, block),
                        std::string(algo) + " block " + std::to_string(block));
    fabric.settle();
  }
  for (int me = 0; me < p; ++me) {
    auto frames = test::read_pcap(dir / ("node" + std::to_string(me) + ".pcap"));
    INFO("node " << me);
    CHECK(longest(frames) == kJumboFrame);
    std::size_t full = 0;
    for (const auto& f : frames) {
      auto h = engine::peek(f.bytes);
      if (h && h->type == engine::FrameType::kData && h->payload_len == kJumbo - engine::kDataHeaderLen) {
        CHECK(f.len == kJumboFrame);
        ++full;
      }
    }
    CHECK(full > 100);  // 256 KiB blocks are 30 full frames each, sent and received
  }
}

TEST_CASE("MTU 9000 over net_pcap: a block received from 9014-byte frames in a pcap file is byte-exact") {
  auto dir = test::scratch_dir("jumbo-pcap");
  Topology t = single_switch_topology(2);
  Schedule s = make_schedule(t, {Algorithm::kRing, 0});
  const std::uint64_t block = 3 * (kJumbo - engine::kDataHeaderLen) + 17;
  {
    auto opts = test::nodes(2);
    opts.mtu = kJumbo;
    opts.capture_dir = dir.string();
    test::Fabric fabric(opts);
    test::expect_ok(test::run_exchange(fabric, s, 1, block), "ring p=2");
    fabric.settle();
  }
  // What rank 1 received from rank 0, played to a rank 1 on a net_pcap port.
  std::vector<std::vector<std::uint8_t>> from0;
  for (const auto& f : test::read_pcap(dir / "node1.pcap")) {
    auto h = engine::peek(f.bytes);
    if (h && h->src == 0 && h->dst == 1) from0.push_back(f.bytes);
  }
  REQUIRE(std::any_of(from0.begin(), from0.end(), [](const auto& f) { return f.size() == kJumboFrame; }));
  test::write_pcap(dir / "rx.pcap", from0);
  test::start_eal();
  nic::PortOptions po;
  po.device = "net_pcap_jumbo0,rx_pcap=" + (dir / "rx.pcap").string() + ",tx_pcap=" + (dir / "tx.pcap").string();
  po.mac = test::Fabric::mac(1);
  po.mtu = kJumbo;
  po.pool_size = 1023;
  std::vector<std::uint8_t> in(block, 0xEE), out(block, 1);
  {
    auto port = nic::EthPort::open(po);
    engine::EngineConfig cfg;
    cfg.rank = 1;
    cfg.peers = {test::Fabric::mac(0), test::Fabric::mac(1)};
    cfg.mtu = kJumbo;
    engine::Engine eng(*port, cfg);
    auto spec = engine::exchange_spec(s, 1, 1);
    spec.send[0] = {out.data(), block};
    spec.recv[0] = {in.data(), block};
    REQUIRE(eng.start(std::move(spec)));
    for (int i = 0; i < 2000; ++i) eng.poll();
    CHECK(eng.counters().frames_received == from0.size());
    eng.abort(1, "test over");
  }
  for (std::uint64_t k = 0; k < block; ++k) {
    if (in[k] == test::pattern(0, 1, 1, k)) continue;
    FAIL("byte " << k << " of the block from rank 0 is " << int{in[k]});
  }
  // Rank 1 answered on the port: its frames are in the transmit capture, none longer than the MTU's.
  auto sent = test::read_pcap(dir / "tx.pcap");
  CHECK(!sent.empty());
  CHECK(longest(sent) <= kJumboFrame);
}


TEST_CASE("MTU 9000 over net_af_packet: the ring is sized for the MTU, and an interface with a smaller MTU is refused by name", "[root]") {
  // A network namespace of this thread's own: its loopback is ours to reconfigure.
  if (::unshare(CLONE_NEWNET) != 0) {
    AAPC_SKIP("creating a network namespace needs root (CAP_SYS_ADMIN)");
  }
  test::start_eal();
  nic::PortOptions po;
  po.device = "net_af_packet_jumbo0,iface=lo,qdisc_bypass=0";
  po.mtu = kJumbo;
  po.pool_size = 1023;
  REQUIRE(test::loopback_up(1500));
  try {
    nic::EthPort::open(po);
    FAIL("opened af_packet at MTU 9000 on an interface of MTU 1500");
  } catch (const nic::NicError& e) {
    CHECK_THAT(e.what(), Catch::Contains("interface lo has MTU 1500") && Catch::Contains("ip link set lo mtu 9000"));
  }
  REQUIRE(test::loopback_up(kJumbo));
  auto port = nic::EthPort::open(po);  // landed main: "configuring failed: Invalid argument"
  // A 9014-byte frame out and back in whole: the ring slot and the mbufs hold it.
  std::vector<std::uint8_t> frame(kJumboFrame);
  for (std::size_t k = 0; k < frame.size(); ++k) frame[k] = static_cast<std::uint8_t>(k * 7 + k / 251);
  const std::uint8_t head[14] = {0x02, 0, 0, 0, 0, 0x42, 0x02, 0, 0, 0, 0, 0x43, 0x88, 0xB5};
  std::copy(std::begin(head), std::end(head), frame.begin());
  rte_mbuf* m = rte_pktmbuf_alloc(port->pool());
  REQUIRE(m != nullptr);
  std::memcpy(rte_pktmbuf_append(m, static_cast<std::uint16_t>(frame.size())), frame.data(), frame.size());
  REQUIRE(port->tx_burst(&m, 1) == 1);
  bool back = false;
  for (int i = 0; i < 1000 && !back; ++i) {
    rte_mbuf* got[8];
    const std::uint16_t n = port->rx_burst(got, 8);
    for (std::uint16_t k = 0; k < n; ++k) {
      INFO("received " << rte_pktmbuf_pkt_len(got[k]) << " bytes in " << int{got[k]->nb_segs} << " segments");
      if (rte_pktmbuf_pkt_len(got[k]) == frame.size() && got[k]->nb_segs == 1 &&
          std::memcmp(rte_pktmbuf_mtod(got[k], const void*), frame.data(), frame.size()) == 0)
        back = true;
      rte_pktmbuf_free(got[k]);
    }
    if (!back) ::usleep(1000);
  }
  CHECK(back);
  CHECK(port->device_stats().tx_errors == 0);
}

// An exchange that receives at least EngineConfig::stream_bytes, in frames of at
// least stream_min_chunk bytes, writes the payloads around the caches (non-temporal stores,
// fenced once a burst). Such exchanges stay byte-exact however the frames come: in order,
// placed while parsed; attached to the senders' memory; through an I/O lcore, which leaves the
// copy to the exchange; with losses, duplicates and reordering, whose resent frames fill holes
// among streamed ones. Smaller exchanges, and frames below stream_min_chunk, keep the caches.
TEST_CASE("MTU 9000: exchanges that receive more than stream_bytes write around the caches, byte-exact") {
  const int p = 4;
  const std::uint64_t threshold = 3 * 256 * 1024;  // what a rank receives from 3 peers of 256 KiB
  struct Mode {
    const char* what;
    bool zero_copy, io_lcore;
    const char* faults;
  };
  for (const Mode& mode : {Mode{"placed while parsed", false, false, nullptr}, Mode{"zero copy", true, false, nullptr},
                           Mode{"I/O lcore", false, true, nullptr}, Mode{"faults", false, false, "drop=0.05,dup=0.02,reorder=0.05,depth=4,seed=11"}}) {
    INFO(mode.what);
    auto opts = test::nodes(p);
    opts.mtu = kJumbo;
    opts.zero_copy = mode.zero_copy;
    opts.io_lcore = mode.io_lcore;
    if (mode.faults != nullptr) opts.faults = nic::FaultOptions::parse(mode.faults);
    opts.tune = [&](engine::EngineConfig& c) { c.stream_bytes = threshold; };
    test::Fabric fabric(opts);
    const std::uint64_t chunk = fabric.engine(0).chunk();
    Topology t = single_switch_topology(p);
    std::uint32_t id = 1;
    for (std::uint64_t block : {std::uint64_t{256} * 1024, std::uint64_t{256} * 1024 - 1, 40 * chunk + 4031, std::uint64_t{1} << 20})
      for (const char* algo : {"ring", "sync-shuffle"}) {
        const std::string what = std::string(algo) + " block " + std::to_string(block);
        auto run = test::run_exchange(fabric, test::planned(t, algo, "none"), id++, block);
        test::expect_ok(run, what);
        INFO(what);
        for (const auto& r : run.reports) CHECK(r.counters.streamed == (3 * block >= threshold));
      }
    fabric.settle();
  }
}

TEST_CASE("stream_min_chunk: at MTU 1500 payloads keep the caches, unless the bound is lowered") {
  for (std::uint32_t min_chunk : {std::uint32_t{4096}, std::uint32_t{0}}) {
    INFO("stream_min_chunk " << min_chunk);
    auto opts = test::nodes(4);
    opts.tune = [&](engine::EngineConfig& c) {
      c.stream_bytes = 0;
      c.stream_min_chunk = min_chunk;
    };
    test::Fabric fabric(opts);
    Topology t = single_switch_topology(4);
    std::uint32_t id = 1;
    for (std::uint64_t block : {std::uint64_t{1}, std::uint64_t{1455}, std::uint64_t{100'003}}) {
      auto run = test::run_exchange(fabric, test::planned(t, "sync-shuffle", "none"), id++, block);
      test::expect_ok(run, "block " + std::to_string(block));
      for (const auto& r : run.reports) CHECK(r.counters.streamed == (min_chunk == 0));
    }
    fabric.settle();
  }
}
