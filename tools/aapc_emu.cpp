// aapc-emu: an Ethernet switched cluster on one Linux box, from a topology file.
//
// One network namespace per machine (aapc-<machine>), one bridge per switch (aapcb<i>), a
// veth pair per link, tbf on both ends of every link with the topology's rate and the
// switch's buffer. What a machine sends is shaped where it arrives, through an IFB device
// (aapci<rank>), since AF_XDP's transmit skips the machine's own qdisc; where the kernel has
// no IFB, on the machine's end, and the daemons use af_packet. Every name it makes starts with "aapc"; `down` removes exactly those, also
// after a crash, and nothing else.
//
//   aapc-emu up TOPO | down | status
//   aapc-emu exec MACHINE -- CMD...
//   aapc-emu run TOPO -- CMD...     (daemons on every machine, CMD on every machine, one report)
//   aapc-emu mpirun TOPO [--ppn K] [--mpi openmpi|mpich] -- PROGRAM ARGS...
//                                    (daemons on every machine, an MPI job with libaapc-mpi.so)
//   aapc-emu start | stop            (daemons on the cluster that is up)
//
// The daemons authenticate their frames with a key made for the cluster (--no-key: none),
// and open their machine's interface through AF_XDP where they can (--port).
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "aapc/sched/dot.hpp"
#include "common/mpilaunch.hpp"
#include "common/procutil.hpp"
#include "aapc/sched/topology.hpp"

namespace fs = std::filesystem;
using aapc::sched::NodeKind;
using aapc::sched::Topology;
using Json = nlohmann::json;

namespace {

const fs::path kStateDir = aapc::tools::kEmuStateDir;
const fs::path kStateFile = aapc::tools::kEmuStateFile;
const std::regex kOurLink("^aapc(b|p|m|l|i)[0-9]+[ab]?$");  // every interface name we make
const std::string kNetnsPrefix = aapc::tools::emu_netns("");

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool verbose = false;

using aapc::tools::Output;

// Runs argv, returns its exit status and combined output; shown first with --verbose.
Output run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  if (verbose) {
    std::cerr << "+";
    for (const auto& a : argv) std::cerr << " " << a;
    std::cerr << "\n";
  }
  return aapc::tools::run(argv, env);
}

void must(const std::vector<std::string>& argv) {
  Output o = run(argv);
  if (o.status != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw Failure("`" + cmd + "` failed: " + o.text);
  }
}

bool on_path(const std::string& tool) {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"})
    if (::access((fs::path(dir) / tool).c_str(), X_OK) == 0) return true;
  return false;
}

void preflight() {
  if (::geteuid() != 0) throw Failure("aapc-emu needs root: it creates network namespaces, bridges and veth pairs (run it with sudo)");
  for (const char* tool : {"ip", "tc"})
    if (!on_path(tool)) throw Failure(std::string("aapc-emu needs `") + tool + "` (Debian package iproute2)");
  Output o = run({"ip", "link", "add", "aapcprobe0", "type", "bridge"});
  if (o.status != 0 && o.text.find("File exists") == std::string::npos)
    throw Failure("this kernel cannot make bridges here: " + o.text);
  run({"ip", "link", "del", "aapcprobe0"});
}

std::string netns_of(const std::string& machine) { return aapc::tools::emu_netns(machine); }

// Rate in tc's notation, burst (aapc::tools::emu_tbf_burst) and queue limits in bytes.
std::string tc_rate(std::uint64_t bps) { return std::to_string(bps / 1000) + "kbit"; }

void shape(const std::string& netns, const std::string& dev, std::uint64_t bps, std::uint64_t limit, int mtu) {
  std::vector<std::string> argv;
  if (!netns.empty()) argv = {"ip", "netns", "exec", netns};
  std::uint64_t burst = aapc::tools::emu_tbf_burst(bps, mtu);
  for (const std::string& a : {std::string("tc"), std::string("qdisc"), std::string("replace"), std::string("dev"), dev, std::string("root"),
                               std::string("tbf"), std::string("rate"), tc_rate(bps), std::string("burst"), std::to_string(burst),
                               std::string("limit"), std::to_string(std::max(limit, burst))})
    argv.push_back(a);
  must(argv);
}

void no_ipv6(const std::string& netns, const std::string& dev) {
  // Quiet links: no router solicitations or duplicate address probes on the emulated wires.
  std::string key = "net.ipv6.conf." + dev + ".disable_ipv6=1";
  if (netns.empty()) {
    run({"sysctl", "-qw", key});
  } else {
    run({"ip", "netns", "exec", netns, "sysctl", "-qw", key});
  }
}

Json read_state() { return aapc::tools::read_emu_state(); }

std::vector<std::string> our_netns() {
  std::vector<std::string> out;
  std::istringstream in(run({"ip", "netns", "list"}).text);
  std::string line;
  while (std::getline(in, line)) {
    std::string name = line.substr(0, line.find(' '));
    if (name.rfind(kNetnsPrefix, 0) == 0) out.push_back(name);
  }
  return out;
}

std::vector<std::string> our_links() {
  std::vector<std::string> out;
  std::istringstream in(run({"ip", "-o", "link", "show"}).text);
  std::string line;
  while (std::getline(in, line)) {
    // "12: aapcp0@if11: <...": the name, before '@' and ':'
    auto colon = line.find(": ");
    if (colon == std::string::npos) continue;
    std::string name = line.substr(colon + 2);
    name = name.substr(0, name.find_first_of("@:"));
    if (std::regex_match(name, kOurLink)) out.push_back(name);
  }
  return out;
}

// A process in the process table, zombies included.
bool in_process_table(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

// A daemon process that still runs. kill(pid, 0) alone is not enough: a daemon whose
// `aapc-emu start` has exited is reparented, and until its new parent reaps it a killed one
// stays a zombie that kill(pid, 0) still finds (seen: a SIGKILLed daemon was taken for
// running, not restarted, and `start` waited 20 s on its dead socket).
bool running(pid_t pid) {
  if (!in_process_table(pid)) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');  // the state follows "pid (comm) "
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

void stop_daemons(const Json& state, bool quiet = false) {
  if (!state.contains("daemons")) return;
  std::vector<pid_t> pids;
  for (const auto& d : state["daemons"]) {
    pid_t pid = d.value("pid", 0);
    if (running(pid)) ::kill(pid, SIGTERM);
    if (in_process_table(pid)) pids.push_back(pid);  // zombies too: wait until reaped
  }
  // Until each is gone from the process table, so that nothing of ours is left once `down`
  // returns (init here reaps orphans up to 2 s late).
  auto wait_gone = [](pid_t pid, std::chrono::steady_clock::time_point deadline) {
    while (in_process_table(pid) && std::chrono::steady_clock::now() < deadline) {
      ::waitpid(pid, nullptr, WNOHANG);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (pid_t pid : pids) {
    wait_gone(pid, deadline);
    if (running(pid)) {
      if (!quiet) std::cerr << "aapc-emu: daemon " << pid << " did not stop in 5 s; killing it\n";
      ::kill(pid, SIGKILL);
      wait_gone(pid, std::chrono::steady_clock::now() + std::chrono::seconds(5));
    }
  }
}

int cmd_down(bool quiet) {
  preflight();
  Json state = read_state();
  stop_daemons(state, quiet);
  auto netns = our_netns();
  for (const auto& ns : netns) run({"ip", "netns", "del", ns});
  auto links = our_links();
  for (const auto& l : links) run({"ip", "link", "del", l});  // bridges and host ends
  if (fs::exists(kStateDir)) fs::remove_all(kStateDir);
  if (!quiet) std::cout << "aapc-emu: removed " << netns.size() << " namespaces and " << links.size() << " interfaces\n";
  return 0;
}

int cmd_down(bool quiet);
Json build_cluster(const Topology& t, const std::string& subnet);

Json cmd_up(const std::string& topo_arg, const std::string& subnet) {
  preflight();
  Topology t = aapc::sched::load_topology(topo_arg);
  Json state = read_state();
  if (!state.is_null() || !our_netns().empty() || !our_links().empty())
    throw Failure("an emulated cluster is already up (" + state.value("topology", std::string("unknown")) + "); run `aapc-emu down` first");
  try {
    return build_cluster(t, subnet);
  } catch (...) {
    cmd_down(true);  // nothing half-made stays behind
    throw;
  }
}

// A machine's end of a cable: host interface `dev` moved into the machine's namespace as
// aapc0, with the machine's MAC and address, the topology's MTU, and the NIC's queue shaped.
// A machine's own link, the direction it sends: its NIC queue at the link's rate.
constexpr std::uint64_t kNicQueue = 256 * 1024;

// Whether this kernel has IFB devices (and tc's ingress redirect to them), so that a
// machine's sends can be shaped past its namespace (shape_sends).
bool ifb_available() {
  const std::string probe = "aapci999999";
  if (run({"ip", "link", "add", probe, "type", "ifb"}).status != 0) return false;
  run({"ip", "link", "del", probe});
  return true;
}

// Shapes what a machine sends where its frames arrive, at `dev` (the other end of its link,
// in `netns`, "" for the host): AF_XDP's transmit passes no qdisc of the sender's, so its
// NIC queue is emulated by an IFB device that dev's ingress redirects every frame through.
void shape_sends(const std::string& netns, const std::string& dev, const std::string& ifb, std::uint64_t bps, int mtu) {
  std::vector<std::string> in;
  if (!netns.empty()) in = {"ip", "netns", "exec", netns};
  auto there = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), in.begin(), in.end());
    must(argv);
  };
  there({"ip", "link", "add", ifb, "type", "ifb"});
  no_ipv6(netns, ifb);
  there({"ip", "link", "set", ifb, "mtu", std::to_string(mtu), "up"});
  shape(netns, ifb, bps, kNicQueue, mtu);
  there({"tc", "qdisc", "replace", "dev", dev, "ingress"});
  there({"tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0", "0", "action", "mirred", "egress",
         "redirect", "dev", ifb});
}

void machine_end(const Topology& t, const aapc::sched::Node& m, const std::string& dev, const std::string& ip, std::uint64_t bps, bool ifb) {
  const std::string ns = netns_of(m.name);
  must({"ip", "link", "set", dev, "netns", ns});
  must({"ip", "netns", "exec", ns, "ip", "link", "set", dev, "name", "aapc0"});
  no_ipv6(ns, "aapc0");
  must({"ip", "netns", "exec", ns, "ip", "link", "set", "aapc0", "address", m.mac.str(), "mtu", std::to_string(t.mtu()), "up"});
  must({"ip", "netns", "exec", ns, "ip", "addr", "add", ip + "/16", "dev", "aapc0"});
  if (!ifb) shape(ns, "aapc0", bps, kNicQueue, t.mtu());  // the machine's NIC queue (else where its frames arrive)
}

// The link of machine node `ends.machine`: a veth pair, its end in the machine's namespace,
// the other on the switch's bridge `bridge` (a port of `buffer` bytes), or, where `bridge` is
// empty, in the namespace of the machine at the other end (two machines on one cable).
struct MachineLink {
  int machine, other;
  std::uint64_t bps;
  bool ifb;  // sends shaped where they arrive (shape_sends)
};
void machine_link(const Topology& t, const Json& machines, const MachineLink& ends, const std::string& bridge, std::uint64_t buffer) {
  const auto& m = t.node(ends.machine);
  const std::string inner = "aapcm" + std::to_string(m.rank), outer = "aapcp" + std::to_string(m.rank);
  must({"ip", "link", "add", inner, "type", "veth", "peer", "name", outer});
  machine_end(t, m, inner, machines[static_cast<std::size_t>(m.rank)]["ip"], ends.bps, ends.ifb);
  const std::string ifb_of_m = "aapci" + std::to_string(m.rank);
  if (!bridge.empty()) {
    no_ipv6("", outer);
    must({"ip", "link", "set", outer, "master", bridge, "mtu", std::to_string(t.mtu()), "up"});
    shape("", outer, ends.bps, buffer, t.mtu());  // the switch's output port
    if (ends.ifb) shape_sends("", outer, ifb_of_m, ends.bps, t.mtu());
    return;
  }
  const auto& peer = t.node(ends.other);
  machine_end(t, peer, outer, machines[static_cast<std::size_t>(peer.rank)]["ip"], ends.bps, ends.ifb);
  if (ends.ifb) {
    shape_sends(netns_of(peer.name), "aapc0", ifb_of_m, ends.bps, t.mtu());
    shape_sends(netns_of(m.name), "aapc0", "aapci" + std::to_string(peer.rank), ends.bps, t.mtu());
  }
}

Json build_cluster(const Topology& t, const std::string& subnet) {
  Json state;
  fs::create_directories(kStateDir);
  ::chmod(kStateDir.c_str(), 0755);
  // Where a machine's sends are shaped: "ifb" where they arrive (any port, AF_XDP included),
  // else "machine" (its own qdisc, which only af_packet passes).
  const bool ifb = ifb_available();
  state = {{"topology", fs::absolute(t.source()).string()}, {"machines", Json::array()}, {"daemons", Json::array()}, {"send_shaping", ifb ? "ifb" : "machine"}};
  // Write the state first: a crash half-way still leaves `down` a record.
  auto save = [&] { std::ofstream(kStateFile) << state.dump(2); };
  save();
  const std::regex safe("^[A-Za-z0-9_.-]{1,40}$");
  std::vector<int> switch_index(t.nodes().size(), -1);
  int switches = 0;
  for (std::size_t i = 0; i < t.nodes().size(); ++i) {
    const auto& node = t.nodes()[i];
    if (node.kind == NodeKind::kSwitch) {
      switch_index[i] = switches++;
    } else if (!std::regex_match(node.name, safe)) {
      throw Failure("machine name '" + node.name + "' cannot name a network namespace (letters, digits, _ . - only)");
    }
  }
  const std::string mtu = std::to_string(t.mtu());
  auto bridge = [&](int node) { return "aapcb" + std::to_string(switch_index[static_cast<std::size_t>(node)]); };
  auto buffer_of = [&](int node) { return aapc::sched::buffer_or_default(t.node(node)); };
  for (std::size_t i = 0; i < t.nodes().size(); ++i) {
    if (switch_index[i] < 0) continue;
    std::string br = bridge(static_cast<int>(i));
    // An emulated switch forwards Ethernet frames and nothing else: the host's netfilter
    // hooks (bridge-nf-call-*, on wherever br_netfilter is loaded) would cost every frame a
    // pass through its iptables rules (the tiny exchanges are bound by the kernel's
    // work per frame). Kernels without the per-bridge switch get the bridge as it was.
    if (run({"ip", "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0", "nf_call_iptables", "0", "nf_call_ip6tables", "0",
              "nf_call_arptables", "0"})
             .status != 0)
      must({"ip", "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0"});
    no_ipv6("", br);
    must({"ip", "link", "set", br, "mtu", mtu, "up"});
  }
  for (int r = 0; r < t.machine_count(); ++r) {
    const auto& m = t.machine(r);
    std::string ns = netns_of(m.name);
    must({"ip", "netns", "add", ns});
    std::string ip = subnet + "." + std::to_string((r + 1) / 250) + "." + std::to_string((r + 1) % 250 + 1);
    state["machines"].push_back({{"name", m.name}, {"rank", r}, {"netns", ns}, {"iface", "aapc0"}, {"mac", m.mac.str()}, {"ip", ip}});
    save();
    must({"ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"});
  }
  // Links: a veth pair each, shaped at both ends.
  for (std::size_t l = 0; l < t.links().size(); ++l) {
    const auto& link = t.links()[l];
    const auto& a = t.node(link.a);
    const auto& b = t.node(link.b);
    if (a.kind == NodeKind::kMachine || b.kind == NodeKind::kMachine) {
      const int mnode = a.kind == NodeKind::kMachine ? link.a : link.b;
      const int other = mnode == link.a ? link.b : link.a;
      const bool to_switch = t.node(other).kind == NodeKind::kSwitch;
      machine_link(t, state["machines"], {mnode, other, link.rate_bps, ifb}, to_switch ? bridge(other) : "", to_switch ? buffer_of(other) : 0);
    } else {
      std::string ea = "aapcl" + std::to_string(l) + "a", eb = "aapcl" + std::to_string(l) + "b";
      must({"ip", "link", "add", ea, "type", "veth", "peer", "name", eb});
      for (const auto& [dev, node] : {std::pair{ea, link.a}, std::pair{eb, link.b}}) {
        no_ipv6("", dev);
        must({"ip", "link", "set", dev, "master", bridge(node), "mtu", mtu, "up"});
        shape("", dev, link.rate_bps, buffer_of(node), t.mtu());
      }
    }
  }
  save();
  return state;
}

int cmd_status() {
  Json state = read_state();
  auto netns = our_netns();
  auto links = our_links();
  if (state.is_null() && netns.empty() && links.empty()) {
    std::cout << "aapc-emu: nothing is up\n";
    return 0;
  }
  std::cout << "topology   " << state.value("topology", std::string("(no state file: left over from a crash? run aapc-emu down)")) << "\n";
  std::cout << "namespaces " << netns.size() << "\ninterfaces " << links.size() << " (host side)\n";
  if (state.contains("machines"))
    for (const auto& m : state["machines"])
      std::cout << "  rank " << m["rank"].get<int>() << "  " << m["name"].get<std::string>() << "  " << m["mac"].get<std::string>() << "  "
                << m["ip"].get<std::string>() << "  netns " << m["netns"].get<std::string>() << "\n";
  if (state.contains("daemons"))
    for (const auto& d : state["daemons"]) {
      pid_t pid = d.value("pid", 0);
      std::cout << "  aapcd on " << d.value("machine", std::string("?")) << ": pid " << pid << (running(pid) ? " running" : " gone")
                << ", socket " << d.value("socket", std::string()) << "\n";
    }
  return 0;
}

int cmd_exec(const std::string& machine, const std::vector<std::string>& cmd) {
  if (::geteuid() != 0) throw Failure("aapc-emu exec needs root (ip netns exec)");
  std::vector<std::string> argv = {"ip", "netns", "exec", netns_of(machine)};
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  ::execvp("ip", args.data());
  throw Failure(std::string("cannot run ip: ") + std::strerror(errno));
}

// --- run ----------------------------------------------------------------------------------

volatile sig_atomic_t g_interrupted = 0;
void on_signal(int) { g_interrupted = 1; }

bool socket_answers(const std::string& path) {
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(s);
  return ok;
}

std::string tail(const std::string& file, std::size_t lines = 15) {
  std::ifstream in(file);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(line);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "    " + all[i] + "\n";
  return out;
}

fs::path sibling(const char* argv0, const std::string& tool) {
  fs::path self = fs::canonical("/proc/self/exe");
  fs::path next = self.parent_path() / tool;
  if (fs::exists(next)) return next;
  (void)argv0;
  return tool;  // from PATH
}

struct RunOptions {
  std::string topology, faults, capture_dir, daemon_args, subnet = "10.77";
  bool keep = false;
  bool no_key = false;  // daemons without a cluster key: frames unauthenticated
  std::string port = "auto";  // aapcd --iface-driver: auto (AF_XDP, else af_packet), af_xdp, af_packet
  int timeout_s = 600;
};

std::string socket_of(const std::string& machine) { return aapc::tools::emu_socket(machine); }

// The daemons' --cluster-key: frames are authenticated by default (docs/design.md, "Jobs kept
// apart"), so the cluster gets a key of its own, made once while it is up (`down` removes it
// with the state directory), readable by root alone. None with --no-key, or when
// --daemon-args gives one.
std::vector<std::string> key_args(const RunOptions& o) {
  if (o.no_key || o.daemon_args.find("--cluster-key") != std::string::npos) return {};
  const fs::path key = kStateDir / "cluster.key";
  if (!fs::exists(key)) {
    std::vector<char> bytes(32);
    std::ifstream random("/dev/urandom", std::ios::binary);
    if (!random.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) throw Failure("cannot read /dev/urandom for the cluster key");
    const int fd = ::open(key.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw Failure("cannot create " + key.string() + ": " + std::strerror(errno));
    const bool written = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
    ::close(fd);
    if (!written) throw Failure("cannot write " + key.string());
  }
  return {"--cluster-key", key.string()};
}

// The daemon's port: its machine's interface through --port where the
// cluster shapes sends past the machine (state "send_shaping": "ifb"); else af_packet through
// the machine's qdisc, which AF_XDP's transmit would skip.
std::vector<std::string> port_args(const Json& state, const RunOptions& o) {
  if (state.value("send_shaping", std::string("machine")) == "ifb") {
    return {"--iface", "aapc0", "--iface-driver", o.port};
  }
  if (o.port == "af_xdp")
    throw Failure("--port af_xdp: this kernel has no IFB devices, so what AF_XDP sends (which skips the machine's own qdisc) could not be "
                  "shaped to the link's rate; use --port af_packet or auto");
  return {"--vdev", "net_af_packet0,iface=aapc0"};
}

// Starts aapcd in every machine's namespace whose daemon is not running, and waits until
// each answers on its socket.
void start_daemons(Json& state, const RunOptions& o, const char* argv0) {
  const fs::path aapcd = sibling(argv0, "aapcd");
  const std::string topo_path = state["topology"];
  Json daemons = Json::array();
  for (const auto& d : state["daemons"]) {
    pid_t pid = d.value("pid", 0);
    if (!running(pid)) continue;
    if (const std::string port = d.value("port", std::string("auto")); port != o.port)
      throw Failure("the daemons run with --port " + port + ", not " + o.port + "; `aapc-emu stop` them first");
    daemons.push_back(d);
  }
  for (const auto& m : state["machines"]) {
    std::string name = m["name"];
    bool running = false;
    for (const auto& d : daemons) running = running || d["machine"] == name;
    if (running) continue;
    fs::path dir = kStateDir / name;
    fs::create_directories(dir);
    std::string socket = socket_of(name);
    std::vector<std::string> argv = {"ip", "netns", "exec", m["netns"], aapcd.string(), "--topology", topo_path, "--socket", socket, "--log-level", "warn"};
    const auto port = port_args(state, o);
    argv.insert(argv.end(), port.begin(), port.end());
    const auto key = key_args(o);
    argv.insert(argv.end(), key.begin(), key.end());
    if (!o.faults.empty()) argv.insert(argv.end(), {"--faults", o.faults});
    if (!o.capture_dir.empty()) {
      fs::create_directories(o.capture_dir);
      argv.insert(argv.end(), {"--capture", (fs::absolute(o.capture_dir) / (name + ".pcap")).string()});
    }
    std::istringstream extra(o.daemon_args);
    for (std::string a; extra >> a;) argv.push_back(a);
    pid_t pid = aapc::tools::spawn(argv, {(dir / "aapcd.log").string(), {}, true});
    daemons.push_back({{"machine", name}, {"pid", pid}, {"socket", socket}, {"log", (dir / "aapcd.log").string()}, {"port", o.port}});
  }
  state["daemons"] = daemons;
  std::ofstream(kStateFile) << state.dump(2);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (const auto& d : state["daemons"]) {
    while (!socket_answers(d["socket"])) {
      int status = 0;
      if (::waitpid(d["pid"].get<pid_t>(), &status, WNOHANG) > 0 || g_interrupted || std::chrono::steady_clock::now() > deadline)
        throw Failure("aapcd on " + d["machine"].get<std::string>() + " did not come up; its log:\n" + tail(d["log"]));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

int cmd_start(const RunOptions& o, const char* argv0) {
  preflight();
  Json state = read_state();
  if (state.is_null()) throw Failure("no cluster is up; run `aapc-emu up TOPO` first");
  start_daemons(state, o, argv0);
  for (const auto& d : state["daemons"])
    std::cout << "aapc-emu: aapcd on " << d["machine"].get<std::string>() << " (pid " << d["pid"].get<pid_t>() << "), AAPC_SOCKET=" << d["socket"].get<std::string>()
              << "\n";
  return 0;
}

int cmd_stop() {
  Json state = read_state();
  if (state.is_null()) return 0;
  stop_daemons(state);
  state["daemons"] = Json::array();
  std::ofstream(kStateFile) << state.dump(2);
  return 0;
}

// The command on every machine at once, rank 0's output shown as it comes, and one report:
// rank 0's output, and the output of every machine that failed. Returns how many failed.
int command_everywhere(const Json& state, const RunOptions& o, const std::vector<std::string>& cmd) {
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (const auto& m : state["machines"]) {
    std::string name = m["name"];
    std::vector<std::string> argv = {"ip", "netns", "exec", m["netns"]};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    std::string log = (kStateDir / name / "command.log").string();
    pids.push_back(aapc::tools::spawn(argv, {log, {"AAPC_SOCKET=" + socket_of(name)}, true}));
    logs.push_back(log);
  }
  std::vector<int> status(pids.size(), -1);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(o.timeout_s);
  std::size_t running = pids.size();
  bool killed = false;
  // Rank 0's output is shown as it comes (progress of long runs).
  std::ifstream rank0;
  auto stream_rank0 = [&] {
    if (!rank0.is_open()) rank0.open(logs[0]);
    if (!rank0.is_open()) return;
    rank0.clear();
    std::string chunk((std::istreambuf_iterator<char>(rank0)), std::istreambuf_iterator<char>());
    if (!chunk.empty()) {
      std::cout << chunk << std::flush;
    }
  };
  while (running > 0) {
    stream_rank0();
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = aapc::tools::exit_status(st);
        --running;
      }
    }
    if (running > 0 && !killed && (g_interrupted || std::chrono::steady_clock::now() > end)) {
      // Once: killed processes may take a while to be reaped on a loaded machine.
      killed = true;
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (status[i] == -1) ::kill(-pids[i], SIGKILL);
      if (!g_interrupted) std::cerr << "aapc-emu: the command did not finish within " << o.timeout_s << " s; killed\n";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stream_rank0();
  int failed = 0;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    std::ifstream in(logs[i]);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string name = state["machines"][i]["name"];
    if (status[i] != 0) {
      ++failed;
      std::cerr << "aapc-emu: " << name << " (rank " << i << ") exited with " << status[i] << (i == 0 ? "" : ":\n" + text) << "\n";
    }
  }
  if (failed > 0) {
    for (const auto& d : state["daemons"])
      std::cerr << "aapc-emu: aapcd log of " << d["machine"].get<std::string>() << ":\n" << tail(d["log"], 6);
  }
  return failed;
}

// Brings up o.topology (unless it is up), starts the daemons, runs `body` on the cluster,
// and stops what it started, also when `body` throws or the user interrupts.
int with_cluster(const RunOptions& o, const char* argv0, const std::function<int(const Json&)>& body) {
  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);
  ::signal(SIGPIPE, SIG_IGN);  // a reader that goes away (| head) must not stop the clean-up
  Json state = read_state();
  bool brought_up = false;
  Topology t = aapc::sched::load_topology(o.topology);
  if (state.is_null()) {
    state = cmd_up(o.topology, o.subnet);
    brought_up = true;
  } else if (state.value("topology", std::string()) != fs::absolute(t.source()).string()) {
    throw Failure("another cluster is up (" + state.value("topology", std::string()) + "); run `aapc-emu down` first");
  }
  // Daemons that ran before this command (`aapc-emu start`'s, another run's) are left running,
  // with the clients they serve.
  std::set<pid_t> theirs;
  if (state.contains("daemons"))
    for (const auto& d : state["daemons"])
      if (running(d.value("pid", 0))) theirs.insert(d.value("pid", 0));
  auto cleanup = [&] {
    Json mine = Json::array(), kept = Json::array();
    for (const auto& d : state["daemons"]) (theirs.count(d.value("pid", 0)) != 0 ? kept : mine).push_back(d);
    stop_daemons(Json{{"daemons", mine}}, true);
    state["daemons"] = kept;
    if (brought_up && !o.keep) {
      cmd_down(true);
    } else {
      std::ofstream(kStateFile) << state.dump(2);
    }
  };
  try {
    start_daemons(state, o, argv0);
    const int rc = body(state);
    cleanup();
    return rc;
  } catch (...) {
    cleanup();
    throw;
  }
}

int cmd_run(const RunOptions& o, const std::vector<std::string>& cmd, const char* argv0) {
  if (cmd.empty()) throw Failure("give the command to run on every machine after --, e.g. -- aapc run --size 64K");
  return with_cluster(o, argv0, [&](const Json& state) { return command_everywhere(state, o, cmd) == 0 ? 0 : 1; });
}

struct MpiOptions {
  std::string ppn = "1";  // K, or K0,K1,... by machine
  std::string impl = "openmpi";
  std::string library;  // libaapc-mpi.so; found beside the tools when empty
  bool no_preload = false;
  std::vector<std::string> env;
};

// Ranks per machine from "K" or "K0,K1,...".
std::vector<int> ranks_per_machine(const std::string& spec, std::size_t machines) {
  std::vector<int> out;
  std::stringstream in(spec);
  for (std::string k; std::getline(in, k, ',');) {
    char* end = nullptr;
    const long v = std::strtol(k.c_str(), &end, 10);
    if (k.empty() || *end != '\0' || v < 1 || v > 1024) throw Failure("--ppn: '" + k + "' is not a number of ranks from 1 to 1024");
    out.push_back(static_cast<int>(v));
  }
  if (out.size() == 1) out.assign(machines, out.front());
  if (out.size() != machines)
    throw Failure("--ppn gives " + std::to_string(out.size()) + " counts; the cluster has " + std::to_string(machines) + " machines");
  return out;
}

// libaapc-mpi.so: as given, or where a build or an install puts it beside these tools.
std::string mpi_library(const std::string& given) {
  if (!given.empty()) {
    if (!fs::exists(given)) throw Failure("--library " + given + ": no such file");
    return fs::absolute(given).string();
  }
  if (auto found = aapc::tools::beside_tools("libaapc-mpi.so", {"../mpi", "../lib/x86_64-linux-gnu", "../lib64", "../lib"})) return found->string();
  throw Failure("cannot find libaapc-mpi.so beside " + fs::canonical("/proc/self/exe").parent_path().string() +
                "; give --library PATH, or --no-preload for the MPI alone");
}

int cmd_mpirun(const RunOptions& o, const MpiOptions& m, const std::vector<std::string>& program, const char* argv0) {
  if (program.empty()) throw Failure("give the MPI program after --, e.g. -- ./fft 1024");
  if (aapc::tools::MpiCluster::launcher(m.impl).empty())
    throw Failure("--mpi " + m.impl + ": its launcher is not installed (Debian: openmpi-bin or mpich)");
  aapc::tools::MpiJob job;
  job.impl = m.impl;
  job.env = m.env;
  job.preload = m.no_preload ? "" : mpi_library(m.library);
  job.program = program;
  job.timeout_s = o.timeout_s;
  return with_cluster(o, argv0, [&](const Json& state) {
    job.ppn = ranks_per_machine(m.ppn, state["machines"].size());
    aapc::tools::MpiCluster cluster(state, kStateDir / "mpi");
    const int st = cluster.run(job);
    if (const std::size_t left = cluster.end_job(); left > 0)
      std::cerr << "aapc-emu: ended " << left << " processes the MPI job left running (MPICH can spin in MPI_Finalize)\n";
    if (st != 0) std::cerr << "aapc-emu: the MPI job exited with " << st << (st == 124 ? " (timed out)" : "") << "\n";
    return st == 0 ? 0 : 1;
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-emu: an emulated Ethernet switched cluster on this box, from a topology file.\n"
               "Machines are network namespaces (aapc-<name>), switches are bridges (aapcb<i>), links are veth pairs shaped by tbf.\n"
               "The daemons open their interface through AF_XDP (af_packet where it cannot; --port)."};
  app.require_subcommand(1);
  app.add_flag("--verbose,-v", verbose, "print every command run");
  std::string topo, machine, subnet = "10.77";
  auto* up = app.add_subcommand("up", "bring up the cluster of a topology file");
  up->add_option("TOPO", topo, "topology file or shipped name")->required();
  up->add_option("--subnet", subnet, "first two octets of the machines' IPv4 addresses (/16)")->capture_default_str();
  app.add_subcommand("down", "remove everything aapc-emu made (also after a crash)");
  app.add_subcommand("status", "what is up");
  std::vector<std::string> cmd;
  auto* ex = app.add_subcommand("exec", "run a command in a machine's namespace: aapc-emu exec n0 -- ip link");
  ex->add_option("MACHINE", machine, "machine name")->required();
  ex->add_option("CMD", cmd, "command")->required();
  RunOptions ro;
  const std::string kPortHelp = "how each daemon opens its machine's interface: auto (AF_XDP where it can, else af_packet), af_xdp or af_packet";
  const auto kPorts = CLI::IsMember({"auto", "af_xdp", "af_packet"});
  const std::string kNoKeyHelp = "run the daemons without a cluster key (frames unauthenticated; by default the cluster gets a key of its own)";
  auto* runc = app.add_subcommand("run", "bring up TOPO (unless up), start aapcd on every machine (unless running), run CMD on every machine, report, stop and tear down what it started");
  runc->add_option("TOPO", ro.topology, "topology file or shipped name")->required();
  runc->add_option("CMD", cmd, "command for every machine, after --")->required();
  runc->add_flag("--keep", ro.keep, "leave the cluster up afterwards");
  runc->add_option("--faults", ro.faults, "inject faults in every daemon's port, e.g. drop=0.01");
  runc->add_option("--capture-dir", ro.capture_dir, "every daemon writes DIR/<machine>.pcap");
  runc->add_option("--daemon-args", ro.daemon_args, "further aapcd arguments");
  runc->add_flag("--no-key", ro.no_key, kNoKeyHelp);
  runc->add_option("--port", ro.port, kPortHelp)->check(kPorts)->capture_default_str();
  runc->add_option("--timeout", ro.timeout_s, "seconds the command may take")->capture_default_str();
  runc->add_option("--subnet", ro.subnet, "first two octets of the machines' IPv4 addresses")->capture_default_str();
  auto* startc = app.add_subcommand("start", "start aapcd on every machine of the cluster that is up (those not running)");
  startc->add_option("--faults", ro.faults, "inject faults in every daemon's port, e.g. drop=0.01");
  startc->add_option("--capture-dir", ro.capture_dir, "every daemon writes DIR/<machine>.pcap");
  startc->add_option("--daemon-args", ro.daemon_args, "further aapcd arguments");
  startc->add_flag("--no-key", ro.no_key, kNoKeyHelp);
  startc->add_option("--port", ro.port, kPortHelp)->check(kPorts)->capture_default_str();
  app.add_subcommand("stop", "stop the daemons (the cluster stays up)");
  MpiOptions mo;
  auto* mpic = app.add_subcommand("mpirun", "bring up TOPO (unless up), start aapcd on every machine, run an MPI program on the cluster with "
                                            "libaapc-mpi.so preloaded, stop and tear down what it started");
  mpic->add_option("TOPO", ro.topology, "topology file or shipped name")->required();
  mpic->add_option("PROGRAM", cmd, "the MPI program and its arguments, after --")->required();
  mpic->add_option("--ppn", mo.ppn, "ranks per machine: K, or K0,K1,... machine by machine")->capture_default_str();
  mpic->add_option("--mpi", mo.impl, "openmpi or mpich")->check(CLI::IsMember({"openmpi", "mpich"}))->capture_default_str();
  mpic->add_option("--library", mo.library, "libaapc-mpi.so to preload (default: the one beside these tools)");
  mpic->add_flag("--no-preload", mo.no_preload, "run the program on the MPI alone");
  mpic->add_option("--env", mo.env, "NAME=VALUE for every rank (repeatable), e.g. AAPC_MPI_VERBOSE=1")->allow_extra_args(false);
  mpic->add_flag("--keep", ro.keep, "leave the cluster up afterwards");
  mpic->add_option("--daemon-args", ro.daemon_args, "further aapcd arguments");
  mpic->add_flag("--no-key", ro.no_key, kNoKeyHelp);
  mpic->add_option("--port", ro.port, kPortHelp)->check(kPorts)->capture_default_str();
  mpic->add_option("--timeout", ro.timeout_s, "seconds the job may take; past them, where each of its processes waits is shown (gdb's backtraces), and the job is ended")->capture_default_str();
  mpic->add_option("--subnet", ro.subnet, "first two octets of the machines' IPv4 addresses")->capture_default_str();
  app.positionals_at_end();
  CLI11_PARSE(app, argc, argv);
  try {
    if (up->parsed()) {
      Json state = cmd_up(topo, subnet);
      std::cout << "aapc-emu: up: " << state["machines"].size() << " machines of " << state["topology"].get<std::string>() << "\n";
      return 0;
    }
    if (app.got_subcommand("down")) return cmd_down(false);
    if (app.got_subcommand("status")) return cmd_status();
    if (ex->parsed()) return cmd_exec(machine, cmd);
    if (startc->parsed()) return cmd_start(ro, argv[0]);
    if (app.got_subcommand("stop")) return cmd_stop();
    if (mpic->parsed()) return cmd_mpirun(ro, mo, cmd, argv[0]);
    return cmd_run(ro, cmd, argv[0]);
  } catch (const std::exception& e) {
    std::cerr << "aapc-emu: " << e.what() << "\n";
    return 1;
  }
}
