// MPI jobs on aapc-emu's cluster, shared by `aapc-emu mpirun` and aapc-bench's MPI baselines:
// a hosts file in every machine's namespace (/etc/netns/aapc-<machine>/hosts), an rsh-like
// agent that runs the launchers' commands in a machine's namespace under its name, a
// wrapper that points every rank at its machine's aapcd, and the launcher's command line for
// Open MPI or MPICH. Not installed.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace aapc::tools {

struct MpiJob {
  std::string impl = "openmpi";        // or "mpich"
  std::vector<int> ppn;                // ranks on each machine, in rank order (empty: 1 each)
  std::vector<std::string> env;        // NAME=VALUE for every rank
  std::string preload;                 // a library every rank preloads (LD_PRELOAD), or none
  std::string launcher_args;           // further arguments for mpirun / mpiexec
  std::vector<std::string> program;    // the program and its arguments
  int timeout_s = 0;                   // 0: none
};

class MpiCluster {
 public:
  // Writes the hosts files, the agent and the wrapper into `workdir`, from aapc-emu's state.
  MpiCluster(const nlohmann::json& state, const std::filesystem::path& workdir);
  ~MpiCluster();  // removes the hosts files
  MpiCluster(const MpiCluster&) = delete;
  MpiCluster& operator=(const MpiCluster&) = delete;

  // The shell command that runs `job` from the first machine's namespace.
  std::string command(const MpiJob& job) const;
  // After a job: kills what it left running in the machines' namespaces (everything there
  // but aapcd), and returns how many. Debian's MPICH over UCX/TCP leaves ranks spinning in
  // MPI_Finalize after the launcher returned, for up to the 20 s after which mpi-alltoall
  // ends them: a job started meanwhile shared the 2 cores with them (measured: an aapc
  // all-to-all on two halves of 8-two-switch took 168-175 ms right after an MPICH job, 73-75
  // ms otherwise).
  std::size_t end_job() const;
  // Runs `job` to its end and returns its exit status (124 when it ran past its timeout).
  // A job that runs past its timeout is shown before it is ended: where each of its processes
  // waits (stacks()), so that a hang says where it hangs.
  int run(const MpiJob& job) const;
  // Every thread's stack of each process that a job runs in the machines' namespaces (not
  // aapcd, the launchers, their agents or shells), by machine: gdb's backtraces, or how to
  // get them where gdb is not installed.
  std::string stacks() const;
  // The mpirun of `impl`, or empty when it is not installed.
  static std::string launcher(const std::string& impl);

 private:
  nlohmann::json state_;
  std::filesystem::path dir_, agent_, wrapper_;
  std::string subnet_;
};

// A file that a build puts beside the tools and an install under their lib directory: the
// first of `dirs` (relative to the directory of this process's executable) that holds it.
std::optional<std::filesystem::path> beside_tools(const std::string& file, const std::vector<std::filesystem::path>& dirs);

// 'text' for a POSIX shell.
std::string shell_quote(const std::string& text);

}  // namespace aapc::tools
