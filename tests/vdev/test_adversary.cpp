// Issue 15: what a forger on the wire, heavy loss or a dead peer can do to the engines of a
// fabric. Nothing may fail an exchange that would otherwise succeed, corrupt a byte, or hang.
#include <catch2/catch.hpp>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "checks.hpp"
#include "fabric.hpp"

using namespace aapc;
using namespace aapc::sched;
using engine::DropReason;
using engine::FrameType;

namespace {

std::uint64_t drops(const engine::Engine& e, DropReason r) { return e.counters().drops[static_cast<std::size_t>(r)]; }

// A frame as rank `src` would send it to rank `dst`, sealed with CRC32C only.
std::vector<std::uint8_t> forge(FrameType type, std::uint32_t exchange, std::uint32_t epoch, int src, int dst,
                                const std::string& payload = {}) {
  engine::Header h;
  h.type = type;
  h.exchange = exchange;
  h.epoch = epoch;
  h.src = static_cast<std::uint16_t>(src);
  h.dst = static_cast<std::uint16_t>(dst);
  h.chunk = 1500 - engine::kHeaderLen;
  h.payload_len = static_cast<std::uint16_t>(payload.size());
  std::vector<std::uint8_t> f(engine::kFrameOverhead + payload.size());
  engine::encode(f.data(), test::Fabric::mac(dst), test::Fabric::mac(src), engine::kDefaultEtherType, h);
  std::copy(payload.begin(), payload.end(), f.begin() + static_cast<std::ptrdiff_t>(engine::kFrameOverhead));
  engine::seal(f.data());
  return f;
}

Schedule ring(int p) { return make_schedule(single_switch_topology(p), {Algorithm::kRing, 0}); }

}  // namespace

TEST_CASE("finding 5: a forged PING with a far-future epoch is dropped; the sender's real frames still count") {
  test::Fabric fabric(test::nodes(4));
  test::expect_ok(test::run_exchange(fabric, ring(4), 1, 5'000), "before");
  const std::uint32_t real = fabric.engine(0).epoch();
  fabric.inject(1, forge(FrameType::kPing, 0, real + 1'000'000, 0, 1));
  fabric.settle();
  CHECK(drops(fabric.engine(1), DropReason::kFutureEpoch) == 1);
  // Had rank 1 taken the forged epoch, every real frame of rank 0 would now be stale.
  test::expect_ok(test::run_exchange(fabric, ring(4), 2, 5'000, std::chrono::milliseconds(10'000)), "after the forged PING");
  CHECK(drops(fabric.engine(1), DropReason::kStaleEpoch) == 0);
}

TEST_CASE("finding 5: a forged ABORT with a stale exchange id kills nothing; one naming the running exchange fails it") {
  test::Fabric fabric(test::nodes(4));
  test::expect_ok(test::run_exchange(fabric, ring(4), 1, 5'000), "before");
  // Received while exchange 2 runs: used to fail it and the two after it.
  fabric.inject(1, forge(FrameType::kAbort, 1, fabric.engine(0).epoch(), 0, 1, "forged"));
  for (std::uint32_t id : {2U, 3U, 4U}) test::expect_ok(test::run_exchange(fabric, ring(4), id, 5'000), "exchange " + std::to_string(id));
  CHECK(drops(fabric.engine(1), DropReason::kNotLive) >= 1);
  // The real thing: an ABORT for the exchange that runs fails it, naming the peer.
  fabric.inject(1, forge(FrameType::kAbort, 5, fabric.engine(0).epoch(), 0, 1, "gone"));
  auto run = test::run_exchange(fabric, ring(4), 5, 5'000, std::chrono::milliseconds(20'000));
  REQUIRE(run.finished);
  CHECK(run.reports[1].state == engine::ExchangeState::kFailed);
  CHECK(run.reports[1].code == Errc::kPeerAborted);
  CHECK(run.reports[1].peer == 0);
}
