// aapc-bench's emulated cluster: aapc-emu brings the topology up, runs aapc-bench in
// measurement mode on every machine, and takes the cluster down.
#include <csignal>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include <sys/wait.h>
#include <unistd.h>

#include "aapc/sched/choice.hpp"
#include "aapc/sched/spec.hpp"
#include "bench/bench.hpp"

namespace aapc::bench {

namespace {

// The aapc-emu that brought the cluster up, while it is up: a bench stopped by a signal
// (Ctrl-C, a batch system's SIGTERM, a closed terminal) takes the cluster down with it. Before,
// it left its namespaces up and the next run refused to start.
char g_emu[4096] = {};
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Only async-signal-safe calls (fork, execv, waitpid, signal, raise).
void down_and_die(int sig) {
  if (g_emu[0] != '\0') {
    const pid_t child = ::fork();
    if (child == 0) {
      char down[] = "down";
      char* argv[] = {g_emu, down, nullptr};
      ::execv(g_emu, argv);
      ::_exit(127);
    }
    if (child > 0) ::waitpid(child, nullptr, 0);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

EmuSession::EmuSession(const Sweep& sweep) : sweep_(sweep), emu_((sweep.tools / "aapc-emu").string()) {
  auto st = run_collect(emu_ + " status", [](const Json&) {});
  if (st.other.find("nothing is up") == std::string::npos) throw std::runtime_error("an emulated cluster is already up: `aapc-emu down` it first");
  if (emu_.size() >= sizeof g_emu) throw std::runtime_error("the path of aapc-emu is too long: " + emu_);
  std::memcpy(g_emu, emu_.c_str(), emu_.size() + 1);  // from here on a signal takes down whatever came up
  for (int sig : kStopSignals) ::signal(sig, down_and_die);
  up_ = true;
  auto up = run_collect(emu_ + " up " + shell_quote(sweep_.topo_file.string()), [](const Json&) {});
  if (up.status != 0) {
    down();
    throw std::runtime_error("aapc-emu up failed:\n" + up.other);
  }
}

EmuSession::~EmuSession() { down(); }

void EmuSession::down() {
  if (!up_) return;
  up_ = false;
  run_collect(emu_ + " down", [](const Json&) {});
  g_emu[0] = '\0';
  for (int sig : kStopSignals) ::signal(sig, SIG_DFL);
}

// A run that is not measured first: right after the cluster comes up (and after an earlier
// cluster's namespaces are torn down, which the kernel finishes in the background) the first
// configuration measured 30% below the same one a minute later at 1 KiB. It runs what `auto`
// weighs by measurement too (sched::kWeighed: the tree's phases, the paced shuffle, two
// unscheduled ones) at 4 and 64 KiB and at the sweep's sizes where `auto` may weigh them (not
// where many senders share the bottleneck from 32 KiB): the daemons then know how fast their
// node sends a phase, what a hand-over costs, and what each reached at those sizes
// (daemon_measure.cpp), as a cluster's daemons do from its earlier jobs, and `auto` chooses with
// it from the first measured run.
void EmuSession::warm_up() const {
  std::string configs = " auto", sizes = " 4096 65536";
  for (const auto& w : aapc::sched::kWeighed) configs += " " + aapc::sched::format_plan_spec(w.algorithm_spec(), w.sync_spec());
  for (const auto b : sweep_.sizes)
    if (aapc::sched::reach_octave(b) && b != 4096 && b != 65536 && (b < aapc::sched::kLargeBlockFrom || !sweep_.many_senders)) sizes += " " + std::to_string(b);
  run_collect(emu_ + " run " + shell_quote(sweep_.topo_file.string()) + " --keep --port " + sweep_.port + " -- " + shell_quote((sweep_.tools / "aapc-bench").string()) +
                  " --measure --configs" + configs + " --point-seconds 1 --max-iters 20 --sizes" + sizes,
              [](const Json&) {});
}

Run EmuSession::run_aapc(const Args& a, const std::function<void(const Json&)>& on_point) const {
  std::string sizes_arg;  // machine-level sizes (ppn^2 x the per-rank ones)
  for (const auto b : sweep_.sizes) sizes_arg += " " + std::to_string(b);
  std::ostringstream cmd;
  cmd << emu_ << " run " << shell_quote(sweep_.topo_file.string()) << " --keep --port " << sweep_.port << " --timeout "
      << static_cast<int>(sweep_.job_budget_s * static_cast<double>(sweep_.configs.size())) << " -- "
      << shell_quote((sweep_.tools / "aapc-bench").string()) << " --measure --point-seconds " << a.point_seconds << " --max-iters " << a.max_iters
      << (a.check ? " --check" : "") << " --sizes" << sizes_arg << " --configs";
  for (const auto& [schedule, sync] : sweep_.configs) cmd << " " << aapc::sched::join_spec(schedule, sync);
  return run_collect(cmd.str(), on_point);
}

}  // namespace aapc::bench
