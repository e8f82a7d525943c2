// Pacing and waking at scale (README, "Scale"): what an engine does between frames, and when
// its sender-based tokens leave.
#include <catch2/catch.hpp>

#include <algorithm>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "pcap_files.hpp"

using namespace aapc;
using namespace aapc::sched;

namespace {

using test::planned;

std::uint32_t be32(const std::uint8_t* p) { return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3]; }
std::uint16_t be16(const std::uint8_t* p) { return static_cast<std::uint16_t>((p[0] << 8) | p[1]); }

}  // namespace

// Found at 64 machines on two cores: engines with a running exchange but nothing to do woke
// every timer period (500 us) and together starved the nodes that were sending.
TEST_CASE("an engine that waits sleeps until its earliest deadline, not the timer period") {
  auto opts = test::nodes(3);
  opts.tune = [](engine::EngineConfig& c) {
    c.rto = std::chrono::milliseconds(40);
    c.eager_frames = 0;  // the blocks wait for READY (eager ones would be sent at once)
  };
  test::Fabric fabric(opts);
  fabric.unplug(2);  // rank 2 never acknowledges our READY: a retransmission is due
  Topology t = single_switch_topology(3);
  Schedule s = planned(t, "ring", "none");
  std::vector<std::vector<std::uint8_t>> send(3, std::vector<std::uint8_t>(4000, 1)), recv(3, std::vector<std::uint8_t>(4000, 0));
  // Only rank 0 starts: its READYs go out, and no peer's READY comes back.
  auto start_rank0 = [&](test::Fabric& f) {
    auto spec = engine::exchange_spec(s, 0, 1);
    for (std::size_t r = 0; r < 3; ++r) {
      spec.send[r] = {send[r].data(), send[r].size()};
      spec.recv[r] = {recv[r].data(), recv[r].size()};
    }
    REQUIRE(f.engine(0).start(std::move(spec)));
    f.settle(std::chrono::milliseconds(5));  // the READYs that arrive are acknowledged (kept as early)
  };
  start_rank0(fabric);
  auto& eng = fabric.engine(0);
  const auto now = engine::Clock::now();
  const auto wake = eng.next_event(now) - now;
  // No data can go (no READY from the peers); the next thing due is READY's retransmission
  // to rank 2, one RTO (40 ms) after the first, less the time settle() took.
  CHECK(wake > std::chrono::milliseconds(2));
  CHECK(wake <= eng.config().rto);
  // Once every control frame is answered, the next deadline is the keepalive.
  test::Fabric calm(opts);
  start_rank0(calm);
  const auto now2 = engine::Clock::now();
  CHECK(calm.engine(0).next_event(now2) - now2 > std::chrono::milliseconds(50));
  CHECK(calm.engine(0).report(1)->state == engine::ExchangeState::kRunning);
}

// Found at 64 machines: a daemon woken late catches up with a burst (the bucket allows one),
// and the burst waits in the next switch's queue. Its sender-based token used to leave right
// after the burst, so the next user of the link started while the burst was still queued; over
// hundreds of hand-overs on a link that is never idle the queue overflowed. The token is now
// handed over no earlier than the round's last frame can start to leave at the paced rate.
TEST_CASE("a late engine's burst holds back its sender-based tokens until the frames ahead have drained") {
  Topology t = single_switch_topology(4);
  Schedule s = planned(t, "pairwise", "sender-all");
  // A token that travels between two nodes after a round of data.
  const Sync* token = nullptr;
  for (const auto& sync : s.syncs)
    if (sync.trigger == SyncTrigger::kAfterSend && sync.from != sync.to && sync.from_round >= 0) {
      token = &sync;
      break;
    }
  REQUIRE(token != nullptr);
  const Round& round = s.programs[static_cast<std::size_t>(token->from)].rounds[static_cast<std::size_t>(token->from_round)];
  REQUIRE(round.sends.size() == 1);
  const Rank dst = round.sends.front().dst;

  const std::uint64_t rate = 20'000'000;  // a 1514-byte frame every 0.6 ms
  auto scratch = test::scratch_dir("pacing-burst");
  auto opts = test::nodes(4);
  opts.capture_dir = scratch.string();
  opts.capture_snaplen = 64;
  opts.tune = [&](engine::EngineConfig& c) { c.pace_bps = rate; };
  opts.late_node = token->from;  // polled every 2.5 ms: it sends 4 frames at a time
  opts.late_period = std::chrono::microseconds(2500);
  const std::uint64_t block = 40 * 1456;
  {
    test::Fabric fabric(opts);
    auto run = test::run_exchange(fabric, s, 1, block);
    test::expect_ok(run, "pairwise + sender-all with a late node");
  }
  // From the late node's capture: when its last frame to `dst` can have started to leave at
  // the paced rate (a frame cannot start before it was handed over, nor before the previous
  // one has left), and when the token went.
  const double frame_ns = 1514.0 * 8e9 / static_cast<double>(rate);
  double drained = 0, last_start = 0;
  std::int64_t sync_sent = -1;
  int bursts = 0;
  std::int64_t last_data = -1;
  for (const auto& f : test::read_pcap(scratch / ("node" + std::to_string(token->from) + ".pcap"))) {
    if (f.bytes.size() < 14 + 24 || be16(&f.bytes[12]) != engine::kDefaultEtherType) continue;
    const std::uint8_t* h = &f.bytes[14];
    const auto type = static_cast<engine::FrameType>(h[3]);
    if (be16(h + 16) != static_cast<std::uint16_t>(token->from)) continue;  // received, not sent
    if (type == engine::FrameType::kData && be16(h + 18) == dst && (h[4] & engine::kFlagRetransmit) == 0) {
      if (static_cast<double>(f.ns - last_data) < frame_ns / 4) ++bursts;  // handed over together with the previous one
      last_data = f.ns;
      last_start = std::max(drained, static_cast<double>(f.ns));
      drained = last_start + static_cast<double>(f.len) * 8e9 / static_cast<double>(rate);
    }
    if (type == engine::FrameType::kSync && be32(h + 20) == token->id && sync_sent < 0) sync_sent = f.ns;
  }
  REQUIRE(last_data >= 0);
  REQUIRE(bursts > 0);  // the late polls did send in bursts
  INFO("token " << (static_cast<double>(sync_sent) - last_start) / 1e6 << " ms after the round's last frame could start");
  // The capture's clock: half a frame.
  CHECK(static_cast<double>(sync_sent) >= last_start - frame_ns / 2);
}

// Found at 128 machines: every exchange pinged every peer it had not heard from for a fifth of
// the peer deadline, so PINGs and their ACKs outnumbered the data frames (390,104 PINGs for
// 747,892 DATA frames). A node pings only the peers it waits on.
TEST_CASE("liveness pings go only to the peers a node waits on") {
  auto opts = test::nodes(6);
  opts.tune = [](engine::EngineConfig& c) {
    c.peer_deadline = std::chrono::milliseconds(100);  // keepalive after 20 ms of silence
    c.pace_bps = 20'000'000;                           // each block takes 40 ms
  };
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(6);
  auto run = test::run_exchange(fabric, planned(t, "ring", "none"), 1, 100'000);
  test::expect_ok(run, "ring, 200 ms");
  std::uint64_t pings = 0;
  for (const auto& r : run.reports) pings += r.counters.pings_sent;
  // Nobody waits on anybody while the blocks flow (READY is answered at once, nothing else is
  // awaited until a node's own blocks are out), so only the last moments may ping.
  const double ms = std::chrono::duration<double, std::milli>(run.elapsed).count();
  INFO(pings << " pings in " << ms << " ms");
  CHECK(pings <= 6);
}

// The paced shuffle (docs/design.md, "Fast links"): a round of k blocks leaves at k times the
// schedule's block rate, however fast the link's own pace lets the node send. Without the
// exchange's pacing these blocks leave at the link's pace, ten times sooner.
TEST_CASE("a paced round sends each block at the schedule's block rate, below the link's pace") {
  auto opts = test::nodes(4);
  opts.tune = [](engine::EngineConfig& c) { c.pace_bps = 1'000'000'000; };
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(4, 100'000'000);
  Schedule s = paced_shuffle_schedule(TreeModel(t));
  REQUIRE(s.block_rate_bps == static_cast<std::uint64_t>(kPacedShare * 100e6 / 3));  // 3 blocks a machine's link each way
  const std::uint64_t block = 100'000;
  auto run = test::run_exchange(fabric, s, 1, block);
  test::expect_ok(run, "paced-shuffle");
  // Every block's frames, headers included, at the block rate.
  const double wire_bytes = static_cast<double>(block) * 1514.0 / 1470.0;
  const double paced_ms = wire_bytes * 8e3 / static_cast<double>(s.block_rate_bps);
  const double ms = std::chrono::duration<double, std::milli>(run.elapsed).count();
  INFO("exchange took " << ms << " ms; each block paced to " << paced_ms << " ms");
  CHECK(ms >= 0.8 * paced_ms);
  for (const auto& r : run.reports) CHECK(r.counters.retransmitted_frames == 0);
}

// Found on random trees whose links differ in rate: the tree's phases sent every block at the
// sender's own rate, and a slower link further on queued the difference until the switch
// dropped frames (thousands resent an exchange). A round whose block crosses a slower link is
// capped at its rate (sched::Round::rate_bps) and the engine paces it there.
TEST_CASE("a round whose block crosses a slower link leaves at that link's rate, not the sender's") {
  auto opts = test::nodes(4);
  opts.tune = [](engine::EngineConfig& c) { c.pace_bps = 1'000'000'000; };
  test::Fabric fabric(opts);
  // One switch; n3's link at 100 Mbit/s, the others' at 1 Gbit/s.
  const Topology t = Topology::from_spec(read_dot(R"(graph g {
    n0 [mac="02:00:00:00:00:01"]; n1 [mac="02:00:00:00:00:02"]; n2 [mac="02:00:00:00:00:03"]; n3 [mac="02:00:00:00:00:04"];
    s -- n0 [rate="1Gbit"]; s -- n1 [rate="1Gbit"]; s -- n2 [rate="1Gbit"]; s -- n3 [rate="100Mbit"];
  })",
                                                  "one slow host"));
  const Schedule s = plan_sync(t, make_schedule(t, *AlgorithmSpec::parse("pairwise-ec")), *SyncSpec::parse("none"));
  const std::uint64_t block = 200'000;
  auto run = test::run_exchange(fabric, s, 1, block);
  test::expect_ok(run, "pairwise-ec, one slow host");
  const double wire_bits = static_cast<double>(block) * 1514.0 / 1470.0 * 8;
  const auto& rounds = s.programs[0].rounds;
  const auto& times = run.reports[0].counters.rounds;
  REQUIRE(times.size() == rounds.size());
  int capped = 0;
  for (std::size_t r = 0; r < rounds.size(); ++r) {
    REQUIRE(rounds[r].sends.size() == 1);
    const double ms = static_cast<double>(times[r].end_ns - times[r].start_ns) / 1e6;
    INFO("n0's round " << r << " to n" << rounds[r].sends[0].dst << ": " << ms << " ms, capped at " << rounds[r].rate_bps);
    if (rounds[r].sends[0].dst == 3) {
      CHECK(rounds[r].rate_bps == 100'000'000);
      CHECK(ms >= 0.8 * wire_bits / 1e8 * 1e3);  // 16.5 ms at 100 Mbit/s, not 1.6 at 1 Gbit/s
      ++capped;
    } else {
      CHECK(rounds[r].rate_bps == 0);
      CHECK(ms < 0.5 * wire_bits / 1e8 * 1e3);
    }
  }
  CHECK(capped == 1);
}

// Found on 8-two-switch at 300 Mbit/s: eight daemons that each woke for every frame they sent
// and every frame they received left two cores 3% idle, and at 500 Mbit/s, with the ranks
// checking their bytes between exchanges, the paced shuffle reached 73.6-76.9% of the limit
// (86.6-88.8% now; `aapc run --check`, six rounds side by side). A paced round now wakes its
// engine once per batch of frames (Exchange::pace_frame), and lets what arrives meanwhile wait
// in the port's ring (Engine::receive_wait_until).
TEST_CASE("a paced round wakes its engine once per batch of frames, not for every frame sent or received") {
  auto opts = test::nodes(4);
  opts.tune = [](engine::EngineConfig& c) { c.pace_bps = 1'000'000'000; };
  opts.sleeping_node = 0;
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(4, 1'000'000'000);
  Schedule s = paced_shuffle_schedule(TreeModel(t));
  const std::uint64_t block = 400'000;
  auto run = test::run_exchange(fabric, s, 1, block);
  test::expect_ok(run, "paced-shuffle");
  const auto& k = run.reports[0].counters;
  // Still paced: every block at the block rate (a frame every 12 us for the node's three).
  const double paced_ms = static_cast<double>(block) * 1514.0 / 1470.0 * 8e3 / static_cast<double>(s.block_rate_bps);
  const double ms = std::chrono::duration<double, std::milli>(run.elapsed).count();
  INFO("exchange took " << ms << " ms, paced to " << paced_ms << " ms; rank 0 sent " << k.data_frames_sent << " and received "
                        << k.data_frames_received << " data frames in " << fabric.sleeps(0) << " sleeps");
  CHECK(ms >= 0.8 * paced_ms);
  CHECK(k.retransmitted_frames == 0);
  // Woken per frame, the node would sleep once for each of the 800 frames it sent or received.
  CHECK(fabric.sleeps(0) * 8 < k.data_frames_sent + k.data_frames_received);
}

// Found on 8-two-switch at 300-500 Mbit/s: rounds held back by the link's own bucket (the
// tree's, the shuffles') still woke their daemon for every frame sent and received, and the
// tree reached 64-67% of the limit at 500 Mbit/s, 256 KiB (77-81% now, side by side). A
// wake-up now sends whole frames ahead of the bucket (Link::may_send_ahead), and while every round
// waits only for the bucket what arrives waits for that wake-up.
TEST_CASE("a round held back by the link's pace wakes its engine once per batch of frames, and still keeps to the pace") {
  const std::uint64_t rate = 1'000'000'000;
  auto opts = test::nodes(4);
  opts.tune = [&](engine::EngineConfig& c) { c.pace_bps = rate; };
  opts.sleeping_node = 0;
  test::Fabric fabric(opts);
  Topology t = single_switch_topology(4, rate);
  Schedule s = planned(t, "sync-shuffle", "none");
  const std::uint64_t block = 400'000;
  auto run = test::run_exchange(fabric, s, 1, block);
  test::expect_ok(run, "sync-shuffle");
  const auto& k = run.reports[0].counters;
  // Rank 0's three blocks at the link's pace, less the bucket's half-millisecond start.
  const double paced_ms = 3.0 * static_cast<double>(block) * 1514.0 / 1470.0 * 8e3 / static_cast<double>(rate) - 0.5;
  const double ms = std::chrono::duration<double, std::milli>(run.elapsed).count();
  INFO("exchange took " << ms << " ms, paced to " << paced_ms << " ms; rank 0 sent " << k.data_frames_sent << " and received "
                        << k.data_frames_received << " data frames in " << fabric.sleeps(0) << " sleeps");
  CHECK(ms >= 0.9 * paced_ms);
  CHECK(k.retransmitted_frames == 0);
  // Woken per frame, the node would sleep once for each of the 1,640 frames it sent or received.
  CHECK(fabric.sleeps(0) * 8 < k.data_frames_sent + k.data_frames_received);
}
