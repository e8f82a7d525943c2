// An unreachable peer, replayed and forged frames through net_pcap, and the golden trace.
#include <catch2/catch.hpp>

#include <pcap/pcap.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <unistd.h>

#include <filesystem>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "paths.hpp"
#include "pcap_files.hpp"

using namespace aapc;
using namespace aapc::sched;
using engine::DropReason;
namespace fs = std::filesystem;

namespace {

using test::read_pcap;
using test::scratch_dir;
using test::write_pcap;

std::uint64_t drops(const engine::Engine& e, DropReason r) { return e.counters().drops[static_cast<std::size_t>(r)]; }

// Every node of the fabric starts exchange 1 of `s` with blocks of `block` bytes; the
// buffers are returned, to outlive the exchange.
std::vector<std::vector<std::uint8_t>> start_everywhere(test::Fabric& fabric, const Schedule& s, std::size_t block) {
  const auto n = static_cast<std::size_t>(fabric.size());
  std::vector<std::vector<std::uint8_t>> buffers(2 * n, std::vector<std::uint8_t>(n * block, 1));
  for (std::size_t me = 0; me < n; ++me) {
    auto spec = engine::exchange_spec(s, static_cast<int>(me), 1);
    for (std::size_t p = 0; p < n; ++p) {
      spec.send[p] = {buffers[me].data() + p * block, block};
      spec.recv[p] = {buffers[n + me].data() + p * block, block};
    }
    REQUIRE(fabric.engine(static_cast<int>(me)).start(std::move(spec)));
  }
  return buffers;
}

// Steps the fabric until every node reported its exchange (false after 10 s: a hang).
bool every_report(test::Fabric& fabric, std::vector<std::optional<engine::ExchangeReport>>& reports) {
  reports.assign(static_cast<std::size_t>(fabric.size()), std::nullopt);
  return fabric.run_until(
      [&] {
        for (int me = 0; me < fabric.size(); ++me)
          for (auto& r : fabric.engine(me).take_finished()) reports[static_cast<std::size_t>(me)] = r;
        return std::all_of(reports.begin(), reports.end(), [](const auto& r) { return r.has_value(); });
      },
      std::chrono::milliseconds(10'000));
}

// Every report failed, and those of the others name the victim.
void expect_victim_named(const std::vector<std::optional<engine::ExchangeReport>>& reports, int victim, const std::string& name) {
  for (std::size_t me = 0; me < reports.size(); ++me) {
    const auto& r = *reports[me];
    INFO("rank " << me << ": " << r.error);
    CHECK(r.state == engine::ExchangeState::kFailed);
    if (static_cast<int>(me) != victim) {
      CHECK_THAT(r.error, Catch::Contains(name));
      CHECK((r.code == Errc::kPeerSilent || r.code == Errc::kPeerAborted));
    }
  }
}

}  // namespace

TEST_CASE("an unreachable peer: the others report an error naming it within the deadline") {
  const auto deadline = std::chrono::milliseconds(400);
  for (bool mid_exchange : {false, true}) {
    INFO((mid_exchange ? "cut off during the exchange" : "cut off from the start"));
    auto opts = test::nodes(6);
    opts.tune = [&](engine::EngineConfig& c) {
      c.peer_deadline = deadline;
      c.pace_bps = 1'000'000'000;  // the exchange lasts long enough to be cut in the middle
    };
    test::Fabric fabric(opts);
    Topology t = single_switch_topology(6);
    Schedule s = plan_sync(t, make_schedule(t, {Algorithm::kTree, 0}), {SyncKind::kSenderAll, 1});
    const int victim = 3;
    if (!mid_exchange) fabric.unplug(victim);
    const auto buffers = start_everywhere(fabric, s, 400'000);
    if (mid_exchange) {
      fabric.run_until([] { return false; }, std::chrono::milliseconds(5));
      fabric.unplug(victim);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::optional<engine::ExchangeReport>> reports;
    REQUIRE(every_report(fabric, reports));  // nothing hangs
    auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took < deadline + std::chrono::milliseconds(600));
    expect_victim_named(reports, victim, "rank 3 (02:00:00:00:00:04)");
    // Resources are released: every mbuf is back in its pool once the fabric is quiet.
    fabric.settle();
    for (int me = 0; me < 6; ++me) {
      CHECK(fabric.engine(me).quiet());
      CHECK(rte_mempool_avail_count(fabric.engine(me).config().peers.empty() ? nullptr : fabric.eth(me).pool()) == 4095);
    }
  }
}

// A node of a paced shuffle sends its blocks for the whole exchange, while every peer's block
// streams in. A peer that stops mid-block (its daemon killed) is found silent about a deadline
// later, not a deadline after the node's own last frame has left: here each block takes 2 s
// at its paced rate, and the deadline is 0.4 s.
TEST_CASE("a peer that stops in the middle of its block is found silent within about the deadline, by nodes still sending") {
  const auto deadline = std::chrono::milliseconds(400);
  auto opts = test::nodes(6);
  opts.tune = [&](engine::EngineConfig& c) { c.peer_deadline = deadline; };
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(6, 10'000'000);
  Schedule s = paced_shuffle_schedule(TreeModel(t));
  const std::size_t block = 500'000;  // 2 s at the block rate, about 2 Mbit/s
  REQUIRE(static_cast<double>(block) * 8 / static_cast<double>(s.block_rate_bps) > 1.8);
  const auto buffers = start_everywhere(fabric, s, block);
  fabric.run_until([] { return false; }, std::chrono::milliseconds(200));
  const int victim = 2;
  fabric.unplug(victim);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::optional<engine::ExchangeReport>> reports;
  REQUIRE(every_report(fabric, reports));
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO("every node reported " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms after the cut");
  CHECK(took < deadline + std::chrono::milliseconds(600));
  expect_victim_named(reports, victim, "rank 2 (02:00:00:00:00:03)");
}

// An ABORT is one frame. A member that lost it used to wait for the failed node's block until
// its own stall deadline (15 s on the cluster at 30% loss), the failed node answering its
// keepalives and READYs as if still in the exchange.
TEST_CASE("a member that lost a failed node's ABORT hears it again at its next frame and fails within the deadline") {
  const auto deadline = std::chrono::milliseconds(300);
  int aborts = 0;
  auto opts = test::nodes(2);
  opts.tune = [&](engine::EngineConfig& c) { c.peer_deadline = deadline; };
  opts.drop = [&](int src, int, const engine::Header& h) { return src == 0 && h.type == engine::FrameType::kAbort && aborts++ == 0; };
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(2);
  Schedule s = plan_sync(t, make_schedule(t, {Algorithm::kTree, 0}), {SyncKind::kSenderAll, 1});
  const auto buffers = start_everywhere(fabric, s, 50'000);
  fabric.engine(0).abort(1, "its client went away");  // before rank 0 sent a frame of its block
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::optional<engine::ExchangeReport>> reports;
  REQUIRE(every_report(fabric, reports));
  const auto took = std::chrono::steady_clock::now() - t0;
  const auto& r = *reports[1];
  INFO("rank 1 reported " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms after the abort: " << r.error);
  CHECK(took < deadline + std::chrono::milliseconds(600));
  CHECK(aborts >= 2);  // the first was lost
  CHECK(fabric.engine(0).counters().aborts_resent >= 1);
  CHECK(r.state == engine::ExchangeState::kFailed);
  CHECK(r.code == Errc::kPeerAborted);
  CHECK_THAT(r.error, Catch::Contains("aborted by peer rank 0: rank 0: its client went away"));
}

// A peer that answers is alive, even while every answer to one frame is lost: at 30% loss per
// port direction 41 tries of a token all went unanswered about once in a hundred cluster runs,
// and the token's sender failed the exchange although the peer answered its pings.
TEST_CASE("a live peer whose acknowledgements are lost for longer than the retries is not given up") {
  using engine::FrameType;
  const auto deadline = std::chrono::milliseconds(300);
  auto opts = test::nodes(4);
  opts.tune = [&](engine::EngineConfig& c) {
    c.peer_deadline = deadline;
    c.rto_max = std::chrono::milliseconds(10);  // 41 tries in about 0.4 s
  };
  auto until = std::chrono::steady_clock::time_point::max();
  int lost = 0;
  // Lost until `until`: every answer that tells a token, a READY or a block arrived.
  opts.drop = [&](int, int, const engine::Header& h) {
    const bool answer = h.type == FrameType::kNack ||
                        (h.type == FrameType::kAck && (h.aux != static_cast<std::uint32_t>(FrameType::kPing) || (h.flags & engine::kFlagAckList) != 0));
    const bool drop = answer && std::chrono::steady_clock::now() < until;
    lost += drop ? 1 : 0;
    return drop;
  };
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(4);
  Schedule s = plan_sync(t, make_schedule(t, {Algorithm::kTree, 0}), {SyncKind::kSenderAll, 1});
  REQUIRE_FALSE(s.syncs.empty());
  const auto window = std::chrono::milliseconds(1'200);  // 4 deadlines, 3 times the 41 tries
  const auto t0 = std::chrono::steady_clock::now();
  until = t0 + window;
  auto run = test::run_exchange(fabric, s, 1, 50'000, std::chrono::milliseconds(20'000));
  INFO(lost << " answers lost");
  CHECK(lost > 50);
  test::expect_ok(run, "answers lost for 1.2 s");
  CHECK(std::chrono::steady_clock::now() - t0 >= window);  // no sender is done before its blocks' ACKs
}

TEST_CASE("replayed, forged and lying frames are dropped and counted; the buffer is untouched") {
  auto dir = scratch_dir("replay");
  Topology t = single_switch_topology(2);
  const std::uint64_t block = 10'000;
  // An earlier exchange between ranks 0 and 1, captured.
  {
    auto opts = test::nodes(2);
    opts.capture_dir = dir.string();
    test::Fabric fabric(opts);
    auto run = test::run_exchange(fabric, make_schedule(t, {Algorithm::kRing, 0}), 1, block);
    REQUIRE(run.byte_exact);
    fabric.settle();
  }
  auto captured = read_pcap(dir / "node1.pcap");
  REQUIRE(captured.size() >= 10);  // data both ways, READY, ACK

  // Forged frames for a live exchange (id 10) at rank 1, which posted a block of `block`
  // bytes from rank 0.
  const engine::MacAddr m0 = test::Fabric::mac(0), m1 = test::Fabric::mac(1);
  const std::uint32_t chunk = 1500 - engine::kDataHeaderLen;
  auto forge = [&](engine::Header h, std::size_t payload, const engine::MacAddr& src_mac, std::optional<std::uint16_t> claimed_len = {}) {
    std::vector<std::uint8_t> f(engine::frame_overhead(h.type) + payload, 0x5A);
    h.epoch = 77;
    h.src = 0;
    h.dst = 1;
    h.payload_len = claimed_len.value_or(static_cast<std::uint16_t>(payload));
    engine::encode(f.data(), m1, src_mac, engine::kDefaultEtherType, h);
    if (claimed_len) {
      std::vector<std::uint8_t> padded(engine::frame_overhead(h.type) + *claimed_len, 0x5A);
      std::copy(f.begin(), f.end(), padded.begin());
      engine::seal(padded.data());  // a valid CRC over more bytes than the frame will carry
      padded.resize(f.size());
      return padded;
    }
    engine::seal(f.data());
    return f;
  };
  engine::Header data;
  data.type = engine::FrameType::kData;
  data.exchange = 10;
  std::vector<std::vector<std::uint8_t>> forged;
  forged.push_back(forge(data, chunk, {0x02, 0x99, 0, 0, 0, 1}));  // unknown source MAC
  engine::Header h = data;
  h.flags = engine::kFlagLast;
  forged.push_back(forge(h, chunk, m0));  // the last frame of a first pass: a block of another length than posted
  h = data;
  h.seq = 1000;
  forged.push_back(forge(h, chunk, m0));  // frame index beyond the block
  h = data;
  forged.push_back(forge(h, chunk - 1, m0));  // payload shorter than the frame's share
  h = data;
  forged.push_back(forge(h, chunk + 1, m0));  // longer than any frame of the receiver's cut
  h = data;
  h.seq = engine::frame_count(block, chunk) - 1;
  forged.push_back(forge(h, engine::frame_payload(block, chunk, h.seq), m0, static_cast<std::uint16_t>(1400)));  // claims more than it carries
  h = data;
  h.exchange = 11;
  forged.push_back(forge(h, chunk, m0));  // an exchange that is not live
  engine::Header nack;
  nack.type = engine::FrameType::kNack;
  nack.exchange = 10;
  nack.block_len = block;
  nack.chunk = static_cast<std::uint16_t>(chunk);
  nack.seq = 1;
  {
    std::vector<std::uint8_t> f(engine::kFrameOverhead + 8);
    engine::encode(f.data(), m1, m0, engine::kDefaultEtherType, [&] {
      engine::Header x = nack;
      x.epoch = 77;
      x.src = 0;
      x.dst = 1;
      x.payload_len = 8;
      return x;
    }());
    engine::put_nack_range(f.data() + engine::kFrameOverhead, 0, 5, 1000);  // beyond the block
    engine::seal(f.data());
    forged.push_back(f);
  }
  std::vector<std::vector<std::uint8_t>> replay;
  for (const auto& f : captured) replay.push_back(f.bytes);
  replay.insert(replay.end(), forged.begin(), forged.end());
  write_pcap(dir / "replay.pcap", replay);

  // Rank 1 again, on a net_pcap port that plays the file, running exchange 10.
  test::start_eal();
  nic::PortOptions po;
  po.device = "net_pcap_replay0,rx_pcap=" + (dir / "replay.pcap").string() + ",tx_pcap=" + (dir / "tx.pcap").string();
  po.mac = m1;
  po.pool_size = 1023;
  auto port = nic::EthPort::open(po);
  engine::EngineConfig cfg;
  cfg.rank = 1;
  cfg.peers = {m0, m1};
  engine::Engine eng(*port, cfg);
  // An earlier exchange ran here too (ids only grow): start 9 and 10.
  Schedule s = make_schedule(t, {Algorithm::kRing, 0});
  std::vector<std::uint8_t> out(block, 1), in(block, 0xEE), out2(block, 1), in2(block, 0xEE);
  for (std::uint32_t id : {9U, 10U}) {
    auto spec = engine::exchange_spec(s, 1, id);
    spec.send[0] = {id == 9 ? out.data() : out2.data(), block};
    spec.recv[0] = {id == 9 ? in.data() : in2.data(), block};
    REQUIRE(eng.start(std::move(spec)));
  }
  for (int i = 0; i < 2000; ++i) eng.poll();
  std::string counts;
  for (int d = 0; d < engine::kDropReasons; ++d)
    if (eng.counters().drops[static_cast<std::size_t>(d)] > 0)
      counts += std::string(engine::drop_reason_name(static_cast<DropReason>(d))) + "=" + std::to_string(eng.counters().drops[static_cast<std::size_t>(d)]) + " ";
  INFO("drops: " << counts);
  CHECK(std::all_of(in2.begin(), in2.end(), [](std::uint8_t b) { return b == 0xEE; }));  // untouched
  CHECK(std::all_of(in.begin(), in.end(), [](std::uint8_t b) { return b == 0xEE; }));
  CHECK(drops(eng, DropReason::kNotLive) >= captured.size() / 2);  // the earlier exchange's frames
  CHECK(drops(eng, DropReason::kNotForUs) > 0);                      // those rank 1 itself sent
  CHECK(drops(eng, DropReason::kUnknownSource) == 1);
  CHECK(drops(eng, DropReason::kUnexpectedBlock) == 3);  // another length, index beyond, short payload
  CHECK(drops(eng, DropReason::kBadOffset) == 2);        // longer than a chunk, NACK range
  CHECK(drops(eng, DropReason::kBadLength) == 1);
  auto r = eng.report(10);
  REQUIRE(r);
  CHECK(r->counters.data_frames_received == 0);
  eng.abort(9, "test over");
  eng.abort(10, "test over");
}

TEST_CASE("golden trace: a 4-node synchronous shuffle puts its data frames in the schedule's packet order") {
  auto dir = scratch_dir("golden");
  const int p = 4;
  const std::uint32_t frames_per_block = 5;
  {
    auto opts = test::nodes(p);
    opts.capture_dir = dir.string();
    test::Fabric fabric(opts);
    const std::uint64_t block = static_cast<std::uint64_t>(fabric.engine(0).chunk()) * frames_per_block;
    auto run = test::run_exchange(fabric, sync_shuffle_schedule(p), 1, block);
    REQUIRE(run.byte_exact);
    fabric.settle();
  }
  for (int me = 0; me < p; ++me) {
    INFO("rank " << me);
    std::vector<std::pair<int, std::uint32_t>> order;  // (destination, frame index) as sent
    for (const auto& f : read_pcap(dir / ("node" + std::to_string(me) + ".pcap"))) {
      auto h = engine::peek(f.bytes);
      if (!h || h->type != engine::FrameType::kData || h->src != me) continue;
      order.emplace_back(h->dst, h->seq);
    }
    // Alg. 2: at instant i the frame goes to (me + i) mod p; frame f of every destination
    // before frame f + 1 of any.
    std::vector<std::pair<int, std::uint32_t>> expected;
    for (std::uint32_t f = 0; f < frames_per_block; ++f)
      for (int i = 1; i < p; ++i) expected.emplace_back((me + i) % p, f);
    CHECK(order == expected);
  }
}
