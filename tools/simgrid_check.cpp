// aapc-simgrid-check: the tree's phases with sender-based tokens replayed in SimGrid, against
// `aapc-sched predict`, on a two-level tree of L leaves of M machines.
//
// One actor per machine runs its rounds in phase order: it waits for its round's tokens, sends
// its block (a SimGrid flow), and then sends a token to every node whose next round waits for it.
// A second actor per machine takes in the blocks. The network is SimGrid's CM02 flow model with no
// cross-traffic, links without latency and the bandwidth scaled by the block's share of its bytes
// on the wire (aapc's frames: the payload over payload and headers), so that a block alone on its
// path takes its wire time; a token takes no time on the wire and the hand-over is a fixed delay
// that the waiter adds to the latest token's emission. predict() is run with the same hand-over
// (its engine term; the others zero). Both see no switch queue and no drop: they agree only where
// the schedule keeps blocks apart (contention-free phases with tokens on every phase).
//
// Tokens come from the planned schedule (--planned: plan_sync's sender-all tokens, up to about
// 1,024 machines) or from the phases alone (every consecutive user of a directed link from
// another node, as the planner orders them; the planner's redundant ones removed or not, the
// longest path is the same).
#include <CLI/CLI.hpp>
#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/predict.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/tree.hpp"

namespace sg4 = simgrid::s4u;
using namespace aapc::sched;

namespace {

std::size_t idx(std::int64_t x) { return static_cast<std::size_t>(x); }

// Every node's rounds (one block each) and, per round, how many tokens it waits for and whom
// it notifies once its block is sent: the notified rounds of all nodes in one flat array.
struct Replay {
  std::vector<std::size_t> first;  // each node's first round in the flat arrays
  std::vector<Rank> dst;
  std::vector<std::uint32_t> waits;
  std::vector<std::size_t> notify_begin;  // size rounds + 1
  std::vector<std::pair<Rank, std::uint32_t>> notify;
};

// The planned tokens: each round's waits, and the rounds its emits release.
Replay from_plan(const Schedule& s) {
  Replay rp;
  for (const Program& prog : s.programs) {
    rp.first.push_back(rp.dst.size());
    for (const Round& round : prog.rounds) {
      rp.dst.push_back(round.sends.front().dst);
      rp.waits.push_back(static_cast<std::uint32_t>(round.waits.size()));
      rp.notify_begin.push_back(rp.notify.size());
      for (std::uint32_t id : round.emits) rp.notify.emplace_back(s.syncs[id].to, static_cast<std::uint32_t>(s.syncs[id].to_round));
    }
  }
  rp.first.push_back(rp.dst.size());
  rp.notify_begin.push_back(rp.notify.size());
  return rp;
}

// The tokens derived from the phases: a round waits for the previous user of each directed link
// on its path when that user is another node (one token per emitting round).
Replay from_phases(const Topology& t, const std::vector<Phase>& phases) {
  const int n = t.machine_count();
  std::vector<std::uint32_t> rounds(idx(n), 0);
  for (const Phase& ph : phases)
    for (const Message& m : ph) ++rounds[idx(m.src)];
  Replay rp;
  rp.first.resize(idx(n) + 1, 0);
  for (Rank c = 0; c < n; ++c) rp.first[idx(c) + 1] = rp.first[idx(c)] + rounds[idx(c)];
  rp.dst.resize(rp.first.back());
  rp.waits.assign(rp.first.back(), 0);
  std::vector<std::pair<std::size_t, std::pair<Rank, std::uint32_t>>> edges;  // emitting round -> notified
  std::vector<std::pair<Rank, std::uint32_t>> last(idx(t.directed_edge_count()), {-1, 0});
  std::fill(rounds.begin(), rounds.end(), 0);
  std::vector<int> path;
  for (const Phase& ph : phases) {
    for (const Message& m : ph) {
      const std::uint32_t r = rounds[idx(m.src)]++;
      rp.dst[rp.first[idx(m.src)] + r] = m.dst;
      t.path(t.machine_node(m.src), t.machine_node(m.dst), path);
      std::vector<std::size_t> from;
      for (int e : path) {
        const auto [u, ur] = last[idx(e)];
        if (u >= 0 && u != m.src) from.push_back(rp.first[idx(u)] + ur);
        last[idx(e)] = {m.src, r};
      }
      std::sort(from.begin(), from.end());
      from.erase(std::unique(from.begin(), from.end()), from.end());
      for (std::size_t g : from) edges.push_back({g, {m.src, r}});
      rp.waits[rp.first[idx(m.src)] + r] = static_cast<std::uint32_t>(from.size());
    }
  }
  std::sort(edges.begin(), edges.end());
  rp.notify_begin.assign(rp.first.back() + 1, 0);
  for (const auto& e : edges) ++rp.notify_begin[e.first + 1];
  for (std::size_t g = 0; g < rp.first.back(); ++g) rp.notify_begin[g + 1] += rp.notify_begin[g];
  rp.notify.reserve(edges.size());
  for (const auto& e : edges) rp.notify.push_back(e.second);
  return rp;
}

struct Run {
  const Replay* replay = nullptr;
  double handover_s = 0.0;
  std::uint64_t block = 0;
  std::vector<sg4::Mailbox*> data, tokens;
};

// What a block's comm carries: nothing but its simulated size.
int g_block_payload = 0;

void sender(const Run& run, Rank c) {
  const Replay& rp = *run.replay;
  std::vector<std::uint32_t> got(rp.first[idx(c) + 1] - rp.first[idx(c)], 0);
  std::vector<double> latest(got.size(), 0.0);
  sg4::this_actor::sleep_for(run.handover_s);  // every receiver's READY
  for (std::size_t r = 0; r < got.size(); ++r) {
    const std::size_t g = rp.first[idx(c)] + r;
    while (got[r] < rp.waits[g]) {
      auto* tok = run.tokens[idx(c)]->get<std::pair<std::uint32_t, double>>();
      ++got[tok->first];
      latest[tok->first] = std::max(latest[tok->first], tok->second);
      delete tok;
    }
    if (rp.waits[g] > 0) {
      const double ready = latest[r] + run.handover_s;
      if (ready > sg4::Engine::get_clock()) sg4::this_actor::sleep_until(ready);
    }
    run.data[idx(rp.dst[g])]->put(&g_block_payload, run.block);
    const double now = sg4::Engine::get_clock();
    for (std::size_t k = rp.notify_begin[g]; k < rp.notify_begin[g + 1]; ++k) {
      const auto [to, to_round] = rp.notify[k];
      run.tokens[idx(to)]->put_init(new std::pair<std::uint32_t, double>(to_round, now), 0)->detach();
    }
  }
}

void receiver(const Run& run, Rank c, std::size_t blocks) {
  for (std::size_t i = 0; i < blocks; ++i) run.data[idx(c)]->get<int>();
}

// The two-level tree as a SimGrid fat tree (bandwidths in bytes a second): host i under leaf
// i / per_leaf, as `aapc-sched generate --shape two-level` numbers them.
void build_platform(int leaves, int per_leaf, double bps) {
  auto* root = sg4::create_full_zone("world");
  const sg4::ClusterCallbacks callbacks([](sg4::NetZone* zone, const std::vector<unsigned long>&, unsigned long id) {
    auto* host = zone->create_host("n" + std::to_string(id), 1e9);
    return std::make_pair(host->get_netpoint(), static_cast<simgrid::kernel::routing::NetPoint*>(nullptr));
  });
  sg4::create_fatTree_zone("tree", root,
                           sg4::FatTreeParams(2, {static_cast<unsigned>(per_leaf), static_cast<unsigned>(leaves)}, {1, 1}, {1, 1}),
                           callbacks, bps / 8.0, 0.0, sg4::Link::SharingPolicy::SPLITDUPLEX)
      ->seal();
  root->seal();
}

// Runs the replay on SimGrid: the simulated time of the exchange.
double simulate(int& argc, char** argv, int leaves, int per_leaf, std::uint64_t bps, std::uint64_t block, double h, const Replay& rp) {
  // The block's bits on the wire (PredictOptions' wire: MTU 1500, 44 + 24 bytes a frame).
  const std::uint64_t frames = (block + 1469) / 1470;
  const double share = static_cast<double>(block) / static_cast<double>(block + frames * 68);
  sg4::Engine engine(&argc, argv);
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:1e18");
  sg4::Engine::set_config("network/latency-factor:1");
  sg4::Engine::set_config("network/bandwidth-factor:" + std::to_string(share));
  sg4::Engine::set_config("network/weight-S:0");
  sg4::Engine::set_config("contexts/stack-size:64");
  build_platform(leaves, per_leaf, static_cast<double>(bps));
  const int machines = leaves * per_leaf;
  Run run;
  run.replay = &rp;
  run.handover_s = h;
  run.block = block;
  std::vector<std::size_t> incoming(idx(machines), 0);
  for (Rank d : rp.dst) ++incoming[idx(d)];
  for (Rank c = 0; c < machines; ++c) {
    run.data.push_back(sg4::Mailbox::by_name("data" + std::to_string(c)));
    run.tokens.push_back(sg4::Mailbox::by_name("tok" + std::to_string(c)));
  }
  for (Rank c = 0; c < machines; ++c) {
    sg4::Host* host = sg4::Host::by_name("n" + std::to_string(c));
    auto tx = sg4::Actor::create("tx" + std::to_string(c), host, [&run, c] { sender(run, c); });
    auto rx = sg4::Actor::create("rx" + std::to_string(c), host, [&run, c, &incoming] { receiver(run, c, incoming[idx(c)]); });
    run.tokens[idx(c)]->set_receiver(tx);
    run.data[idx(c)]->set_receiver(rx);
  }
  engine.run();
  return sg4::Engine::get_clock();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-simgrid-check: the tree's phases with sender-based tokens in SimGrid against aapc-sched predict, on a two-level tree"};
  int leaves = 32, per_leaf = 32;
  std::string size = "64K", rate = "100Gbit";
  double h = 1e-6;
  bool planned = false;
  app.add_option("--leaves", leaves, "leaf switches")->check(CLI::Range(2, 256))->capture_default_str();
  app.add_option("--per-leaf", per_leaf, "machines on each leaf")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--size", size, "block size")->capture_default_str();
  app.add_option("--rate", rate, "every link's rate")->capture_default_str();
  app.add_option("--handover", h, "the fixed hand-over of a token, in seconds")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_flag("--planned", planned, "replay plan_sync's tokens instead of deriving them from the phases");
  CLI11_PARSE(app, argc, argv);
  const auto block = parse_bytes(size);
  const auto bps = parse_rate(rate);
  if (!block || *block == 0 || !bps) {
    std::cerr << "aapc-simgrid-check: --size and --rate take a size like 64K and a rate like 100Gbit\n";
    return 2;
  }

  RandomTreeOptions o;
  o.machines = leaves * per_leaf;
  o.switches = leaves + 1;
  o.shape = TreeShape::kTwoLevel;
  o.rate_bps = *bps;
  std::mt19937_64 rng(1);
  const Topology t = random_tree(o, rng);

  PredictOptions po;
  po.block_bytes = *block;
  po.hand_over = HandOver{0.0, 0.0, 1.0, 0, 0.0, 0.0, h, 0.0, TokenLeaves::kDrained};
  po.keep_path = false;
  auto t0 = std::chrono::steady_clock::now();
  const Prediction p = predict(t, *AlgorithmSpec::parse("tree"), *SyncSpec::parse("sender-all"), po);
  const double predict_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Replay rp;
  t0 = std::chrono::steady_clock::now();
  {
    const TreeModel model(t);
    rp = planned ? from_plan(plan_sync(t, tree_schedule(model), *SyncSpec::parse("sender-all"))) : from_phases(t, tree_phases(model));
  }
  const double simulated = simulate(argc, argv, leaves, per_leaf, *bps, *block, h, rp);
  const double sim_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << std::setprecision(9) << o.machines << " machines (" << leaves << " leaves of " << per_leaf << "), " << *block << " bytes at " << rate
            << ", hand-over " << h << " s, tokens " << (planned ? "planned" : "from the phases") << "\n"
            << "  SimGrid  " << simulated << " s  (" << sim_s << " s to build the replay and simulate)\n"
            << "  predict  " << p.time_s << " s  (" << predict_s << " s)\n"
            << "  difference " << std::setprecision(3) << 100.0 * (p.time_s - simulated) / simulated << "%\n";
  return std::abs(p.time_s - simulated) <= 0.01 * simulated ? 0 : 1;
}
