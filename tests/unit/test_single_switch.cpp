// Every single-switch algorithm for p = 2..64, and the edge colouring of Tam/Wang Fig. 1.
#include <catch2/catch.hpp>

#include <set>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/verify.hpp"

using namespace aapc::sched;

TEST_CASE("edge colouring: perfect matchings for even p, one idle node per colour for odd p") {
  for (int p = 2; p <= 64; ++p) {
    INFO("p = " << p);
    const int colours = edge_color_count(p);
    CHECK(colours == (p % 2 == 0 ? p - 1 : p));
    std::set<std::pair<int, int>> edges;
    for (int c = 0; c < colours; ++c) {
      int idle = 0;
      for (int i = 0; i < p; ++i) {
        int partner = edge_color_partner(c, i, p);
        if (partner < 0) {
          ++idle;
          continue;
        }
        REQUIRE(partner < p);
        CHECK(partner != i);
        CHECK(edge_color_partner(c, partner, p) == i);  // a matching: symmetric
        if (i < partner) edges.emplace(i, partner);
      }
      CHECK(idle == (p % 2 == 0 ? 0 : 1));
    }
    CHECK(edges.size() == static_cast<std::size_t>(p * (p - 1) / 2));  // every edge of K_p once
  }
}

TEST_CASE("every single-switch algorithm verifies for p = 2..64") {
  for (int p = 2; p <= 64; ++p) {
    Topology t = single_switch_topology(p);
    std::vector<std::string> algorithms = {"linear", "ring", "pairwise", "pairwise-ec", "lp", "sync-shuffle", "group-shuffle:1",
                                           "group-shuffle:3", "group-shuffle:4", "group-shuffle:64", "tree"};
    if ((p & (p - 1)) == 0) algorithms.push_back("pairwise-xor");
    for (const auto& name : algorithms) {
      INFO("p = " << p << ", " << name);
      Schedule s = make_schedule(t, *AlgorithmSpec::parse(name));
      auto report = verify(t, s);
      INFO(report.summary());
      REQUIRE(report.ok());
      CHECK(s.message_count() == static_cast<std::size_t>(p * (p - 1)));
      CHECK(s.contention_free == (name != "linear"));
    }
  }
}

TEST_CASE("round and phase counts of the single-switch algorithms") {
  for (int p : {2, 3, 5, 6, 8, 13, 16, 31, 32}) {
    INFO("p = " << p);
    int pow2 = 1;
    while (pow2 < p) pow2 *= 2;
    CHECK(ring_schedule(p).phases.size() == static_cast<std::size_t>(p - 1));
    CHECK(pairwise_ec_schedule(p).phases.size() == static_cast<std::size_t>(p % 2 == 0 ? p - 1 : p));
    CHECK(lp_schedule(p).phases.size() == static_cast<std::size_t>(pow2 - 1));
    Schedule sync = sync_shuffle_schedule(p);
    CHECK(sync.packet_level);
    for (const auto& prog : sync.programs) {
      REQUIRE(prog.rounds.size() == 1);
      CHECK(prog.rounds[0].sends.size() == static_cast<std::size_t>(p - 1));
      // Slot i of node me goes to (me + i) mod p (Alg. 2).
      for (int i = 1; i < p; ++i) CHECK(prog.rounds[0].sends[static_cast<std::size_t>(i - 1)].dst == (prog.rank + i) % p);
    }
    for (int w : {1, 2, 5}) {
      Schedule g = group_shuffle_schedule(p, w);
      int colours = edge_color_count(p);
      std::size_t rounds = static_cast<std::size_t>((colours + w - 1) / w);
      for (const auto& prog : g.programs) {
        CHECK(prog.rounds.size() <= rounds);
        for (const auto& round : prog.rounds) CHECK(round.sends.size() <= static_cast<std::size_t>(w));
      }
    }
  }
  CHECK_THROWS_WITH(pairwise_xor_schedule(6), Catch::Contains("power of two"));
  // XOR pairing: in round k node i meets i ^ k.
  Schedule x = pairwise_xor_schedule(8);
  for (std::size_t k = 0; k < x.phases.size(); ++k)
    for (const Message& m : x.phases[k]) CHECK(m.dst == (m.src ^ static_cast<int>(k + 1)));
}

TEST_CASE("algorithm names parse and print") {
  for (const auto& name : AlgorithmSpec::names()) {
    auto spec = AlgorithmSpec::parse(name);
    REQUIRE(spec);
    CHECK(spec->name() == name);
  }
  CHECK(AlgorithmSpec::parse("group-shuffle(5)")->param == 5);
  CHECK(!AlgorithmSpec::parse("ring:3"));
  CHECK(!AlgorithmSpec::parse("bogus"));
  CHECK(!AlgorithmSpec::parse("group-shuffle:0"));
}
