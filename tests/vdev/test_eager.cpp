// Small exchanges without round trips. Blocks of a few frames are eager: sent at
// once, without waiting for the receiver's READY; a receiver that has not started the exchange
// yet keeps their frames for its start; and a rank is done once every block is in and every
// round has run, while what it sent still waits for acknowledgements (it settles, resending
// from its own copy).
#include <catch2/catch.hpp>
#include <malloc.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/generate.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "frames.hpp"

using namespace aapc;
using namespace aapc::sched;
using Ms = std::chrono::milliseconds;

namespace {

// One rank's side of an alltoall of `block`-byte blocks: its buffers (the pattern out, 0xEE in).
struct Side {
  std::vector<std::vector<std::uint8_t>> send, recv;
  std::optional<engine::ExchangeReport> report;

  bool byte_exact(int me, std::uint32_t id) const {
    for (std::size_t src = 0; src < recv.size(); ++src)
      for (std::uint64_t k = 0; k < recv[src].size(); ++k)
        if (recv[src][k] != test::pattern(static_cast<int>(src), me, id, k)) return false;
    return true;
  }
};

void start_side(test::Fabric& fabric, const Schedule& s, int me, std::uint32_t id, std::uint64_t block, Side& side) {
  const auto n = static_cast<std::size_t>(s.machines);
  side.send.assign(n, std::vector<std::uint8_t>(block));
  side.recv.assign(n, std::vector<std::uint8_t>(block, 0xEE));
  auto spec = engine::exchange_spec(s, me, id);
  for (std::size_t p = 0; p < n; ++p) {
    for (std::uint64_t k = 0; k < block; ++k) side.send[p][k] = test::pattern(me, static_cast<int>(p), id, k);
    spec.send[p] = {side.send[p].data(), block};
    spec.recv[p] = {side.recv[p].data(), block};
  }
  REQUIRE(fabric.engine(me).start(std::move(spec)));
}

// Steps the fabric until `until` holds, collecting the reports of exchange `id`.
bool run_sides(test::Fabric& fabric, std::vector<Side>& sides, std::uint32_t id, const std::function<bool()>& until, Ms deadline) {
  return fabric.run_until(
      [&] {
        for (int r = 0; r < fabric.size(); ++r)
          for (auto& rep : fabric.engine(r).take_finished())
            if (rep.id == id) sides[static_cast<std::size_t>(r)].report = rep;
        return until();
      },
      deadline);
}

// Back to back, as a program calls them: a tiny alltoall on one switch, then a barrier.
void tiny_pair(test::Fabric& fabric, std::uint32_t& id, std::uint64_t block = 8) {
  const int n = fabric.size();
  test::expect_ok(test::run_exchange(fabric, make_schedule(single_switch_topology(n), {Algorithm::kSyncShuffle, 0}), id++, block), "alltoall");
  test::expect_ok(test::run_exchange(fabric, barrier_schedule(n, 2), id++, 0), "barrier");
}

}  // namespace

TEST_CASE("eager blocks that reach a rank before it starts are kept, and nothing is resent") {
  const int n = 4;
  Schedule s = make_schedule(single_switch_topology(n), {Algorithm::kSyncShuffle, 0});
  for (std::uint64_t block : {std::uint64_t{8}, std::uint64_t{1024}, std::uint64_t{5000}}) {
    INFO(block << "-byte blocks");
    test::Fabric fabric(test::nodes(n));
    std::vector<Side> sides(n);
    for (int me = 0; me < n - 1; ++me) start_side(fabric, s, me, 1, block, sides[static_cast<std::size_t>(me)]);
    fabric.settle(Ms(5));  // their blocks reach rank 3, which has not started
    const auto kept = fabric.engine(n - 1).counters().early_data_frames;
    CHECK(kept == static_cast<std::uint64_t>(n - 1) * engine::frame_count(block, fabric.engine(0).chunk()));
    start_side(fabric, s, n - 1, 1, block, sides[n - 1]);
    REQUIRE(run_sides(fabric, sides, 1, [&] { return std::all_of(sides.begin(), sides.end(), [](const Side& d) { return d.report.has_value(); }); }, Ms(10'000)));
    for (int me = 0; me < n; ++me) {
      const auto& rep = *sides[static_cast<std::size_t>(me)].report;
      INFO("rank " << me << ": " << rep.error);
      CHECK(rep.state == engine::ExchangeState::kDone);
      CHECK(sides[static_cast<std::size_t>(me)].byte_exact(me, 1));
      // Kept, not dropped: nothing had to be sent again.
      CHECK(rep.counters.retransmitted_frames == 0);
    }
  }
}

TEST_CASE("a rank whose eager blocks are not yet acknowledged is done, and resends them from its own copy") {
  const int n = 3;
  Schedule s = make_schedule(single_switch_topology(n), {Algorithm::kRing, 0});
  auto opts = test::nodes(n);
  // Rank 2 keeps nothing that comes early: the blocks of ranks 0 and 1 to it are lost.
  opts.tune = [](engine::EngineConfig& c) {
    if (c.rank == 2) c.early_data_bytes = 0;
  };
  test::Fabric fabric(opts);
  std::vector<Side> sides(n);
  const std::uint64_t block = 3000;
  for (int me = 0; me < 2; ++me) start_side(fabric, s, me, 1, block, sides[static_cast<std::size_t>(me)]);
  fabric.settle(Ms(5));
  start_side(fabric, s, 2, 1, block, sides[2]);
  // Ranks 0 and 1 have everything once rank 2's blocks are in: done, while theirs to rank 2
  // still wait for a poll (one RTO) to be sent again.
  REQUIRE(run_sides(fabric, sides, 1, [&] { return sides[0].report && sides[1].report; }, Ms(10'000)));
  CHECK_FALSE(sides[2].report.has_value());
  for (int me = 0; me < 2; ++me) {
    auto& side = sides[static_cast<std::size_t>(me)];
    CHECK(side.report->state == engine::ExchangeState::kDone);
    CHECK(side.byte_exact(me, 1));
    // The caller may reuse its buffer once done: what rank 2 gets must not change.
    for (auto& b : side.send) std::fill(b.begin(), b.end(), 0x5A);
  }
  REQUIRE(run_sides(fabric, sides, 1, [&] { return sides[2].report.has_value(); }, Ms(10'000)));
  INFO(sides[2].report->error);
  CHECK(sides[2].report->state == engine::ExchangeState::kDone);
  CHECK(sides[2].byte_exact(2, 1));
  fabric.settle();
  for (int me = 0; me < 2; ++me) {
    const auto rep = fabric.engine(me).report(1);
    REQUIRE(rep);
    CHECK(rep->counters.retransmitted_frames > 0);  // sent again, after the report
  }
  CHECK(fabric.engine(0).quiet());
}

TEST_CASE("blocks larger than eager_frames still wait for READY") {
  const int n = 3;
  Schedule s = make_schedule(single_switch_topology(n), {Algorithm::kRing, 0});
  test::Fabric fabric(test::nodes(n));
  std::vector<Side> sides(n);
  const std::uint64_t block = static_cast<std::uint64_t>(fabric.engine(0).config().eager_frames + 1) * fabric.engine(0).chunk();
  for (int me = 0; me < 2; ++me) start_side(fabric, s, me, 1, block, sides[static_cast<std::size_t>(me)]);
  fabric.settle(Ms(20));
  // Rank 2 has not started: its READY has not gone, and no data came (not even to be dropped).
  CHECK(fabric.engine(2).counters().early_data_frames == 0);
  CHECK(fabric.engine(2).counters().drops[static_cast<std::size_t>(engine::DropReason::kNotLive)] == 0);
  start_side(fabric, s, 2, 1, block, sides[2]);
  REQUIRE(run_sides(fabric, sides, 1, [&] { return std::all_of(sides.begin(), sides.end(), [](const Side& d) { return d.report.has_value(); }); }, Ms(10'000)));
  for (int me = 0; me < n; ++me) CHECK(sides[static_cast<std::size_t>(me)].byte_exact(me, 1));
}

TEST_CASE("acknowledgements of eager blocks and tokens are gathered, several in a frame, and every exchange settles") {
  const int n = 4;
  auto opts = test::nodes(n);
  // An RTO well past the 5 ms that acknowledgements are gathered for: the fabric's 2 ms is
  // stalled past by a loaded host, and a poll follows. So was 20 ms, under an ASan build at a
  // load average of 16 (three polls in each of 36 reports).
  opts.tune = [](engine::EngineConfig& c) { c.rto = std::chrono::milliseconds(100); };
  test::Fabric fabric(opts);
  std::uint32_t id = 1;
  for (int i = 0; i < 10; ++i) tiny_pair(fabric, id, 64);
  fabric.settle(Ms(100));
  std::uint64_t gathered = 0, lists = 0;
  for (int r = 0; r < n; ++r) {
    gathered += fabric.engine(r).counters().acks_gathered;
    lists += fabric.engine(r).counters().ack_lists_sent;
    CHECK(fabric.engine(r).quiet());  // every acknowledgement arrived: nothing settles any more
    for (std::uint32_t x = 1; x < id; ++x) {
      const auto rep = fabric.engine(r).report(x);
      REQUIRE(rep);
      CHECK(rep->counters.polls_sent == 0);  // none came so late that a sender asked
    }
  }
  // Each rank acknowledges 3 blocks per alltoall and 2 tokens per barrier.
  CHECK(gathered == static_cast<std::uint64_t>(n) * 10 * (3 + 2));
  INFO("gathered " << gathered << ", lists " << lists);
  CHECK(lists * 2 < gathered);
}

TEST_CASE("READYs and tokens kept for an exchange not started yet are still there however late it starts") {
  // At 30% loss per port direction an exchange takes 30 s, and ranks start the next one that
  // far apart. The READYs and tokens a rank keeps for it were acknowledged: nobody sends them
  // again. They used to expire after `linger`, and then both sides waited for each other.
  const int n = 4;
  const std::uint64_t block = 64 * 1024;  // not eager: its sender waits for READY
  const auto topo = single_switch_topology(n);
  Schedule s = plan_sync(topo, make_schedule(topo, {Algorithm::kTree, 0}), {SyncKind::kSenderAll, 1});
  test::FabricOptions opts = test::nodes(n);
  opts.tune = [](engine::EngineConfig& c) { c.linger = Ms(100); };
  test::Fabric fabric(opts);
  std::vector<Side> sides(n);
  for (int me = 0; me < n - 1; ++me) start_side(fabric, s, me, 1, block, sides[static_cast<std::size_t>(me)]);
  // Three times the linger: the late rank's timers run meanwhile.
  fabric.run_until([] { return false; }, Ms(300));
  CHECK(fabric.engine(n - 1).counters().early_frames >= static_cast<std::uint64_t>(n - 1));  // their READYs at least
  start_side(fabric, s, n - 1, 1, block, sides[n - 1]);
  REQUIRE(run_sides(fabric, sides, 1, [&] { return std::all_of(sides.begin(), sides.end(), [](const Side& d) { return d.report.has_value(); }); }, Ms(20'000)));
  for (int me = 0; me < n; ++me) {
    const auto& side = sides[static_cast<std::size_t>(me)];
    INFO("rank " << me << ": " << side.report->error);
    CHECK(side.report->state == engine::ExchangeState::kDone);
    CHECK(side.byte_exact(me, 1));
  }
}


#if defined(__SANITIZE_ADDRESS__)
// ASan's allocator (glibc's mallinfo2 does not see it); its header is not installed here.
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace {

// Bytes the heap has handed out and not taken back.
std::size_t heap_in_use() {
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
}

}  // namespace

TEST_CASE("exchanges that linger after tiny ones hold little memory") {
  // A benchmark of tiny blocks finishes thousands of exchanges a second, and each lingers
  // (EngineConfig::linger, 15 s in aapcd) to answer late frames: on 8 machines aapcd grew by
  // 12 MB a second, 5 KiB an exchange of it in queues that were never used.
  const int n = 8, pairs = 60;
  test::Fabric fabric(test::nodes(n));
  std::uint32_t id = 1;
  tiny_pair(fabric, id);  // the engines' first allocations
  fabric.settle(Ms(50));
  const std::size_t before = heap_in_use();
  for (int i = 0; i < pairs; ++i) tiny_pair(fabric, id);
  fabric.settle(Ms(50));
  const std::size_t after = heap_in_use();
  for (int r = 0; r < n; ++r) REQUIRE(fabric.engine(r).report(1));  // all still linger
  const double per_exchange = static_cast<double>(after > before ? after - before : 0) / (2.0 * pairs * n);
  INFO("heap per lingering exchange and rank: " << per_exchange << " bytes");
  // 8.4 KiB with a std::deque per block sent and two more (they allocate when made), 4.9 KiB
  // without (the blocks, the program, the tokens' state).
  CHECK(per_exchange < 6144);
}

TEST_CASE("at most linger_max exchanges of a group linger, and the ended ones still answer a sender's poll") {
  const int n = 4;
  const std::uint32_t keep = 8;
  auto opts = test::nodes(n);
  opts.tune = [&](engine::EngineConfig& c) { c.linger_max = keep; };
  test::Fabric fabric(opts);
  std::uint32_t id = 1;
  for (int i = 0; i < 10; ++i) tiny_pair(fabric, id);
  fabric.settle(Ms(50));
  const std::size_t before = heap_in_use();
  for (int i = 0; i < 40; ++i) tiny_pair(fabric, id);
  fabric.settle(Ms(50));
  const std::size_t after = heap_in_use();
  // Without the bound each of the 80 more exchanges held a few KiB on each rank.
  INFO("heap grew by " << (after > before ? after - before : 0) << " bytes");
  CHECK(after < before + 16 * 1024);
  const std::uint32_t last = id - 1;
  for (int r = 0; r < n; ++r) {
    for (std::uint32_t x = last - keep + 1; x <= last; ++x) CHECK(fabric.engine(r).report(x));
    CHECK_FALSE(fabric.engine(r).report(last - keep));
  }
  // A sender whose acknowledgements were all lost polls for its block of an exchange that
  // ended here: the answer is still that it arrived.
  const std::uint32_t ended = last - 2 * keep - 1;  // an alltoall's (odd ids)
  REQUIRE(ended % 2 == 1);
  const std::uint64_t sent_before = fabric.engine(1).counters().frames_sent;
  engine::Header h;
  h.type = engine::FrameType::kPoll;
  h.exchange = ended;
  h.epoch = fabric.engine(0).epoch();
  h.block_len = 8;
  h.chunk = 1500 - engine::kDataHeaderLen;
  fabric.inject(1, test::fabric_frame(h, 0, 1));
  fabric.settle(Ms(20));
  CHECK(fabric.engine(1).counters().frames_sent == sent_before + 1);  // its ACK
  // So do a token and a READY resent because their ACKs were lost: the exchange had every
  // token it waited for. (Unanswered, the sender, done and settling, resent them to a peer it
  // heard from otherwise until its own linger time: 600 s in the test below.)
  for (const auto type : {engine::FrameType::kSync, engine::FrameType::kReady}) {
    INFO(engine::frame_type_name(type));
    engine::Header c;
    c.type = type;
    c.exchange = ended;
    c.epoch = fabric.engine(0).epoch();
    c.seq = 0;
    const std::uint64_t sent = fabric.engine(1).counters().frames_sent;
    fabric.inject(1, test::fabric_frame(c, 0, 1));
    fabric.settle(Ms(20));
    CHECK(fabric.engine(1).counters().frames_sent == sent + 1);
  }
}

TEST_CASE("with few exchanges lingering, tiny exchanges at 20% loss stay byte-exact") {
  const int n = 4;
  auto opts = test::nodes(n);
  opts.faults = nic::FaultOptions::parse("drop=0.2,seed=5");
  opts.tune = [](engine::EngineConfig& c) {
    c.linger_max = 2;
    c.linger = std::chrono::milliseconds(600'000);  // only linger_max ends lingering
    c.rto = std::chrono::milliseconds(20);
  };
  test::Fabric fabric(opts);
  std::uint32_t id = 1;
  for (int i = 0; i < 30; ++i) tiny_pair(fabric, id);
  fabric.settle(Ms(300));
  for (int r = 0; r < n; ++r) {
    REQUIRE(fabric.engine(r).quiet());  // every exchange settled
    CHECK(fabric.engine(r).report(id - 1));
    // Also those that settled after later ones had started to linger (the losses make many).
    for (std::uint32_t x = 1; x + 2 < id; ++x) CHECK_FALSE(fabric.engine(r).report(x));
  }
}
