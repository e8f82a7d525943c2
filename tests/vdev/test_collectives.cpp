// Collectives that cannot hang, mismatches named. Ranks that
// call different collectives (or the same with other blocks or another schedule) fail at
// once on every side, each naming the peer and what differs; an exchange that a rank never
// joins fails after a deadline derived from its size; one that keeps progressing does not.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "checks.hpp"
#include "fabric.hpp"

using namespace aapc;
using namespace aapc::sched;
using engine::Collective;
using Ms = std::chrono::milliseconds;

namespace {

// What one rank calls: the schedule, the collective, and its blocks (by peer; a barrier has none).
struct Call {
  Schedule schedule;
  Collective kind = Collective::kAlltoall;
  std::vector<std::uint64_t> send, recv;
  std::chrono::milliseconds timeout{0};
};

Call alltoall(const Schedule& s, std::uint64_t block) {
  const auto n = static_cast<std::size_t>(s.machines);
  return {s, Collective::kAlltoall, std::vector<std::uint64_t>(n, block), std::vector<std::uint64_t>(n, block), Ms(0)};
}

Call barrier(int n) { return {barrier_schedule(n), Collective::kBarrier, {}, {}, Ms(0)}; }

Schedule tree(const Topology& t) { return test::planned(t, "tree", "sender-all"); }

// Starts `call` as exchange `id` on rank `me`; the buffers live as long as the returned holder.
std::shared_ptr<void> start(test::Fabric& fabric, int me, const Call& call, std::uint32_t id) {
  auto spec = engine::exchange_spec(call.schedule, me, id);
  spec.descriptor.kind = call.kind;
  spec.descriptor.block = call.kind == Collective::kAlltoall && !call.send.empty() ? call.send[0] : 0;
  spec.timeout = call.timeout;
  auto buffers = std::make_shared<std::vector<std::vector<std::uint8_t>>>();
  for (std::size_t p = 0; p < call.send.size(); ++p) {
    buffers->emplace_back(call.send[p], static_cast<std::uint8_t>(me));
    spec.send[p] = {buffers->back().data(), call.send[p]};
  }
  for (std::size_t p = 0; p < call.recv.size(); ++p) {
    buffers->emplace_back(call.recv[p], 0);
    spec.recv[p] = {buffers->back().data(), call.recv[p]};
  }
  auto started = fabric.engine(me).start(std::move(spec));
  REQUIRE(started);
  return buffers;
}

struct Outcome {
  std::vector<std::optional<engine::ExchangeReport>> reports;
  Ms took{};
  bool all = false;
};

// Polls until every rank in `ranks` reported exchange `id`, or `deadline`.
Outcome wait(test::Fabric& fabric, const std::vector<int>& ranks, std::uint32_t id, Ms deadline) {
  Outcome out;
  out.reports.resize(static_cast<std::size_t>(fabric.size()));
  const auto t0 = std::chrono::steady_clock::now();
  out.all = fabric.run_until(
      [&] {
        for (int r = 0; r < fabric.size(); ++r)
          for (auto& rep : fabric.engine(r).take_finished())
            if (rep.id == id) out.reports[static_cast<std::size_t>(r)] = rep;
        return std::all_of(ranks.begin(), ranks.end(), [&](int r) { return out.reports[static_cast<std::size_t>(r)].has_value(); });
      },
      deadline);
  out.took = std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - t0);
  return out;
}

std::vector<int> all_ranks(int n) {
  std::vector<int> r(static_cast<std::size_t>(n));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// Every rank failed with `code`, its error containing what `expect` says for it.
void expect_failed(const Outcome& o, const std::vector<int>& ranks, Errc code, const std::function<std::string(int)>& expect) {
  REQUIRE(o.all);
  for (int r : ranks) {
    const auto& rep = *o.reports[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << rep.error);
    CHECK(rep.state == engine::ExchangeState::kFailed);
    CHECK(rep.code == code);
    CHECK_THAT(rep.error, Catch::Contains(expect(r)));
  }
}

}  // namespace

TEST_CASE("alltoall with other block sizes on one rank fails at once on every rank, naming the rank and both sizes") {
  Topology t = single_switch_topology(4);
  for (bool late : {false, true}) {
    INFO((late ? "the odd rank starts 100 ms after the others" : "all start together"));
    test::Fabric fabric(test::nodes(4));
    std::vector<std::shared_ptr<void>> keep;
    for (int me : {0, 1, 3}) keep.push_back(start(fabric, me, alltoall(tree(t), 8192), 1));
    if (late) fabric.run_until([] { return false; }, Ms(100));  // their READYs wait, early, at rank 2
    keep.push_back(start(fabric, 2, alltoall(tree(t), 4096), 1));
    auto o = wait(fabric, all_ranks(4), 1, Ms(20'000));
    CHECK(o.took < Ms(1'000));  // was 18.7 s: "did not acknowledge its block after 41 polls"
    expect_failed(o, all_ranks(4), Errc::kInvalidArgument, [](int r) {
      return r == 2 ? std::string("called alltoall with 8192-byte blocks, this rank 4096-byte blocks")
                    : std::string("rank 2 called alltoall with 4096-byte blocks, this rank 8192-byte blocks");
    });
    // Rank 0 hears of it from rank 2, or from the rank that found it first (through its ABORT,
    // which names rank 2: its blocks are eager, sent without a READY that would tell rank 0).
    CHECK((o.reports[0]->peer == 2 || o.reports[0]->error.find("aborted by peer rank") != std::string::npos));
  }
}

TEST_CASE("barrier on one rank, alltoall on the others: every rank fails at once, naming the difference") {
  Topology t = single_switch_topology(4);
  for (bool late : {false, true}) {
    INFO((late ? "the barrier starts 100 ms after the alltoalls" : "all start together"));
    test::Fabric fabric(test::nodes(4));
    std::vector<std::shared_ptr<void>> keep;
    for (int me : {0, 2, 3}) keep.push_back(start(fabric, me, alltoall(tree(t), 4096), 7));
    if (late) fabric.run_until([] { return false; }, Ms(100));
    keep.push_back(start(fabric, 1, barrier(4), 7));
    auto o = wait(fabric, all_ranks(4), 7, Ms(20'000));  // hung for at least 45 s
    CHECK(o.took < Ms(1'000));
    expect_failed(o, all_ranks(4), Errc::kInvalidArgument, [](int r) {
      return r == 1 ? std::string("called alltoall with 4096-byte blocks, this rank barrier")
                    : std::string("rank 1 called barrier, this rank alltoall with 4096-byte blocks");
    });
  }
}

TEST_CASE("barriers of another radix on one rank: every rank fails at once, naming both and aapcd's option") {
  // Found by restarting one aapcd of seven with --barrier-radix 4, the others 2: every rank
  // timed out after 15 s, "still waiting for rank 4: a token".
  constexpr int kN = 7;
  test::Fabric fabric(test::nodes(kN));
  std::vector<std::shared_ptr<void>> keep;
  for (int me = 0; me < kN; ++me) keep.push_back(start(fabric, me, {barrier_schedule(kN, me == 0 ? 4 : 2), Collective::kBarrier, {}, {}, Ms(0)}, 3));
  auto o = wait(fabric, all_ranks(kN), 3, Ms(20'000));
  CHECK(o.took < Ms(1'000));
  // A rank that heard a token of the other radix names both; the others have that in the
  // abort they were sent.
  expect_failed(o, all_ranks(kN), Errc::kInvalidArgument, [](int) { return std::string("barrier:"); });
  int named = 0;
  for (int r = 0; r < kN; ++r) {
    const std::string& e = o.reports[static_cast<std::size_t>(r)]->error;
    INFO("rank " << r << ": " << e);
    CHECK(e.find("barrier:4+none") != std::string::npos);
    CHECK(e.find("barrier:2+none") != std::string::npos);
    if (e.find("aborted by peer rank") == std::string::npos) {
      ++named;
      CHECK_THAT(e, Catch::Contains("(another barrier radix: aapcd --barrier-radix must match on every node)"));
    }
  }
  CHECK(named >= 1);
}

namespace {

// Whether `error`, rank 0's or rank 1's, names rank 1's block of `sent` bytes where rank 0
// posted `posted`: as rank 0 finds it from the frames, or as rank 1 finds it from rank 0's
// READY; the other rank then has it in the abort it was sent.
bool names_block_mismatch(const std::string& error, std::uint64_t sent, std::uint64_t posted) {
  return error.find("rank 1 sends a " + std::to_string(sent) + "-byte block to this rank, which expects " + std::to_string(posted) + " bytes") != std::string::npos ||
         error.find("rank 0 expects a " + std::to_string(posted) + "-byte block from this rank, which sends " + std::to_string(sent) + " bytes") !=
             std::string::npos;
}

}  // namespace

TEST_CASE("another schedule on one rank, and alltoallv counts that disagree, are named") {
  Topology t = single_switch_topology(4);
  SECTION("schedules") {
    test::Fabric fabric(test::nodes(4));
    std::vector<std::shared_ptr<void>> keep;
    for (int me : {0, 1, 2}) keep.push_back(start(fabric, me, alltoall(tree(t), 3000), 1));
    keep.push_back(start(fabric, 3, alltoall(test::planned(t, "ring", "none"), 3000), 1));
    auto o = wait(fabric, all_ranks(4), 1, Ms(20'000));
    CHECK(o.took < Ms(1'000));
    expect_failed(o, all_ranks(4), Errc::kInvalidArgument, [](int r) {
      return r == 3 ? std::string("called alltoall with schedule tree+sender-all, this rank ring+none")
                    : std::string("rank 3 called alltoall with schedule ring+none, this rank tree+sender-all");
    });
  }
  SECTION("alltoallv counts") {
    // Rank 1 sends rank 0 a 200-byte block where rank 0 posted 100 bytes.
    test::Fabric fabric(test::nodes(4));
    std::vector<std::shared_ptr<void>> keep;
    for (int me = 0; me < 4; ++me) {
      Call c = alltoall(tree(t), 100);
      c.kind = Collective::kAlltoallv;
      if (me == 1) c.send[0] = 200;
      keep.push_back(start(fabric, me, c, 1));
    }
    auto o = wait(fabric, all_ranks(4), 1, Ms(20'000));
    CHECK(o.took < Ms(1'000));
    REQUIRE(o.all);
    INFO("rank 0: " << o.reports[0]->error << "; rank 1: " << o.reports[1]->error);
    CHECK(o.reports[0]->code == Errc::kInvalidArgument);
    // Named by rank 0 when the eager frames come first, or by rank 1 from rank 0's READY when
    // that comes first (under ASan it can), and then on rank 0 as rank 1's abort.
    CHECK(names_block_mismatch(o.reports[0]->error, 200, 100));
    // The 200 bytes are eager: sent, without waiting for rank 0's READY, by a rank
    // that may have every block of its own by the time rank 0's READY says what it expects. It
    // then names the mismatch too, or it has finished (as ranks 2 and 3 may have).
    if (o.reports[1]->state == engine::ExchangeState::kFailed) CHECK(names_block_mismatch(o.reports[1]->error, 200, 100));
  }
  SECTION("alltoallv counts: a shorter block whose frames all fit the posted one, its last frame lost or not") {
    // DATA frames do not carry their block's length. Rank 1 sends rank 0 one
    // frame's worth where rank 0 posted two, and that frame fits the posted block: only the
    // last frame of the first pass says where the sender's block ends, and when it is lost,
    // the sender's polls. (Polls of another length were dropped silently before: a stall.)
    for (bool lose : {false, true}) {
      INFO((lose ? "every DATA frame from rank 1 to rank 0 lost" : "nothing lost"));
      auto opts = test::nodes(4);
      if (lose) opts.drop = [](int src, int dst, const engine::Header& h) { return src == 1 && dst == 0 && h.type == engine::FrameType::kData; };
      test::Fabric fabric(opts);
      const std::uint64_t chunk = fabric.engine(0).chunk();
      std::vector<std::shared_ptr<void>> keep;
      for (int me = 0; me < 4; ++me) {
        Call c = alltoall(tree(t), 2 * chunk);
        c.kind = Collective::kAlltoallv;
        if (me == 1) c.send[0] = chunk;
        keep.push_back(start(fabric, me, c, 1));
      }
      auto o = wait(fabric, all_ranks(4), 1, Ms(20'000));
      CHECK(o.took < Ms(2'000));
      REQUIRE(o.all);
      INFO("rank 0: " << o.reports[0]->error);
      CHECK(o.reports[0]->code == Errc::kInvalidArgument);
      // Named by rank 0 (the last frame or a poll), or by rank 1 from rank 0's late READY (an
      // eager block that does not come in time is asked for) when rank 1 still runs then.
      CHECK(names_block_mismatch(o.reports[0]->error, chunk, 2 * chunk));
    }
  }
}

namespace {

test::FabricOptions short_deadlines(int n) {
  auto opts = test::nodes(n);
  opts.tune = [](engine::EngineConfig& c) {
    c.peer_deadline = Ms(300);
    c.timeout_allowance = Ms(400);  // stalls of 1 s fail
  };
  return opts;
}

}  // namespace

TEST_CASE("the default deadline is derived from the size and the link rate") {
  // 1 MB over the bottleneck at 8 Mbit/s is 1 s; eight times that, plus the allowance.
  CHECK(engine::derived_timeout(1'000'000, 8'000'000, Ms(500)) == Ms(8'500));
  engine::EngineConfig c;
  c.link_bps = 100'000'000;
  const auto s = tree(single_switch_topology(4));
  auto spec = engine::exchange_spec(s, 0, 1);
  std::vector<std::uint8_t> block(1'000'000);
  for (auto& b : spec.send) b = {block.data(), block.size()};
  // 3 phases (the bottleneck load of 4 machines on a switch) of 1 MB in 681 frames of 1,470
  // bytes and 44 of headers (MTU 1500), at 100 Mbit/s: 247.4 ms, eight times.
  REQUIRE(spec.bottleneck_load == 3);
  CHECK(engine::default_timeout(spec, c, 1470) == Ms(1'979) + engine::stall_allowance(c));
  CHECK(engine::stall_allowance(c) == Ms(15'000));
}

TEST_CASE("a rank that never starts the exchange (its client exited): the others fail after the derived deadline, naming it") {
  Topology t = single_switch_topology(4);
  test::Fabric fabric(short_deadlines(4));
  std::vector<std::shared_ptr<void>> keep;
  for (int me : {0, 1, 2}) keep.push_back(start(fabric, me, alltoall(tree(t), 5'000), 1));
  // Rank 3's engine runs and answers (a daemon without a client): nobody is silent.
  auto o = wait(fabric, {0, 1, 2}, 1, Ms(15'000));
  REQUIRE(o.all);  // hung for at least 30 s
  CHECK(o.took < Ms(5'000));
  for (int r : {0, 1, 2}) {
    const auto& rep = *o.reports[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << rep.error);
    CHECK(rep.state == engine::ExchangeState::kFailed);
    CHECK(((rep.code == Errc::kTimeout && rep.error.find("derived from its size") != std::string::npos) || rep.code == Errc::kPeerAborted));
    CHECK_THAT(rep.error, Catch::Contains("rank 3 (02:00:00:00:00:04)"));
  }
}

namespace {

using JoinResults = std::vector<std::optional<Result<std::uint32_t>>>;

// Each of `ranks`' join results (by rank), polled until all of them have one or `wait` passed.
JoinResults join_results(test::Fabric& fabric, const std::vector<int>& ranks, Ms wait) {
  JoinResults results(static_cast<std::size_t>(fabric.size()));
  fabric.run_until(
      [&] {
        for (int me : ranks)
          if (!results[static_cast<std::size_t>(me)]) results[static_cast<std::size_t>(me)] = fabric.engine(me).join_result();
        return std::all_of(ranks.begin(), ranks.end(), [&](int me) { return results[static_cast<std::size_t>(me)].has_value(); });
      },
      wait);
  return results;
}

}  // namespace

TEST_CASE("at the session's start, a rank whose daemon answers but has no client fails the join after its deadline") {
  test::Fabric fabric(test::nodes(3));
  for (int me : {0, 1}) fabric.engine(me).start_join(10, Ms(400));
  const auto t0 = std::chrono::steady_clock::now();
  const JoinResults results = join_results(fabric, {0, 1}, Ms(10'000));
  REQUIRE((results[0] && results[1]));
  CHECK(std::chrono::steady_clock::now() - t0 < Ms(2'000));
  for (const auto& r : {results[0], results[1]}) {
    REQUIRE(!*r);
    CHECK(r->error().code() == Errc::kTimeout);
    CHECK_THAT(r->error().message(), Catch::Contains("rank 2 (02:00:00:00:00:03) did not call the collective within 400 ms"));
  }
}

// `auto` weighs the tree's phases with what the ranks measured (sched::Measured): every rank must
// agree on the same figures, or ranks would choose different schedules for one exchange.
TEST_CASE("the session's join agrees on the slowest fill, the longest hand-over and each schedule's lowest reach any rank measured, the same on every rank") {
  test::Fabric fabric(test::nodes(4));
  // Reaches in ten-thousandths, by exchange: of cell 3, ranks 0 and 3 saw exchanges 40-42 and
  // rank 0 alone exchange 39; the lowest of each counts (9,000, 7,000, 8,000, 6,500), and what
  // they reach together (the harmonic mean, 7,507) is agreed. Of cell 7, rank 2 alone (it
  // measured no fit) saw exchange 50; cell 9 none.
  const std::vector<engine::JoinMeasure> proposed = {
      {900'000, 120'000, {{39, 3, 9'000}, {40, 3, 7'000}, {41, 3, 8'800}, {42, 3, 9'100}}},
      {},
      {0, 0, {{50, 7, 5'000}}},
      {640'000, 278'000, {{40, 3, 9'000}, {41, 3, 8'000}, {42, 3, 6'500}}}};
  for (int me = 0; me < 4; ++me) fabric.engine(me).start_join(10, Ms(5'000), {}, proposed[static_cast<std::size_t>(me)]);
  const JoinResults results = join_results(fabric, {0, 1, 2, 3}, Ms(10'000));
  for (int me = 0; me < 4; ++me) {
    INFO("rank " << me);
    REQUIRE(results[static_cast<std::size_t>(me)]);
    REQUIRE(*results[static_cast<std::size_t>(me)]);
    // Rank 1 measured nothing (its daemon ran no exchange yet): the others' figures hold.
    CHECK(fabric.engine(me).agreed_measure() == engine::AgreedMeasure{640'000, 278'000, {0, 0, 0, 7'507, 0, 0, 0, 5'000}});
  }
  // A session in which nobody measured agrees on nothing, whatever the last one agreed.
  fabric.settle();
  for (int me = 0; me < 4; ++me) fabric.engine(me).start_join(20, Ms(5'000));
  const JoinResults next = join_results(fabric, {0, 1, 2, 3}, Ms(10'000));
  for (int me = 0; me < 4; ++me) {
    REQUIRE(next[static_cast<std::size_t>(me)]);
    CHECK(fabric.engine(me).agreed_measure() == engine::AgreedMeasure{});
  }
}

// A JOIN is resent until acknowledged, also after its sender's join completed. A copy that came
// after the receiver's join had used that proposal stood for the peer's next session: the
// receiver's next join completed without the peer, whose slot was still closed (its client
// gone), and the peer answered the session's first exchange with the old session's ABORT.
TEST_CASE("a JOIN resent after the join it was for completed does not join the peer to the next session") {
  bool lose_join_acks = true;  // rank 1's acknowledgements of rank 0's JOIN
  auto opts = test::nodes(2);
  opts.drop = [&](int src, int, const engine::Header& h) {
    return lose_join_acks && src == 1 && h.type == engine::FrameType::kAck && h.aux == static_cast<std::uint32_t>(engine::FrameType::kJoin);
  };
  test::Fabric fabric(opts);
  for (int me : {0, 1}) fabric.engine(me).start_join(10, Ms(5'000));
  auto first = join_results(fabric, {0, 1}, Ms(5'000));
  for (int me : {0, 1}) {
    REQUIRE(first[static_cast<std::size_t>(me)]);
    REQUIRE(*first[static_cast<std::size_t>(me)]);
    CHECK(first[static_cast<std::size_t>(me)]->value() == 10);
  }
  fabric.run_until([] { return false; }, Ms(200));  // rank 0 resends its JOIN, unacknowledged
  lose_join_acks = false;
  fabric.settle();
  // Rank 1's next session; rank 0 has no client that joins it.
  fabric.engine(1).start_join(20, Ms(400));
  auto second = join_results(fabric, {1}, Ms(5'000));
  REQUIRE(second[1]);
  REQUIRE_FALSE(*second[1]);
  CHECK(second[1]->error().code() == Errc::kTimeout);
  CHECK_THAT(second[1]->error().message(), Catch::Contains("rank 0 (02:00:00:00:00:01) did not call the collective within 400 ms"));
}

// What `auto` weighs (docs/design.md, Fast links) must be the cluster's time for an exchange: a
// rank that starts late finds the others' frames waiting and finishes soon after, though they
// waited for it all along. Its span runs from the first frame of the exchange it saw.
TEST_CASE("a rank that starts an exchange late spans it from the first frame of it that came, not from its own start") {
  const Topology t = single_switch_topology(3);
  test::Fabric fabric(test::nodes(3));
  const Call call = alltoall(tree(t), 4096);
  auto early0 = start(fabric, 0, call, 1), early1 = start(fabric, 1, call, 1);
  fabric.run_until([] { return false; }, Ms(150));  // their READYs wait, early, at rank 2
  auto late = start(fabric, 2, call, 1);
  const Outcome o = wait(fabric, all_ranks(3), 1, Ms(10'000));
  REQUIRE(o.all);
  const engine::ExchangeReport& r = *o.reports[2];
  REQUIRE(r.state == engine::ExchangeState::kDone);
  INFO("duration " << r.duration_ns << " ns, span " << r.span_ns << " ns");
  // The early frames are taken in (and timed) by polls during those 150 ms, up to a poll's
  // delay after they start: on a busy box that delay exceeded the late rank's own 30 us.
  CHECK(r.span_ns >= 140'000'000);
  CHECK(r.duration_ns < r.span_ns - 100'000'000);
  // A rank that started first spans what it took.
  CHECK(o.reports[0]->span_ns == o.reports[0]->duration_ns);
}

TEST_CASE("a derived deadline does not cut an exchange that keeps making progress") {
  // The link rate is claimed a hundred times too high: the derived deadline (0.1 s + 0.7 s of
  // allowance) is far shorter than the exchange at its paced rate (1.4 s), which keeps
  // completing frames and blocks.
  Topology t = single_switch_topology(4);
  auto opts = short_deadlines(4);
  opts.tune = [](engine::EngineConfig& c) {
    c.peer_deadline = Ms(300);
    c.timeout_allowance = Ms(100);
    c.pace_bps = 1'000'000;
    c.link_bps = 100'000'000;
  };
  test::Fabric fabric(opts);
  auto run = test::run_exchange(fabric, test::planned(t, "tree", "sender-all"), 1, 60'000, Ms(30'000));
  test::expect_ok(run, "paced at a hundredth of the claimed link rate");
  CHECK(run.elapsed > Ms(1'200));  // well past the derived deadline of about 0.8 s
}

TEST_CASE("Options::timeout stays a hard limit") {
  Topology t = single_switch_topology(3);
  test::Fabric fabric(short_deadlines(3));
  std::vector<std::shared_ptr<void>> keep;
  for (int me : {0, 1}) {
    Call c = alltoall(tree(t), 5'000);
    c.timeout = Ms(250);
    keep.push_back(start(fabric, me, c, 1));
  }
  auto o = wait(fabric, {0, 1}, 1, Ms(10'000));
  REQUIRE(o.all);
  CHECK(o.took < Ms(1'000));
  for (int r : {0, 1}) {
    INFO(o.reports[static_cast<std::size_t>(r)]->error);
    CHECK_THAT(o.reports[static_cast<std::size_t>(r)]->error, Catch::Contains("did not finish within 250 ms; still waiting for"));
    CHECK_THAT(o.reports[static_cast<std::size_t>(r)]->error, Catch::Contains("rank 2 (02:00:00:00:00:03): "));
    // What it waits for: rank 2 never started, so its blocks are not acknowledged.
    CHECK_THAT(o.reports[static_cast<std::size_t>(r)]->error, Catch::Contains("an ACK of our block"));
  }
}
