#include "procutil.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace aapc::tools {

namespace {

// In the child: the environment, then argv; never returns. Descriptors other than the three
// standard ones are closed: a daemon started here must not hold what its starter had open (the
// cluster lock of `flock /tmp/aapc-cluster.lock`, which an aapcd left running by a crashed
// test would otherwise hold for good).
[[noreturn]] void exec_child(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  ::close_range(3, ~0U, 0);
  for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

// Both output streams of the child to `fd`.
void output_to(int fd) {
  ::dup2(fd, 1);
  ::dup2(fd, 2);
}

}  // namespace

int exit_status(int wait_status) { return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status); }

pid_t spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  // The log is truncated here, not in the child: whoever reads it after spawn() returns must
  // not see a previous run's output.
  const int fd = options.log.empty() ? -1 : ::open(options.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (options.own_group) ::setpgid(0, 0);
    if (fd >= 0) output_to(fd);
    exec_child(argv, options.env);
  }
  if (fd >= 0) ::close(fd);
  return pid;
}

Output run(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid == 0) {
    output_to(pipefd[1]);
    exec_child(argv, env);
  }
  ::close(pipefd[1]);
  Output out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) out.text.append(buf, static_cast<std::size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  out.status = exit_status(status);
  return out;
}

Output run_shell(const std::string& command) { return run({"sh", "-c", command}); }

nlohmann::json read_emu_state() {
  std::ifstream in(kEmuStateFile);
  if (!in) return nlohmann::json();
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception&) {
    return nlohmann::json();
  }
}

std::string emu_netns(const std::string& machine) { return "aapc-" + machine; }

std::string emu_socket(const std::string& machine) { return (kEmuStateDir / machine / "aapcd.sock").string(); }

std::uint64_t emu_tbf_burst(std::uint64_t bps, int mtu) {
  return std::max<std::uint64_t>({16384, 2 * (static_cast<std::uint64_t>(mtu) + 14), bps / 8 / 500});
}

std::vector<std::string> emu_machines(const nlohmann::json& state) {
  std::vector<std::string> out;
  if (state.contains("machines"))
    for (const auto& m : state["machines"]) out.push_back(m["name"]);
  return out;
}

}  // namespace aapc::tools
