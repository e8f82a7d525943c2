#include "common/mpilaunch.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "common/procutil.hpp"

namespace fs = std::filesystem;

namespace aapc::tools {

std::string shell_quote(const std::string& text) {
  std::string q = "'";
  for (char c : text) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::optional<fs::path> beside_tools(const std::string& file, const std::vector<fs::path>& dirs) {
  const fs::path bin = fs::canonical("/proc/self/exe").parent_path();
  for (const auto& d : dirs)
    if (fs::exists(bin / d / file)) return fs::canonical(bin / d / file);
  return std::nullopt;
}

namespace {

// libaapc-mpich-yield.so (tools/common/mpich_yield.cpp), beside the tools or the tests of a
// build, or where `meson install` puts it.
// Looked for once a process, which warns once when it is missing.
const std::string& mpich_yield_library() {
  static const std::string path = [] {
    auto found = beside_tools("libaapc-mpich-yield.so", {".", "../tools", "../lib/x86_64-linux-gnu/aapc", "../lib64/aapc", "../lib/aapc"});
    if (!found)
      std::cerr << "warning: libaapc-mpich-yield.so is not beside these tools: MPICH's ranks will spin in their waits, and on few cores "
                   "its barriers take tens of ms\n";
    return found ? found->string() : std::string();
  }();
  return path;
}

}  // namespace

MpiCluster::MpiCluster(const nlohmann::json& state, const fs::path& workdir)
    : state_(state), dir_(workdir), agent_(workdir / "mpi-agent"), wrapper_(workdir / "mpi-rank") {
  if (state_.is_null() || !state_.contains("machines") || state_["machines"].empty())
    throw std::runtime_error("no emulated cluster is up (" + kEmuStateFile.string() + ")");
  fs::create_directories(dir_);
  std::string hosts = "127.0.0.1 localhost\n";
  for (const auto& m : state_["machines"]) hosts += m["ip"].get<std::string>() + " " + m["name"].get<std::string>() + "\n";
  for (const auto& m : state_["machines"]) {
    fs::path d = fs::path("/etc/netns") / m["netns"].get<std::string>();
    fs::create_directories(d);
    std::ofstream(d / "hosts") << hosts;
  }
  // The launchers' remote shell: the command runs in the machine's namespace, with the
  // machine's name as its hostname (the MPIs tell nodes apart by it).
  std::ofstream(agent_) << "#!/bin/sh\n# rsh for MPI launchers: run the command in the machine's namespace, with its hostname.\n"
                           "while [ \"${1#-}\" != \"$1\" ]; do shift; done\nhost=$1; shift\n"
                           "exec ip netns exec \"" << emu_netns("") << "$host\" unshare --uts sh -c \"hostname $host; $*\"\n";
  // Every rank: its machine's daemon, whichever way the launcher started it.
  std::ofstream(wrapper_) << "#!/bin/sh\n# One MPI rank on aapc-emu's cluster: AAPC_SOCKET of its machine (by hostname).\n"
                             "AAPC_SOCKET=" << kEmuStateDir.string() << "/$(hostname)/aapcd.sock\nexport AAPC_SOCKET\n"
                             "if [ -n \"$AAPC_EMU_PRELOAD\" ]; then LD_PRELOAD=\"$AAPC_EMU_PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}\"; export LD_PRELOAD; fi\n"
                             "exec \"$@\"\n";
  for (const auto& f : {agent_, wrapper_}) fs::permissions(f, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  const std::string ip = state_["machines"][0]["ip"];
  subnet_ = ip.substr(0, ip.find('.', ip.find('.') + 1)) + ".0.0/16";
}

MpiCluster::~MpiCluster() {
  std::error_code ec;
  for (const auto& m : state_["machines"]) fs::remove_all(fs::path("/etc/netns") / m["netns"].get<std::string>(), ec);
}

namespace {

// The processes in a machine's namespace, with their names (/proc/PID/comm).
std::vector<std::pair<pid_t, std::string>> processes_in(const std::string& netns) {
  std::vector<std::pair<pid_t, std::string>> out;
  std::istringstream pids(run({"ip", "netns", "pids", netns}).text);
  for (pid_t pid = 0; pids >> pid;) {
    std::string comm;
    std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/comm"), comm);
    out.emplace_back(pid, comm);
  }
  return out;
}

// Not a job's own process: the daemon, the launchers and their helpers.
bool launchers_own(const std::string& comm) {
  static const std::set<std::string> names = {"aapcd", "sh", "bash", "ip", "unshare", "timeout", "mpiexec.mpich", "mpiexec.hydra",
                                              "hydra_pmi_proxy", "mpirun.openmpi", "orterun", "orted", "gdb"};
  return names.count(comm) != 0;
}

// gdb's backtraces of every thread of `pid`: the lines that name a thread or a frame.
std::string backtraces(pid_t pid) {
  const Output o = run({"timeout", "30", "gdb", "-nx", "-batch", "-p", std::to_string(pid), "-ex", "thread apply all bt"});
  std::istringstream lines(o.text);
  std::string out;
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("Thread ", 0) == 0 || line.rfind('#', 0) == 0) out += "  " + line + "\n";
  return out.empty() ? "  (gdb could not read it: exit " + std::to_string(o.status) + ")\n" : out;
}

}  // namespace

std::size_t MpiCluster::end_job() const {
  std::vector<pid_t> left;
  for (const auto& m : state_["machines"])
    for (const auto& [pid, comm] : processes_in(m["netns"].get<std::string>()))
      if (comm != "aapcd" && ::kill(pid, SIGKILL) == 0) left.push_back(pid);
  // Gone from the process table (reaped by their parents, or by init) within a second or two.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (pid_t pid : left)
    while (fs::exists("/proc/" + std::to_string(pid) + "/comm") && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return left.size();
}

std::string MpiCluster::stacks() const {
  const bool have_gdb = ::access("/usr/bin/gdb", X_OK) == 0;
  std::string out;
  for (const auto& m : state_["machines"])
    for (const auto& [pid, comm] : processes_in(m["netns"].get<std::string>())) {
      if (launchers_own(comm)) continue;
      out += m["name"].get<std::string>() + ": " + comm + " (pid " + std::to_string(pid) + ")\n";
      if (have_gdb) out += backtraces(pid);
    }
  if (!have_gdb && !out.empty()) out += "(install gdb to see where each of them waits)\n";
  return out.empty() ? "none of the job's processes is left\n" : out;
}

int MpiCluster::run(const MpiJob& job) const {
  if (job.timeout_s <= 0) return exit_status(std::system(command(job).c_str()));
  // The launcher's own timeout is a backstop: the watchdog below ends the job first.
  MpiJob backstop = job;
  backstop.timeout_s = job.timeout_s + 120;
  std::mutex m;
  std::condition_variable over_cv;
  bool over = false, timed_out = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> hold(m);
    if (over_cv.wait_for(hold, std::chrono::seconds(job.timeout_s), [&] { return over; })) return;
    timed_out = true;
    hold.unlock();
    std::cerr << "aapc-emu: the MPI job did not finish within " << job.timeout_s << " s; where its processes wait:\n" << stacks() << std::flush;
    end_job();
  });
  const int status = exit_status(std::system(command(backstop).c_str()));
  {
    std::lock_guard<std::mutex> hold(m);
    over = true;
  }
  over_cv.notify_one();
  watchdog.join();
  return timed_out ? 124 : status;
}

std::string MpiCluster::launcher(const std::string& impl) {
  const std::string exe = impl == "openmpi" ? "/usr/bin/mpirun.openmpi" : impl == "mpich" ? "/usr/bin/mpiexec.mpich" : "";
  return !exe.empty() && ::access(exe.c_str(), X_OK) == 0 ? exe : "";
}

std::string MpiCluster::command(const MpiJob& job) const {
  const std::string exe = launcher(job.impl);
  if (exe.empty()) throw std::runtime_error("no launcher for MPI '" + job.impl + "' (install openmpi-bin or mpich)");
  const auto& machines = state_["machines"];
  std::vector<int> ppn = job.ppn;
  if (ppn.empty()) ppn.assign(machines.size(), 1);
  if (ppn.size() != machines.size())
    throw std::runtime_error(std::to_string(ppn.size()) + " ranks-per-machine counts for " + std::to_string(machines.size()) + " machines");
  int n = 0;
  std::string hostlist;
  std::ofstream hostfile(dir_ / "mpi-hosts");
  for (std::size_t i = 0; i < ppn.size(); ++i) {
    const std::string name = machines[i]["name"];
    n += ppn[i];
    hostfile << name << " slots=" << ppn[i] << "\n";
    hostlist += (hostlist.empty() ? "" : ",") + name + ":" + std::to_string(ppn[i]);
  }
  std::vector<std::string> env = job.env;
  std::string preload = job.preload;
  if (job.impl == "mpich") {
    // MPICH's idle ranks yield, as Open MPI's do below, with libaapc-mpi.so or without.
    const std::string& yield = mpich_yield_library();
    if (!yield.empty()) preload += (preload.empty() ? "" : ":") + yield;
  }
  if (!preload.empty()) env.push_back("AAPC_EMU_PRELOAD=" + preload);
  std::string launch = exe;
  if (job.impl == "openmpi") {
    // TCP between machines on the emulated network; shared memory (vader) within one. Idle
    // ranks yield: every emulated machine shares this box's few cores, and a rank that spins
    // in a barrier takes them from the daemons and ranks that still work (on a real cluster
    // each machine has cores of its own). The emulated machines are the whole allocation,
    // whatever the box runs in: the launcher is named, not only its agent (an environment's
    // OMPI_MCA_plm=isolated, set in some containers, would start no daemon on the other
    // machines: "not enough slots"), and no resource manager's allocation is read (inside a
    // SLURM job, Open MPI refused the hostfile's machines as "not present in the allocation").
    launch += " --allow-run-as-root -np " + std::to_string(n) + " --hostfile " + (dir_ / "mpi-hosts").string() +
              " --mca plm rsh --mca ras ^slurm,tm,lsf,gridengine,alps --mca plm_rsh_agent " + agent_.string() + " --mca btl tcp,vader,self --mca pml ob1 --mca btl_tcp_if_include " + subnet_ + " --mca oob_tcp_if_include " + subnet_ +
              " --mca mpi_yield_when_idle 1";
    for (const auto& e : env) launch += " -x " + shell_quote(e);
  } else {
    // Debian's MPICH is ch4:ucx, and UCX takes every namespace of one box for one host: left
    // alone it moves the data through shared memory, not the emulated network. TCP only, on aapc0.
    launch += " -n " + std::to_string(n) + " -hosts " + hostlist + " -launcher rsh -launcher-exec " + agent_.string() +
              " -iface aapc0 -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES aapc0";
    for (const auto& e : env) launch += " -genv " + shell_quote(e.substr(0, e.find('='))) + " " + shell_quote(e.substr(e.find('=') + 1));
  }
  if (!job.launcher_args.empty()) launch += " " + job.launcher_args;
  launch += " " + wrapper_.string();
  for (const auto& a : job.program) launch += " " + shell_quote(a);
  if (job.timeout_s > 0) launch = "timeout -k 10 " + std::to_string(job.timeout_s) + " " + launch;
  const std::string first = machines[0]["name"];
  return "ip netns exec " + emu_netns(first) + " unshare --uts sh -c " + shell_quote("hostname " + first + "; " + launch);
}

}  // namespace aapc::tools
