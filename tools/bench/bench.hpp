// aapc-bench's parts (not installed): the options and helpers, the measurement mode that runs
// on every node, and for the emulated cluster the emulator session, the MPI launcher and the
// statistics of the report. tools/aapc_bench.cpp plans a sweep and runs them in turn.
#pragma once

#include <nlohmann/json.hpp>

#include "aapc/sched/algorithms.hpp"
#include "common/mpilaunch.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace aapc::bench {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The schedules a sweep compares unless told: auto, and the registry's rows worth running on a
// tree of switches, by their names there.
inline std::vector<std::string> default_schedules() {
  using sched::Algorithm;
  std::vector<std::string> out{"auto"};
  for (Algorithm a : {Algorithm::kTree, Algorithm::kSyncShuffle, Algorithm::kGroupShuffle, Algorithm::kPairwise, Algorithm::kPairwiseEc,
                      Algorithm::kRing, Algorithm::kLinear})
    out.emplace_back(sched::algorithm_info(a).name);
  return out;
}

struct Args {
  std::string topology = "8-two-switch";
  std::string rate;
  std::vector<std::string> rates;  // --rates: the whole sweep at each of these rates, and one plot against the rate
  std::vector<std::string> sizes = {"1K", "2K", "4K", "8K", "16K", "32K", "64K", "128K", "256K", "512K", "1M"};
  std::vector<std::string> schedules = default_schedules();
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
  // MPI jobs with this many ranks per machine. Sizes stay per rank for MPI; aapc's own
  // schedules run the machine-level equivalent, blocks of ppn^2 x size.
  int ppn = 1;
  std::string port = "auto";  // aapc-emu's --port: how the daemons open their interface
  bool aapc_mpi = false;  // also each MPI with libaapc-mpi.so preloaded ("openmpi+aapc")
};

// --- helpers (common.cpp) ----------------------------------------------------------------------

std::vector<std::uint64_t> parse_sizes(const std::vector<std::string>& sizes);
// Bits one exchange of blocks of `block` bytes moves among n machines.
double exchange_bits(int n, double block);
int iterations(std::uint64_t block, int n, double peak_bps, double budget_s, int max_iters);
// A configuration's name in the report: its spec, "none" left out.
std::string label_of(const std::string& schedule, const std::string& sync);
using aapc::tools::shell_quote;  // for sh
std::string mb(double bps);               // Mbit/s, one decimal
fs::path self_dir();                      // where aapc-bench and its sibling tools are

struct Run {
  int status = -1;
  std::vector<Json> points;
  std::string other;  // lines that were not JSON
};

// Runs a command and collects JSON lines as they come, calling `on_point` for each.
Run run_collect(const std::string& cmd, const std::function<void(const Json&)>& on_point);

// --- measurement mode (measure.cpp): runs on every node ---------------------------------------

int measure(const Args& a);

// --- a sweep on an emulated cluster -------------------------------------------------------------

// What orchestrate() planned, shared by the parts below.
struct Sweep {
  std::string name;  // the topology's, with the rate
  fs::path out, topo_file, tools;
  int n = 0;
  double peak = 0;
  // How long the limiting link passes at once what its tbf bucket holds (aapc-emu fills it
  // while the link idles, as between two exchanges): on the emulated cluster an exchange can
  // end this much sooner than the limit allows.
  double burst_s = 0;
  bool multi_switch = false;
  bool many_senders = false;  // sched::shared_by_many_senders: `auto` weighs no measure from 32 KiB
  std::vector<std::uint64_t> sizes;
  std::vector<std::pair<std::string, std::string>> configs;  // schedule and sync of aapc
  // Per size, computed once: the iterations (the MPI program is told them), a time budget so
  // that no job is waited for forever, and what rank 0 must at least put on its wire in an MPI
  // job.
  double job_budget_s = 120, least_tx = 0;
  std::string points_arg;  // SIZE:ITERS per point, SIZE per rank (the MPI program's)
  int ppn = 1;
  std::string port = "auto";  // Args::port
};

// The emulated cluster (emu_session.cpp): aapc-emu up on construction, down when destroyed
// (also when a part of the sweep threw) or at down().
class EmuSession {
 public:
  // Throws when a cluster is already up, or when it cannot be brought up.
  explicit EmuSession(const Sweep& sweep);
  ~EmuSession();
  EmuSession(const EmuSession&) = delete;
  EmuSession& operator=(const EmuSession&) = delete;

  void warm_up() const;
  // Every aapc configuration in one run on the cluster, interleaved turn by turn.
  Run run_aapc(const Args& a, const std::function<void(const Json&)>& on_point) const;
  void down();

 private:
  const Sweep& sweep_;
  std::string emu_;
  bool up_ = false;
};

// MPI over TCP on the same emulated network (mpi.cpp).
struct MpiVariant {
  std::string impl, label, env;  // env: extra mpirun arguments or environment
  bool preload = false;          // libaapc-mpi.so preloaded
};

std::vector<MpiVariant> mpi_variants(const Args& a);

class MpiLauncher {
 public:
  // Hosts files per namespace, an rsh-like agent and a host file, from aapc-emu's state.
  explicit MpiLauncher(const Sweep& sweep);
  // One job of variant `v`: its points (labelled, marked when the job went around the
  // network) and whether it failed; `on_point` sees each as it comes.
  std::vector<Json> run(const MpiVariant& v, const Args& a, const std::function<void(const Json&)>& on_point, bool& failed) const;

 private:
  std::string command(const MpiVariant& v, const Args& a) const;
  double tx_bytes() const;  // what rank 0 has put on its link so far

  const Sweep& sweep_;
  Json state_;
  aapc::tools::MpiCluster cluster_;  // hosts files, agent and wrapper, removed with it
};

// --- the report (stats.cpp) -------------------------------------------------------------------

// One point per label and size, the median of its runs, each with why it falls short.
std::vector<Json> report_points(std::vector<Json>& runs, const Sweep& sweep);
// auto against the best aapc schedule and the best MPI at every size.
Json summary(const Args& a, const Sweep& sweep, const std::vector<Json>& runs, const std::vector<Json>& points);
// results.{json,csv,txt} (the table also on stdout) and the plots.
void write_report(const Args& a, const Sweep& sweep, const std::vector<Json>& points, const Json& summary);
// --rates: rates.csv and rates.{png,svg} in `dir`, % of the limit against the link rate, one line
// per configuration and block size, from each rate's report points (rate in bit/s, points).
void write_rates_report(const fs::path& dir, const std::string& title, const std::vector<std::pair<std::uint64_t, std::vector<Json>>>& by_rate, bool plot);

}  // namespace aapc::bench
