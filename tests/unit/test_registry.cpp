// The registry of algorithms (aapc/sched/algorithms.def): every row parses, names itself and
// builds; a selection "ALGORITHM[:PARAM][+SYNC]" is parsed alike for every algorithm, auto too;
// and the docs list exactly the registry's rows.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/verify.hpp"
#include "paths.hpp"

using namespace aapc::sched;

namespace {

// Every name a spec may give as its algorithm part: auto, then the registry's dense rows.
std::vector<std::string> selectable() {
  std::vector<std::string> out{"auto"};
  for (const auto& name : AlgorithmSpec::names()) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("every dense row parses, names itself as it parsed, and builds a verified schedule of a row") {
  const Topology one = single_switch_topology(8);
  const Topology tree = load_topology(aapc::test::topology_path("8-two-switch"));
  for (const AlgorithmInfo& info : algorithms()) {
    INFO(info.name);
    CHECK(algorithm_info(info.id).name == info.name);
    CHECK(find_algorithm(info.name) == &algorithm_info(info.id));
    CHECK_FALSE(info.description.empty());
    if (info.input == AlgorithmInput::kPattern) {
      CHECK_FALSE(AlgorithmSpec::parse(info.name));
      CHECK(forced_sparse_algorithm(info.name) == std::string(info.name));
      continue;
    }
    CHECK_FALSE(forced_sparse_algorithm(info.name));
    const auto spec = AlgorithmSpec::parse(info.name);
    REQUIRE(spec);
    CHECK(spec->algorithm == info.id);
    CHECK(AlgorithmSpec::parse(spec->name())->name() == spec->name());
    for (const Topology* t : {&one, &tree}) {
      const Schedule s = make_schedule(*t, *spec);
      CHECK(AlgorithmSpec::parse(s.algorithm));  // its own name, or what it resolved to (pairwise: -xor or -ec)
      if (info.id != Algorithm::kPairwise) CHECK(s.algorithm == spec->name());  // the builder names it by its row
      CHECK(verify(*t, s).ok());
      // The single-switch algorithms are unscheduled baselines on a tree of switches.
      if (info.kind == AlgorithmKind::kSwitch && !t->single_switch()) CHECK_FALSE(s.contention_free);
    }
  }
}

TEST_CASE("a parameter is taken by the rows that have one, and refused by the others") {
  for (const AlgorithmInfo& info : algorithms()) {
    if (info.input == AlgorithmInput::kPattern) continue;
    INFO(info.name);
    const auto with = AlgorithmSpec::parse(std::string(info.name) + ":3");
    if (info.param.empty()) {
      CHECK_FALSE(with);
      CHECK(info.usage() == info.name);
    } else {
      REQUIRE(with);
      CHECK(with->param == 3);
      CHECK(AlgorithmSpec::parse(info.name)->param == info.param_default);
      CHECK(info.usage() == std::string(info.name) + "[:" + std::string(info.param) + "]");
    }
  }
  // names() lists the rows a dense spec may name, in the registry's order, each as it parses.
  std::vector<std::string> dense;
  for (const AlgorithmInfo& info : algorithms())
    if (info.input != AlgorithmInput::kPattern) dense.push_back(AlgorithmSpec{info.id, info.param_default}.name());
  CHECK(AlgorithmSpec::names() == dense);
}

TEST_CASE("every algorithm, auto too, takes every sync variant and refuses an unknown one alike") {
  const Topology topology = load_topology(aapc::test::topology_path("8-two-switch"));
  const TreeModel model(topology);
  for (const auto& algorithm : selectable()) {
    INFO(algorithm);
    for (const auto& sync : SyncSpec::names()) CHECK_NOTHROW(choose(model, algorithm + "+" + sync, 1 << 20));
    CHECK_NOTHROW(choose(model, algorithm + "+auto", 1 << 20));
    // Until the registry, "auto+often" ran auto while "ring+often" was refused.
    CHECK_THROWS_WITH(choose(model, algorithm + "+often", 1 << 20), "unknown sync variant 'often'");
    CHECK_THROWS_WITH(parse_plan_spec(algorithm + "+often"), "unknown sync variant 'often'");
  }
  CHECK_THROWS_WITH(choose(model, "trees+often", 1 << 20), "unknown schedule 'trees'");
  CHECK_THROWS_WITH(choose(model, "ring:3", 1 << 20), "unknown schedule 'ring:3'");
  CHECK_THROWS_WITH(choose(model, "cgm", 1 << 20), "unknown schedule 'cgm'");  // an alltoallv's pattern only
}

TEST_CASE("a spec that names no sync variant runs with its row's, and a schedule's name finds its row") {
  const Topology topology = load_topology(aapc::test::topology_path("8-two-switch"));
  const TreeModel model(topology);
  for (const AlgorithmInfo& info : algorithms()) {
    INFO(info.name);
    if (info.input == AlgorithmInput::kPattern) {
      CHECK(info.sync.empty());  // planned_sparse picks the tokens of a pattern's schedule
      CHECK_FALSE(algorithm_of(info.name));
      continue;
    }
    const auto sync = SyncSpec::parse(info.sync);
    REQUIRE(sync);
    CHECK(default_sync(info.id).name() == sync->name());
    const Choice c = choose(model, info.name, 1 << 20);
    CHECK(c.sync.kind == sync->kind);
    CHECK(c.sync.block == sync->block);
    CHECK(algorithm_of(info.name) == info.id);
  }
  CHECK(choose(model, "tree", 1 << 20).sync.kind == SyncKind::kSenderAll);
  CHECK(choose(model, "tree", 1 << 20).reason == "given; the tree's default tokens");
  CHECK(choose(model, "ring", 1 << 20).reason == "given; no tokens by default");
  CHECK(algorithm_of(make_schedule(topology, {Algorithm::kGroupShuffle, 3}).algorithm) == Algorithm::kGroupShuffle);
  CHECK(algorithm_of(barrier_schedule(8).algorithm) == std::nullopt);
  CHECK_FALSE(algorithm_of("auto"));
}

TEST_CASE("the all-to-many rows build a pattern's partial permutations; a dense name does not") {
  const Topology tree = load_topology(aapc::test::topology_path("8-two-switch"));
  std::vector<std::vector<std::uint64_t>> sizes(8, std::vector<std::uint64_t>(8, 0));
  for (std::size_t i = 0; i < 8; ++i) sizes[i][(i + 1) % 8] = sizes[i][(i + 3) % 8] = 100;
  const SparsePattern pattern = SparsePattern::from_sizes(sizes);
  for (const AlgorithmInfo& info : algorithms()) {
    INFO(info.name);
    if (info.input == AlgorithmInput::kDense) {
      CHECK_THROWS_WITH(pattern_schedule(tree, pattern, info.name), Catch::Contains("unknown all-to-many algorithm"));
      continue;
    }
    const Schedule s = pattern_schedule(tree, pattern, info.name);
    CHECK(check_permutations(pattern, s.phases).empty());
    if (info.id != Algorithm::kSparse) CHECK(s.algorithm == info.name);  // sparse builds cgm-links here
  }
  CHECK(pattern_schedule(tree, pattern, "sparse").algorithm == "cgm-links");
  CHECK(pattern_schedule(single_switch_topology(8), pattern, "sparse").algorithm == "cgm");
}

TEST_CASE("the docs list the registry's algorithms") {
  // docs/guide.md holds algorithms_markdown() between these two lines; when a row changes,
  // paste the table this test prints.
  const std::string begin = "<!-- algorithms: the registry's table (aapc/sched/algorithms.def), checked by unit/registry -->\n";
  const std::string end = "<!-- end of algorithms -->\n";
  std::ifstream in(std::string(AAPC_TEST_DOCS) + "/guide.md");
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  const std::string guide = text.str();
  const auto from = guide.find(begin);
  REQUIRE(from != std::string::npos);
  const auto to = guide.find(end, from);
  REQUIRE(to != std::string::npos);
  const std::string table = guide.substr(from + begin.size(), to - from - begin.size());
  INFO("the table the registry gives:\n" << algorithms_markdown());
  CHECK(table == algorithms_markdown());
}
