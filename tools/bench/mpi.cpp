// aapc-bench's MPI baselines: Open MPI's and MPICH's MPI_Alltoall over TCP on the emulated
// network, launched through an rsh-like agent into the machines' namespaces.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "bench/bench.hpp"
#include "common/procutil.hpp"

namespace aapc::bench {

std::vector<MpiVariant> mpi_variants(const Args& a) {
  std::vector<MpiVariant> out;
  for (const auto& impl : a.mpi) {
    if (!fs::exists(self_dir() / ("mpi-alltoall-" + impl))) {
      std::cerr << "aapc-bench: skipping " << impl << ": mpi-alltoall-" << impl << " was not built (is " << impl << " installed?)\n";
      continue;
    }
    if (a.aapc_mpi) out.push_back({impl, impl + "+aapc", "", true});
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

MpiLauncher::MpiLauncher(const Sweep& sweep) : sweep_(sweep), state_(aapc::tools::read_emu_state()), cluster_(state_, sweep.out) {}

double MpiLauncher::tx_bytes() const {
  auto r = run_collect("ip netns exec " + state_["machines"][0]["netns"].get<std::string>() + " cat /sys/class/net/aapc0/statistics/tx_bytes",
                       [](const Json&) {});
  return std::strtod(r.other.c_str(), nullptr);
}

std::string MpiLauncher::command(const MpiVariant& v, const Args& a) const {
  aapc::tools::MpiJob job;
  job.impl = v.impl;
  // v.env: mpirun arguments for Open MPI, NAME=VALUE for MPICH.
  if (v.impl == "openmpi") job.launcher_args = v.env;
  else if (!v.env.empty()) job.env.push_back(v.env);
  job.program = {(sweep_.tools / ("mpi-alltoall-" + v.impl)).string()};
  if (a.check) job.program.emplace_back("--check");
  std::istringstream points(sweep_.points_arg);
  for (std::string p; points >> p;) job.program.push_back(p);
  job.timeout_s = static_cast<int>(sweep_.job_budget_s);
  job.ppn.assign(state_["machines"].size(), sweep_.ppn);
  if (v.preload) {
    job.env.emplace_back("AAPC_MPI_VERBOSE=1");
    job.preload = (self_dir().parent_path() / "mpi" / "libaapc-mpi.so").string();
    if (!fs::exists(job.preload)) throw std::runtime_error(job.preload + " was not built");
  }
  return cluster_.command(job);
}

std::vector<Json> MpiLauncher::run(const MpiVariant& v, const Args& a, const std::function<void(const Json&)>& on_point, bool& failed) const {
  const double tx0 = tx_bytes();
  // The program reports per-rank blocks; the report compares machine-level ones (ppn^2 x).
  const auto k2 = static_cast<std::uint64_t>(sweep_.ppn) * static_cast<std::uint64_t>(sweep_.ppn);
  auto label = [&](Json& p) {
    if (!p.contains("rank_block")) {
      p["rank_block"] = p["size"];
      p["size"] = p["size"].get<std::uint64_t>() * k2;
    }
    p["impl"] = v.impl;
    p["label"] = v.label;
    p["aapc_mpi"] = v.preload;
    p["ppn"] = sweep_.ppn;
  };
  // With the library, the daemons run beside the job (aapc-emu start/stop), and the library
  // must say that MPI_COMM_WORLD went through aapc: a job that fell back measures the MPI.
  const std::string emu = shell_quote((sweep_.tools / "aapc-emu").string());
  if (v.preload) run_collect(emu + " start --port " + sweep_.port, [](const Json&) {});
  auto r = run_collect(command(v, a), [&](Json p) {
    label(p);
    on_point(p);
  });
  cluster_.end_job();  // nothing of it may take the cores from the next job
  if (v.preload) run_collect(emu + " stop", [](const Json&) {});
  if (v.preload && r.other.find("MPI_COMM_WORLD (") != std::string::npos && r.other.find("all-to-all through aapc") == std::string::npos) {
    std::cerr << "aapc-bench: " << v.label << ": libaapc-mpi did not carry MPI_COMM_WORLD:\n" << r.other;
    failed = true;
    return {};
  }
  // An MPI that found a way around the network (shared memory) measures nothing of it.
  const double sent = tx_bytes() - tx0;
  const bool bypassed = r.status == 0 && sent < 0.9 * sweep_.least_tx;
  if (bypassed)
    std::cerr << "aapc-bench: " << v.label << ": rank 0 sent " << static_cast<std::uint64_t>(sent) << " bytes on its link, at least "
              << static_cast<std::uint64_t>(sweep_.least_tx) << " expected: it did not use the network; its figures are marked\n";
  for (auto& p : r.points) {
    label(p);
    p["over_network"] = !bypassed;
  }
  failed = false;
  if (r.status != 0 && r.points.size() == sweep_.sizes.size()) {
    std::cerr << "aapc-bench: " << v.label << ": every point measured, then the job exited with status " << r.status
              << " (a rank that hangs in MPI_Finalize is ended by the program after 20 s)\n";
  } else if (r.status != 0) {
    failed = true;
    std::cerr << "aapc-bench: " << v.label << " failed:\n" << r.other;
  }
  return r.points;
}

}  // namespace aapc::bench
