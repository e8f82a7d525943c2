// DPDK EAL start-up. Defaults work without hugepages or PCI devices.
#pragma once

#include <string>
#include <vector>

namespace aapc::nic {

struct EalOptions {
  std::vector<std::string> vdevs;  // each becomes --vdev=...; e.g. "net_af_packet0,iface=eth0"
  // Further EAL arguments, passed as they are. Without -l, -c or --lcores among them, the
  // EAL's one lcore (the thread that calls eal_init: the engine's) may run on every CPU this
  // process may use, as the scheduler sees fit; left to itself the EAL would pin that thread
  // to the first of them, and every daemon of a machine would share one CPU.
  std::vector<std::string> extra;
  // >= 0: pin the EAL's lcore to the CPU of that index (modulo their number) among those the
  // process may use, as benchmarks and tests want one core; -1: let it run on all of them.
  int pin_main = -1;
  int memory_mb = 512;             // -m, with --no-huge
  bool no_huge = true;
  bool no_pci = true;
  // --no-shconf: no shared config files. (--in-memory does not combine with --no-huge in
  // DPDK 22.11, which implies legacy memory.) The empty runtime directory DPDK still makes
  // under /var/run/dpdk/<file_prefix> is removed at exit.
  bool no_shconf = true;
  std::string file_prefix = "aapc";
  bool no_telemetry = true;
  std::string log_level = "warning";
  std::string program = "aapc";

  // `cpus`: the CPUs the main lcore may run on (allowed_cpus()).
  std::vector<std::string> args(const std::vector<int>& cpus) const;
};

// "0-3,6,8-9" for {0, 1, 2, 3, 6, 8, 9} (sorted, no duplicates): the EAL's and taskset's form.
std::string cpu_list(const std::vector<int>& cpus);

// Starts the EAL once per process; throws NicError with DPDK's reason. A second call with the
// EAL already running does nothing. At exit the EAL is cleaned up.
void eal_init(const EalOptions& options);
bool eal_running();
// What exit does after eal_init: the EAL cleaned up and its runtime directory
// (/var/run/dpdk/PREFIX) removed. For a process that leaves by _exit (a forked child); once.
void eal_cleanup();

// The CPUs this process may use (taskset, cgroups, a batch job's binding), as they were when
// the EAL started (it may pin its main thread to fewer), or now if it has not started.
std::vector<int> allowed_cpus();
// The CPUs the calling thread may run on now.
std::vector<int> thread_cpus();

}  // namespace aapc::nic
