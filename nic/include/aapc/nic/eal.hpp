// DPDK EAL start-up. Defaults work without hugepages or PCI devices.
#pragma once

#include <string>
#include <vector>

namespace aapc::nic {

struct EalOptions {
  std::vector<std::string> vdevs;  // each becomes --vdev=...; e.g. "net_af_packet0,iface=eth0"
  std::vector<std::string> extra;  // further EAL arguments, passed as they are
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

  std::vector<std::string> args() const;
};

// Starts the EAL once per process; throws NicError with DPDK's reason. A second call with the
// EAL already running does nothing. At exit the EAL is cleaned up.
void eal_init(const EalOptions& options);
bool eal_running();

}  // namespace aapc::nic
