// I/O lcores: a second thread takes a port's bursts, checks every received
// frame's CRC (and tag) and seals every frame sent, while the engines run in the test's thread. Exchanges stay
// byte-exact at MTU 1500 and 9000, with and without a cluster key; frames corrupted on the
// way are caught on the lcore; a flag set on a frame before it is received never passes for a
// check; frames queued before the lcore stops still leave; an idle lcore sleeps until the
// engine rings it. And the pool an AF_XDP port's UMEM is made of lies end to end.
#include <catch2/catch.hpp>
#include <poll.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "skip.hpp"
#include "aapc/nic/eal.hpp"
#include "aapc/nic/eth_port.hpp"
#include "aapc/nic/io_lcore.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/wire/wire.hpp"
#include "checks.hpp"
#include "fabric.hpp"

using namespace aapc;
using namespace aapc::sched;

namespace {

struct Totals {
  std::uint64_t received = 0, prechecked = 0, bad_crc = 0, bad_auth = 0;
};

Totals totals(test::Fabric& fabric) {
  Totals t;
  for (int i = 0; i < fabric.size(); ++i) {
    const auto& k = fabric.engine(i).counters();
    t.received += k.frames_received;
    t.prechecked += k.rx_prechecked;
    t.bad_crc += k.drops[static_cast<std::size_t>(engine::DropReason::kBadCrc)];
    t.bad_auth += k.drops[static_cast<std::size_t>(engine::DropReason::kBadAuth)];
  }
  return t;
}

// Every engine with the same cluster key.
void with_key(engine::EngineConfig& c) {
  engine::FrameKey k{};
  k.bytes.fill(0x5a);
  c.key = k;
}

void run_some(test::Fabric& fabric, std::uint32_t& id, const std::string& what) {
  Topology t = single_switch_topology(fabric.size());
  const std::uint64_t chunk = fabric.engine(0).chunk();
  for (std::uint64_t block : {std::uint64_t{1}, chunk, 3 * chunk + 17, std::uint64_t{256} * 1024})
    for (const char* algo : {"ring", "sync-shuffle"})
      test::expect_ok(test::run_exchange(fabric, test::planned(t, algo, "none"), id++, block), what + " " + algo + " block " + std::to_string(block));
}

// Port options for a net_ring ethdev of one queue each way over `rx` and `tx`, made for `base`.
nic::PortOptions ring_device(const std::string& base, rte_ring** rx, rte_ring** tx) {
  test::start_eal();
  *rx = rte_ring_create((base + "rx").c_str(), 256, static_cast<int>(rte_socket_id()), RING_F_SP_ENQ | RING_F_SC_DEQ);
  *tx = rte_ring_create((base + "tx").c_str(), 256, static_cast<int>(rte_socket_id()), RING_F_SP_ENQ | RING_F_SC_DEQ);
  REQUIRE((*rx != nullptr && *tx != nullptr));
  const int id = rte_eth_from_rings(base.c_str(), rx, 1, tx, 1, rte_socket_id());
  REQUIRE(id >= 0);
  char name[RTE_ETH_NAME_MAX_LEN];
  rte_eth_dev_get_name_by_port(static_cast<std::uint16_t>(id), name);
  nic::PortOptions po;
  po.device = name;
  po.pool_size = 511;
  return po;
}

// A net_ring port of its own, its two rings kept for the test to fill and drain.
struct RingPort {
  rte_ring* rx = nullptr;
  rte_ring* tx = nullptr;
  std::unique_ptr<nic::EthPort> eth;
  explicit RingPort(const std::string& base) : eth(nic::EthPort::open(ring_device(base, &rx, &tx))) {}
  ~RingPort() {
    eth.reset();
    rte_mbuf* m = nullptr;
    for (rte_ring* r : {rx, tx}) {
      while (rte_ring_dequeue(r, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
      rte_ring_free(r);
    }
  }
  RingPort(const RingPort&) = delete;
  RingPort& operator=(const RingPort&) = delete;
};

rte_mbuf* frame_of(rte_mempool* pool, std::uint8_t fill) {
  rte_mbuf* m = rte_pktmbuf_alloc(pool);
  REQUIRE(m != nullptr);
  char* p = rte_pktmbuf_append(m, 100);
  std::memset(p, fill, 100);
  return m;
}

// A hook that says every frame is good: what a check that passed looks like to the engine.
void approve_all(rte_mbuf** frames, std::uint16_t n, std::uint64_t flag, const void* /*context*/) {
  for (std::uint16_t i = 0; i < n; ++i) frames[i]->ol_flags |= flag;
}

}  // namespace

TEST_CASE("I/O lcore: exchanges byte-exact at MTU 1500 and 9000, every frame checked on the lcore") {
  for (int mtu : {1500, 9000}) {
    for (bool keyed : {false, true}) {
      INFO("MTU " << mtu << (keyed ? ", cluster key" : ""));
      auto opts = test::nodes(4);
      opts.mtu = mtu;
      opts.io_lcore = true;
      if (keyed) opts.tune = with_key;
      test::Fabric fabric(opts);
      // Frames leave the engines unsealed, and are sealed on the lcore.
      for (int i = 0; i < fabric.size(); ++i) REQUIRE(fabric.offload(i)->tx_seal_flag() != 0);
      std::uint32_t id = 1;
      run_some(fabric, id, "MTU " + std::to_string(mtu));
      fabric.settle();
      const Totals t = totals(fabric);
      CHECK(t.received > 0);
      CHECK(t.prechecked == t.received);  // nothing on the way changed a byte
      CHECK(t.bad_crc == 0);
      CHECK(t.bad_auth == 0);
    }
  }
}

TEST_CASE("I/O lcore: frames corrupted or truncated before the check are dropped, and the exchanges recover") {
  for (bool keyed : {false, true}) {
    INFO((keyed ? "cluster key" : "no key"));
    auto opts = test::nodes(4);
    opts.io_lcore = true;
    nic::FaultOptions f;
    f.seed = 11;
    f.corrupt = {0.01, nic::Direction::kRx};
    f.truncate = {0.005, nic::Direction::kRx};
    opts.faults = f;
    if (keyed) opts.tune = with_key;
    test::Fabric fabric(opts);
    std::uint32_t id = 1;
    run_some(fabric, id, keyed ? "keyed" : "unkeyed");
    fabric.settle();
    const Totals t = totals(fabric);
    std::uint64_t corrupted = 0;
    for (int i = 0; i < fabric.size(); ++i) corrupted += fabric.faults(i)->rx_counts().corrupted;
    REQUIRE(corrupted > 0);
    // Every frame the injector changed failed the lcore's check, and the engine's own found it.
    CHECK(t.prechecked < t.received);
    CHECK(t.bad_crc + t.bad_auth > 0);
  }
}

TEST_CASE("I/O lcore: a frame that arrives with the checked flag set does not pass for checked") {
  RingPort rp("iol_flag");
  nic::OffloadPort port(*rp.eth);
  nic::IoLcore io;
  io.serve_rx(port);  // no hook: nothing is checked, so no frame may carry the flag
  io.start();
  // rx_verified_flag() is 0 without a hook; the bit is the same dynamic flag either way.
  nic::OffloadPort probe(*rp.eth);
  nic::IoLcore hooked;
  hooked.serve_rx(probe, {&approve_all, nullptr});
  const std::uint64_t flag = probe.rx_verified_flag();
  REQUIRE(flag != 0);
  CHECK(port.rx_verified_flag() == 0);
  rte_mbuf* m = frame_of(rp.eth->pool(), 0xab);
  m->ol_flags |= flag;  // as a sender's mbuf handed over by net_ring might carry it
  REQUIRE(rte_ring_enqueue(rp.rx, m) == 0);
  rte_mbuf* got = nullptr;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (port.rx_burst(&got, 1) == 0 && std::chrono::steady_clock::now() < until) got = nullptr;
  REQUIRE(got != nullptr);
  CHECK((got->ol_flags & flag) == 0);
  CHECK(rte_pktmbuf_mtod(got, const std::uint8_t*)[0] == 0xab);
  rte_pktmbuf_free(got);
}

TEST_CASE("I/O lcore: what was sent before it stops leaves; a direction is served once") {
  RingPort rp("iol_stop");
  nic::OffloadPort port(*rp.eth);
  {
    nic::IoLcore io;
    io.serve_tx(port);
    CHECK_THROWS_AS(io.serve_tx(port), nic::NicError);
    io.start();
    rte_mbuf* m[40];
    for (int i = 0; i < 40; ++i) m[i] = frame_of(rp.eth->pool(), static_cast<std::uint8_t>(i));
    REQUIRE(port.tx_burst(m, 40) == 40);
    io.stop();
    CHECK(port.tx_pending() == 0);
  }
  CHECK(rte_ring_count(rp.tx) == 40);
  rte_mbuf* first = nullptr;
  REQUIRE(rte_ring_dequeue(rp.tx, reinterpret_cast<void**>(&first)) == 0);
  CHECK(rte_pktmbuf_mtod(first, const std::uint8_t*)[0] == 0);  // in the order sent
  rte_pktmbuf_free(first);

  // The fault injector keeps state across its two directions: one lcore must serve both.
  nic::FaultOptions f;
  f.drop = {0.5, nic::Direction::kBoth};
  nic::FaultPort faults(*rp.eth, f);
  nic::OffloadPort over_faults(faults);
  nic::IoLcore rx, tx;
  rx.serve_rx(over_faults);
  CHECK_THROWS_AS(tx.serve_tx(over_faults), nic::NicError);
  nic::IoLcore both;
  nic::OffloadPort over_faults2(faults);
  both.serve_rx(over_faults2);
  CHECK_NOTHROW(both.serve_tx(over_faults2));
  // An ethdev's queues are apart: two lcores may serve it.
  nic::OffloadPort over_eth(*rp.eth);
  nic::IoLcore erx, etx;
  erx.serve_rx(over_eth);
  CHECK_NOTHROW(etx.serve_tx(over_eth));
}

TEST_CASE("I/O lcores on two transmit queues: exchanges byte-exact, both queues carry frames, none resent for frames passing each other") {
  for (bool keyed : {false, true}) {
    INFO((keyed ? "cluster key" : "no key"));
    auto opts = test::nodes(4);
    opts.io_lcore = true;
    opts.tx_queues = 2;
    if (keyed) opts.tune = with_key;
    test::Fabric fabric(opts);
    for (int i = 0; i < fabric.size(); ++i) {
      REQUIRE(fabric.eth(i).tx_queue_count() == 2);
      REQUIRE(fabric.offload(i)->tx_queues() == 2);
      REQUIRE(fabric.offload(i)->tx_seal_flag() != 0);  // both queues' lcores seal
    }
    std::uint32_t id = 1;
    run_some(fabric, id, keyed ? "keyed" : "unkeyed");
    fabric.settle();
    std::uint64_t resent = 0;
    for (int i = 0; i < fabric.size(); ++i) {
      resent += fabric.engine(i).counters().drops[static_cast<std::size_t>(engine::DropReason::kDuplicate)];
      rte_eth_stats st{};
      REQUIRE(rte_eth_stats_get(fabric.eth(i).port_id(), &st) == 0);
      INFO("node " << i << ": queue 0 sent " << st.q_opackets[0] << ", queue 1 " << st.q_opackets[1]);
      CHECK(st.q_opackets[0] > 0);  // its peers' frames went out on both queues
      CHECK(st.q_opackets[1] > 0);
    }
    // A destination's frames keep to one queue, so a block's LAST frame never passes the
    // frames before it: the switch takes the queues in turn, and a frame overtaken would be
    // NACKed, resent, and arrive twice.
    CHECK(resent == 0);
    const Totals t = totals(fabric);
    CHECK(t.prechecked == t.received);
    CHECK(t.bad_crc + t.bad_auth == 0);
  }
}

TEST_CASE("I/O lcores on several transmit queues: destinations spread evenly; a queue nobody serves, or one the port lacks, is refused") {
  // aapc-emu's and the fabric's MACs count up in their last bytes.
  for (std::uint16_t queues : {2, 3, 4}) {
    std::vector<int> per(queues, 0);
    for (int rank = 0; rank < 64; ++rank) ++per[nic::OffloadPort::tx_queue_of(test::Fabric::mac(rank).data(), queues)];
    for (int n : per) CHECK(n >= 64 / queues - 1);
  }
  auto opts = test::nodes(2);
  opts.tx_queues = 2;  // no lcores: the test serves the port itself
  test::Fabric fabric(opts);
  nic::OffloadPort port(fabric.eth(0));
  REQUIRE(port.tx_queues() == 2);
  nic::IoLcore io, other;
  io.serve_rx(port);
  io.serve_tx(port, {}, 0);
  CHECK_THROWS_WITH(other.serve_tx(port, {}, 2), Catch::Contains("no queue 2"));
  CHECK_THROWS_WITH(io.start(), Catch::Contains("transmit queue 1") && Catch::Contains("never leave"));
  other.serve_tx(port, {}, 1);
  CHECK_NOTHROW(io.start());
  CHECK_NOTHROW(other.start());
  // A wrapper that keeps state across frames has one queue.
  nic::FaultPort faults(fabric.eth(1), nic::FaultOptions{});
  CHECK(faults.tx_queue_count() == 1);
  // A device of one transmit queue, asked for two, says so.
  rte_ring *rx = nullptr, *tx = nullptr;
  nic::PortOptions two = ring_device("iolq_one", &rx, &tx);
  two.queues = 2;
  CHECK_THROWS_WITH(nic::EthPort::open(two), Catch::Contains("1 transmit queue(s), fewer than the 2"));  // and closed it
  rte_ring_free(rx);
  rte_ring_free(tx);
}

// The process's set is the one it had when the EAL started: the EAL may pin the thread that
// starts an lcore to one CPU (-l; aapc-engine-bench does), and that is no reason to refuse
// another CPU of the set. aapcd under a taskset that leaves the CPU out is refused, saying so:
// the cluster suite's "aapcd --io-cores" case (a process can only be started under one).
TEST_CASE("I/O lcore: a CPU of the process's set is taken though the calling thread is pinned elsewhere; one the machine lacks is refused", "[cpus]") {
  test::start_eal();
  const std::vector<int> cpus = nic::allowed_cpus();
  REQUIRE(!cpus.empty());
  RingPort rp("iol_cpu");
  {
    nic::IoLcore beyond({static_cast<int>(std::thread::hardware_concurrency()), "aapc-io-test"});
    nic::OffloadPort port(*rp.eth);
    beyond.serve_rx(port);
    CHECK_THROWS_WITH(beyond.start(), Catch::Contains("no CPU"));
  }
  if (cpus.size() < 2) {
    AAPC_SKIP("the rest needs two CPUs in this process's set");
  }
  cpu_set_t saved;
  REQUIRE(sched_getaffinity(0, sizeof saved, &saved) == 0);
  struct Restore {
    cpu_set_t set;
    ~Restore() { sched_setaffinity(0, sizeof set, &set); }
  } restore{saved};
  cpu_set_t only;
  CPU_ZERO(&only);
  CPU_SET(static_cast<unsigned>(cpus[0]), &only);
  REQUIRE(sched_setaffinity(0, sizeof only, &only) == 0);  // as the EAL's -l pins its main thread
  nic::IoLcore io({cpus[1], "aapc-io-test"});
  nic::OffloadPort port(*rp.eth);
  io.serve_rx(port);
  CHECK_NOTHROW(io.start());
}

namespace {

// The thread of this process named `name`: its voluntary context switches so far.
long voluntary_switches(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string have;
    std::getline(comm, have);
    if (have != name) continue;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(line.find(':') + 1));
  }
  return -1;
}

template <typename F>
bool eventually(F&& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("I/O lcore: idle, it sleeps in poll(2) instead of spinning, and the engine's frames ring it awake") {
  RingPort rp("iol_nap");
  nic::OffloadPort port(*rp.eth);
  nic::IoLcore io({-1, "aapc-naptest"});
  io.serve_tx(port);
  io.start();
  REQUIRE(eventually([&] { return io.naps() > 0; }));
  // Asleep, it wakes only at its safety timeout (20 times a second). Spinning with short
  // sleeps, as it did, an idle lcore switched tens of thousands of times a second, and eight
  // idle daemons with two each left no CPU of two idle (an emulated cluster stalled).
  const long before = voluntary_switches("aapc-naptest");
  REQUIRE(before >= 0);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  CHECK(voluntary_switches("aapc-naptest") - before < 200);
  for (int round = 0; round < 3; ++round) {
    // Once it has gone to sleep again, frames put into its ring wake it.
    const std::uint64_t naps = io.naps(), rung = io.doorbells();
    REQUIRE(eventually([&] { return io.naps() > naps; }));
    rte_mbuf* m[8];
    for (auto*& f : m) f = frame_of(rp.eth->pool(), static_cast<std::uint8_t>(round));
    REQUIRE(port.tx_burst(m, 8) == 8);
    CHECK(eventually([&] { return rte_ring_count(rp.tx) == 8; }));
    CHECK(eventually([&] { return io.doorbells() > rung; }));
    rte_mbuf* out[8];
    rte_pktmbuf_free_bulk(out, rte_ring_dequeue_burst(rp.tx, reinterpret_cast<void**>(out), 8, nullptr));
  }
  io.stop();
}

TEST_CASE("An AF_XDP port's pool lies end to end, as the UMEM its driver registers assumes, also without hugepages") {
  test::start_eal();
  // net_af_xdp (DPDK 22.11) registers mbufs x object size from the first object as the
  // socket's UMEM. On 4 KiB pages a default pool put each 2,368-byte mbuf on a page of its
  // own: the last 42% of the pool lay outside, frames sent from there never left, and the
  // fill queue lost each one given to it until the port received nothing.
  for (int mtu : {1500, 9000}) {
    rte_mempool* pool = nic::frame_pool("net_af_xdp_layout" + std::to_string(mtu) + ",iface=none", 77, mtu, 4095);
    REQUIRE(pool != nullptr);
    std::vector<std::uintptr_t> objects;
    rte_mempool_obj_iter(pool, [](rte_mempool*, void* list, void* obj, unsigned) { static_cast<std::vector<std::uintptr_t>*>(list)->push_back(reinterpret_cast<std::uintptr_t>(obj)); }, &objects);
    REQUIRE(objects.size() == pool->populated_size);
    const auto [first, last] = std::minmax_element(objects.begin(), objects.end());
    const std::uintptr_t object = rte_mempool_calc_obj_size(pool->elt_size, pool->flags, nullptr);
    CHECK(*last - *first == (pool->populated_size - 1) * object);
  }
}

TEST_CASE("I/O lcore: an engine asleep on the port's descriptor is rung awake by the frames its receiving lcore takes") {
  // The engine slept 30-200 us at a time, polling, while an lcore received for it.
  RingPort rp("iol_bell");
  nic::OffloadPort port(*rp.eth);
  nic::IoLcore io;
  io.serve_rx(port);
  io.start();
  REQUIRE(port.wait_fd() >= 0);
  pollfd p{port.wait_fd(), POLLIN, 0};
  for (int round = 0; round < 3; ++round) {
    REQUIRE(port.arm_wait());  // nothing waits: it may sleep
    CHECK(::poll(&p, 1, 0) == 0);
    rte_mbuf* in[4];
    for (auto*& f : in) f = frame_of(rp.eth->pool(), static_cast<std::uint8_t>(round));
    REQUIRE(rte_ring_enqueue_burst(rp.rx, reinterpret_cast<void**>(in), 4, nullptr) == 4);  // the device receives them
    CHECK(::poll(&p, 1, 5000) == 1);
    port.disarm_wait();
    unsigned got = 0;
    CHECK(eventually([&] {
      rte_mbuf* out[8];
      const std::uint16_t n = port.rx_burst(out, 8);
      rte_pktmbuf_free_bulk(out, n);
      return (got += n) == 4;
    }));
    // Quiet again for the next sleep, once the engine has polled the port (the lcore writes
    // the doorbell, then says so: a poll between the two leaves one spurious wake-up, no more).
    CHECK(eventually([&] {
      rte_mbuf* none[1];
      REQUIRE(port.rx_burst(none, 1) == 0);
      return ::poll(&p, 1, 0) == 0;
    }));
  }
  // Frames that wait already: no sleep.
  rte_mbuf* f = frame_of(rp.eth->pool(), 9);
  REQUIRE(rte_ring_enqueue(rp.rx, f) == 0);
  CHECK(eventually([&] { return !port.arm_wait(); }));
  io.stop();
}
