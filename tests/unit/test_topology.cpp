// Topology files: the shipped ones load with the figures the papers give; every kind of bad
// file gets its own error naming the file and the culprit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/tree.hpp"
#include "aapc/sched/verify.hpp"
#include "paths.hpp"

using namespace aapc::sched;

namespace {

Topology parse(const std::string& text) { return Topology::from_spec(read_dot(text, "bad.dot")); }

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const TopologyError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("shipped topologies load with the papers' figures") {
  struct Expect {
    const char* name;
    int machines, switches;
    std::int64_t load;
    double peak_mbps;  // at 100 Mbit/s links
  };
  const Expect cases[] = {
      {"fy-generator-fig1", 6, 3, 9, 6 * 5 * 100.0 / 9},
      {"fyp-sync-fig1", 5, 6, 6, 5 * 4 * 100.0 / 6},
      {"fy-eval-a-24", 24, 1, 23, 2400},
      {"fy-eval-b-32-star", 32, 4, 192, 32 * 31 * 100.0 / 192},
      {"fy-eval-c-32-chain", 32, 4, 256, 32 * 31 * 100.0 / 256},
      {"tw-16", 16, 1, 15, 1600},
      {"8-one-switch", 8, 1, 7, 800},
      {"8-two-switch", 8, 2, 16, 350},
      {"12-three-level", 12, 5, 36, 12 * 11 * 100.0 / 36},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    Topology t = load_topology(aapc::test::topology_path(c.name));
    TreeModel model(t);
    CHECK(t.machine_count() == c.machines);
    CHECK(t.switch_count() == c.switches);
    CHECK(model.load() == c.load);
    CHECK(std::abs(model.peak_aggregate_bps() / 1e6 - c.peak_mbps) < 1e-6);
    // Lemma 1: every subtree of the root has at most |M|/2 machines.
    for (const auto& st : model.subtrees()) CHECK(static_cast<int>(st.machines.size()) * 2 <= c.machines);
    // Round trip through DOT keeps ranks, MACs and rates.
    Topology again = Topology::from_spec(read_dot(to_dot(t), "again"));
    REQUIRE(again.machine_count() == t.machine_count());
    for (Rank r = 0; r < t.machine_count(); ++r) {
      CHECK(again.machine(r).name == t.machine(r).name);
      CHECK(again.machine(r).mac == t.machine(r).mac);
    }
    CHECK(TreeModel(again).peak_aggregate_bps() == Approx(model.peak_aggregate_bps()));
  }
}

TEST_CASE("shipped topologies are found by name") {
  Topology t = load_topology("8-two-switch");
  CHECK(t.machine_count() == 8);
  CHECK_THROWS_WITH(load_topology("no-such-topology"), Catch::Contains("no such file"));
}

TEST_CASE("attributes: rate, mtu, buffer, rank") {
  Topology t = parse(R"(graph g { mtu=9000;
      a [mac="02:00:00:00:00:01", rank=1]; b [mac="02:00:00:00:00:02", rank=0];
      s [buffer="128K"]; s -- a [rate="10Gbit"]; s -- b [rate="2.5Gbit"]; })");
  CHECK(t.mtu() == 9000);
  CHECK(t.machine(0).name == "b");
  CHECK(t.machine(1).name == "a");
  CHECK(t.node(*t.find_node("s")).buffer_bytes == 128 * 1024);
  CHECK(t.links()[0].rate_bps == 10'000'000'000ULL);
  CHECK(t.links()[1].rate_bps == 2'500'000'000ULL);
  // Peak set by the slower link: 2 x 1 x 2.5 Gbit/s / 1.
  CHECK(TreeModel(t).peak_aggregate_bps() == Approx(5e9));
  Topology d = parse(R"(graph g { a [mac="02:00:00:00:00:01"]; b [mac="02:00:00:00:00:02"]; s -- a; s -- b; })");
  CHECK(d.links()[0].rate_bps == kDefaultRateBps);
  CHECK(d.mtu() == 1500);
  CHECK(parse_rate("100Mbit") == 100'000'000ULL);
  CHECK(parse_rate("1gbit") == 1'000'000'000ULL);
  CHECK(parse_rate("100Mbps") == 100'000'000ULL);
  CHECK(!parse_rate("fast"));
  CHECK(!parse_rate("100"));
  CHECK(format_rate(100'000'000ULL) == "100Mbit");
  CHECK(format_rate(2'500'000'000ULL) == "2.5Gbit");
}

TEST_CASE("every malformed topology gets its own error naming the file and the culprit") {
  const std::string two = R"(a [mac="02:00:00:00:00:01"]; b [mac="02:00:00:00:00:02"];)";
  struct Bad {
    const char* what;
    std::string text;
    const char* expect;
  };
  const Bad cases[] = {
      {"syntax", "graph { a -- ", "not a valid DOT graph"},
      {"digraph", "digraph g { " + two + " s -> a; s -> b; }", "undirected"},
      {"cycle", "graph g { " + two + " s -- a; s -- b; s -- t; t -- u; u -- s; }", "edge u -- s closes a cycle"},
      {"double link", "graph g { " + two + " s -- a; s -- b; s -- t; s -- t; }", "closes a cycle"},
      {"self loop", "graph g { " + two + " s -- a; s -- b; s -- s; }", "links a node to itself"},
      {"machine not a leaf", "graph g { " + two + " c [mac=\"02:00:00:00:00:03\"]; s -- a; s -- b; b -- c; }",
       "machine 'b' has 2 links"},
      {"disconnected", "graph g { " + two + " s -- a; t -- b; }", "is not connected"},
      {"isolated switch", "graph g { " + two + " s -- a; s -- b; lonely; }", "node 'lonely' is not connected"},
      {"one machine", "graph g { a [mac=\"02:00:00:00:00:01\"]; s -- a; }", "has 1 machine(s)"},
      {"no machine", "graph g { s -- t; }", "has 0 machine(s)"},
      // The machine that lacks its mac is named, with a free one to give it.
      {"machine without mac", "graph g { a [mac=\"02:00:00:00:00:01\"]; n3; s -- a; s -- n3; }",
       "has 1 machine(s); an exchange needs at least 2 (a machine is a node with a mac attribute): machine 'n3' has no mac attribute; "
       "give it mac=\"02:00:00:00:00:02\""},
      {"ranked machine without mac", "graph g { " + two + " n3 [rank=2]; s -- a; s -- b; s -- n3; }",
       "machine 'n3' has no mac attribute; give it mac=\"02:00:00:00:00:03\" (a node without mac is a switch), and only machines have ranks"},
      {"duplicate mac", "graph g { a [mac=\"02:00:00:00:00:01\"]; b [mac=\"02:00:00:00:00:01\"]; s -- a; s -- b; }",
       "machines 'a' and 'b' have the same mac"},
      {"malformed mac", "graph g { a [mac=\"02:00:00:00:01\"]; b [mac=\"02:00:00:00:00:02\"]; s -- a; s -- b; }",
       "machine 'a': mac=\"02:00:00:00:01\" is not a MAC address"},
      {"multicast mac", "graph g { a [mac=\"01:00:5e:00:00:01\"]; b [mac=\"02:00:00:00:00:02\"]; s -- a; s -- b; }",
       "not a unicast address"},
      {"malformed rate", "graph g { " + two + " s -- a [rate=\"fast\"]; s -- b; }", "edge s -- a: rate=\"fast\" is not a link rate"},
      {"duplicate rank", "graph g { a [mac=\"02:00:00:00:00:01\", rank=0]; b [mac=\"02:00:00:00:00:02\", rank=0]; s -- a; s -- b; }",
       "machines 'a' and 'b' have the same rank 0"},
      {"partial ranks", "graph g { a [mac=\"02:00:00:00:00:01\", rank=0]; " + std::string("b [mac=\"02:00:00:00:00:02\"]; s -- a; s -- b; }"),
       "machine 'b' has no rank while other machines do"},
      {"rank out of range", "graph g { a [mac=\"02:00:00:00:00:01\", rank=0]; b [mac=\"02:00:00:00:00:02\", rank=7]; s -- a; s -- b; }",
       "rank=\"7\" is not a rank between 0 and 1"},
      {"bad mtu", "graph g { mtu=12; " + two + " s -- a; s -- b; }", "mtu=\"12\" is not an MTU"},
      {"bad buffer", "graph g { " + two + " s [buffer=\"lots\"]; s -- a; s -- b; }", "switch 's': buffer=\"lots\""},
  };
  std::set<std::string> messages;
  for (const auto& c : cases) {
    INFO(c.what);
    std::string message = error_of(c.text);
    CHECK_THAT(message, Catch::StartsWith("bad.dot: "));
    CHECK_THAT(message, Catch::Contains(c.expect));
    messages.insert(message);
  }
  CHECK(messages.size() == std::size(cases));  // each its own error
}

TEST_CASE("paths and loads on a generated tree") {
  std::mt19937_64 rng(7);
  RandomTreeOptions o;
  o.machines = 20;
  o.switches = 6;
  Topology t = random_tree(o, rng);
  TreeModel model(t);
  // The load of a directed edge equals the number of AAPC messages using it.
  std::vector<std::int64_t> uses(static_cast<std::size_t>(t.directed_edge_count()), 0);
  for (Rank a = 0; a < t.machine_count(); ++a)
    for (Rank b = 0; b < t.machine_count(); ++b)
      if (a != b)
        for (int e : t.path_between(a, b)) uses[static_cast<std::size_t>(e)]++;
  for (std::size_t l = 0; l < t.links().size(); ++l) {
    CHECK(uses[2 * l] == model.link_load(static_cast<int>(l)));
    CHECK(uses[2 * l + 1] == model.link_load(static_cast<int>(l)));
  }
  // A path starts at the source and ends at the destination, each edge continuing the last.
  auto p = t.path_between(0, 19);
  REQUIRE(!p.empty());
  CHECK(t.edge_from(p.front()) == t.machine_node(0));
  CHECK(t.edge_to(p.back()) == t.machine_node(19));
  for (std::size_t i = 1; i < p.size(); ++i) CHECK(t.edge_to(p[i - 1]) == t.edge_from(p[i]));
}

TEST_CASE("more machines than the wire's 16-bit ranks can name are refused") {
  auto spec_of = [](std::size_t machines) {
    TopologySpec spec;
    spec.source = "big.dot";
    spec.nodes.push_back({"s", {}});
    for (std::size_t i = 0; i < machines; ++i) {
      Mac m;
      m.bytes = {0x02, 0, 0, static_cast<std::uint8_t>(i >> 16), static_cast<std::uint8_t>(i >> 8), static_cast<std::uint8_t>(i)};
      spec.nodes.push_back({"m" + std::to_string(i), {{"mac", m.str()}}});
      spec.edges.push_back({"s", "m" + std::to_string(i), {}});
    }
    return spec;
  };
  try {
    (void)Topology::from_spec(spec_of(70'000));
    FAIL("a topology of 70,000 machines was accepted");
  } catch (const TopologyError& e) {
    CHECK_THAT(e.what(), Catch::Contains("big.dot: has 70000 machines; the wire's 16-bit rank fields allow at most 65535"));
  }
  CHECK(Topology::from_spec(spec_of(kMaxMachines)).machine_count() == 65535);
}

TEST_CASE("a group's tree joins its members by the cluster's own links; its tree schedule is contention-free") {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 40; ++trial) {
    RandomTreeOptions o;
    o.machines = 4 + static_cast<int>(rng() % 30);
    o.switches = 1 + static_cast<int>(rng() % 8);
    const Topology t = random_tree(o, rng);
    std::vector<Rank> members(static_cast<std::size_t>(t.machine_count()));
    std::iota(members.begin(), members.end(), 0);
    std::shuffle(members.begin(), members.end(), rng);
    members.resize(2 + rng() % (members.size() - 1));  // any order, any size from 2
    INFO("trial " << trial << ": " << members.size() << " of " << t.machine_count() << " machines");
    const Topology g = sub_topology(t, members);
    REQUIRE(g.machine_count() == static_cast<int>(members.size()));
    CHECK(g.mtu() == t.mtu());
    auto names = [](const Topology& topo, const std::vector<int>& path) {
      std::vector<std::string> out;
      for (int e : path) out.push_back(topo.edge_name(e));
      return out;
    };
    for (Rank i = 0; i < g.machine_count(); ++i) {
      CHECK(g.machine(i).mac == t.machine(members[static_cast<std::size_t>(i)]).mac);
      for (Rank j = 0; j < g.machine_count(); ++j)
        CHECK(names(g, g.path_between(i, j)) == names(t, t.path_between(members[static_cast<std::size_t>(i)], members[static_cast<std::size_t>(j)])));
    }
    for (const Link& l : g.links()) {
      const int a = *t.find_node(g.node(l.a).name), b = *t.find_node(g.node(l.b).name);
      auto same = std::find_if(t.links().begin(), t.links().end(), [&](const Link& x) { return (x.a == a && x.b == b) || (x.a == b && x.b == a); });
      REQUIRE(same != t.links().end());
      CHECK(same->rate_bps == l.rate_bps);
    }
    const auto tree = make_schedule(g, *AlgorithmSpec::parse("tree"));
    const VerifyReport report = verify(g, tree);
    INFO(report.summary());
    CHECK(report.ok());
    CHECK(report.phases == TreeModel(g).load());
  }
}

TEST_CASE("a group of fewer than 2 machines, a rank twice or out of range is refused, naming it") {
  const Topology t = parse("graph g { n0 [mac=\"02:00:00:00:00:01\"]; n1 [mac=\"02:00:00:00:00:02\"]; n2 [mac=\"02:00:00:00:00:03\"]; s -- n0; s -- n1; s -- n2; }");
  auto error = [&](const std::vector<Rank>& members) {
    try {
      (void)sub_topology(t, members);
    } catch (const TopologyError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error({1}), Catch::Contains("needs at least 2 machines"));
  CHECK_THAT(error({1, 2, 1}), Catch::Contains("rank 1 is named twice"));
  CHECK_THAT(error({0, 3}), Catch::Contains("rank 3 is not a machine"));
  CHECK(sub_topology(t, {2, 0}).machine(0).name == "n2");
}
