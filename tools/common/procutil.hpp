// What aapc-emu, aapc-bench and the cluster tests share: starting processes, and reading the
// state file that aapc-emu keeps of the cluster it brought up. Not installed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace aapc::tools {

// --- processes --------------------------------------------------------------------------------

// The exit status of a waited-for child: its exit code, or 128 + the signal that ended it.
int exit_status(int wait_status);

struct SpawnOptions {
  std::string log;               // stdout and stderr go here, truncated before spawn() returns
  std::vector<std::string> env;  // NAME=VALUE, set in the child
  bool own_group = false;        // a process group of its own, to be signalled as one
};

// Starts `argv` (looked up on PATH) in the background; returns its pid. A command that cannot
// be run exits 127 with the reason in its log.
pid_t spawn(const std::vector<std::string>& argv, const SpawnOptions& options = {});

struct Output {
  int status = -1;   // exit_status()
  std::string text;  // stdout and stderr together
};

// Runs `argv` to its end. Throws std::runtime_error when no pipe can be made.
Output run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
// Runs a command line with sh -c.
Output run_shell(const std::string& command);

// --- aapc-emu's state file ----------------------------------------------------------------------
// /run/aapc-emu/state.json: {"topology", "machines": [{"name", "rank", "netns", "iface", "mac",
// "ip"}], "daemons": [{"machine", "pid", "socket", "log"}]}. aapc-emu writes it; this format is
// what other tools and scripts read, and stays as it is.

inline const std::filesystem::path kEmuStateDir = "/run/aapc-emu";
inline const std::filesystem::path kEmuStateFile = kEmuStateDir / "state.json";

// The state, or null when there is no (readable) state file.
nlohmann::json read_emu_state();
// The namespace of a machine, and the socket of its daemon.
std::string emu_netns(const std::string& machine);
std::string emu_socket(const std::string& machine);
// The machines' names, in rank order.
std::vector<std::string> emu_machines(const nlohmann::json& state);
// The burst of aapc-emu's tbf on a link of `bps` bits/s and that MTU, in bytes. tbf drops a
// frame longer than its burst, so it holds two frames of the MTU besides 2 ms at the rate. A
// link that was idle passes that many bytes at once, faster than its rate.
std::uint64_t emu_tbf_burst(std::uint64_t bps, int mtu);

}  // namespace aapc::tools
