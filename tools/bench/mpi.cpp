// aapc-bench's MPI baselines: Open MPI's and MPICH's MPI_Alltoall over TCP on the emulated
// network, launched through an rsh-like agent into the machines' namespaces.
#include <cstdlib>
#include <fstream>
#include <iostream>
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

MpiLauncher::MpiLauncher(const Sweep& sweep)
    : sweep_(sweep), state_(aapc::tools::read_emu_state()), agent_(sweep.out / "mpi-agent"), hostfile_(sweep.out / "mpi-hosts") {
  if (state_.is_null()) throw std::runtime_error("cannot read " + aapc::tools::kEmuStateFile.string());
  std::string hosts = "127.0.0.1 localhost\n";
  for (const auto& m : state_["machines"]) {
    hosts += m["ip"].get<std::string>() + " " + m["name"].get<std::string>() + "\n";
    hostlist_ += (hostlist_.empty() ? "" : ",") + m["name"].get<std::string>();
  }
  for (const auto& m : state_["machines"]) {
    fs::path dir = fs::path("/etc/netns") / m["netns"].get<std::string>();
    fs::create_directories(dir);
    std::ofstream(dir / "hosts") << hosts;
  }
  std::ofstream(agent_) << "#!/bin/sh\n# rsh for MPI launchers: run the command in the machine's namespace, with its hostname.\n"
                           "while [ \"${1#-}\" != \"$1\" ]; do shift; done\nhost=$1; shift\n"
                           "exec ip netns exec \"aapc-$host\" unshare --uts sh -c \"hostname $host; $*\"\n";
  fs::permissions(agent_, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  {
    std::ofstream h(hostfile_);
    for (const auto& m : state_["machines"]) h << m["name"].get<std::string>() << " slots=1\n";
  }
  first_ = state_["machines"][0]["name"];
  subnet_ = state_["machines"][0]["ip"].get<std::string>().substr(0, state_["machines"][0]["ip"].get<std::string>().find('.', 3)) + ".0.0/16";
}

void MpiLauncher::remove_hosts_files() const {
  for (const auto& m : state_["machines"]) fs::remove_all(fs::path("/etc/netns") / m["netns"].get<std::string>());
}

double MpiLauncher::tx_bytes() const {
  auto r = run_collect("ip netns exec " + state_["machines"][0]["netns"].get<std::string>() + " cat /sys/class/net/aapc0/statistics/tx_bytes",
                       [](const Json&) {});
  return std::strtod(r.other.c_str(), nullptr);
}

std::string MpiLauncher::command(const MpiVariant& v, const Args& a) const {
  const int n = sweep_.n;
  std::string exe = (sweep_.tools / ("mpi-alltoall-" + v.impl)).string() + (a.check ? " --check" : "") + sweep_.points_arg;
  std::string launch;
  if (v.impl == "openmpi") {
    launch = "mpirun.openmpi --allow-run-as-root -np " + std::to_string(n) + " --hostfile " + hostfile_.string() + " --mca plm_rsh_agent " +
             agent_.string() + " --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include " + subnet_ + " --mca oob_tcp_if_include " + subnet_ +
             " " + v.env + " " + exe;
  } else {
    // Debian's MPICH is ch4:ucx, and UCX takes every namespace of one box for one host:
    // left alone it moves the data through shared memory, not the emulated network
    // (measured: 3 KB on a rank's wire for a 256 KiB exchange). TCP only, on aapc0.
    launch = "mpiexec.mpich -n " + std::to_string(n) + " -hosts " + hostlist_ + " -launcher rsh -launcher-exec " + agent_.string() +
             " -iface aapc0 -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES aapc0 " +
             (v.env.empty() ? "" : "-genv " + v.env.substr(0, v.env.find('=')) + " " + v.env.substr(v.env.find('=') + 1) + " ") + exe;
  }
  launch = "timeout -k 10 " + std::to_string(static_cast<int>(sweep_.job_budget_s)) + " " + launch;
  return "ip netns exec aapc-" + first_ + " unshare --uts sh -c " + quote("hostname " + first_ + "; " + launch);
}

std::vector<Json> MpiLauncher::run(const MpiVariant& v, const Args& a, const std::function<void(const Json&)>& on_point, bool& failed) const {
  const double tx0 = tx_bytes();
  auto r = run_collect(command(v, a), [&](Json p) {
    p["impl"] = v.impl;
    p["label"] = v.label;
    on_point(p);
  });
  // An MPI that found a way around the network (shared memory) measures nothing of it.
  const double sent = tx_bytes() - tx0;
  const bool bypassed = r.status == 0 && sent < 0.9 * sweep_.least_tx;
  if (bypassed)
    std::cerr << "aapc-bench: " << v.label << ": rank 0 sent " << static_cast<std::uint64_t>(sent) << " bytes on its link, at least "
              << static_cast<std::uint64_t>(sweep_.least_tx) << " expected: it did not use the network; its figures are marked\n";
  for (auto& p : r.points) {
    p["impl"] = v.impl;
    p["label"] = v.label;
    p["over_network"] = !bypassed;
  }
  failed = false;
  if (r.status != 0 && r.points.size() == sweep_.sizes.size()) {
    std::cerr << "aapc-bench: " << v.label << ": every point measured, then the job exited with status " << r.status
              << " (MPICH over UCX/TCP can hang in MPI_Finalize; the program ends such a rank)\n";
  } else if (r.status != 0) {
    failed = true;
    std::cerr << "aapc-bench: " << v.label << " failed:\n" << r.other;
  }
  return r.points;
}

}  // namespace aapc::bench
