#include <unistd.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "aapc/sched/dot.hpp"
#include "aapc/sched/spec.hpp"
#include "bench/bench.hpp"

namespace aapc::bench {

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

std::string mb(double bps) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << bps / 1e6;
  return o.str();
}

}  // namespace aapc::bench
