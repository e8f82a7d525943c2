// aapc-bench: every schedule against the physical limit of the topology and against MPI.
//
// On an emulated cluster (the default; needs root) it brings up the topology with aapc-emu,
// runs itself in measurement mode on every machine for each schedule, runs Open MPI's and
// MPICH's MPI_Alltoall (each algorithm they let you force) over TCP on the same network, and
// writes a table, CSV, JSON and plots. With --existing it measures on daemons already running
// (start it on every node at once, e.g. with mpirun or srun; rank 0 reports).
//
// Timing as in the papers (Faraj/Yuan/Patarasuk Figure 5): warm-up exchanges, a barrier, then
// iterations of an exchange followed by a barrier, averaged; more iterations for small blocks.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <stdexcept>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/tree.hpp"
#include "bench/bench.hpp"
#include "common/procutil.hpp"

using namespace aapc::bench;

namespace {

// Why schedule `name` cannot run on `topo` (its builder refuses it), or nothing. A name that is
// no schedule is the user's mistake, not the tree's: it ends the sweep before anything runs.
std::optional<std::string> not_applicable(const aapc::sched::Topology& topo, const std::string& name) {
  if (name == "auto") return std::nullopt;
  const auto spec = aapc::sched::AlgorithmSpec::parse(name);
  if (!spec) throw std::runtime_error("--schedules: '" + name + "' is not a schedule (aapc-bench --help lists them)");
  try {
    (void)aapc::sched::make_schedule(topo, *spec);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return std::nullopt;
}

// The sweep of `a`: the topology (at --rate when given), where results go, the configurations
// and the per-size budgets.
Sweep plan_sweep(const Args& a) {
  aapc::sched::Topology topo = aapc::sched::load_topology(a.topology);
  Sweep s;
  s.name = fs::path(topo.source()).stem().string() + (a.rate.empty() ? "" : "-" + a.rate);
  s.out = a.out.empty() ? fs::path("bench") / s.name : fs::path(a.out);
  fs::create_directories(s.out);
  s.out = fs::canonical(s.out);
  s.topo_file = fs::absolute(topo.source());
  if (!a.rate.empty()) {
    auto bps = aapc::sched::parse_rate(a.rate);
    if (!bps) throw std::runtime_error("--rate " + a.rate + " is not a rate like 10Mbit");
    s.topo_file = s.out / "topology.dot";
    std::ofstream(s.topo_file) << aapc::sched::to_dot(topo, *bps);
    topo = aapc::sched::load_topology(s.topo_file.string());
  }
  const aapc::sched::TreeModel model(topo);
  s.peak = model.peak_aggregate_bps();
  if (model.limiting_link() >= 0) {
    const std::uint64_t rate = topo.links()[static_cast<std::size_t>(model.limiting_link())].rate_bps;
    s.burst_s = 8.0 * static_cast<double>(aapc::tools::emu_tbf_burst(rate, topo.mtu())) / static_cast<double>(rate);
  }
  s.n = topo.machine_count();
  s.multi_switch = !topo.single_switch();
  s.many_senders = aapc::sched::shared_by_many_senders(model);
  s.ppn = a.ppn;
  s.port = a.port;
  // Machine-level sizes: with K ranks per machine, each pair of machines carries K^2 blocks.
  s.sizes = parse_sizes(a.sizes);
  for (auto& b : s.sizes) b *= static_cast<std::uint64_t>(a.ppn) * static_cast<std::uint64_t>(a.ppn);
  s.tools = self_dir();
  // Configurations: every schedule, and the tree with each sync variant asked for. A schedule
  // that does not apply to this tree (pairwise-xor on 11 machines) is skipped, and said so,
  // before the cluster comes up: otherwise every rank would fail on it, and the whole sweep
  // with it.
  for (const auto& sched : a.schedules) {
    if (auto why = not_applicable(topo, sched)) {
      std::cout << "aapc-bench: skipping " << sched << ": " << *why << std::endl;
      continue;
    }
    if (aapc::sched::algorithm_of(sched) == aapc::sched::Algorithm::kTree) {
      for (const auto& y : a.tree_syncs) s.configs.emplace_back(sched, y);
    } else {
      s.configs.emplace_back(sched, "auto");
    }
  }
  // Per size: the iterations, a time budget (its points at 2% of the limit with 0.1 s more
  // per exchange, plus start-up), and every block to n-1 others, warm-ups included.
  for (std::uint64_t b : s.sizes) {
    const int it = iterations(b, s.n, s.peak, a.point_seconds, a.max_iters);
    s.job_budget_s += (it + 2) * (0.1 + exchange_bits(s.n, static_cast<double>(b)) / (0.02 * s.peak));
    s.points_arg += " " + std::to_string(b / static_cast<std::uint64_t>(a.ppn * a.ppn)) + ":" + std::to_string(it);
    s.least_tx += static_cast<double>(s.n - 1) * static_cast<double>(b) * (it + 2);
  }
  return s;
}

int orchestrate(const Args& a) {
  if (::geteuid() != 0) throw std::runtime_error("the emulated cluster needs root; on a real cluster use --existing on every node");
  const Sweep sweep = plan_sweep(a);
  auto variants = mpi_variants(a);
  if (sweep.configs.empty() && variants.empty()) throw std::runtime_error("nothing to measure: no schedule asked for runs on this topology, and --mpi none");
  const std::size_t total = (sweep.configs.size() + variants.size()) * sweep.sizes.size() * static_cast<std::size_t>(a.repeat);
  std::size_t done = 0;
  auto progress = [&](const Json& p) {
    ++done;
    double agg = exchange_bits(sweep.n, p["size"].get<double>()) / p["seconds"].get<double>();
    std::cout << "[" << std::setw(3) << done << "/" << total << "] " << std::left << std::setw(34) << p["label"].get<std::string>() << std::right
              << std::setw(8) << p["size"].get<std::uint64_t>() << " B  " << std::setw(8) << mb(agg) << " Mbit/s  " << std::setw(5)
              << std::fixed << std::setprecision(1) << agg / sweep.peak * 100 << "% of the limit" << std::endl;
  };
  std::cout << "aapc-bench: " << sweep.name << ", " << sweep.n << " machines, physical limit " << mb(sweep.peak) << " Mbit/s; " << total
            << " points; results in " << sweep.out << std::endl;  // shown even when a signal ends the run
  EmuSession emu(sweep);
  int failures = 0;
  std::vector<Json> runs;  // every measurement; the report holds one per label and size
  emu.warm_up();
  std::optional<MpiLauncher> mpi;
  if (!variants.empty()) mpi.emplace(sweep);
  // Repetitions are interleaved (every configuration once, then again) so that a slow
  // minute of the machine falls on all of them alike rather than on one.
  for (int rep = 0; rep < a.repeat; ++rep) {
    if (!sweep.configs.empty()) {
      auto r = emu.run_aapc(a, progress);
      for (auto& p : r.points) {
        p["rep"] = rep;
        runs.push_back(p);
      }
      if (r.status != 0) {
        ++failures;
        std::cerr << "aapc-bench: the aapc schedules failed:\n" << r.other;
      }
    }
    for (const auto& v : variants) {
      bool failed = false;
      for (auto& p : mpi->run(v, a, progress, failed)) {
        p["rep"] = rep;
        runs.push_back(p);
      }
      failures += failed ? 1 : 0;
    }
  }
  mpi.reset();  // its hosts files go
  emu.down();
  const std::vector<Json> points = report_points(runs, sweep);
  write_report(a, sweep, points, summary(a, sweep, runs, points));
  return failures == 0 ? 0 : 1;
}

// --rates: the whole sweep at each rate in turn, each in a folder of its own under the output,
// then % of the limit against the rate in one plot.
int orchestrate_rates(const Args& a) {
  const aapc::sched::Topology topo = aapc::sched::load_topology(a.topology);
  const std::string stem = fs::path(topo.source()).stem().string();
  const fs::path base = a.out.empty() ? fs::path("bench") / (stem + "-rates") : fs::path(a.out);
  std::vector<std::pair<std::uint64_t, std::vector<Json>>> by_rate;
  int status = 0;
  for (std::size_t i = 0; i < a.rates.size(); ++i) {
    const auto bps = aapc::sched::parse_rate(a.rates[i]);
    if (!bps) throw std::runtime_error("--rates: " + a.rates[i] + " is not a rate like 100Mbit");
    std::cout << "aapc-bench: rate " << i + 1 << " of " << a.rates.size() << ": " << a.rates[i] << "\n";
    Args one = a;
    one.rates.clear();
    one.rate = a.rates[i];
    one.out = (base / a.rates[i]).string();
    status |= orchestrate(one);
    std::ifstream in(fs::path(one.out) / "results.json");
    const Json report = Json::parse(in, nullptr, false);
    if (report.is_discarded() || !report.contains("points")) throw std::runtime_error("no results.json in " + one.out);
    by_rate.emplace_back(*bps, report["points"].get<std::vector<Json>>());
  }
  write_rates_report(fs::canonical(base), stem + ": % of the physical limit against the link rate", by_rate, a.plot);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-bench: every schedule against the physical limit of the topology and against MPI_Alltoall on the same network"};
  Args a;
  app.add_option("--topology,-t", a.topology, "topology (file or shipped name)")->capture_default_str();
  app.add_option("--rate", a.rate, "run every link at this rate (e.g. 20Mbit for large topologies on few cores)");
  app.add_option("--rates", a.rates, "a rate sweep: the whole sweep at each of these link rates (e.g. 100Mbit,500Mbit,1Gbit), then rates.csv and a plot of % of the limit against the rate")
      ->delimiter(',')
      ->excludes("--rate");
  app.add_option("--sizes", a.sizes, "block sizes")->capture_default_str();
  app.add_option("--schedules", a.schedules, "aapc schedules: auto, " + aapc::sched::algorithm_usages(aapc::sched::AlgorithmInput::kDense))
      ->capture_default_str();
  app.add_option("--tree-syncs", a.tree_syncs, "sync variants swept for the tree schedule")->capture_default_str();
  app.add_option("--mpi", a.mpi, "MPI baselines: openmpi, mpich (none for no MPI)")->capture_default_str();
  app.add_flag("!--default-mpi-algorithms-only", a.all_mpi_algorithms, "only the MPIs' default algorithm, not every forced one");
  app.add_option("--point-seconds", a.point_seconds, "time budget per point (iterations follow the papers within it)")->capture_default_str();
  app.add_option("--max-iters", a.max_iters, "iterations per point at most")->capture_default_str();
  app.add_option("--repeat", a.repeat, "measure every point this many times, interleaved, and report the median (odd counts are best)")
      ->capture_default_str()
      ->check(CLI::Range(1, 99));
  app.add_flag("--check", a.check, "validate every received byte");
  app.add_option("--ppn", a.ppn, "ranks per machine of the MPI jobs; sizes are per rank, aapc's own schedules run blocks of ppn^2 x size")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--port", a.port, "how the emulated cluster's daemons open their interface: auto (AF_XDP where it can, else af_packet), af_xdp, af_packet")
      ->check(CLI::IsMember({"auto", "af_xdp", "af_packet"}))
      ->capture_default_str();
  app.add_flag("--aapc-mpi", a.aapc_mpi, "also run each MPI's job with libaapc-mpi.so preloaded (label MPI+aapc)");
  app.add_option("--out,-o", a.out, "directory for results.{txt,csv,json} and throughput.{png,svg} (default bench/<topology>)");
  app.add_flag("--existing", a.existing, "measure on daemons already running: start this on every node at once (rank 0 reports)");
  app.add_flag("!--no-plot", a.plot, "skip the gnuplot plots");
  app.add_flag("--measure", a.measure, "(internal) measure one schedule on this node")->group("");
  app.add_option("--schedule", a.schedule, "(with --existing) the schedule")->group("");
  app.add_option("--sync", a.sync, "(with --existing) the sync variant")->group("");
  app.add_option("--configs", a.configs, "(with --existing) SCHEDULE[+SYNC] specs measured interleaved, e.g. auto tree+sender-all linear");
  CLI11_PARSE(app, argc, argv);
  if (std::find(a.mpi.begin(), a.mpi.end(), "none") != a.mpi.end()) a.mpi.clear();
  try {
    if (a.measure || a.existing) return measure(a);
    if (!a.rates.empty()) return orchestrate_rates(a);
    return orchestrate(a);
  } catch (const std::exception& e) {
    std::cerr << "aapc-bench: " << e.what() << "\n";
    return 1;
  }
}
