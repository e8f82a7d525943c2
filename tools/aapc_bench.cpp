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
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include "aapc/client.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/tree.hpp"
#include "common/procutil.hpp"
#include "pattern.h"

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

struct Args {
  std::string topology = "8-two-switch";
  std::string rate;
  std::vector<std::string> sizes = {"1K", "2K", "4K", "8K", "16K", "32K", "64K", "128K", "256K", "512K", "1M"};
  std::vector<std::string> schedules = {"auto", "tree", "sync-shuffle", "group-shuffle", "pairwise", "pairwise-ec", "ring", "linear"};
  std::vector<std::string> tree_syncs = {"sender-all", "receiver-all", "none"};
  std::vector<std::string> mpi = {"openmpi", "mpich"};
  bool all_mpi_algorithms = true;
  double point_seconds = 2.0;
  int max_iters = 500;
  int repeat = 1;
  bool check = false;
  std::string out;
  bool existing = false;
  bool measure = false;  // internal: measure the configurations on this node
  std::string schedule = "auto", sync = "auto";
  std::vector<std::string> configs;  // SCHEDULE[+SYNC] specs measured interleaved (--configs)
  bool plot = true;
};

std::vector<std::uint64_t> parse_sizes(const std::vector<std::string>& sizes) {
  std::vector<std::uint64_t> out;
  for (const auto& s : sizes) {
    auto b = aapc::sched::parse_bytes(s);
    if (!b || *b == 0) throw std::runtime_error("size '" + s + "' is not like 64K or 1M");
    out.push_back(*b);
  }
  return out;
}

// What one exchange of `block`-byte blocks moves, all machines together: |M|(|M|-1)B.
double exchange_bits(int n, double block) { return static_cast<double>(n) * (n - 1) * block * 8; }

// The papers' iteration counts (50 up to 256 KB, 20 above), fewer when a point would take
// longer than the budget, more for small blocks (a quarter of the budget): a 1 KiB exchange
// takes a few milliseconds and 50 of them vary by tens of percent from run to run on a
// shared box. Every node computes the same.
int iterations(std::uint64_t block, int n, double peak_bps, double budget_s, int max_iters) {
  double estimate = exchange_bits(n, static_cast<double>(block)) / peak_bps + 0.003;
  int papers = block <= 256 * 1024 ? 50 : 20;
  int fit = static_cast<int>(budget_s / estimate);
  int it = fit >= papers ? std::max(papers, fit / 4) : fit;
  return std::max(3, std::min(it, max_iters));
}

std::string label_of(const std::string& schedule, const std::string& sync) {
  return sync == "none" ? schedule : aapc::sched::join_spec(schedule, sync);
}

// --- measurement mode: runs on every node ------------------------------------------------

// Several configurations are measured interleaved, a few exchanges of each in turn, so that
// they share the machine's slow and fast moments: on a box where the daemons share two cores
// the same schedule measured a minute apart differs by 5-60% at 1 KiB, which would swamp
// the differences between schedules that `auto` is calibrated from.
struct Config {
  std::string schedule, sync;
};

std::vector<Config> parse_configs(const std::vector<std::string>& specs) {
  std::vector<Config> out;
  for (const auto& s : specs) {
    auto parts = aapc::sched::read_spec(s);  // also the old SCHEDULE:SYNC
    out.push_back({parts.algorithm, parts.sync.empty() ? "auto" : parts.sync});
  }
  return out;
}

int measure(const Args& a) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  const std::vector<Config> configs = a.configs.empty() ? std::vector<Config>{{a.schedule, a.sync}} : parse_configs(a.configs);
  auto fail = [&](const aapc::Error& e) {
    std::cerr << "aapc-bench: rank " << me << ": " << e.message() << "\n";
    return 1;
  };
  for (std::uint64_t block : parse_sizes(a.sizes)) {
    const int iters = iterations(block, n, c.info().peak_bps, a.point_seconds, a.max_iters);
    // In turns of a few exchanges: ten per configuration, together at least `iters`.
    const int rounds = std::min(iters, 10), per_round = (iters + rounds - 1) / rounds;
    aapc::Buffer send = c.allocate(n * block), recv = c.allocate(n * block);
    for (int d = 0; d < n; ++d)
      for (std::size_t k = 0; k < block; ++k) send.data()[static_cast<std::size_t>(d) * block + k] = aapc::tools::pattern(me, d, 0, k);
    // What each configuration measured; summed over its turns.
    struct Tally {
      std::string schedule, sync;  // what ran
      double retransmissions = 0, wait = 0, cpu = 0, busy = 0, barrier = 0, seconds = 0;
      std::vector<double> turns;  // this rank's time per exchange in each turn, in round order
      bool ok = true;
    };
    std::vector<Tally> tally(configs.size());
    std::vector<aapc::Options> options(configs.size());
    for (std::size_t i = 0; i < configs.size(); ++i) {
      options[i].schedule = configs[i].schedule;
      options[i].sync = configs[i].sync;
      for (int w = 0; w < 2; ++w) {
        auto r = c.alltoall(send, recv, block, options[i]);
        if (!r) return fail(r.error());
        tally[i].schedule = r->schedule;
        tally[i].sync = r->sync;
      }
    }
    // Every round runs the configurations in a new order, the same on every rank, so that
    // none always follows the same one: a schedule that overflows the queues leaves the next
    // one a busier machine. (Rotating one order, as before, changed which came first but kept
    // each one's predecessor.) Fisher-Yates on mt19937_64, whose output the standard fixes,
    // so that ranks built with different libraries still agree.
    std::vector<std::size_t> order(configs.size());
    for (int round = 0; round < rounds; ++round) {
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::mt19937_64 draw(block * 1000 + static_cast<std::uint64_t>(round));
      for (std::size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[draw() % k]);
      for (const std::size_t i : order) {
        Tally& t = tally[i];
        // The check below must see what this turn's exchanges delivered, nothing earlier.
        if (a.check) std::fill(recv.data(), recv.data() + n * block, std::uint8_t{0});
        if (auto b = c.barrier(); !b) return fail(b.error());
        const auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < per_round; ++k) {
          auto r = c.alltoall(send, recv, block, options[i]);
          if (!r) return fail(r.error());
          t.retransmissions += static_cast<double>(r->retransmissions);
          t.wait += r->sync_wait_seconds;
          t.cpu += r->daemon_cpu_seconds;
          t.busy += r->seconds;
          const auto b0 = std::chrono::steady_clock::now();
          if (auto b = c.barrier(); !b) return fail(b.error());
          t.barrier += std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
        }
        const double turn = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t.seconds += turn;
        t.turns.push_back(turn / per_round);
        if (a.check)
          for (int s = 0; s < n && t.ok; ++s)
            for (std::size_t k = 0; k < block; ++k)
              if (recv.data()[s * block + k] != aapc::tools::pattern(s, me, 0, k)) {
                t.ok = false;
                break;
              }
      }
    }
    const int timed = rounds * per_round;
    // Every rank's counters of every configuration to rank 0, in one small exchange of our
    // own: the figures below are the cluster's (resent frames summed, the rest averaged over
    // the ranks; the time is the slowest rank's, which is when the exchange was done
    // everywhere).
    struct Counters {
      double retransmissions, wait, cpu, busy, barrier, seconds, ok;
    };
    const std::size_t k = configs.size();
    aapc::Buffer out = c.allocate(n * k * sizeof(Counters)), in = c.allocate(n * k * sizeof(Counters));
    for (int d = 0; d < n; ++d)
      for (std::size_t i = 0; i < k; ++i) {
        const Tally& t = tally[i];
        out.as<Counters>()[static_cast<std::size_t>(d) * k + i] = {t.retransmissions, t.wait, t.cpu, t.busy, t.barrier, t.seconds, t.ok ? 1.0 : 0.0};
      }
    if (auto r = c.alltoall(out, in, k * sizeof(Counters), aapc::Options{}); !r) return fail(r.error());
    bool all_ok = true;
    for (std::size_t i = 0; i < k; ++i) {
      Tally& t = tally[i];
      t.retransmissions = t.wait = t.cpu = t.busy = t.barrier = t.seconds = 0;
      for (int s = 0; s < n; ++s) {
        const Counters& c_s = in.as<Counters>()[static_cast<std::size_t>(s) * k + i];
        t.retransmissions += c_s.retransmissions;
        t.wait += c_s.wait / n;
        t.cpu += c_s.cpu / n;
        t.busy += c_s.busy / n;
        t.barrier += c_s.barrier / n;
        t.seconds = std::max(t.seconds, c_s.seconds);
        t.ok = t.ok && c_s.ok != 0;
      }
      if (!t.ok && me == 0) std::cerr << "aapc-bench: CHECK FAILED at " << block << " bytes with " << label_of(configs[i].schedule, configs[i].sync) << "\n";
      all_ok = all_ok && t.ok;
      if (me == 0) {
        const bool is_auto = configs[i].schedule == "auto";
        Json j = {{"impl", "aapc"},
                  {"schedule", t.schedule},
                  {"sync", t.sync},
                  {"label", is_auto ? std::string("auto") : label_of(configs[i].schedule, configs[i].sync)},
                  {"size", block},
                  {"iters", timed},
                  {"seconds", t.seconds / timed},
                  {"retransmissions", static_cast<std::uint64_t>(t.retransmissions)},
                  {"sync_wait_s", t.wait / timed},
                  {"cpu_s", t.cpu / timed},
                  {"exchange_s", t.busy / timed},
                  {"barrier_s", t.barrier / timed},
                  {"turn_s", t.turns},  // rank 0's: every turn starts and ends with a barrier
                  {"checked", a.check},
                  {"check_ok", t.ok},
                  {"interleaved", configs.size()}};
        if (is_auto) j["chosen"] = label_of(t.schedule, t.sync);
        std::cout << j.dump() << std::endl;
      }
    }
    if (!all_ok) return 1;
  }
  return 0;
}

// --- orchestration on an emulated cluster --------------------------------------------------

struct Run {
  int status = -1;
  std::vector<Json> points;
  std::string other;  // lines that were not JSON
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a command and collects JSON lines as they come, calling `on_point` for each.
Run run_collect(const std::string& cmd, const std::function<void(const Json&)>& on_point) {
  Run r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[65536];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    std::string line(buf);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty() && line.front() == '{') {
      try {
        Json j = Json::parse(line);
        r.points.push_back(j);
        on_point(j);
        continue;
      } catch (const std::exception&) {
      }
    }
    r.other += line + "\n";
  }
  int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

fs::path self_dir() { return fs::canonical("/proc/self/exe").parent_path(); }

struct MpiVariant {
  std::string impl, label, env;  // env: extra mpirun arguments or environment
};

std::vector<MpiVariant> mpi_variants(const Args& a) {
  std::vector<MpiVariant> out;
  for (const auto& impl : a.mpi) {
    if (!fs::exists(self_dir() / ("mpi-alltoall-" + impl))) {
      std::cerr << "aapc-bench: skipping " << impl << ": mpi-alltoall-" << impl << " was not built (is " << impl << " installed?)\n";
      continue;
    }
    if (impl == "openmpi") {
      out.push_back({impl, "openmpi default", ""});
      if (a.all_mpi_algorithms) {
        // coll_tuned_alltoall_algorithm: 1 basic linear, 2 pairwise, 3 modified Bruck, 4 linear with sync.
        const char* names[] = {"", "linear", "pairwise", "bruck", "linear-sync"};
        for (int k = 1; k <= 4; ++k)
          out.push_back({impl, std::string("openmpi ") + names[k],
                         "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_alltoall_algorithm " + std::to_string(k)});
      }
    } else {
      out.push_back({impl, "mpich default", ""});
      if (a.all_mpi_algorithms)
        // The values MPICH 4.0 accepts for an intra-communicator (its alltoall/ sources).
        for (const char* alg : {"brucks", "pairwise", "pairwise_sendrecv_replace", "scattered"})
          out.push_back({impl, std::string("mpich ") + alg, std::string("MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM=") + alg});
    }
  }
  return out;
}

std::string mb(double bps) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << bps / 1e6;
  return o.str();
}

// Why a point falls short of 90% of the limit, from what it measured.
std::string why(const Json& p, double fraction, bool multi_switch) {
  if (p.contains("check_ok") && !p["check_ok"].get<bool>()) return "CHECK FAILED: received bytes wrong";
  // Nothing crosses the bottleneck faster than the wire: a point above the limit did not
  // move its data over the network, whatever the library reported.
  if (fraction > 1.02) return "ABOVE the physical limit: not a real exchange";
  if (!p.value("over_network", true)) return "NOT over the network (shared memory?)";
  if (fraction >= 0.9) return "";
  std::vector<std::string> reasons;
  const double secs = p.value("seconds", 0.0);
  if (p.value("impl", std::string()) != "aapc") return "TCP, MPI's own schedule";
  if (p.value("retransmissions", 0) > 0) reasons.push_back(std::to_string(p["retransmissions"].get<std::uint64_t>()) + " frames resent (queues overflowed)");
  const double wait = p.value("sync_wait_s", 0.0), cpu = p.value("cpu_s", 0.0);
  if (wait > 0.1 * secs) reasons.push_back("sync wait " + std::to_string(static_cast<int>(wait / secs * 100)) + "%");
  if (cpu > 0.8 * secs) reasons.push_back("daemon CPU " + std::to_string(static_cast<int>(cpu / secs * 100)) + "%");
  const std::string s = p.value("schedule", std::string());
  if (multi_switch && s != "tree") reasons.push_back("not contention-free on this tree");
  const double fixed = secs - p.value("exchange_s", secs);
  if (fixed > 0.1 * secs) reasons.push_back("barrier/start " + std::to_string(static_cast<int>(fixed / secs * 100)) + "%");
  if (reasons.empty()) reasons.push_back("per-exchange overhead at this size");
  std::string out;
  for (const auto& r : reasons) out += (out.empty() ? "" : "; ") + r;
  return out;
}

// One point per label and size from repeated runs: the run with the median time (the slower
// of the two middle ones for an even count), with every run's time and the spread
// (max - min) / median kept. A point is trusted only if every run was: one failed check or
// one run around the network marks it.
std::vector<Json> median_points(const std::vector<Json>& runs) {
  std::map<std::pair<std::string, std::uint64_t>, std::vector<const Json*>> by;
  for (const auto& r : runs) by[{r["label"].get<std::string>(), r["size"].get<std::uint64_t>()}].push_back(&r);
  std::vector<Json> out;
  for (auto& [key, group] : by) {
    Json all = Json::array();  // in the order of the repetitions
    for (const Json* r : group) all.push_back((*r)["seconds"]);
    std::sort(group.begin(), group.end(), [](const Json* x, const Json* y) { return (*x)["seconds"].get<double>() < (*y)["seconds"].get<double>(); });
    Json p = *group[group.size() / 2];
    bool check_ok = true, over_network = true;
    for (const Json* r : group) {
      check_ok = check_ok && r->value("check_ok", true);
      over_network = over_network && r->value("over_network", true);
    }
    p["runs"] = group.size();
    p["seconds_all"] = all;
    p["spread"] = (group.back()->at("seconds").get<double>() - group.front()->at("seconds").get<double>()) / p["seconds"].get<double>();
    if (p.contains("check_ok")) p["check_ok"] = check_ok;
    if (p.contains("over_network")) p["over_network"] = over_network;
    out.push_back(std::move(p));
  }
  return out;
}

void plot(const fs::path& dir, const std::vector<Json>& points, double peak_bps, const std::string& title) {
  std::map<std::string, std::vector<std::pair<std::uint64_t, double>>> series;
  for (const auto& p : points) series[p["label"]].emplace_back(p["size"].get<std::uint64_t>(), p["aggregate_bps"].get<double>() / 1e6);
  std::ofstream script(dir / "plot.gp");
  script << "set title \"" << title << "\"\nset xlabel \"block size (bytes)\"\nset ylabel \"aggregate throughput (Mbit/s)\"\n"
         << "set logscale x 2\nset format x \"%.0s%cB\"\nset key outside right\nset grid\n";
  std::string plots;
  int i = 0;
  for (auto& [label, data] : series) {
    std::sort(data.begin(), data.end());
    std::string file = "series-" + std::to_string(i++) + ".dat";
    std::ofstream d(dir / file);
    for (auto& [x, y] : data) d << x << " " << y << "\n";
    plots += (plots.empty() ? "" : ", ") + std::string("'") + file + "' with linespoints title '" + label + "'";
  }
  plots += ", " + std::to_string(peak_bps / 1e6) + " with lines dashtype 2 lw 2 title 'peak (physical limit)'";
  for (const char* term : {"pngcairo size 1200,700", "svg size 1200,700"}) {
    std::string ext = std::string(term).rfind("png", 0) == 0 ? "png" : "svg";
    script << "set terminal " << term << "\nset output \"throughput." << ext << "\"\nplot " << plots << "\n";
  }
  script.close();
  std::string cmd = "cd " + quote(dir.string()) + " && gnuplot plot.gp 2>&1";
  if (std::system(cmd.c_str()) != 0) std::cerr << "aapc-bench: gnuplot failed (is gnuplot installed?); data and script are in " << dir << "\n";
}

int orchestrate(const Args& a) {
  if (::geteuid() != 0) throw std::runtime_error("the emulated cluster needs root; on a real cluster use --existing on every node");
  aapc::sched::Topology topo = aapc::sched::load_topology(a.topology);
  std::string name = fs::path(topo.source()).stem().string() + (a.rate.empty() ? "" : "-" + a.rate);
  fs::path out = a.out.empty() ? fs::path("bench") / name : fs::path(a.out);
  fs::create_directories(out);
  out = fs::canonical(out);
  fs::path topo_file = fs::absolute(topo.source());
  if (!a.rate.empty()) {
    auto bps = aapc::sched::parse_rate(a.rate);
    if (!bps) throw std::runtime_error("--rate " + a.rate + " is not a rate like 10Mbit");
    topo_file = out / "topology.dot";
    std::ofstream(topo_file) << aapc::sched::to_dot(topo, *bps);
    topo = aapc::sched::load_topology(topo_file.string());
  }
  aapc::sched::TreeModel model(topo);
  const double peak = model.peak_aggregate_bps();
  const int n = topo.machine_count();
  const bool multi_switch = !topo.single_switch();
  const auto sizes = parse_sizes(a.sizes);
  const fs::path tools = self_dir();
  const std::string emu = (tools / "aapc-emu").string();

  // Configurations: every schedule, and the tree with each sync variant asked for.
  std::vector<std::pair<std::string, std::string>> configs;
  for (const auto& s : a.schedules) {
    if (s == "tree") {
      for (const auto& y : a.tree_syncs) configs.emplace_back(s, y);
    } else {
      configs.emplace_back(s, "auto");
    }
  }
  auto variants = mpi_variants(a);
  const std::size_t total = (configs.size() + variants.size()) * sizes.size() * static_cast<std::size_t>(a.repeat);
  std::size_t done = 0;
  auto progress = [&](const Json& p) {
    ++done;
    double agg = exchange_bits(n, p["size"].get<double>()) / p["seconds"].get<double>();
    std::cout << "[" << std::setw(3) << done << "/" << total << "] " << std::left << std::setw(34) << p["label"].get<std::string>() << std::right
              << std::setw(8) << p["size"].get<std::uint64_t>() << " B  " << std::setw(8) << mb(agg) << " Mbit/s  " << std::setw(5)
              << std::fixed << std::setprecision(1) << agg / peak * 100 << "% of the limit" << std::endl;
  };

  std::cout << "aapc-bench: " << name << ", " << n << " machines, physical limit " << mb(peak) << " Mbit/s; " << total << " points; results in "
            << out << "\n";
  auto st = run_collect(emu + " status", [](const Json&) {});
  if (st.other.find("nothing is up") == std::string::npos) throw std::runtime_error("an emulated cluster is already up: `aapc-emu down` it first");
  auto up = run_collect(emu + " up " + quote(topo_file.string()), [](const Json&) {});
  if (up.status != 0) throw std::runtime_error("aapc-emu up failed:\n" + up.other);
  // Per size, computed once: the iterations (the MPI program is told them), a time budget so
  // that no job is waited for forever (its points at 2% of the limit with 0.1 s more per
  // exchange, plus start-up), and what rank 0 must at least put on its wire in an MPI job
  // (every block to n-1 others, warm-ups included).
  double job_budget_s = 120, least_tx = 0;
  std::string points_arg;
  for (std::uint64_t b : sizes) {
    const int it = iterations(b, n, peak, a.point_seconds, a.max_iters);
    job_budget_s += (it + 2) * (0.1 + exchange_bits(n, static_cast<double>(b)) / (0.02 * peak));
    points_arg += " " + std::to_string(b) + ":" + std::to_string(it);
    least_tx += static_cast<double>(n - 1) * static_cast<double>(b) * (it + 2);
  }
  int failures = 0;
  std::vector<Json> runs;  // every measurement; `points` below holds one per label and size
  try {
    std::string sizes_arg;
    for (const auto& s : a.sizes) sizes_arg += " " + s;
    // A run that is not measured first: right after the cluster comes up (and after an
    // earlier cluster's namespaces are torn down, which the kernel finishes in the background)
    // the first configuration measured 30% below the same one a minute later at 1 KiB.
    run_collect(emu + " run " + quote(topo_file.string()) + " --keep -- " + quote((tools / "aapc-bench").string()) +
                    " --measure --schedule auto --sync auto --point-seconds 1 --max-iters 20 --sizes 4K 64K",
                [](const Json&) {});
    // Every aapc configuration in one run on the cluster, interleaved turn by turn.
    auto run_aapc = [&](int rep) {
      std::ostringstream cmd;
      cmd << emu << " run " << quote(topo_file.string()) << " --keep --timeout " << static_cast<int>(job_budget_s * static_cast<double>(configs.size())) << " -- " << quote((tools / "aapc-bench").string()) << " --measure --point-seconds "
          << a.point_seconds << " --max-iters " << a.max_iters << (a.check ? " --check" : "") << " --sizes" << sizes_arg << " --configs";
      for (const auto& [schedule, sync] : configs) cmd << " " << aapc::sched::join_spec(schedule, sync);
      auto r = run_collect(cmd.str(), [&](const Json& p) { progress(p); });
      for (auto& p : r.points) {
        p["rep"] = rep;
        runs.push_back(p);
      }
      if (r.status != 0) {
        ++failures;
        std::cerr << "aapc-bench: the aapc schedules failed:\n" << r.other;
      }
    };
    // MPI over TCP on the same emulated network: hosts files per namespace, an rsh-like agent.
    Json state;
    std::string hostlist, first, subnet;
    const fs::path agent = out / "mpi-agent", hostfile = out / "mpi-hosts";
    if (!variants.empty()) {
      state = aapc::tools::read_emu_state();
      if (state.is_null()) throw std::runtime_error("cannot read " + aapc::tools::kEmuStateFile.string());
      std::string hosts = "127.0.0.1 localhost\n";
      for (const auto& m : state["machines"]) {
        hosts += m["ip"].get<std::string>() + " " + m["name"].get<std::string>() + "\n";
        hostlist += (hostlist.empty() ? "" : ",") + m["name"].get<std::string>();
      }
      for (const auto& m : state["machines"]) {
        fs::path dir = fs::path("/etc/netns") / m["netns"].get<std::string>();
        fs::create_directories(dir);
        std::ofstream(dir / "hosts") << hosts;
      }
      std::ofstream(agent) << "#!/bin/sh\n# rsh for MPI launchers: run the command in the machine's namespace, with its hostname.\n"
                              "while [ \"${1#-}\" != \"$1\" ]; do shift; done\nhost=$1; shift\n"
                              "exec ip netns exec \"aapc-$host\" unshare --uts sh -c \"hostname $host; $*\"\n";
      fs::permissions(agent, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
      {
        std::ofstream h(hostfile);
        for (const auto& m : state["machines"]) h << m["name"].get<std::string>() << " slots=1\n";
      }
      first = state["machines"][0]["name"];
      subnet = state["machines"][0]["ip"].get<std::string>().substr(0, state["machines"][0]["ip"].get<std::string>().find('.', 3)) + ".0.0/16";
    }
    auto tx_bytes = [&] {
      auto r = run_collect("ip netns exec " + state["machines"][0]["netns"].get<std::string>() + " cat /sys/class/net/aapc0/statistics/tx_bytes",
                           [](const Json&) {});
      return std::strtod(r.other.c_str(), nullptr);
    };
    auto run_mpi = [&](const MpiVariant& v, int rep) {
      std::string exe = (tools / ("mpi-alltoall-" + v.impl)).string() + (a.check ? " --check" : "") + points_arg;
      std::string launch;
      if (v.impl == "openmpi") {
        launch = "mpirun.openmpi --allow-run-as-root -np " + std::to_string(n) + " --hostfile " + hostfile.string() + " --mca plm_rsh_agent " +
                 agent.string() + " --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include " + subnet + " --mca oob_tcp_if_include " + subnet +
                 " " + v.env + " " + exe;
      } else {
        // Debian's MPICH is ch4:ucx, and UCX takes every namespace of one box for one host:
        // left alone it moves the data through shared memory, not the emulated network
        // (measured: 3 KB on a rank's wire for a 256 KiB exchange). TCP only, on aapc0.
        launch = "mpiexec.mpich -n " + std::to_string(n) + " -hosts " + hostlist + " -launcher rsh -launcher-exec " + agent.string() +
                 " -iface aapc0 -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES aapc0 " +
                 (v.env.empty() ? "" : "-genv " + v.env.substr(0, v.env.find('=')) + " " + v.env.substr(v.env.find('=') + 1) + " ") + exe;
      }
      launch = "timeout -k 10 " + std::to_string(static_cast<int>(job_budget_s)) + " " + launch;
      std::string cmd = "ip netns exec aapc-" + first + " unshare --uts sh -c " + quote("hostname " + first + "; " + launch);
      const double tx0 = tx_bytes();
      auto r = run_collect(cmd, [&](Json p) {
        p["impl"] = v.impl;
        p["label"] = v.label;
        progress(p);
      });
      // An MPI that found a way around the network (shared memory) measures nothing of it.
      const double sent = tx_bytes() - tx0;
      const bool bypassed = r.status == 0 && sent < 0.9 * least_tx;
      if (bypassed)
        std::cerr << "aapc-bench: " << v.label << ": rank 0 sent " << static_cast<std::uint64_t>(sent) << " bytes on its link, at least "
                  << static_cast<std::uint64_t>(least_tx) << " expected: it did not use the network; its figures are marked\n";
      for (auto& p : r.points) {
        p["impl"] = v.impl;
        p["label"] = v.label;
        p["over_network"] = !bypassed;
        p["rep"] = rep;
        runs.push_back(p);
      }
      if (r.status != 0 && r.points.size() == sizes.size()) {
        std::cerr << "aapc-bench: " << v.label << ": every point measured, then the job exited with status " << r.status
                  << " (MPICH over UCX/TCP can hang in MPI_Finalize; the program ends such a rank)\n";
      } else if (r.status != 0) {
        ++failures;
        std::cerr << "aapc-bench: " << v.label << " failed:\n" << r.other;
      }
    };
    // Repetitions are interleaved (every configuration once, then again) so that a slow
    // minute of the machine falls on all of them alike rather than on one.
    for (int rep = 0; rep < a.repeat; ++rep) {
      if (!configs.empty()) run_aapc(rep);
      for (const auto& v : variants) run_mpi(v, rep);
    }
    if (!variants.empty())
      for (const auto& m : state["machines"]) fs::remove_all(fs::path("/etc/netns") / m["netns"].get<std::string>());
  } catch (...) {
    run_collect(emu + " down", [](const Json&) {});
    throw;
  }
  run_collect(emu + " down", [](const Json&) {});

  // The report: one point per label and size, the median of its runs.
  for (auto& p : runs) {
    double agg = exchange_bits(n, p["size"].get<double>()) / p["seconds"].get<double>();
    p["aggregate_bps"] = agg;
    p["fraction_of_peak"] = agg / peak;
  }
  std::vector<Json> points = median_points(runs);
  for (auto& p : points) p["why"] = why(p, p["fraction_of_peak"].get<double>(), multi_switch);
  std::sort(points.begin(), points.end(), [](const Json& x, const Json& y) {
    if (x["size"] != y["size"]) return x["size"].get<std::uint64_t>() < y["size"].get<std::uint64_t>();
    return x["aggregate_bps"].get<double>() > y["aggregate_bps"].get<double>();
  });
  Json report = {{"topology", name}, {"machines", n}, {"peak_bps", peak}, {"points", points}};
  // auto against the best aapc schedule at every size.
  auto trusted = [](const Json& p) { return p.value("check_ok", true) && p.value("over_network", true) && p["fraction_of_peak"].get<double>() <= 1.02; };
  // One configuration against another, turn by turn: the r-th turns of all configurations
  // ran in the same round, within a second or so of each other, so their ratio is what the
  // machine's slow and fast moments do not move. The median of these ratios over every round
  // of every repetition. (Comparing each repetition's totals with the best total of that
  // repetition, as before, favoured whichever of eight near-equal schedules drew the luckiest
  // noise: auto then trailed "the best" by as much as it trailed its own schedule measured as
  // itself.)
  auto paired = [&](std::uint64_t b, const std::string& label, const std::string& against) {
    std::vector<double> ratios;
    for (int r = 0; r < a.repeat; ++r) {
      const Json *mine = nullptr, *ref = nullptr;
      for (const auto& p : runs) {
        if (p["size"] != b || p.value("rep", 0) != r || p["impl"] != "aapc" || !trusted(p)) continue;
        if (p["label"] == label) mine = &p;
        if (p["label"] == against) ref = &p;
      }
      if (mine == nullptr || ref == nullptr) continue;
      const Json &x = (*mine)["turn_s"], &y = (*ref)["turn_s"];
      for (std::size_t t = 0; t < std::min(x.size(), y.size()); ++t)
        if (x[t].get<double>() > 0) ratios.push_back(y[t].get<double>() / x[t].get<double>());  // throughput: time inverted
    }
    if (ratios.empty()) return 0.0;
    std::sort(ratios.begin(), ratios.end());
    const std::size_t m = ratios.size() / 2;
    return ratios.size() % 2 == 1 ? ratios[m] : (ratios[m - 1] + ratios[m]) / 2;
  };
  Json auto_check = Json::array();
  for (std::uint64_t b : sizes) {
    double best = 0, chosen = 0;
    std::string best_label, choice;
    for (const auto& p : points) {
      if (p["size"] != b || p["impl"] != "aapc" || !trusted(p)) continue;
      if (p["label"] == "auto") chosen = p["aggregate_bps"], choice = p.value("chosen", std::string());
      if (p["aggregate_bps"].get<double>() > best) best = p["aggregate_bps"], best_label = p["label"];
    }
    // auto runs one of the other configurations; that one's own measurement, where the sweep
    // has it, is a second reading of the same schedule, and how far the two differ is how
    // finely this machine can tell schedules apart.
    double choice_bps = 0;
    std::string choice_label;
    for (const auto& p : points)
      if (p["size"] == b && p["impl"] == "aapc" && p["label"] != "auto" && label_of(p["schedule"], p["sync"]) == choice && trusted(p))
        choice_bps = p["aggregate_bps"], choice_label = p["label"];
    double best_mpi = 0;
    std::string best_mpi_label;
    for (const auto& p : points)
      if (p["size"] == b && p["impl"] != "aapc" && trusted(p) && p["aggregate_bps"].get<double>() > best_mpi) best_mpi = p["aggregate_bps"], best_mpi_label = p["label"];
    Json row = {{"size", b}, {"best", best_label}, {"best_bps", best}, {"auto_bps", chosen}};
    if (best > 0 && chosen > 0) {
      row["auto_of_best"] = paired(b, "auto", best_label);
      row["auto_within_5pct"] = row["auto_of_best"].get<double>() >= 0.95;
    }
    if (!choice.empty()) row["auto_chose"] = choice;
    if (choice_bps > 0) {
      row["auto_choice"] = choice_label;
      row["auto_choice_bps"] = choice_bps;
      row["auto_choice_of_best"] = paired(b, choice_label, best_label);
      row["auto_of_choice"] = paired(b, "auto", choice_label);  // the same schedule twice: the resolution
    }
    if (best_mpi > 0) {
      row["best_mpi"] = best_mpi_label;
      row["best_mpi_bps"] = best_mpi;
      row["speedup_over_best_mpi"] = best / best_mpi;
    }
    auto_check.push_back(row);
  }
  report["summary"] = auto_check;
  std::ofstream(out / "results.json") << report.dump(2);
  {
    std::ofstream csv(out / "results.csv");
    csv << "impl,label,schedule,sync,size,iters,seconds,aggregate_bps,fraction_of_peak,retransmissions,sync_wait_s,daemon_cpu_s,runs,spread,why\n";
    for (const auto& p : points)
      csv << p.value("impl", std::string()) << "," << p["label"].get<std::string>() << "," << p.value("schedule", std::string()) << ","
          << p.value("sync", std::string()) << "," << p["size"] << "," << p["iters"] << "," << p["seconds"] << "," << p["aggregate_bps"] << ","
          << p["fraction_of_peak"] << "," << p.value("retransmissions", 0) << "," << p.value("sync_wait_s", 0.0) << "," << p.value("cpu_s", 0.0) << ","
          << p["runs"] << "," << p["spread"] << ",\""
          << p["why"].get<std::string>() << "\"\n";
  }
  std::ostringstream table;
  table << "\n" << name << ": " << n << " machines, physical limit " << mb(peak) << " Mbit/s\n";
  table << std::left << std::setw(34) << "schedule" << std::right << std::setw(9) << "block" << std::setw(11) << "ms/exch" << std::setw(11) << "Mbit/s"
        << std::setw(8) << "limit" << std::setw(9) << "resent" << (a.repeat > 1 ? "  spread" : "") << "  why below 90%\n";
  for (const auto& p : points) {
    table << std::left << std::setw(34) << p["label"].get<std::string>() << std::right << std::setw(9) << p["size"].get<std::uint64_t>() << std::setw(11)
          << std::fixed << std::setprecision(2) << p["seconds"].get<double>() * 1e3 << std::setw(11) << mb(p["aggregate_bps"]) << std::setw(7)
          << std::setprecision(1) << p["fraction_of_peak"].get<double>() * 100 << "%" << std::setw(9) << p.value("retransmissions", 0);
    if (a.repeat > 1) table << std::setw(7) << p["spread"].get<double>() * 100 << "%";
    table << "  " << p["why"].get<std::string>() << "\n";
  }
  table << "\nper block size: best aapc schedule, auto, best MPI"
        << (a.repeat > 1 ? " (Mbit/s: medians of " + std::to_string(a.repeat) + " runs)" : "")
        << "\n  (auto's % of the best: the median, over every round of turns, of auto's throughput over the best schedule's in the same round)\n";
  for (const auto& r : auto_check) {
    table << "  " << std::setw(8) << r["size"].get<std::uint64_t>() << " B  best " << std::left << std::setw(24) << r["best"].get<std::string>() << std::right
          << std::setw(8) << mb(r["best_bps"]) << "  auto " << std::setw(8) << mb(r["auto_bps"]);
    if (r.contains("auto_of_best"))
      table << " = " << std::setprecision(1) << r["auto_of_best"].get<double>() * 100 << "% of the best"
            << (r["auto_within_5pct"].get<bool>() ? " (within 5%)" : " (MORE than 5% below)");
    if (r.contains("auto_chose")) table << ", ran " << r["auto_chose"].get<std::string>();
    if (r.contains("auto_choice"))
      table << " (as " << r["auto_choice"].get<std::string>() << ": " << mb(r["auto_choice_bps"]) << ", " << r["auto_choice_of_best"].get<double>() * 100
            << "%; auto/" << r["auto_choice"].get<std::string>() << " " << r["auto_of_choice"].get<double>() * 100 << "%)";
    if (r.contains("best_mpi"))
      table << "  best MPI " << r["best_mpi"].get<std::string>() << " " << mb(r["best_mpi_bps"]) << "  speedup " << std::setprecision(2)
            << r["speedup_over_best_mpi"].get<double>() << "x";
    table << "\n";
  }
  std::cout << table.str();
  std::ofstream(out / "results.txt") << table.str();
  if (a.plot && !points.empty()) plot(out, points, peak, name + ": aggregate throughput (" + std::to_string(n) + " machines)");
  std::cout << "written: " << out / "results.txt" << ", results.csv, results.json" << (a.plot ? ", throughput.png, throughput.svg" : "") << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-bench: every schedule against the physical limit of the topology and against MPI_Alltoall on the same network"};
  Args a;
  app.add_option("--topology,-t", a.topology, "topology (file or shipped name)")->capture_default_str();
  app.add_option("--rate", a.rate, "run every link at this rate (e.g. 20Mbit for large topologies on few cores)");
  app.add_option("--sizes", a.sizes, "block sizes")->capture_default_str();
  app.add_option("--schedules", a.schedules, "aapc schedules")->capture_default_str();
  app.add_option("--tree-syncs", a.tree_syncs, "sync variants swept for the tree schedule")->capture_default_str();
  app.add_option("--mpi", a.mpi, "MPI baselines: openmpi, mpich (none for no MPI)")->capture_default_str();
  app.add_flag("!--default-mpi-algorithms-only", a.all_mpi_algorithms, "only the MPIs' default algorithm, not every forced one");
  app.add_option("--point-seconds", a.point_seconds, "time budget per point (iterations follow the papers within it)")->capture_default_str();
  app.add_option("--max-iters", a.max_iters, "iterations per point at most")->capture_default_str();
  app.add_option("--repeat", a.repeat, "measure every point this many times, interleaved, and report the median (odd counts are best)")
      ->capture_default_str()
      ->check(CLI::Range(1, 99));
  app.add_flag("--check", a.check, "validate every received byte");
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
    return orchestrate(a);
  } catch (const std::exception& e) {
    std::cerr << "aapc-bench: " << e.what() << "\n";
    return 1;
  }
}
