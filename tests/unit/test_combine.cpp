// The combining schedules for tiny blocks: Bruck's index algorithm (any p) and Sur/Jin/Panda's
// hypercube (powers of two), built, verified for p = 2..33, and a verifier that catches
// corrupted plans.
#include <catch2/catch.hpp>

#include <algorithm>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/verify.hpp"

using namespace aapc::sched;

namespace {

int ceil_log2(int p) {
  int s = 0;
  while ((1 << s) < p) ++s;
  return s;
}

bool power_of_two(int p) { return (p & (p - 1)) == 0; }

std::size_t pieces_sent(const Schedule& s, Rank i) {
  std::size_t n = 0;
  for (const auto& step : s.combine[static_cast<std::size_t>(i)]) n += step.send.size();
  return n;
}

}  // namespace

TEST_CASE("bruck and hypercube verify for p = 2..33, in ceil(log2 p) steps") {
  for (int p = 2; p <= 33; ++p) {
    INFO("p = " << p);
    Topology t = single_switch_topology(p);
    std::vector<Schedule> schedules{make_schedule(t, *AlgorithmSpec::parse("bruck"))};
    if (power_of_two(p)) schedules.push_back(make_schedule(t, *AlgorithmSpec::parse("hypercube")));
    for (const Schedule& s : schedules) {
      INFO(s.algorithm);
      VerifyReport r = verify(t, s);
      INFO(r.summary());
      CHECK(r.ok());
      CHECK(r.messages == static_cast<std::int64_t>(p) * (p - 1));
      REQUIRE(s.combine.size() == static_cast<std::size_t>(p));
      CHECK(s.phases.size() == static_cast<std::size_t>(ceil_log2(p)));
      for (Rank i = 0; i < p; ++i) {
        const auto& steps = s.combine[static_cast<std::size_t>(i)];
        REQUIRE(steps.size() == static_cast<std::size_t>(ceil_log2(p)));
        for (std::size_t k = 0; k < steps.size(); ++k) {
          const int dist = 1 << k;
          if (s.algorithm == "bruck") {
            CHECK(steps[k].to == (i + dist) % p);
            CHECK(steps[k].from == ((i - dist) % p + p) % p);
          } else {
            CHECK(steps[k].to == (i ^ dist));
            CHECK(steps[k].from == (i ^ dist));
            CHECK(steps[k].send.size() == static_cast<std::size_t>(p / 2));  // Sur/Jin/Panda 3.2.1: p/2 packets per step
          }
        }
      }
      // The plan survives the sync step untouched (its local tokens are the algorithm).
      Schedule planned = plan_sync(t, s, SyncSpec{});
      CHECK(planned.syncs.size() == s.syncs.size());
      CHECK(verify(t, planned).ok());
      CHECK_THROWS_WITH(plan_sync(t, s, SyncSpec{SyncKind::kSenderAll, 1}), Catch::Contains("applies only to phased schedules"));
    }
  }
}

TEST_CASE("bruck sends each node's share of blocks: sum over steps of the indices with bit k set") {
  // Bruck 1997, radix 2: node i sends, at step k, the blocks whose index (d - o) mod p has bit
  // k set; over all steps, the blocks of index j travel popcount(j) times.
  for (int p : {5, 8, 12, 33}) {
    Schedule s = bruck_schedule(p);
    std::size_t expected = 0;
    for (int j = 1; j < p; ++j) expected += static_cast<std::size_t>(__builtin_popcount(static_cast<unsigned>(j)));
    for (Rank i = 0; i < p; ++i) CHECK(pieces_sent(s, i) == expected);
  }
}

TEST_CASE("hypercube needs a power of two; the rule is named") {
  for (int p : {3, 5, 6, 12, 33}) CHECK_THROWS_WITH(hypercube_schedule(p), Catch::Contains("power of two"));
  CHECK_THROWS_WITH(make_schedule(single_switch_topology(12), *AlgorithmSpec::parse("hypercube")), Catch::Contains("use bruck"));
  CHECK(AlgorithmSpec::parse("bruck")->name() == "bruck");
  CHECK(!AlgorithmSpec::parse("bruck:2"));
  CHECK(choose(TreeModel(single_switch_topology(8)), "hypercube", 8).algorithm.algorithm == Algorithm::kHypercube);
}

TEST_CASE("a corrupted combining plan fails verification") {
  Topology t = single_switch_topology(8);
  const Schedule good = bruck_schedule(8);
  REQUIRE(verify(t, good).ok());
  auto fails = [&](const Schedule& s, const std::string& what) {
    VerifyReport r = verify(t, s);
    INFO(r.summary());
    REQUIRE(!r.ok());
    bool named = false;
    for (const auto& e : r.errors) named = named || e.find(what) != std::string::npos;
    CHECK(named);
  };
  {  // a block dropped from a message (and from what the partner expects): never arrives
    Schedule s = good;
    s.combine[2][1].send.pop_back();
    s.combine[s.combine[2][1].to][1].recv.pop_back();
    fails(s, "reaches its destination 0 times");
  }
  {  // the sender's message differs from what its partner expects
    Schedule s = good;
    std::swap(s.combine[3][0].send.front(), s.combine[3][0].send.back());
    fails(s, "is not the one");
  }
  {  // forwarding a block before it has arrived: moved from step 1 to step 0
    Schedule s = good;
    Rank i = 0;
    auto& step1 = s.combine[0][1];
    CombinePiece forwarded{-1, -1};
    for (const auto& piece : step1.send)
      if (piece.origin != i) forwarded = piece;
    REQUIRE(forwarded.origin >= 0);
    auto erase = [&](std::vector<CombinePiece>& v) { v.erase(std::find(v.begin(), v.end(), forwarded)); };
    erase(step1.send);
    erase(s.combine[step1.to][1].recv);
    s.combine[0][0].send.push_back(forwarded);
    s.combine[s.combine[0][0].to][0].recv.push_back(forwarded);
    fails(s, "which it does not hold then");
  }
  {  // a step that does not wait for what it forwards
    Schedule s = good;
    s.programs[4].rounds[2].waits.clear();
    fails(s, "does not wait for the message of step 1");
  }
  {  // the same partner twice: the engine keeps one block per peer and direction
    Schedule s = hypercube_schedule(8);
    s.combine[1][2].to = s.combine[1][0].to;
    fails(s, "again");
  }
}
