// Payload sent without a copy: frames whose payload is an mbuf attached to
// the sender's registered memory, chained behind a header mbuf, over net_ring. Exchanges are
// byte-exact with such frames, retransmissions too, captures hold them whole, and faults that
// change bytes never change the sender's memory.
#include <catch2/catch.hpp>
#include <net/if.h>
#include <rte_mbuf.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "skip.hpp"
#include "aapc/nic/extmem.hpp"
#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/wire/wire.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "loopback.hpp"
#include "mapping.hpp"
#include "pcap_files.hpp"
#include "recording_port.hpp"

using namespace aapc;
using namespace aapc::sched;

namespace {

std::uint64_t zero_copy_frames(test::Fabric& fabric) {
  std::uint64_t n = 0;
  for (int i = 0; i < fabric.size(); ++i) n += fabric.engine(i).counters().zero_copy_frames;
  return n;
}

// Exchanges of a few sizes and algorithms; every one byte-exact, and its frames gone from the
// send buffers before they are freed.
std::uint64_t run_some(test::Fabric& fabric, std::uint32_t& id, const std::string& what) {
  Topology t = single_switch_topology(fabric.size());
  const std::uint64_t chunk = fabric.engine(0).chunk();
  std::uint64_t attached = 0;
  for (std::uint64_t block : {std::uint64_t{100}, chunk, 3 * chunk + 300, std::uint64_t{256} * 1024}) {
    for (const char* algo : {"ring", "sync-shuffle"}) {
      auto run = test::run_exchange(fabric, test::planned(t, algo, "none"), id++, block);
      test::expect_ok(run, what + " " + algo + " block " + std::to_string(block));
      CHECK(run.in_flight_left == 0);
      attached += run.attached;
    }
  }
  return attached;
}

}  // namespace

TEST_CASE("zero copy over net_ring at MTU 1500 and 9000: byte-exact, data frames in two segments") {
  for (int mtu : {1500, 9000}) {
    INFO("MTU " << mtu);
    auto opts = test::nodes(4);
    opts.mtu = mtu;
    opts.zero_copy = true;
    if (mtu == 1500) opts.tune = [](engine::EngineConfig& c) { c.zero_copy_min = 256; };  // 9000: the default
    test::Fabric fabric(opts);
    std::uint32_t id = 1;
    const std::uint64_t attached = run_some(fabric, id, "MTU " + std::to_string(mtu));
    fabric.settle();
    // Every frame attached to a send buffer went through the switch as a chained frame with
    // an external last segment, and the engines counted them. (Eager blocks, of a few frames,
    // go from the exchange's own copy; the 256 KiB blocks are attached.)
    CHECK(attached >= 4 * 3 * 2 * ((256 * 1024) / fabric.engine(0).chunk()));
    CHECK(fabric.switched_external() == attached);
    CHECK(zero_copy_frames(fabric) == attached);
  }
}

TEST_CASE("zero copy: the copy path stays without a region, with a cluster key, and below the threshold") {
  std::uint32_t id = 1;
  {
    test::Fabric fabric(test::nodes(4));  // no regions given
    CHECK(run_some(fabric, id, "no region") == 0);
    CHECK(fabric.switched_external() == 0);
    CHECK(zero_copy_frames(fabric) == 0);
  }
  {
    auto opts = test::nodes(4);  // MTU 1500, the default threshold: full frames copied
    opts.zero_copy = true;
    test::Fabric fabric(opts);
    run_some(fabric, id, "default threshold");
    CHECK(fabric.switched_external() == 0);
  }
  auto opts = test::nodes(4);
  opts.zero_copy = true;
  opts.tune = [](engine::EngineConfig& c) {
    c.key = engine::FrameKey{};
    c.zero_copy_min = 256;
  };
  test::Fabric fabric(opts);
  CHECK(run_some(fabric, id, "keyed") == 0);  // a tag follows the payload: copied
  CHECK(fabric.switched_external() == 0);
}

TEST_CASE("zero copy with loss, duplicates, reordering and corruption: byte-exact, retransmissions right") {
  auto opts = test::nodes(4);
  opts.zero_copy = true;
  opts.tune = [](engine::EngineConfig& c) { c.zero_copy_min = 256; };
  opts.faults = nic::FaultOptions::parse("drop=0.02,dup=0.01,reorder=0.02,corrupt=0.01,truncate=0.005,seed=21");
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(4);
  std::uint64_t retransmitted = 0, attached = 0;
  std::uint32_t id = 1;
  for (std::uint64_t block : {std::uint64_t{20'000}, std::uint64_t{200'000}}) {
    for (const char* algo : {"ring", "pairwise", "sync-shuffle"}) {
      auto run = test::run_exchange(fabric, test::planned(t, algo, "none"), id++, block);
      test::expect_ok(run, std::string(algo) + " block " + std::to_string(block));
      CHECK(run.in_flight_left == 0);
      CHECK(run.send_intact);
      attached += run.attached;
      for (const auto& r : run.reports) retransmitted += r.counters.retransmitted_frames;
    }
  }
  CHECK(retransmitted > 0);
  CHECK(attached > 0);
  std::uint64_t corrupted = 0;
  for (int i = 0; i < 4; ++i) corrupted += fabric.faults(i)->rx_counts().corrupted + fabric.faults(i)->tx_counts().corrupted;
  CHECK(corrupted > 0);
}

TEST_CASE("zero copy: a capture holds the chained frames whole") {
  auto dir = test::scratch_dir("zero-copy-capture");
  const int p = 3;
  std::uint64_t chunk = 0;
  {
    auto opts = test::nodes(p);
    opts.zero_copy = true;
    opts.tune = [](engine::EngineConfig& c) { c.zero_copy_min = 256; };
    opts.capture_dir = dir.string();
    test::Fabric fabric(opts);
    chunk = fabric.engine(0).chunk();
    std::uint32_t id = 1;
    auto run = test::run_exchange(fabric, test::planned(single_switch_topology(p), "ring", "none"), id, 10 * chunk);
    test::expect_ok(run, "ring");
    CHECK(fabric.switched_external() > 0);
    fabric.settle();
  }
  for (int me = 0; me < p; ++me) {
    INFO("node " << me);
    std::size_t full = 0;
    for (const auto& f : test::read_pcap(dir / ("node" + std::to_string(me) + ".pcap"))) {
      CHECK(f.bytes.size() == f.len);
      auto h = engine::peek(f.bytes);  // the CRC, over the whole captured frame, matches
      REQUIRE(h.has_value());
      if (h->type == engine::FrameType::kData && h->payload_len == chunk) ++full;
    }
    CHECK(full >= 2 * 2 * 10);  // ten frames to each of two peers, sent and received
  }
}

TEST_CASE("zero copy: corruption and truncation change a copy of the frame, never the sender's memory") {
  test::start_eal();
  rte_mempool* pool = rte_pktmbuf_pool_create("zc_faults", 1023, 0, 0, 2048, 0);
  REQUIRE(pool != nullptr);
  std::vector<std::uint8_t> buffer(1000, 0xAB);
  {
    nic::ExternalRegion region(buffer.data(), buffer.size());
    test::RecordingPort sink(pool);
    nic::FaultPort faults(sink, nic::FaultOptions::parse("corrupt=1,seed=5"));
    std::vector<std::uint8_t> header(64, 0x11);
    constexpr int kFrames = 50;
    for (int i = 0; i < kFrames; ++i) {
      rte_mbuf* m = rte_pktmbuf_alloc(pool);
      REQUIRE(m != nullptr);
      std::memcpy(rte_pktmbuf_append(m, 64), header.data(), 64);
      rte_mbuf* data = region.attach(buffer.data(), static_cast<std::uint16_t>(buffer.size()));
      REQUIRE(data != nullptr);
      REQUIRE(rte_pktmbuf_chain(m, data) == 0);
      REQUIRE(faults.tx_burst(&m, 1) == 1);
    }
    CHECK(region.in_flight() == 0);  // the frames were copied and freed
    REQUIRE(sink.frames.size() == kFrames);
    // The bit flipped lands anywhere past the Ethernet header: mostly in the payload, which
    // the frames that left carry changed, while the buffer they came from is as it was.
    int payload_hit = 0;
    for (const auto& f : sink.frames) {
      REQUIRE(f.size() == 64 + buffer.size());
      if (!std::equal(buffer.begin(), buffer.end(), f.begin() + 64)) ++payload_hit;
    }
    CHECK(payload_hit > kFrames / 2);
    CHECK(std::all_of(buffer.begin(), buffer.end(), [](std::uint8_t b) { return b == 0xAB; }));
    CHECK(faults.tx_counts().corrupted == kFrames);
  }
  rte_mempool_free(pool);
}

TEST_CASE("the daemon unmaps a freed buffer only once no frame carries its bytes") {
  test::start_eal();
  const auto page = static_cast<std::size_t>(::getpagesize());
  auto mapped = [&](void* p) { return ::msync(p, page, MS_ASYNC) == 0; };  // ENOMEM once unmapped
  auto map = [&] {
    void* p = ::mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    return engine::Mapping{static_cast<std::uint8_t*>(p), 4 * page, 0, 0, std::make_unique<nic::ExternalRegion>(p, 4 * page)};
  };
  engine::Unmapper unmapper;
  engine::Mapping busy = map(), idle = map();
  void* busy_at = busy.data;
  void* idle_at = idle.data;
  // A frame (say, a retransmission queued on the port) carries bytes of `busy`.
  rte_mbuf* frame = busy.region->attach(busy.data + page, 1000);
  REQUIRE(frame != nullptr);
  unmapper.release(std::move(busy));
  unmapper.release(std::move(idle));
  CHECK_FALSE(mapped(idle_at));  // nothing in flight: unmapped at once
  CHECK(mapped(busy_at));        // the frame may still be read
  CHECK(unmapper.held() == 1);
  unmapper.reap();
  CHECK(mapped(busy_at));
  rte_pktmbuf_free(frame);  // the port is done with it
  unmapper.reap();
  CHECK(unmapper.held() == 0);
  CHECK_FALSE(mapped(busy_at));
}


// Last: it moves the test process into a network namespace of its own.
TEST_CASE("zero copy over net_af_packet (what aapcd uses): a chained frame with an external payload leaves whole", "[root]") {
  if (::unshare(CLONE_NEWNET) != 0) {
    AAPC_SKIP("creating a network namespace needs root (CAP_SYS_ADMIN)");
  }
  test::start_eal();
  REQUIRE(test::loopback_up());
  nic::PortOptions po;
  po.device = "net_af_packet_zc0,iface=lo,qdisc_bypass=0";
  po.pool_size = 1023;
  auto port = nic::EthPort::open(po);
  REQUIRE(port->zero_copy_tx());
  std::vector<std::uint8_t> payload(1400);
  for (std::size_t k = 0; k < payload.size(); ++k) payload[k] = static_cast<std::uint8_t>(k * 13 + k / 199);
  const std::uint8_t head[14] = {0x02, 0, 0, 0, 0, 0x42, 0x02, 0, 0, 0, 0, 0x43, 0x88, 0xB5};
  nic::ExternalRegion region(payload.data(), payload.size());
  rte_mbuf* m = rte_pktmbuf_alloc(port->pool());
  REQUIRE(m != nullptr);
  std::memcpy(rte_pktmbuf_append(m, sizeof head), head, sizeof head);
  rte_mbuf* data = region.attach(payload.data(), static_cast<std::uint16_t>(payload.size()));
  REQUIRE(data != nullptr);
  REQUIRE(rte_pktmbuf_chain(m, data) == 0);
  REQUIRE(port->tx_burst(&m, 1) == 1);
  CHECK(region.in_flight() == 0);  // af_packet copied it into its ring and freed it
  bool back = false;
  for (int i = 0; i < 1000 && !back; ++i) {
    rte_mbuf* got[8];
    const std::uint16_t n = port->rx_burst(got, 8);
    for (std::uint16_t k = 0; k < n; ++k) {
      const std::vector<std::uint8_t> f = test::frame_bytes(got[k]);
      if (f.size() == sizeof head + payload.size() && std::equal(std::begin(head), std::end(head), f.begin()) &&
          std::equal(payload.begin(), payload.end(), f.begin() + sizeof head))
        back = true;
      rte_pktmbuf_free(got[k]);
    }
    if (!back) ::usleep(1000);
  }
  CHECK(back);
  CHECK(port->device_stats().tx_errors == 0);
}
