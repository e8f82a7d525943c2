// aapc-sched-bench: how long the schedule library takes, and how it grows with the cluster.
//
// Targets: `tree` plus verification for 1,024 machines on a random tree of 32
// switches under 1 s; a sender-all sync plan for 256 machines under 5 s; CGM for n = 1,024,
// d = 64 under 100 ms. Each figure is the best of --repeat runs.
#include <CLI/CLI.hpp>

#include <chrono>
#include <functional>
#include <iomanip>
#include <iostream>

#include <sys/resource.h>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/predict.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/verify.hpp"

using namespace aapc::sched;

namespace {

double best_of(int repeat, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

Topology tree_of_32_switches(int machines, std::uint64_t seed) {
  RandomTreeOptions o;
  o.machines = machines;
  o.switches = 32;
  o.leave_switches_empty = false;
  std::mt19937_64 rng(seed);
  return random_tree(o, rng);
}

void row(const std::string& what, int n, double seconds, double base, const std::string& extra, double target) {
  std::cout << "  " << std::left << std::setw(28) << what << std::right << std::setw(6) << n << std::setw(12) << std::fixed << std::setprecision(4)
            << seconds << " s" << std::setw(9) << std::setprecision(1) << seconds / base << "x   " << extra;
  if (target > 0) std::cout << (seconds <= target ? "   [target < " : "   [MISSED target < ") << target << " s]";
  std::cout << "\n";
}

// Peak resident memory of this process so far, in MB (Linux reports kilobytes).
double peak_mb() {
  rusage use{};
  getrusage(RUSAGE_SELF, &use);
  return static_cast<double>(use.ru_maxrss) / 1024.0;
}

// `aapc-sched predict` on two-level trees of 64-4,096 machines (leaves of sqrt(n)): the target is
// 4,096 machines in under 10 s and 2 GB. Run last: the peak memory is the process's so far.
void bench_predict(int repeat) {
  std::cout << "\npredict, two-level tree at 100 Gbit/s, 64 KiB blocks (peak memory of the process so far)\n";
  for (const Algorithm algo : {Algorithm::kTree, Algorithm::kPacedShuffle}) {
    double base = 0;
    for (int leaves : {8, 16, 32, 64}) {
      RandomTreeOptions o;
      o.machines = leaves * leaves;
      o.switches = leaves + 1;
      o.shape = TreeShape::kTwoLevel;
      o.rate_bps = 100'000'000'000ULL;
      std::mt19937_64 rng(1);
      const Topology t = random_tree(o, rng);
      const AlgorithmSpec spec{algo, algorithm_info(algo).param_default};
      const SyncSpec sync = default_sync(spec.algorithm);
      Prediction p;
      const double secs = best_of(repeat, [&] { p = predict(t, spec, sync, PredictOptions{}); });
      if (base == 0) base = secs;
      std::ostringstream extra;
      extra << std::setprecision(3) << 100.0 * p.fraction() << "% of the limit; peak " << std::setprecision(4) << peak_mb() << " MB";
      row("predict " + spec.name(), o.machines, secs, base, extra.str(), o.machines == 4096 ? 10.0 : 0);
    }
  }
}

// What a daemon plans for its first exchange on a two-level tree of `machines` (leaves of
// sqrt(machines)): `algorithm` with `sync` (the tree with sender-all unless told), node 0's
// part alone (sched::plan_part), or with `whole` every node's (plan_sync, as `aapc-sched show`
// makes it). Run alone, in a process of its own: the peak memory is the process's.
void bench_daemon_plan(int machines, bool whole, const AlgorithmSpec& algorithm, const SyncSpec& sync) {
  int leaves = 1;
  while ((leaves + 1) * (leaves + 1) <= machines) ++leaves;
  RandomTreeOptions o;
  o.machines = machines;
  o.switches = leaves + 1;
  o.shape = TreeShape::kTwoLevel;
  std::mt19937_64 rng(1);
  const Topology t = random_tree(o, rng);
  const auto t0 = std::chrono::steady_clock::now();
  // As the daemon (its part, from the phases alone) and `aapc-sched show` (every node's) do.
  const Schedule s = whole ? plan_sync(t, make_schedule(t, algorithm), sync) : plan_part(t, algorithm, sync, 0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::size_t rounds = 0;
  for (const Program& p : s.programs) rounds += p.rounds.size();
  std::cout << (whole ? "every node's plan" : "node 0's part") << ", " << algorithm.name() << " + " << sync.name() << ", " << machines << " machines on " << leaves
            << " leaves: " << std::fixed << std::setprecision(2) << secs << " s, peak " << std::setprecision(0) << peak_mb() << " MB; keeps "
            << rounds << " rounds and " << s.syncs.size() << " of " << s.sync_total() << " syncs\n";
}

// The library's figures from 64 to 1,024 machines, against their targets.
void bench_library(int repeat, int max_sync, std::uint64_t seed) {
  const std::vector<int> sizes = {64, 128, 256, 512, 1024};
  std::cout << "tree schedule + verification, random tree of 32 switches (growth relative to 64 machines)\n";
  double base = 0;
  for (int n : sizes) {
    Topology t = tree_of_32_switches(n, seed);
    std::int64_t phases = 0;
    bool ok = true;
    double secs = best_of(repeat, [&] {
      Schedule s = make_schedule(t, {Algorithm::kTree, 0});
      VerifyReport r = verify(t, s);
      phases = r.phases;
      ok = ok && r.ok() && r.phases == r.load;
    });
    if (base == 0) base = secs;
    row("tree + verify", n, secs, base, std::to_string(phases) + " phases" + (ok ? "" : " VERIFY FAILED"), n == 1024 ? 1.0 : 0);
  }

  std::cout << "\nsender-all sync plan (and, separately, its verification), same trees\n";
  base = 0;
  for (int n : sizes) {
    if (n > max_sync) break;
    Topology t = tree_of_32_switches(n, seed);
    Schedule s = make_schedule(t, {Algorithm::kTree, 0});
    Schedule synced;
    double secs = best_of(repeat, [&] { synced = plan_sync(t, s, {SyncKind::kSenderAll, 1}); });
    double vsecs = best_of(1, [&] {
      if (!verify(t, synced).ok()) std::cout << "  VERIFY FAILED\n";
    });
    if (base == 0) base = secs;
    std::ostringstream extra;
    extra << synced.sync_stats.contending_pairs << " pairs -> " << synced.sync_stats.tokens << " tokens + " << synced.sync_stats.local_waits
          << " local; verify " << std::setprecision(3) << vsecs << " s";
    row("plan sender-all", n, secs, base, extra.str(), n == 256 ? 5.0 : 0);
  }

  std::cout << "\nsender-all sync plan on one switch (every pair of messages to a node contends)\n";
  base = 0;
  for (int n : sizes) {
    if (n > max_sync) break;
    Topology t = single_switch_topology(n);
    Schedule s = make_schedule(t, {Algorithm::kTree, 0});
    Schedule synced;
    double secs = best_of(repeat, [&] { synced = plan_sync(t, s, {SyncKind::kSenderAll, 1}); });
    if (base == 0) base = secs;
    row("plan sender-all", n, secs, base, std::to_string(synced.sync_stats.tokens) + " tokens", n == 256 ? 5.0 : 0);
  }

  std::cout << "\nCGM (compact global masking), Figure 7 pattern, d = 64\n";
  base = 0;
  for (int n : sizes) {
    std::mt19937_64 rng(seed);
    auto pattern = SparsePattern::figure7(n, 64, rng);
    std::size_t perms = 0;
    double secs = best_of(repeat, [&] { perms = compact_global_masking(pattern, rng).size(); });
    if (base == 0) base = secs;
    row("cgm d=64", n, secs, base, std::to_string(perms) + " permutations", n == 1024 ? 0.1 : 0);
  }
  bench_predict(repeat);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-sched-bench: time the schedule library from 64 to 1,024 machines"};
  int repeat = 3, max_sync = 256;
  std::uint64_t seed = 1;
  app.add_option("--repeat", repeat, "runs per figure (best is reported)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-sync", max_sync, "largest cluster for the sync plan (256 is the target; 512 and 1024 take long)")
      ->check(CLI::IsMember({64, 128, 256, 512, 1024}))
      ->capture_default_str();
  app.add_option("--seed", seed, "random tree seed")->capture_default_str();
  int daemon_plan = 0;
  bool whole = false;
  auto* plan_opt = app.add_option("--daemon-plan", daemon_plan,
                                  "only time what a daemon plans on a two-level tree of this many machines (its node's part of the plan of "
                                  "--algo and --sync), and its peak memory")
                      ->check(CLI::Range(4, 65534));
  app.add_flag("--whole", whole, "with --daemon-plan: plan every node's part, as before daemons kept their own");
  std::string algo = "tree", sync = "sender-all";
  app.add_option("--algo", algo, "with --daemon-plan: the schedule")->capture_default_str()->needs(plan_opt);
  app.add_option("--sync", sync, "with --daemon-plan: the sync variant")->capture_default_str()->needs(plan_opt);
  CLI11_PARSE(app, argc, argv);
  if (daemon_plan > 0) {
    const auto a = AlgorithmSpec::parse(algo);
    const auto y = SyncSpec::parse(sync);
    if (!a || !y) {
      std::cerr << "aapc-sched-bench: " << (a ? "--sync " + sync + " is not a sync variant" : "--algo " + algo + " is not a schedule")
                << " (aapc-sched show --help lists them)\n";
      return 2;
    }
    try {
      bench_daemon_plan(daemon_plan, whole, *a, *y);
    } catch (const std::exception& e) {
      std::cerr << "aapc-sched-bench: " << e.what() << "\n";
      return 1;
    }
    return 0;
  }
  if (whole) {
    std::cerr << "aapc-sched-bench: --whole goes with --daemon-plan N\n";
    return 2;
  }
  bench_library(repeat, max_sync, seed);
  return 0;
}

