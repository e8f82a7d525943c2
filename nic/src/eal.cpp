#include "aapc/nic/eal.hpp"

#include <rte_eal.h>
#include <rte_errno.h>

#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "aapc/nic/port.hpp"

namespace aapc::nic {
namespace {
std::mutex g_mutex;
bool g_running = false;
}  // namespace

std::vector<std::string> EalOptions::args() const {
  std::vector<std::string> out{program};
  if (no_huge) out.push_back("--no-huge");
  if (no_huge && memory_mb > 0) out.push_back("-m" + std::to_string(memory_mb));
  if (no_pci) out.push_back("--no-pci");
  if (no_shconf) out.push_back("--no-shconf");
  if (!file_prefix.empty()) out.push_back("--file-prefix=" + file_prefix);
  if (no_telemetry) out.push_back("--no-telemetry");
  if (!log_level.empty()) out.push_back("--log-level=" + log_level);
  for (const auto& v : vdevs) out.push_back("--vdev=" + v);
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

void eal_init(const EalOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_running) return;
  std::vector<std::string> args = options.args();
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int rc = rte_eal_init(static_cast<int>(args.size()), argv.data());
  if (rc < 0) {
    std::string all;
    for (const auto& a : args) all += " " + a;
    throw NicError("DPDK EAL did not start (" + std::string(rte_strerror(rte_errno)) + ") with arguments:" + all +
                   ". Without hugepages keep --no-huge and give enough -m memory; run as root for af_packet and PCI devices.");
  }
  g_running = true;
  std::atexit([] {
    std::string dir = rte_eal_get_runtime_dir();
    rte_eal_cleanup();
    ::rmdir(dir.c_str());  // only if empty: nothing else of ours is in it
  });
}

bool eal_running() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_running;
}

}  // namespace aapc::nic
