#include "aapc/nic/eal.hpp"

#include <rte_eal.h>
#include <rte_errno.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "aapc/nic/port.hpp"

namespace aapc::nic {
namespace {
std::mutex g_mutex;
bool g_running = false;
std::vector<int> g_cpus;  // allowed_cpus() when the EAL started

// An lcore option of the caller's own: "-l", "-c" or "--lcores", alone or with its value.
bool names_lcores(const std::string& a) {
  return a.rfind("-l", 0) == 0 || a.rfind("-c", 0) == 0 || a.rfind("--lcores", 0) == 0;
}
bool names_lcores(const EalOptions& o) { return std::any_of(o.extra.begin(), o.extra.end(), [](const std::string& a) { return names_lcores(a); }); }
}  // namespace

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(static_cast<unsigned>(c), &set)) out.push_back(c);
  return out;
}

std::vector<int> allowed_cpus() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_running && !g_cpus.empty()) return g_cpus;
  }
  return thread_cpus();
}

std::vector<std::string> EalOptions::args(const std::vector<int>& cpus) const {
  std::vector<std::string> out{program};
  if (no_huge) out.push_back("--no-huge");
  if (no_huge && memory_mb > 0) out.push_back("-m" + std::to_string(memory_mb));
  if (no_pci) out.push_back("--no-pci");
  if (no_shconf) out.push_back("--no-shconf");
  if (!file_prefix.empty()) out.push_back("--file-prefix=" + file_prefix);
  if (no_telemetry) out.push_back("--no-telemetry");
  if (!log_level.empty()) out.push_back("--log-level=" + log_level);
  for (const auto& v : vdevs) out.push_back("--vdev=" + v);
  if (!cpus.empty() && !names_lcores(*this)) {
    if (pin_main >= 0)
      out.push_back("-l" + std::to_string(cpus[static_cast<std::size_t>(pin_main) % cpus.size()]));
    else
      out.push_back("--lcores=0@(" + cpu_list(cpus) + ")");
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

void eal_init(const EalOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_running) return;
  std::vector<int> cpus = thread_cpus();
  std::vector<std::string> args = options.args(cpus);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int rc = rte_eal_init(static_cast<int>(args.size()), argv.data());
  if (rc < 0) {
    std::string all;
    for (const auto& a : args) all += " " + a;
    // Lcores named by the caller are the likeliest cause then: DPDK itself says only "invalid
    // core list" (aapcd --eal=-l99).
    const std::string cpus_hint = names_lcores(options)
                                      ? " The lcores given (-l, -c, --lcores) must be among the CPUs this process may use: " + cpu_list(cpus) +
                                            " (its affinity; a taskset or the job's allocation sets it)."
                                      : "";
    throw NicError("DPDK EAL did not start (" + std::string(rte_strerror(rte_errno)) + ") with arguments:" + all + "." + cpus_hint +
                   " Without hugepages keep --no-huge and give enough -m memory; run as root for af_packet and PCI devices.");
  }
  g_running = true;
  g_cpus = std::move(cpus);
  std::atexit(eal_cleanup);
}

void eal_cleanup() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_running) return;
  g_running = false;
  std::string dir = rte_eal_get_runtime_dir();
  rte_eal_cleanup();
  ::rmdir(dir.c_str());  // only if empty: nothing else of ours is in it
}

bool eal_running() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_running;
}

}  // namespace aapc::nic
