// The cluster suite: daemons in network namespaces over net_af_packet, on emulated clusters
// (aapc-emu). Needs root; skipped (exit 77) otherwise.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "common/procutil.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const std::string kTools = AAPC_TOOLS_DIR;
const std::string kClient = AAPC_TEST_CLIENT;
const std::string kEmu = kTools + "/aapc-emu";
const fs::path kLogs = fs::temp_directory_path() / ("aapc-cluster-" + std::to_string(::getpid()));

using Sh = aapc::tools::Output;  // status, and stdout with stderr as text

Sh sh(const std::string& cmd) { return aapc::tools::run_shell(cmd); }

nlohmann::json state() { return aapc::tools::read_emu_state(); }

std::string socket_of(const std::string& machine) { return aapc::tools::emu_socket(machine); }

// A process of a test; one still running when its test ends (a failed REQUIRE before the test
// stops it) is killed and reaped rather than left waiting.
struct Proc {
  pid_t pid = -1;
  std::string machine, log;
  int status = -1;
  bool reaped = false;
  Proc() = default;
  Proc(Proc&& o) noexcept
      : pid(std::exchange(o.pid, -1)), machine(std::move(o.machine)), log(std::move(o.log)), status(o.status), reaped(o.reaped) {}
  Proc& operator=(Proc&&) = delete;
  ~Proc() {
    if (pid <= 0 || reaped) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  std::string output() const {
    std::ifstream in(log);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
};

// A command in a machine's namespace, with its daemon's socket, in the background.
Proc spawn_in(const std::string& machine, const std::vector<std::string>& argv) {
  fs::create_directories(kLogs);
  static int serial = 0;
  Proc p;
  p.machine = machine;
  p.log = (kLogs / (machine + "-" + std::to_string(serial++) + ".log")).string();
  std::vector<std::string> full = {"ip", "netns", "exec", aapc::tools::emu_netns(machine)};
  full.insert(full.end(), argv.begin(), argv.end());
  p.pid = aapc::tools::spawn(full, {p.log, {"AAPC_SOCKET=" + socket_of(machine)}, false});
  return p;
}

bool wait_for(Proc& p, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    int st = 0;
    if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
      p.reaped = true;
      p.status = aapc::tools::exit_status(st);
      return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

std::vector<std::string> machines() { return aapc::tools::emu_machines(state()); }

// "Cpus_allowed_list" of a /proc status file: "0-1".
std::string cpus_allowed(const std::string& status_file) {
  std::ifstream in(status_file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Cpus_allowed_list:", 0) == 0) return line.substr(line.find_first_not_of(" \t", 18));
  return "";
}

// The CPUs of such a list, in order: "0-2,5" gives 0, 1, 2, 5.
std::vector<int> cpus_of(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  for (std::string part; std::getline(ss, part, ',');) {
    const auto dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash)), hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  return out;
}

// A topology of two machines on one cable, at MTU 9000, written where the logs go.
fs::path two_on_a_cable(int mtu = 9000) {
  fs::create_directories(kLogs);
  const fs::path topo = kLogs / ("two-on-a-cable-" + std::to_string(mtu) + ".dot");
  std::ofstream(topo) << "graph \"two-on-a-cable\" {\n  mtu=" << mtu << ";\n  edge [rate=\"100Mbit\"];\n"
                      << "  a [mac=\"02:00:00:00:00:01\"];\n  b [mac=\"02:00:00:00:00:02\"];\n  a -- b;\n}\n";
  return topo;
}

// The same command on every machine; returns the finished processes (rank order).
std::vector<Proc> everywhere(const std::vector<std::string>& argv, std::chrono::milliseconds limit = 60s) {
  std::vector<Proc> procs;
  for (const auto& m : machines()) procs.push_back(spawn_in(m, argv));
  REQUIRE(procs.size() >= 2);
  for (auto& p : procs) {
    if (!wait_for(p, limit)) {
      ::kill(p.pid, SIGKILL);
      wait_for(p, 5s);
      p.status = -2;
    }
  }
  return procs;
}

// Every machine that failed is named with its output: the first alone seldom says why (a rank
// waiting for a peer fails at the stall deadline; the peer's own error tells what happened).
void require_all_ok(const std::vector<Proc>& procs, const std::string& what) {
  std::string failed;
  for (const auto& p : procs)
    if (p.status != 0) failed += "\n" + what + " on " + p.machine + " (exit " + std::to_string(p.status) + "): " + p.output();
  INFO(failed);
  REQUIRE(failed.empty());
}

bool nothing_left() {
  return sh("ip netns list | grep -c '^aapc-'").text.find_first_not_of("0\n") == std::string::npos &&
         sh("ip -o link show | grep -cE ': aapc(b|p|m|l)[0-9]'").text.find_first_not_of("0\n") == std::string::npos &&
         !fs::exists(aapc::tools::kEmuStateDir) && sh("pgrep -x aapcd").status != 0;
}

// An emulated cluster for one test: torn down even when the test fails.
struct Cluster {
  explicit Cluster(const std::string& topo, const std::string& daemon_args = "", const std::string& faults = "") {
    sh(kEmu + " down");
    auto up = sh(kEmu + " up " + topo);
    INFO(up.text);
    REQUIRE(up.status == 0);
    start(daemon_args, faults);
  }
  void start(const std::string& daemon_args = "", const std::string& faults = "", const std::string& capture_dir = "", bool no_key = false) {
    std::string cmd = kEmu + " start" + (no_key ? " --no-key" : "");
    if (!daemon_args.empty()) cmd += " --daemon-args '" + daemon_args + "'";
    if (!faults.empty()) cmd += " --faults " + faults;
    if (!capture_dir.empty()) cmd += " --capture-dir " + capture_dir;
    auto st = sh(cmd);
    INFO(st.text);
    REQUIRE(st.status == 0);
  }
  ~Cluster() { sh(kEmu + " down"); }
};

// The pid of `machine`'s aapcd, from aapc-emu's state.
pid_t daemon_pid(const std::string& machine) {
  const nlohmann::json s = state();
  for (const auto& d : s["daemons"])
    if (d["machine"] == machine) return d["pid"];
  return 0;
}

// `aapc status` of the first machine's daemon.
Sh status_of_first() { return sh("AAPC_SOCKET=" + socket_of(machines().front()) + " " + kTools + "/aapc status"); }

// `aapc status` of every machine's daemon, parsed.
std::vector<nlohmann::json> all_machines_status() {
  std::vector<nlohmann::json> out;
  for (const auto& m : machines()) {
    const Sh st = sh("AAPC_SOCKET=" + socket_of(m) + " " + kTools + "/aapc status");
    INFO(m << ": " << st.text);
    REQUIRE(st.status == 0);
    out.push_back(nlohmann::json::parse(st.text));
  }
  return out;
}

// Waits until the daemon on `m` runs an exchange that has not finished: a client killed
// before its first collective is one that never called (its peers wait for the collective's
// deadline), not one killed mid-exchange. A fixed sleep raced a busy machine's start-up.
bool wait_running(const std::string& m, std::chrono::seconds bound = 30s) {
  const auto until = std::chrono::steady_clock::now() + bound;
  std::string last;
  while (std::chrono::steady_clock::now() < until) {
    const Sh st = sh("AAPC_SOCKET=" + socket_of(m) + " " + kTools + "/aapc status");
    last = st.text;
    if (st.status == 0) {
      const nlohmann::json status = nlohmann::json::parse(st.text);
      for (const auto& ex : status["exchanges"])
        if (!ex["finished"].get<bool>()) return true;
    }
    std::this_thread::sleep_for(50ms);
  }
  WARN(m << " ran no exchange within " << bound.count() << " s; its last status:\n" << last);
  return false;
}

std::vector<std::string> exchange(std::size_t size, const std::string& schedule, const std::string& sync = "auto", int iters = 2) {
  return {kClient, "exchange", std::to_string(size), schedule, sync, std::to_string(iters)};
}

}  // namespace

TEST_CASE("every schedule is byte-exact on the 8-machine one-switch and two-switch clusters") {
  for (const char* topo : {"8-one-switch", "8-two-switch"}) {
    Cluster c(topo);
    // aapc-emu's daemons open their interface through AF_XDP where the MTU allows it.
    CHECK(nlohmann::json::parse(status_of_first().text)["port_driver"] == "net_af_xdp");
    for (const char* schedule : {"auto", "tree", "sync-shuffle", "paced-shuffle", "group-shuffle", "pairwise", "pairwise-ec", "ring", "linear", "lp"})
      require_all_ok(everywhere(exchange(3000, schedule)), std::string(topo) + " " + schedule);
    for (const char* sync : {"none", "dummy", "receiver-all", "sender-partial:3", "barrier-all"})
      require_all_ok(everywhere(exchange(2000, "tree", sync)), std::string(topo) + " tree + " + sync);
    require_all_ok(everywhere({kClient, "alltoallv"}), std::string(topo) + " alltoallv");
    require_all_ok(everywhere({kClient, "nonblocking", "50000"}), std::string(topo) + " nonblocking");
  }
  CHECK(nothing_left());
}

TEST_CASE("a machine's IP traffic passes on the interface its daemon holds through AF_XDP, during exchanges too") {
  // The XDP program takes aapc's frames alone: libxdp's default one took every frame, and an
  // MPI job's TCP over the same interface hung.
  Cluster c("8-one-switch");
  REQUIRE(nlohmann::json::parse(status_of_first().text)["port_driver"] == "net_af_xdp");
  const std::string server_ip = state()["machines"][1]["ip"];
  Proc server = spawn_in(machines()[1], {"/usr/bin/python3", "-c",
                                         "import socket\n"
                                         "s = socket.socket()\n"
                                         "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                                         "s.bind(('0.0.0.0', 7791))\n"
                                         "s.listen()\n"
                                         "s.settimeout(20)\n"
                                         "c, _ = s.accept()\n"
                                         "c.settimeout(10)\n"
                                         "c.sendall(c.recv(5))\n"});
  std::vector<Proc> load;
  for (const auto& m : machines()) load.push_back(spawn_in(m, exchange(1 << 20, "auto", "auto", 5)));
  std::this_thread::sleep_for(500ms);
  Proc client = spawn_in(machines()[0], {"/usr/bin/python3", "-c",
                                         "import socket, time\n"
                                         "for i in range(50):\n"
                                         "    try:\n"
                                         "        s = socket.create_connection(('" + server_ip + "', 7791), timeout=1)\n"
                                         "        break\n"
                                         "    except OSError:\n"
                                         "        time.sleep(0.1)\n"
                                         "s.settimeout(5)\n"
                                         "s.sendall(b'hello')\n"
                                         "print(s.recv(5))\n"});
  REQUIRE(wait_for(client, 20s));
  INFO(client.output());
  CHECK(client.status == 0);
  CHECK(client.output().find("b'hello'") != std::string::npos);
  REQUIRE(wait_for(server, 20s));
  for (auto& p : load) {
    REQUIRE(wait_for(p, 60s));
    INFO(p.machine << ": " << p.output());
    CHECK(p.status == 0);
  }
}

TEST_CASE("the combining schedules are byte-exact on one switch and on three levels") {
  for (const char* topo : {"8-one-switch", "12-three-level"}) {
    Cluster c(topo);
    const bool eight = std::string(topo) == "8-one-switch";
    for (const char* schedule : {"bruck", "hypercube"}) {
      if (!eight && std::string(schedule) == "hypercube") continue;  // 12 is no power of two
      for (std::size_t block : {std::size_t{8}, std::size_t{3000}})
        require_all_ok(everywhere(exchange(block, schedule, "auto", 3)), std::string(topo) + " " + schedule + " " + std::to_string(block));
    }
  }
  CHECK(nothing_left());
}

TEST_CASE("sparse alltoallv (Figure 7, 3 of N destinations) byte-exact; on a tree auto runs CGM with links masked, with tokens") {
  for (const std::string topo : {"8-one-switch", "12-three-level"}) {
    Cluster c(topo);
    const bool tree = topo != "8-one-switch";
    for (const std::string schedule : {"auto", "cgm", "gm", "cgm-links", "tree"}) {
      auto procs = everywhere({kTools + "/aapc", "run", "--sparse", "3", "--size", "5000", "--iters", "2", "--warmup", "0", "--check", "--schedule", schedule});
      require_all_ok(procs, topo + " sparse " + schedule);
      const std::string out = procs[0].output();
      INFO(out);
      CHECK_THAT(out, Catch::Contains("every byte as sent"));
      if (schedule == "tree") continue;
      const std::string ran = schedule != "auto" ? schedule : tree ? "cgm-links" : "sync-shuffle";
      CHECK_THAT(out, Catch::Contains("5000 B blocks, " + ran + (ran == "sync-shuffle" ? "," : ": ")));
      if (ran != "sync-shuffle") CHECK_THAT(out, Catch::Contains(tree ? "+ sender-all" : " 0 tokens"));
    }
  }
  CHECK(nothing_left());
}

// `aapc run --check` checks and fills its buffers between timed exchanges, untimed, and ranks
// end that at different times. Before a barrier ended it, rank 0's timed exchange waited for
// the slowest rank's check (256 KiB at MTU 9000: 95% of the limit with --check, 98% without).
// Every collective takes the next exchange id, so the daemon's ids count the barriers.
TEST_CASE("aapc run --check: a barrier after the untimed check starts each timed exchange together") {
  Cluster c("8-one-switch");
  auto next_id = [] {
    auto st = status_of_first();
    INFO(st.text);
    REQUIRE(st.status == 0);
    return nlohmann::json::parse(st.text)["next_exchange"].get<long>();
  };
  const long start = next_id();
  const std::vector<std::string> run = {kTools + "/aapc", "run", "--size", "2000", "--iters", "3", "--warmup", "1"};
  require_all_ok(everywhere(run), "aapc run");
  const long plain = next_id();
  auto checked = run;
  checked.push_back("--check");
  auto procs = everywhere(checked);
  require_all_ok(procs, "aapc run --check");
  CHECK_THAT(procs[0].output(), Catch::Contains("every byte as sent"));
  // 4 exchanges, each followed by a barrier; with --check each also preceded by one.
  CHECK(next_id() - plain == plain - start + 4);
}

namespace {

// The original lengths of the frames of a pcap file (the daemons capture 64 bytes of each).
std::vector<std::uint32_t> frame_lengths(const fs::path& pcap) {
  std::ifstream in(pcap, std::ios::binary);
  std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::uint32_t> out;
  auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    std::memcpy(&v, bytes.data() + at, 4);
    return v;
  };
  for (std::size_t at = 24; at + 16 <= bytes.size(); at += 16 + u32(at + 8)) out.push_back(u32(at + 12));
  return out;
}

}  // namespace

// Links of three rates: a at 200 Mbit/s and b at 100 on s2, c and d at 50 on s0, the switches
// joined at 100 (and s1, holding no machine). The tree's phases sent each block at its sender's
// own rate, and a block from a queued at the switches' link and again at its receiver's: on
// random trees of such links the tree resent thousands of frames an exchange (6,561 at 100 KB
// blocks on six machines) and ran at 52-62% of the limit. Now each such block is paced at the
// slowest link of its path (sched::cap_round_rates).
TEST_CASE("a tree whose links differ in rate: the tree's phases resend nothing, each block paced at the slowest link of its path") {
  fs::create_directories(kLogs);
  const fs::path topo = kLogs / "mixed-rates.dot";
  std::ofstream(topo) << "graph \"mixed-rates\" {\n"
                      << "  a [mac=\"02:00:00:00:00:01\"]; b [mac=\"02:00:00:00:00:02\"]; c [mac=\"02:00:00:00:00:03\"]; d [mac=\"02:00:00:00:00:04\"];\n"
                      << "  s0 -- s1 [rate=\"100Mbit\"]; s0 -- s2 [rate=\"100Mbit\"];\n"
                      << "  s2 -- a [rate=\"200Mbit\"]; s2 -- b [rate=\"100Mbit\"]; s0 -- c [rate=\"50Mbit\"]; s0 -- d [rate=\"50Mbit\"];\n}\n";
  Cluster c(topo.string());
  for (const char* sync : {"sender-all", "receiver-all"}) {
    auto procs = everywhere(exchange(256 * 1024, "tree", sync, 3));
    require_all_ok(procs, std::string("tree + ") + sync + " on links of three rates");
    INFO(procs[0].output());
    CHECK_THAT(procs[0].output(), Catch::Contains("retransmissions 0\n"));  // a's own, the last exchange
  }
}

// `auto` weighs the tree's phases with what the daemons measured of them (docs/design.md, Fast
// links): each fits its own tree exchanges, and a session's join agrees on one fit for every
// rank, or ranks would choose different schedules for one collective.
TEST_CASE("the daemons measure their tree exchanges, agree on one fit at the next session's start, and keep it across a restart") {
  Cluster c("8-two-switch");
  for (const auto& st : all_machines_status()) {
    CHECK(st["phases_measured"].is_null());
    CHECK(st["phases_agreed"].is_null());
  }
  require_all_ok(everywhere(exchange(16 * 1024, "tree", "sender-all", 4)), "tree + sender-all");
  const std::vector<nlohmann::json> measured = all_machines_status();
  double fill = 1, hand_over_us = 0, reach = 1;
  for (const auto& st : measured) {
    INFO(st.dump());
    REQUIRE(st["phases_measured"].is_object());
    reach = std::min(reach, st["phases_measured"]["reach"]["tree+sender-all"]["16384"].get<double>());
    CHECK(st["phases_measured"]["exchanges"].get<int>() >= 4);
    fill = std::min(fill, st["phases_measured"]["fill"].get<double>());
    hand_over_us = std::max(hand_over_us, st["phases_measured"]["hand_over_us"].get<double>());
    CHECK(st["phases_agreed"].is_null());  // that session agreed before anything was measured
  }
  // The next session's join: the lowest fill and the longest hand-over, on every rank; and the
  // median over the exchanges of the slowest rank's view of each, at most any rank's median of
  // its own. (Its 2,000-byte blocks run the pairwise exchange, which adds nothing to the fit.)
  require_all_ok(everywhere(exchange(2000, "auto")), "the next session");
  const std::vector<nlohmann::json> agreed = all_machines_status();
  for (const auto& st : agreed) {
    INFO(st.dump());
    REQUIRE(st["phases_agreed"].is_object());
    CHECK(st["phases_agreed"]["fill"].get<double>() == Approx(fill).margin(1e-6));
    CHECK(st["phases_agreed"]["hand_over_us"].get<double>() == Approx(hand_over_us).margin(1e-3));
    const double reach_agreed = st["phases_agreed"]["reach"]["tree+sender-all"]["16384"].get<double>();
    CHECK(reach_agreed > 0);
    CHECK(reach_agreed <= reach + 1e-4);  // in ten-thousandths
    CHECK(st["phases_agreed"] == agreed[0]["phases_agreed"]);
  }
  const std::vector<nlohmann::json> stopping = all_machines_status();
  REQUIRE(sh(kEmu + " stop").status == 0);
  // A file that is not one (a disk that filled, a hand that edited it): that daemon measures anew.
  std::ofstream(socket_of(machines().back()) + ".measured") << "{\"machine\": ";
  c.start();
  const std::vector<nlohmann::json> restarted = all_machines_status();
  for (std::size_t m = 0; m < restarted.size(); ++m) {
    INFO(restarted[m].dump());
    if (m + 1 == restarted.size())
      CHECK(restarted[m]["phases_measured"].is_null());
    else
      CHECK(restarted[m]["phases_measured"] == stopping[m]["phases_measured"]);
    CHECK(restarted[m]["phases_agreed"].is_null());
  }
  require_all_ok(everywhere(exchange(2000, "auto")), "a session after the restart");
}

namespace {

// Writes each machine's measures as its daemon keeps them (daemon_measure.cpp): four exchanges
// of the tree's phases that each took 2 ms a phase beyond its blocks (the phases would reach 40%
// of the limit at 16 KiB), and `reach` ([schedule, smallest block, [[exchange, reach]...]]); the
// first machine `first_reach` where one is given.
void write_measures(const std::vector<nlohmann::json>& statuses, const nlohmann::json& reach, const nlohmann::json& first_reach = nullptr) {
  for (std::size_t m = 0; m < statuses.size(); ++m) {
    const auto& st = statuses[m];
    const nlohmann::json measured = {{"machine", st["machine"]},
                                     {"topology", st["topology"]},
                                     {"pace_bps", st["pace_bps"]},
                                     {"measures", {{0.001, 0.003}, {0.002, 0.004}, {0.001, 0.003}, {0.002, 0.004}}},
                                     {"reach", m == 0 && !first_reach.is_null() ? first_reach : reach}};
    std::ofstream(socket_of(st["machine"].get<std::string>()) + ".measured") << measured.dump();
  }
}

}  // namespace

// Below 32 KiB on a tree `auto` weighs what the cluster measured of each schedule (docs/design.md,
// Fast links): so each is measured now and then, on every rank alike. One that the session knew
// nothing of at that size runs once in 16, and each of the others in turn once in 64, so a
// measure taken while the hosts were busy does not keep a schedule off for good.
TEST_CASE("where auto chooses by measurement, every 16th alltoall measures a schedule not measured yet, and every 64th one of the others") {
  Cluster c("8-two-switch");
  const std::vector<nlohmann::json> before = all_machines_status();
  auto restart_with = [&](const nlohmann::json& reach, const nlohmann::json& first_reach = nullptr) {
    REQUIRE(sh(kEmu + " stop").status == 0);
    write_measures(before, reach, first_reach);
    c.start();
  };
  // `count` alltoalls of `block` bytes in one session: what rank 0 says of the last.
  auto last_of = [](std::uint64_t block, int count) {
    auto procs = everywhere(exchange(block, "auto", "auto", count));
    require_all_ok(procs, std::to_string(count) + " alltoalls of " + std::to_string(block) + " bytes");
    return procs[0].output();
  };
  restart_with(nlohmann::json::array());
  for (const auto& st : all_machines_status()) CHECK(st["phases_measured"]["hand_over_us"].get<double>() == Approx(2000));
  // The phases' measure leaves them below the paced shuffle; the synchronous shuffle and the
  // pairwise exchange are not measured: the 16th runs the first.
  CHECK_THAT(last_of(16 * 1024, 15), Catch::Contains("ok paced-shuffle"));
  CHECK_THAT(last_of(16 * 1024, 16), Catch::Contains("ok sync-shuffle none"));
  for (const auto& st : all_machines_status()) {
    INFO(st.dump());
    CHECK(st["phases_measured"]["reach"]["sync-shuffle+none"]["16384"].get<double>() > 0);
    CHECK(st["phases_measured"]["reach"]["paced-shuffle+none"]["16384"].get<double>() > 0);
    CHECK(st["phases_measured"]["exchanges"].get<int>() == 4);  // no tree exchange ran
  }
  // Now only the pairwise exchange is not measured at 16 KiB.
  CHECK_THAT(last_of(16 * 1024, 16), Catch::Contains("ok pairwise-ec none"));

  // Every one measured, the paced shuffle ahead: 63 run it, and the 64th the first of the others.
  // Each [exchange, reach], of an exchange of an earlier session (ids of the past, not this one's).
  auto one = [](double reach) { return nlohmann::json::array({nlohmann::json::array({9'000'000, reach})}); };
  const nlohmann::json measured = {{"tree+sender-all", 16384, one(0.3)}, {"paced-shuffle+none", 16384, one(0.8)}, {"sync-shuffle+none", 16384, one(0.5)}, {"pairwise-ec+none", 16384, one(0.5)}};
  restart_with(measured);
  CHECK_THAT(last_of(16 * 1024, 63), Catch::Contains("ok paced-shuffle"));
  for (const auto& st : all_machines_status()) {
    INFO(st.dump());
    CHECK(st["phases_agreed"]["hand_over_us"].get<double>() == Approx(2000));
    CHECK(st["phases_agreed"]["reach"]["paced-shuffle+none"]["16384"].get<double>() == Approx(0.8));
  }
  CHECK_THAT(last_of(16 * 1024, 64), Catch::Contains("ok tree sender-all"));
  for (const auto& st : all_machines_status()) CHECK(st["phases_measured"]["exchanges"].get<int>() == 5);  // the four, and the 64th

  // The synchronous shuffle measured well ahead on every machine but one: the join agrees on
  // that one's, and the paced shuffle runs; measured ahead on all, it runs.
  nlohmann::json ahead = measured, behind = measured;
  ahead[2][2] = one(0.95);
  behind[2][2] = one(0.6);
  restart_with(ahead, behind);
  CHECK_THAT(last_of(16 * 1024, 2), Catch::Contains("ok paced-shuffle"));
  restart_with(ahead);
  CHECK_THAT(last_of(16 * 1024, 2), Catch::Contains("ok sync-shuffle none"));
  // At 64 KiB the measures of 16 KiB do not count: the phases' fit (2 ms a hand-over leaves them
  // at 72%, behind the paced shuffle) decides.
  CHECK_THAT(last_of(64 * 1024, 2), Catch::Contains("ok paced-shuffle"));
  // From 32 KiB the unscheduled ones are weighed where the hosts hold the scheduled ones back:
  // the phases measured at 50% at 64 KiB and the paced shuffle at 60%, the 16th alltoall
  // measures the first not measured there; the synchronous shuffle measured 5% ahead of both,
  // it runs.
  nlohmann::json held_back = measured;
  held_back.push_back({"tree+sender-all", 65536, one(0.5)});
  held_back.push_back({"paced-shuffle+none", 65536, one(0.6)});
  restart_with(held_back);
  CHECK_THAT(last_of(64 * 1024, 16), Catch::Contains("ok sync-shuffle none"));
  held_back.push_back({"sync-shuffle+none", 65536, one(0.9)});
  restart_with(held_back);
  CHECK_THAT(last_of(64 * 1024, 2), Catch::Contains("ok sync-shuffle none"));

  // The synchronous shuffle's last 32 exchanges: nine lost a frame and took over three times as
  // long, none of the newest six. The session agrees on what the 32 reached together (60% of the
  // limit, below the paced shuffle), and the paced shuffle runs. (Six kept read 100%: at 200
  // Mbit/s the pairwise exchange ran so at 88.6% of the phases' throughput.)
  nlohmann::json lossy = measured;
  lossy[2][2] = nlohmann::json::array();
  for (int e = 0; e < 32; ++e) lossy[2][2].push_back({9'000'000 + e, e < 26 && e % 3 == 0 ? 0.3 : 1.0});
  restart_with(lossy);
  CHECK_THAT(last_of(16 * 1024, 2), Catch::Contains("ok paced-shuffle"));
  for (const auto& st : all_machines_status()) {
    INFO(st.dump());
    CHECK(st["phases_agreed"]["reach"]["sync-shuffle+none"]["16384"].get<double>() == Approx(32 / (23 + 9 / 0.3)).epsilon(1e-3));
  }
}

TEST_CASE("jumbo frames: 256 KiB exchanges byte-exact at MTU 9000, 9014-byte frames on the wire") {
  Cluster c("8-two-switch-jumbo");  // landed main: aapcd failed to start ("configuring failed")
  for (const char* schedule : {"auto", "tree", "pairwise"})
    require_all_ok(everywhere(exchange(256 * 1024, schedule, "auto", 2)), std::string("mtu 9000, ") + schedule);
  const fs::path dir = kLogs / "capture-jumbo";
  REQUIRE(sh(kEmu + " stop").status == 0);
  c.start("", "", dir.string());
  require_all_ok(everywhere(exchange(64 * 1024, "tree", "auto", 1)), "mtu 9000, captured");
  REQUIRE(sh(kEmu + " stop").status == 0);  // the captures are complete
  const auto lengths = frame_lengths(dir / "n0.pcap");
  REQUIRE(!lengths.empty());
  CHECK(*std::max_element(lengths.begin(), lengths.end()) == 9014);
  CHECK(std::count(lengths.begin(), lengths.end(), 9014U) >= 2 * 7 * 7);  // 64 KiB: 7 full frames, each way, 7 peers
  // The daemons write what they receive around the caches (non-temporal stores) into
  // the clients' shared memory, and each client, once told its exchange is done, checks every
  // byte.
  c.start("--stream-bytes 0");
  require_all_ok(everywhere(exchange(256 * 1024, "auto", "auto", 2)), "mtu 9000, streamed around the caches");
}

TEST_CASE("two machines on one cable, at MTU 9000: byte-exact") {
  // Landed main left the far end of the cable without its MAC, MTU and link: its daemon did
  // not come up.
  Cluster c(two_on_a_cable().string());
  require_all_ok(everywhere(exchange(256 * 1024, "auto", "auto", 2)), "two on a cable");
  const std::string link = sh("ip netns exec " + aapc::tools::emu_netns("b") + " ip link show aapc0").text;
  INFO(link);
  CHECK(link.find("mtu 9000") != std::string::npos);
  CHECK(link.find("02:00:00:00:00:02") != std::string::npos);
  // What a sends is shaped where it arrives, in b: AF_XDP's transmit skips a's own qdisc.
  const std::string shaping = sh("ip netns exec " + aapc::tools::emu_netns("b") + " tc qdisc show").text;
  INFO(shaping);
  CHECK(shaping.find("qdisc tbf") != std::string::npos);
  CHECK(shaping.find("qdisc ingress") != std::string::npos);
  // AF_XDP takes frames of at most a page: at MTU 9000 the daemons fall back to af_packet,
  // and say why.
  const nlohmann::json first = nlohmann::json::parse(status_of_first().text);
  CHECK(first["port_driver"] == "net_af_packet");
  CHECK(sh("grep -c 'AF_XDP could not open it' " + aapc::tools::kEmuStateDir.string() + "/a/aapcd.log").text != "0\n");
  // The daemons' engine threads may run on every CPU this test may: the EAL pinned each to
  // the first (CPU 0), where every daemon of the box then took turns.
  const std::string ours = cpus_allowed("/proc/self/status");
  const nlohmann::json st = state();
  REQUIRE(st["daemons"].size() == 2);
  for (const auto& d : st["daemons"]) {
    const std::string pid = std::to_string(d["pid"].get<int>());
    INFO("aapcd " << pid << " on " << d["machine"].get<std::string>() << ": this test may run on CPUs " << ours);
    CHECK(cpus_allowed("/proc/" + pid + "/task/" + pid + "/status") == ours);
  }
}

TEST_CASE("aapcd --io-cores: a CPU outside the daemon's taskset is refused, saying so; one inside it is taken") {
  const auto cpus = cpus_of(cpus_allowed("/proc/self/status"));
  if (cpus.size() < 2) {
    WARN("needs two CPUs in this process's set; skipped");
    return;
  }
  const std::string topo = two_on_a_cable().string(), other = std::to_string(cpus[1]);
  auto daemon = [&](const std::string& taskset, const std::string& io) {
    return sh(taskset + " timeout 5 " + kTools + "/aapcd -t " + topo + " --vdev net_null0 --rank 0 --socket " + (kLogs / "io-cores.sock").string() +
              " --io-cores " + io + " --eal-memory-mb 256 2>&1");
  };
  const Sh refused = daemon("taskset -c " + std::to_string(cpus[0]), other);
  INFO(refused.text);
  CHECK(refused.status != 0);
  CHECK(refused.text.find("CPU " + other + " is outside this process's CPU set") != std::string::npos);
  // Without a taskset, the same CPU serves until timeout ends the daemon (status 124). The
  // EAL had pinned the thread that checks to the first CPU, and refused it.
  const Sh taken = daemon("", other);
  INFO(taken.text);
  CHECK(taken.status == 124);
  CHECK(taken.text.find("outside") == std::string::npos);
}

TEST_CASE("aapcd --io-cores with two sending CPUs: a transmit queue each, byte-exact; where AF_XDP offers one queue, af_packet carries them, saying why") {
  const auto cpus = cpus_of(cpus_allowed("/proc/self/status"));
  if (cpus.size() < 2) {
    WARN("needs two CPUs in this process's set; skipped");
    return;
  }
  const std::string rx = std::to_string(cpus[0]), tx = std::to_string(cpus[1]);
  Cluster c(two_on_a_cable(1500).string(), "--io-cores " + rx + "," + tx + "," + tx);
  require_all_ok(everywhere(exchange(256 * 1024, "auto", "auto", 3)), "two sending lcores");
  require_all_ok(everywhere(exchange(3000, "sync-shuffle", "none", 2)), "two sending lcores, small blocks");
  const nlohmann::json first = nlohmann::json::parse(status_of_first().text);
  INFO(first.dump());
  CHECK(first["port_queues"]["transmit"] == 2);
  CHECK(first["io_cores"].size() == 3);
  // A veth has no combined channels: AF_XDP binds one queue there.
  CHECK(first["port_driver"] == "net_af_packet");
  CHECK(sh("grep -c 'offers AF_XDP 1 queue' " + aapc::tools::kEmuStateDir.string() + "/a/aapcd.log").text != "0\n");
  // --faults sees every frame in one stream: it cannot go with two sending lcores.
  const Sh refused = sh("timeout 5 " + kTools + "/aapcd -t " + two_on_a_cable().string() + " --vdev net_null0 --rank 0 --socket " +
                        (kLogs / "io-queues.sock").string() + " --io-cores " + rx + "," + tx + "," + tx + " --faults drop=0.1 --eal-memory-mb 256 2>&1");
  INFO(refused.text);
  CHECK(refused.status != 0);
  CHECK(refused.status != 124);
  CHECK(refused.text.find("give one or two CPUs with them") != std::string::npos);
}

TEST_CASE("aapcd --io-cores with receive and send apart, on AF_XDP: eight machines exchange byte-exact, and aapc run --check ends") {
  const auto cpus = cpus_of(cpus_allowed("/proc/self/status"));
  if (cpus.size() < 2) {
    WARN("needs two CPUs in this process's set; skipped");
    return;
  }
  // With a receive and a send lcore, frames cycle through the port's whole pool. Past its
  // first ~58% the pool lay outside the AF_XDP socket's UMEM (a page per mbuf without
  // hugepages): every node stopped receiving after 4,479 frames, and the exchange hung to
  // its deadline. And idle lcores spun: eight daemons with two each left no CPU idle, so
  // aapc run's check (at idle priority) did not run for 20 s and more.
  Cluster c("8-two-switch", "--io-cores " + std::to_string(cpus[0]) + "," + std::to_string(cpus[1]));
  REQUIRE(nlohmann::json::parse(status_of_first().text)["port_driver"] == "net_af_xdp");
  require_all_ok(everywhere(exchange(256 * 1024, "paced-shuffle", "auto", 4)), "receive and send lcores apart");
  require_all_ok(everywhere({kTools + "/aapc", "run", "--size", "256K", "--schedule", "paced-shuffle", "--iters", "3", "--check"}),
                 "aapc run --check, receive and send lcores apart");
}

TEST_CASE("aapc-engine-bench --port-rate: every port kind's frames arrive, af_packet also from two sending threads; AF_XDP on a veth says why it cannot take two") {
  // The AF_XDP receiver got none of the benchmark's frames (EtherType 0x88B6, which the XDP
  // program passes to the kernel) and the table said 100% lost.
  sh(kEmu + " down");  // no cluster beside it; it makes namespaces of its own
  const std::string scratch = "ls -d /tmp/aapc-port-rate-* 2>/dev/null | wc -l";
  const std::string scratch_before = sh(scratch).text;
  const Sh r = sh(kTools + "/aapc-engine-bench --port-rate --port-rate-queues 1 2 --repeat 1 --port-rate-seconds 0.5 2>&1");
  INFO(r.text);
  REQUIRE(r.status == 0);
  // port, then send Gbit/s, send Mframes/s, receive Gbit/s, each a median (min-max).
  const std::regex row(R"((af_\w+(?: x\d+)?) +([\d.]+) \([^)]*\) +([\d.]+) \([^)]*\) +([\d.]+) \([^)]*\) +([\d.]+) \([^)]*\) +([\d.]+))");
  std::map<std::string, std::pair<double, double>> sent_received;
  std::istringstream lines(r.text);
  for (std::string line; std::getline(lines, line);)
    if (std::smatch m; std::regex_search(line, m, row)) sent_received[m[1]] = {std::stod(m[2]), std::stod(m[4])};
  for (const char* kind : {"af_packet", "af_xdp", "af_packet x2"}) {
    INFO(kind);
    REQUIRE(sent_received.count(kind) == 1);
    CHECK(sent_received[kind].first > 0.1);
    CHECK(sent_received[kind].second > 0.5 * sent_received[kind].first);
  }
  CHECK(r.text.find("af_xdp x2: could not run") != std::string::npos);
  CHECK(r.text.find("offers AF_XDP 1 queue(s)") != std::string::npos);
  CHECK(sh("ip netns list").text.find("aapc-rate") == std::string::npos);  // its namespaces are gone
  // Its scratch directory too, also after the kind that could not run (it stayed behind).
  CHECK(sh(scratch).text == scratch_before);
}

TEST_CASE("aapc-emu run: a command past its timeout is killed and said so once") {
  // The line came every 10 ms until the killed processes were reaped: 1,316 times in one run.
  // A gigabyte written takes a while to give back when its process dies.
  const Sh r = sh(kEmu + " run " + two_on_a_cable().string() +
                  " --timeout 4 -- python3 -c \"import time; x = b'x' * (1 << 30); time.sleep(60)\" 2>&1");
  INFO(r.text);
  CHECK(r.status != 0);
  std::size_t said = 0;
  for (std::size_t at = r.text.find("did not finish within 4 s"); at != std::string::npos; at = r.text.find("did not finish within 4 s", at + 1)) ++said;
  CHECK(said == 1);
  CHECK(nothing_left());
}

TEST_CASE("aapcd --eal=-lN, N not a CPU it may use: the error names those it may") {
  const auto cpus = cpus_of(cpus_allowed("/proc/self/status"));
  const int outside = 4000;  // no such CPU (DPDK takes lcores below 128 too, where they exist)
  const Sh r = sh("taskset -c " + std::to_string(cpus[0]) + " timeout 5 " + kTools + "/aapcd -t " + two_on_a_cable().string() +
                  " --vdev net_null0 --rank 0 --socket " + (kLogs / "eal-l.sock").string() + " --eal-memory-mb 256 --eal=-l" + std::to_string(outside) +
                  " 2>&1");
  INFO(r.text);
  CHECK(r.status != 0);
  CHECK(r.status != 124);
  // Was only DPDK's "invalid core list" and the hint about hugepages.
  CHECK(r.text.find("must be among the CPUs this process may use: " + std::to_string(cpus[0]) + " ") != std::string::npos);
}

TEST_CASE("aapcd --barrier-radix: 1 is refused before anything starts, saying what it takes") {
  const Sh r = sh(kTools + "/aapcd -t " + two_on_a_cable().string() + " --vdev net_null0 --barrier-radix 1 2>&1");
  INFO(r.text);
  CHECK(r.status != 0);
  CHECK(r.text.find("--barrier-radix") != std::string::npos);
  CHECK(r.text.find("0, or 2 to 4096") != std::string::npos);
}

TEST_CASE("aapcd --iface with no such interface: the error names it and how to list them, whichever driver") {
  for (const char* driver : {"auto", "af_xdp", "af_packet"}) {
    INFO("--iface-driver " << driver);
    const Sh r = sh("timeout 20 " + kTools + "/aapcd -t " + two_on_a_cable().string() + " --iface aapcnosuch0 --iface-driver " + driver + " --rank 0 --socket " +
                    (kLogs / "nosuch.sock").string() + " --eal-memory-mb 256 2>&1");
    INFO(r.text);
    CHECK(r.status != 0);
    CHECK(r.status != 124);
    // Was af_packet's probe failure alone (auto), or AF_XDP's.
    CHECK(r.text.find("no interface 'aapcnosuch0' here (`ip link` lists") != std::string::npos);
  }
}

TEST_CASE("1% loss injected in every daemon: still byte-exact") {
  Cluster c("8-two-switch", "", "drop=0.01,seed=3");
  auto procs = everywhere(exchange(64 * 1024, "tree", "auto", 2));
  require_all_ok(procs, "tree at 1% loss");
  auto out = procs[0].output();
  INFO(out);
  CHECK(out.find("retransmissions 0") == std::string::npos);  // the loss was there and recovered
  require_all_ok(everywhere(exchange(20'000, "sync-shuffle", "auto", 2)), "sync-shuffle at 1% loss");
  // The agreement on an alltoallv's pattern (gather, broadcast) recovers like any exchange.
  auto sparse = everywhere({kTools + "/aapc", "run", "--sparse", "3", "--size", "20000", "--iters", "3", "--warmup", "0", "--check"});
  require_all_ok(sparse, "sparse alltoallv at 1% loss");
  CHECK_THAT(sparse[0].output(), Catch::Contains("cgm-links: "));
}

// Up to 30% loss per port direction, byte-exact. Before the recovery was shortened (a burst of
// resent frames ends with a frame the receiver answers at once; polls back off to 100 ms, not
// 500), this failed 6 runs of 16 with tree: a frame lost again after each NACK stalled its
// exchange for 15 s.
TEST_CASE("30% loss per port direction: tree and sync-shuffle stay byte-exact") {
  Cluster c("8-two-switch", "", "drop=0.3,seed=5");
  for (const std::string schedule : {"tree", "sync-shuffle"}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto procs = everywhere(exchange(64 * 1024, schedule, "auto", 2), 120s);
    INFO(schedule << " took " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
    require_all_ok(procs, schedule + " at 30% loss");
  }
}

TEST_CASE("a rank whose program never calls the collective: the others fail within seconds, naming it") {
  Cluster c("8-two-switch", "--peer-deadline-ms 1000");
  std::vector<Proc> procs;
  const auto names = machines();
  for (std::size_t i = 0; i + 1 < names.size(); ++i) procs.push_back(spawn_in(names[i], exchange(4096, "tree")));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string absent = "rank " + std::to_string(names.size() - 1);
  for (auto& p : procs) {
    INFO(p.machine);
    REQUIRE(wait_for(p, 60s));
    const std::string out = p.output();
    INFO(out);
    CHECK(p.status != 0);
    CHECK(out.find(absent) != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
}

TEST_CASE("aapc-emu's daemons authenticate frames with a key of the cluster's own unless told --no-key") {
  auto authentication = [] {
    auto st = status_of_first();
    INFO(st.text);
    REQUIRE(st.status == 0);
    return nlohmann::json::parse(st.text.substr(st.text.find('{')))["authentication"];
  };
  {
    Cluster c("8-two-switch");
    CHECK(authentication().is_string());
    const fs::path key = aapc::tools::kEmuStateDir / "cluster.key";
    REQUIRE(fs::exists(key));
    CHECK(fs::file_size(key) == 32);
    CHECK((fs::status(key).permissions() & (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none);
    require_all_ok(everywhere(exchange(3000, "tree")), "tree with aapc-emu's key");
    REQUIRE(sh(kEmu + " stop").status == 0);
    c.start("", "", "", true);
    CHECK(authentication().is_null());
  }
  CHECK(nothing_left());  // the key went with the cluster
}

TEST_CASE("a cluster key: exchanges byte-exact with tagged frames; a key others can read is refused") {
  fs::create_directories(kLogs);
  const fs::path key = kLogs / "cluster.key";
  std::ofstream(key) << std::string(32, 'k');
  fs::permissions(key, fs::perms::owner_read | fs::perms::owner_write);
  {
    Cluster c("8-two-switch", "--cluster-key " + key.string());
    require_all_ok(everywhere(exchange(64 * 1024, "tree")), "tree with a cluster key");
  }
  fs::permissions(key, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  sh(kEmu + " down");
  REQUIRE(sh(kEmu + " up 8-two-switch").status == 0);
  auto refused = sh(kEmu + " start --daemon-args '--cluster-key " + key.string() + "'");
  sh(kEmu + " down");
  INFO(refused.text);
  CHECK(refused.status != 0);
  CHECK(refused.text.find("chmod 600") != std::string::npos);
}

TEST_CASE("a client killed mid-exchange: the others get an error naming it, the daemons keep serving") {
  Cluster c("8-two-switch", "--peer-deadline-ms 2000");
  std::vector<Proc> procs;
  for (const auto& m : machines()) procs.push_back(spawn_in(m, exchange(4'000'000, "tree", "auto", 100)));
  REQUIRE(wait_running("n3"));
  ::kill(procs[3].pid, SIGKILL);  // ip netns exec execs the client: this is the client
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < procs.size(); ++i) {
    if (i == 3) continue;
    INFO(procs[i].machine);
    REQUIRE(wait_for(procs[i], 15s));
    std::string out = procs[i].output();
    INFO(out);
    CHECK(procs[i].status != 0);
    CHECK(out.find("rank 3") != std::string::npos);
  }
  wait_for(procs[3], 5s);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  // The daemons still serve, and agree on what comes next. (Exchanges started within a peer
  // deadline of the abort belong to the aborted session and fail at once.)
  std::this_thread::sleep_for(200ms);
  require_all_ok(everywhere(exchange(5000, "tree")), "after the killed client");
}

TEST_CASE("a daemon killed mid-exchange: errors within seconds; its restart is reported to old clients") {
  Cluster c("8-two-switch", "--peer-deadline-ms 2000");
  Proc hold = spawn_in("n5", {kClient, "hold"});
  for (int i = 0; i < 200 && hold.output().find("ready") == std::string::npos; ++i) std::this_thread::sleep_for(20ms);
  REQUIRE(hold.output().find("ready") != std::string::npos);
  std::vector<Proc> procs;
  for (const auto& m : machines()) procs.push_back(spawn_in(m, exchange(4'000'000, "tree", "auto", 100)));
  REQUIRE(wait_running("n5"));
  const pid_t victim = daemon_pid("n5");
  REQUIRE(victim > 0);
  ::kill(victim, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& p : procs) {
    INFO(p.machine);
    REQUIRE(wait_for(p, 20s));
    std::string out = p.output();
    INFO(out);
    CHECK(p.status != 0);
    if (p.machine != "n5") CHECK(out.find("rank 5") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  // Restarted: a client of the old daemon is told so; everyone can exchange again.
  c.start("--peer-deadline-ms 2000");
  // The killed daemon left its XDP program on the interface; the new one replaced it and runs
  // on AF_XDP again rather than falling back to af_packet.
  CHECK(nlohmann::json::parse(sh("AAPC_SOCKET=" + socket_of("n5") + " " + kTools + "/aapc status").text)["port_driver"] == "net_af_xdp");
  ::kill(hold.pid, SIGUSR1);
  REQUIRE(wait_for(hold, 10s));
  INFO(hold.output());
  CHECK(hold.status == 0);
  CHECK(hold.output().find("restarted") != std::string::npos);
  std::this_thread::sleep_for(300ms);  // the peers have heard of the new epoch
  require_all_ok(everywhere(exchange(5000, "tree")), "after the restart");
}

// What a rank whose peer's daemon (or only its client) died sees: the time from the kill to
// its first error (for a daemon, the peer deadline, 1.5 s, counted from when some rank first
// waits on the dead one, then that rank's ABORT) and of each later call (at once: the dead peer
// is remembered; a departed client's daemon refuses its later ids).
struct KillFigures {
  long worst_first = 0, worst_later = 0;
};
KillFigures kill_mid_exchange(const std::string& block, bool the_daemon = true) {
  Cluster c("8-two-switch");
  std::vector<Proc> procs;
  for (const auto& m : machines())
    if (m != "n5") procs.push_back(spawn_in(m, {kClient, "calls", block, "60"}));
  Proc victim_client = spawn_in("n5", {kClient, "calls", block, "60"});
  REQUIRE(wait_running("n5"));
  const pid_t victim = daemon_pid("n5");
  REQUIRE(victim > 0);
  const auto killed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (the_daemon) ::kill(victim, SIGKILL);
  ::kill(victim_client.pid, SIGKILL);
  KillFigures k;
  std::string firsts;
  for (auto& p : procs) {
    REQUIRE(wait_for(p, 120s));
    const std::string out = p.output();
    INFO(p.machine << ":\n" << out);
    std::istringstream lines(out);
    bool failed = false;
    int later = 0;
    for (std::string line; std::getline(lines, line);) {
      std::istringstream f(line);
      std::string call, i, what;
      long end = 0, took = 0;
      if (!(f >> call >> i >> what >> end >> took) || what != "error" || end < killed) continue;
      if (!failed) {
        failed = true;
        k.worst_first = std::max(k.worst_first, end - killed);
        firsts += " " + p.machine + " " + std::to_string(end - killed) + " ms: " + line.substr(0, 160) + "\n";
      } else {
        ++later;
        k.worst_later = std::max(k.worst_later, took);
      }
    }
    CHECK(failed);
    CHECK(later > 10);
  }
  WARN(block << "-byte blocks: kill -9 of " << (the_daemon ? "a daemon" : "a client") << " to every rank's error " << k.worst_first << " ms at most; each later call " << k.worst_later
             << " ms at most\n" << firsts);
  return k;
}

TEST_CASE("a daemon killed with SIGKILL: every other rank's call fails within seconds, and each later call at once (default deadlines)") {
  for (const char* block : {"65536", "1000000"}) {
    const KillFigures k = kill_mid_exchange(block);
    // The peer deadline (1.5 s) after the kill: a peer is waited on from the moment its block
    // stops arriving mid-stream, not only once a node's own sends are done (2.8 s at 1 MB).
    CHECK(k.worst_first < 2500);
    CHECK(k.worst_later < 100);
  }
}

// A client gone mid-exchange: its peers' later calls used to wait the whole derived deadline
// each (17.8 s at 256 KiB), because its daemon still acknowledged READYs for later ids.
TEST_CASE("a client killed with SIGKILL: every other rank's call fails within seconds, and each later call at once (default deadlines)") {
  const KillFigures k = kill_mid_exchange("262144", false);
  CHECK(k.worst_first < 4000);
  CHECK(k.worst_later < 100);
}

TEST_CASE("another user who takes one machine's rank first: root's job fails on every rank naming that uid, and no block is swapped") {
  Cluster c("8-two-switch", "--allow-uid 65534");
  // The other user's collective on n3, a second before root's job.
  Proc intruder = spawn_in("n3", {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", kClient, "exchange", "4096", "auto", "auto", "1"});
  std::this_thread::sleep_for(1s);
  std::vector<Proc> procs;
  for (const auto& m : machines()) procs.push_back(spawn_in(m, exchange(4096, "auto", "auto", 1)));
  // Every rank fails, never "ok" with another user's bytes. Those that met the intruder's JOIN
  // name its uid; the failure ends their clients, and a rank that joins later learns that
  // their clients went away (or, when it joined after they left, that they did not call).
  int named = 0;
  for (auto& p : procs) {
    REQUIRE(wait_for(p, 60s));
    const std::string out = p.output();
    INFO(p.machine << ": " << out);
    CHECK(p.status != 0);
    CHECK(out.find("ok ") == std::string::npos);
    named += out.find("uid 65534") != std::string::npos ? 1 : 0;
  }
  CHECK(named >= 1);
  REQUIRE(wait_for(intruder, 60s));
  INFO(intruder.output());
  CHECK(intruder.status != 0);
  CHECK(intruder.output().find("uid 0") != std::string::npos);
  // Once the intruder is gone, root's job runs.
  require_all_ok(everywhere(exchange(4096, "auto", "auto", 2)), "root's job after the other user left");
}

TEST_CASE("another user who opens a group's slot at a machine whose member left never takes its place: the group's later calls all fail") {
  Cluster c("8-two-switch", "--allow-uid 65534");
  const fs::path dir = kLogs / "group-left";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::all);  // the other user writes its file there
  std::vector<Proc> procs;
  for (const auto& m : machines()) procs.push_back(spawn_in(m, {kClient, "group-left", dir.string()}));
  Proc intruder = spawn_in("n3", {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", kClient, "intruder", dir.string()});
  int refused = 0;
  for (auto& p : procs) {
    REQUIRE(wait_for(p, 90s));
    INFO(p.machine << ": " << p.output());
    CHECK(p.status == 0);
    refused += p.output().find("call 3 failed as it should") != std::string::npos ? 1 : 0;
  }
  CHECK(refused == static_cast<int>(procs.size()) - 1);
  REQUIRE(wait_for(intruder, 60s));
  INFO("the other user: " << intruder.output());
  CHECK(intruder.status == 0);
  CHECK(intruder.output().find(" ok") == std::string::npos);
}

TEST_CASE("two MPICH (Hydra) jobs of one user: the one that holds a machine's rank first keeps the other out, and no block is swapped") {
  const std::string hydra = "/usr/bin/mpiexec.mpich";
  INFO("tools/setup installs MPICH");
  REQUIRE(::access(hydra.c_str(), X_OK) == 0);
  Cluster c("8-two-switch");
  // The first job: one rank on n3, started by Hydra's mpiexec there. Hydra sets no variable that
  // names its job; each rank's client finds its hydra_pmi_proxy instead (client.cpp, hydra_job).
  Proc first = spawn_in("n3", {hydra, "-n", "1", kClient, "exchange", "4096", "auto", "auto", "1"});
  std::this_thread::sleep_for(1s);
  // The second, a second later: every machine, through Hydra as aapc-emu mpirun starts it. Both
  // jobs send the same bytes, so only the jobs' identities keep them from one exchange.
  const Sh second = sh(kEmu + " mpirun --keep --mpi mpich --no-preload 8-two-switch -- " + kClient + " exchange 4096 auto auto 1");
  INFO("the second job: " << second.text);
  CHECK(second.status != 0);
  CHECK(second.text.find("ok ") == std::string::npos);
  CHECK(second.text.find("another job of uid 0") != std::string::npos);
  REQUIRE(wait_for(first, 60s));
  INFO("the first job: " << first.output());
  CHECK(first.status != 0);
  CHECK(first.output().find("ok ") == std::string::npos);
  // Once both are gone, a job runs.
  require_all_ok(everywhere(exchange(4096, "auto", "auto", 2)), "a job after both");
}

TEST_CASE("two jobs in groups on the two halves: their exchange ids differ; a mismatch or a departed client fails its own half only, the other's calls pass byte-exact") {
  Cluster cluster("8-two-switch");
  for (const char* how : {"mismatch", "exit"}) {
    INFO(how);
    const fs::path dir = kLogs / (std::string("halves-") + how);
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<Proc> procs;
    for (const auto& m : machines()) procs.push_back(spawn_in(m, {kClient, "halves", dir.string(), how}));
    int upper_ok = 0, lower_failed = 0;
    std::set<std::string> ids[2];  // each half's first exchange id, as its ranks saw it
    for (std::size_t i = 0; i < procs.size(); ++i) {
      Proc& p = procs[i];
      if (!wait_for(p, 90s)) p.status = -2;
      INFO(p.machine << ": " << p.output());
      const std::string out = p.output();
      if (const auto at = out.find("first exchange id "); at != std::string::npos)
        ids[i < procs.size() / 2 ? 0 : 1].insert(out.substr(at + 18, out.find('\n', at) - at - 18));
      if (i >= procs.size() / 2) {
        CHECK(p.status == 0);
        upper_ok += p.output().find("ok upper half rank") != std::string::npos ? 1 : 0;
      } else if (i != 1) {
        CHECK(p.status == 0);
        lower_failed += p.output().find("failed as it should") != std::string::npos ? 1 : 0;
      }
    }
    CHECK(upper_ok == static_cast<int>(procs.size() / 2));
    CHECK(lower_failed == static_cast<int>(procs.size() / 2 - 1));
    // Each half agreed on its id, and the halves' ids differ (protocol.hpp, group_slot).
    CHECK(ids[0].size() == 1);
    CHECK(ids[1].size() == 1);
    CHECK(ids[0] != ids[1]);
  }
}

TEST_CASE("a first collective refused for want of a free slot fails every rank at once, and the next two jobs run") {
  Cluster cluster("8-two-switch", "--max-exchanges 1");
  const fs::path dir = kLogs / "occupy";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto all = machines();
  std::vector<Proc> holders;
  for (std::size_t i = 0; i < 2; ++i) holders.push_back(spawn_in(all[i], {kClient, "occupy", dir.string()}));
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (holders[0].output().find("holds its group") == std::string::npos && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  INFO(holders[0].output());
  REQUIRE(holders[0].output().find("holds its group") != std::string::npos);
  // Rank 0's daemon has no slot for the job's first collective: it is refused there, and every
  // other rank, in the collective by then, is told at once instead of waiting out its deadline.
  // (A rank that calls after rank 0's client has gone waits for the join's deadline: a new
  // client may still come to rank 0.)
  std::vector<Proc> others;
  for (std::size_t i = 1; i < all.size(); ++i) others.push_back(spawn_in(all[i], {kClient, "calls", "4096", "1"}));
  std::this_thread::sleep_for(1s);
  Proc first = spawn_in(all[0], {kClient, "calls", "4096", "1"});
  auto refused = [](Proc& p, const char* why) {
    REQUIRE(wait_for(p, 60s));
    const std::string out = p.output();
    INFO(p.machine << ": " << out);
    REQUIRE(p.status == 0);
    REQUIRE(out.rfind("call 0 error ", 0) == 0);
    CHECK(std::stol(out.substr(out.find(' ', 13) + 1)) < 2000);  // TOOK_MS
    CHECK_THAT(out, Catch::Contains(why));
  };
  refused(first, "--max-exchanges");
  for (auto& p : others) refused(p, "rank 0 could not start it");
  std::ofstream(dir / "release").put('\n');
  for (auto& h : holders) CHECK(wait_for(h, 20s));
  // Nothing half-joined is left: the next two jobs run on every rank.
  for (int job = 0; job < 2; ++job) require_all_ok(everywhere(exchange(4096, "auto")), "job " + std::to_string(job + 1) + " after the refusal");
}

TEST_CASE("another user meets every quota of the daemons' defaults, each refusal naming its option; root's job runs after") {
  Cluster cluster("8-one-switch", "--allow-uid 65534");
  const auto probes = everywhere({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", kClient, "quotas"}, 300s);
  require_all_ok(probes, "uid 65534's probes");
  for (const auto& p : probes) {
    INFO(p.machine << ": " << p.output());
    CHECK_THAT(p.output(), Catch::Contains("--max-timeout-ms"));
    CHECK_THAT(p.output(), Catch::Contains("collective 65 at once refused"));  // --max-exchanges-per-client 64
    CHECK_THAT(p.output(), Catch::Contains("buffer 4097 refused"));            // --max-buffers-per-uid 4096
  }
  for (const auto& m : all_machines_status()) CHECK(m["plans"].get<int>() <= 64);  // --max-plans: 80 schedules ran
  require_all_ok(everywhere(exchange(65536, "auto")), "root's job after");
}

// --allow-uid alone: that user's job runs on every machine, with the socket aapcd made.
TEST_CASE("aapcd --allow-uid alone lets that user's job run on every machine") {
  Cluster cluster("8-one-switch", "--allow-uid 65534");
  require_all_ok(everywhere({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", kClient, "exchange", "4096", "auto", "auto", "2"}), "uid 65534's job");
}

TEST_CASE("groups: two clients per machine, each in groups of its own (halves of the tree, all in reverse), byte-exact at once") {
  Cluster cluster("8-two-switch");
  const fs::path dir = kLogs / "reduce";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<Proc> procs;
  for (const auto& m : machines())
    for (const char* kind : {"halves", "reversed"}) procs.push_back(spawn_in(m, {kClient, "group", dir.string(), kind}));
  for (auto& p : procs) {
    if (!wait_for(p, 90s)) p.status = -2;
    INFO(p.machine << ": " << p.output());
    CHECK(p.status == 0);
  }
  auto status = status_of_first();
  INFO(status.text);
  CHECK(status.text.find("\"groups\": []") != std::string::npos);  // closed when their clients went
}

TEST_CASE("bad requests and foreign users are refused; the daemon keeps serving") {
  Cluster c("8-one-switch", "--socket-mode 0666");
  Proc bad = spawn_in("n0", {kClient, "bad-requests"});
  REQUIRE(wait_for(bad, 20s));
  INFO(bad.output());
  CHECK(bad.status == 0);
  Proc other = spawn_in("n1", {kClient, "other-uid", "65534"});
  REQUIRE(wait_for(other, 20s));
  INFO(other.output());
  CHECK(other.status == 0);
  CHECK(other.output().find("uid 65534") != std::string::npos);
  // A second daemon on a socket that a running one serves is refused, and leaves that
  // socket alone (it used to remove the file on its way out, stranding the first daemon).
  auto second = sh("ip netns exec aapc-n0 " + kTools + "/aapcd --topology " + state()["topology"].get<std::string>() +
                   " --vdev net_null0 --rank 0 --socket " + socket_of("n0"));
  INFO(second.text);
  CHECK(second.status != 0);
  CHECK(second.text.find("another aapcd already serves") != std::string::npos);
  CHECK(fs::is_socket(socket_of("n0")));
  require_all_ok(everywhere(exchange(3000, "auto")), "after the refusals");
}

TEST_CASE("a program built only from the installed header and aapc.pc performs an exchange") {
  fs::path dest = kLogs / "install";
  auto inst = sh("meson install -C " + std::string(AAPC_BUILD_DIR) + " --destdir " + dest.string() + " --no-rebuild --quiet");
  INFO(inst.text);
  REQUIRE(inst.status == 0);
  auto pc = sh("find " + dest.string() + " -name aapc.pc");
  REQUIRE(pc.status == 0);
  std::string pcdir = fs::path(pc.text.substr(0, pc.text.find('\n'))).parent_path().string();
  // The .pc names the install prefix; point it into the staging directory.
  auto prefix = sh("PKG_CONFIG_PATH=" + pcdir + " pkg-config --variable=prefix aapc");
  const std::string staged = dest.string() + prefix.text.substr(0, prefix.text.find('\n'));  // the prefix, in the staging directory
  std::string pkgconfig = "PKG_CONFIG_PATH=" + pcdir + " pkg-config --define-variable=prefix=" + staged;
  fs::path exe = kLogs / "example";
  auto build = sh("g++ " + std::string(AAPC_EXAMPLE) + " -o " + exe.string() + " $(" + pkgconfig + " --cflags --libs aapc)");
  INFO(build.text);
  REQUIRE(build.status == 0);
  auto libdir = sh(pkgconfig + " --variable=libdir aapc");
  std::string ld = libdir.text.substr(0, libdir.text.find('\n'));
  // The MPICH yield library is where an installed aapc-emu looks for it (mpilaunch.cpp).
  CHECK(fs::exists(fs::path(ld) / "aapc" / "libaapc-mpich-yield.so"));
  CHECK(fs::equivalent(fs::path(ld) / "aapc", fs::path(staged) / "bin" / ".." / "lib" / "x86_64-linux-gnu" / "aapc"));
  Cluster c("8-one-switch");
  auto procs = everywhere({"env", "LD_LIBRARY_PATH=" + ld, exe.string(), "4096"});
  require_all_ok(procs, "the packaged example");
  CHECK(procs[0].output().find("exchange ok") != std::string::npos);
}

TEST_CASE("traces: linear contends on the inter-switch link, tree with receiver-all never, sender-all only at phase ends") {
  Cluster c("8-two-switch");
  const std::string trace = kTools + "/aapc-trace";
  // One capture directory per schedule: the daemons are restarted with a new one each time.
  auto captured = [&](const std::string& schedule, const std::string& sync) {
    fs::path dir = kLogs / ("capture-" + schedule + "-" + sync);
    fs::create_directories(dir);
    REQUIRE(sh(kEmu + " stop").status == 0);
    c.start("", "", dir.string());
    require_all_ok(everywhere(exchange(64 * 1024, schedule, sync, 1)), schedule + " + " + sync);
    REQUIRE(sh(kEmu + " stop").status == 0);  // the captures are complete
    return dir.string();
  };
  auto links = [&](const std::string& dir) {
    auto r = sh(trace + " links --json --same-clock -t 8-two-switch " + dir);
    INFO(r.text);
    REQUIRE(r.status == 0);
    return nlohmann::json::parse(r.text);
  };
  auto on_trunk = [](const nlohmann::json& contention) {
    double s = 0;
    for (const auto& k : contention)
      if (k["edge"] == "s0->s1" || k["edge"] == "s1->s0") s += k["seconds"].get<double>();
    return s;
  };
  const std::string linear = captured("linear", "none"), receiver = captured("tree", "receiver-all"), sender = captured("tree", "sender-all");
  auto lin = links(linear);
  INFO(lin.dump(1));
  CHECK(on_trunk(lin["contention"]) > 0.010);  // blocks of different senders share s0-s1 for tens of ms
  // Receiver-based tokens: a block starts only after the previous one on its links has
  // arrived whole, so no two ever share a link. The captures time a frame when its daemon
  // polled it, which on a loaded box comes up to a few frame times late; overlaps that short
  // are the clocks', not the wire's (found failing 2 of 3 runs on landed main while the box
  // compiled in the background).
  auto rcv = links(receiver);
  for (const auto& k : rcv["contention"]) {
    INFO("receiver-all: " << k.dump());
    CHECK(k["seconds"].get<double>() < 0.0005);
  }
  // Sender-based tokens let a block start while the previous user's tail is still queued in
  // the network (Faraj/Yuan/Patarasuk section 6): overlaps only at a block's end, each shorter
  // than a switch buffer takes to drain (64 KiB at 100 Mbit/s: 5.2 ms).
  auto snd = links(sender);
  double total = 0;
  for (const auto& k : snd["contention"]) {
    INFO(k.dump());
    CHECK(k["a"]["end_s"].get<double>() <= k["b"]["end_s"].get<double>());
    CHECK(k["seconds"].get<double>() < 0.006);
    total += k["seconds"].get<double>();
  }
  CHECK(total < on_trunk(lin["contention"]) / 3);
  // The rounds of both tree runs started after their tokens (exit status 0), and the summary,
  // the offsets and the plots work on these captures.
  for (const auto& dir : {receiver, sender}) {
    auto ph = sh(trace + " phases -t 8-two-switch " + dir);
    INFO(ph.text);
    CHECK(ph.status == 0);
    CHECK(ph.text.find("tree+") != std::string::npos);
    CHECK(ph.text.find("every one started after its tokens arrived") != std::string::npos);
  }
  auto sum = sh(trace + " summary --json -t 8-two-switch " + linear);
  INFO(sum.text);
  REQUIRE(sum.status == 0);
  auto js = nlohmann::json::parse(sum.text);
  std::uint64_t received = 0;
  for (const auto& n : js["nodes"]) received += n["data_bytes_received"].get<std::uint64_t>();
  CHECK(received >= 8ULL * 7 * 64 * 1024);  // the exchange (and its warm-up), every byte
  for (const auto& k : js["clocks"]) CHECK(std::abs(k["offset_ns"].get<double>()) < 1e6);  // one host: offsets near 0
  // The hand-over terms of the sender-based run: every token of the exchange seen at both ends,
  // blocks at about their link's rate, and flags that aapc-sched predict takes as they are.
  auto ho = sh(trace + " handover --json --same-clock -t 8-two-switch " + sender);
  INFO(ho.text);
  REQUIRE(ho.status == 0);
  auto jh = nlohmann::json::parse(ho.text);
  CHECK(jh["tokens"].get<std::uint64_t>() > 0);
  CHECK(jh["fitted"].get<bool>());  // tokens within a switch and across s0-s1 cross different frame times
  CHECK(jh["received_share"].get<double>() > 0.8);
  CHECK(jh["received_share"].get<double>() < 1.3);  // a tbf passes its burst at once
  auto predicted = sh(kTools + "/aapc-sched predict 8-two-switch --size 64K --token-lead engine " + jh["predict_flags"].get<std::string>());
  INFO(predicted.text);
  CHECK(predicted.status == 0);
  auto plot = sh(trace + " plot -t 8-two-switch -o " + (kLogs / "plots").string() + " " + sender);
  INFO(plot.text);
  CHECK(plot.status == 0);
  CHECK(fs::file_size(kLogs / "plots" / "timeline.png") > 1000);
  CHECK(fs::file_size(kLogs / "plots" / "links.svg") > 1000);
}

// Physics, within what the emulation lets through, for 8-two-switch's blocks of `block` bytes:
// a link's tbf passes its burst at once, so an exchange whose busiest link (s0-s1: 16 blocks
// each way) carries B bytes can end in (B - burst) / rate; and eager blocks leave a
// rank that is out of the barrier before rank 0 starts its clock (5%). With a fixed 1.05 this
// failed at 4 KiB, where the burst is 38% of B: auto measured 107.9% and 108.9%.
double emulated_ceiling(double block) {
  const double busiest = 16.0 * block;
  const double burst = static_cast<double>(aapc::tools::emu_tbf_burst(100'000'000, 1500));
  return 1.05 * busiest / (busiest - burst);
}

TEST_CASE("aapc-bench: a short sweep with the MPI baselines gives a well-formed report") {
  sh(kEmu + " down");
  fs::path out = kLogs / "bench";
  auto r = sh(kTools + "/aapc-bench -t 8-two-switch --sizes 4K 64K --schedules auto paced-shuffle tree linear --tree-syncs sender-all "
                       "--mpi openmpi mpich --default-mpi-algorithms-only --check --max-iters 3 --point-seconds 1 --repeat 2 -o " + out.string());
  INFO(r.text);
  REQUIRE(r.status == 0);
  auto report = nlohmann::json::parse(std::ifstream(out / "results.json"));
  CHECK(report["machines"] == 8);
  // auto's calibrated choice on a tree of switches: the pairwise exchange without tokens for small
  // blocks; above, the paced shuffle, or the phases where the daemons measured them clearly
  // ahead of it (they measure the tree's exchanges from the warm-up on).
  auto chose_well = [](const nlohmann::json& size, const nlohmann::json& chosen) {
    return size == 4096 ? chosen == "pairwise-ec" : chosen == "paced-shuffle" || chosen == "tree+sender-all";
  };
  CHECK(report["peak_bps"].get<double>() > 0);
  std::set<std::string> labels;
  for (const auto& p : report["points"]) {
    INFO(p.dump());
    labels.insert(p["label"].get<std::string>());
    CHECK((p["size"] == 4096 || p["size"] == 65536));
    CHECK(p["seconds"].get<double>() > 0);
    CHECK(p["aggregate_bps"].get<double>() > 0);
    CHECK(p["check_ok"] == true);
    CHECK(p.contains("why"));
    // The MPIs' bytes crossed the emulated network (MPICH over UCX left alone does not).
    if (p["impl"] != "aapc") CHECK(p["over_network"] == true);
    // Each point is the median of its two runs (the slower one), both kept. Every run, the
    // faster one too, is within physics.
    REQUIRE(p["runs"] == 2);
    REQUIRE(p["seconds_all"].size() == 2);
    for (const auto& s : p["seconds_all"])
      CHECK(p["fraction_of_peak"].get<double>() * p["seconds"].get<double>() / s.get<double>() <= emulated_ceiling(p["size"].get<double>()));
    CHECK(p["too_fast"] == false);
    CHECK(p["seconds"] == std::max(p["seconds_all"][0].get<double>(), p["seconds_all"][1].get<double>()));
    CHECK(p["spread"].get<double>() >= 0);
    if (p["label"] == "auto") CHECK(chose_well(p["size"], p["chosen"]));
    // aapc's configurations ran in turns (three of one exchange each here), timed one by one.
    if (p["impl"] == "aapc") {
      REQUIRE(p["turn_s"].size() == 3);
      for (const auto& t : p["turn_s"]) CHECK(t.get<double>() > 0);
    }
  }
  CHECK(labels == std::set<std::string>{"auto", "paced-shuffle", "tree+sender-all", "linear", "openmpi default", "mpich default"});
  CHECK(report["points"].size() == 2 * labels.size());
  CHECK(report["summary"].size() == 2);
  for (const auto& row : report["summary"]) {
    INFO(row.dump());
    CHECK(chose_well(row["size"], row["auto_chose"]));
    // Every run was a real exchange (above), so auto is compared with the best turn by turn in
    // both rounds. A fixed bound of 1.02 on each run's fraction cast out runs of real 4 KiB
    // exchanges (102.4% and 113.1%: the tbf's burst), and with them every round of auto and
    // linear, and the report said auto was at 0.0% of the best.
    CHECK(row["auto_of_best"].get<double>() > 0.5);
    // At 64 KiB auto's choice was also swept on its own: the two are compared turn by turn.
    if (row["size"] == 65536) {
      REQUIRE(row.contains("auto_of_choice"));
      CHECK(row["auto_of_choice"].get<double>() > 0);
    }
  }
  std::ifstream csv(out / "results.csv");
  std::string line;
  std::size_t rows = 0;
  std::getline(csv, line);
  CHECK(line.rfind("impl,label,schedule,sync,size", 0) == 0);
  while (std::getline(csv, line)) ++rows;
  CHECK(rows == report["points"].size());
  CHECK(fs::file_size(out / "throughput.png") > 1000);
  CHECK(fs::file_size(out / "throughput.svg") > 1000);
  CHECK(r.text.find("per block size") != std::string::npos);
  CHECK(!fs::exists("/etc/netns/aapc-n0"));  // the MPI hosts files are gone with the cluster
}

TEST_CASE("aapc-bench --rates: the sweep at each rate, and % of the limit against the rate in one CSV and plot") {
  sh(kEmu + " down");
  fs::path out = kLogs / "bench-rates";
  fs::remove_all(out);
  auto r = sh(kTools + "/aapc-bench -t 8-two-switch --rates 50Mbit,100Mbit --sizes 64K --schedules auto sync-shuffle --mpi none --check "
                       "--max-iters 2 --point-seconds 1 -o " + out.string());
  INFO(r.text);
  REQUIRE(r.status == 0);
  for (const char* rate : {"50Mbit", "100Mbit"}) CHECK(fs::exists(out / rate / "results.json"));
  std::ifstream csv(out / "rates.csv");
  std::string line;
  std::getline(csv, line);
  CHECK(line == "rate_bps,label,size,fraction_of_peak,retransmissions");
  std::set<std::string> rates;
  std::size_t rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    rates.insert(line.substr(0, line.find(',')));
    const double fraction = std::stod(line.substr(line.rfind(',', line.rfind(',') - 1) + 1));
    CHECK(fraction > 0.2);
    CHECK(fraction < 1.2);
  }
  CHECK(rates == std::set<std::string>{"50000000", "100000000"});
  CHECK(rows == 4);  // two configurations, one size, two rates
  CHECK(fs::file_size(out / "rates.png") > 1000);
  CHECK(fs::file_size(out / "rates.svg") > 1000);
  CHECK(nothing_left());
}

TEST_CASE("aapc-bench skips, and says why, a schedule that cannot run on the tree, before any cluster comes up") {
  sh(kEmu + " down");
  // 12 machines: neither pairwise-xor nor hypercube applies. With nothing else to measure the
  // sweep ends with a message of its own, not with every rank failing on the cluster.
  auto r = sh(kTools + "/aapc-bench -t 12-three-level --sizes 4K --schedules pairwise-xor hypercube --mpi none -o " + (kLogs / "bench-skip").string());
  INFO(r.text);
  CHECK(r.status != 0);
  CHECK(r.text.find("skipping pairwise-xor: pairwise-xor needs a power of two machines, got 12") != std::string::npos);
  CHECK(r.text.find("skipping hypercube: hypercube needs a power of two machines") != std::string::npos);
  CHECK(r.text.find("nothing to measure") != std::string::npos);
  CHECK(nothing_left());
}

TEST_CASE("aapc-bench refuses a name that is no schedule before any cluster comes up") {
  sh(kEmu + " down");
  // It used to bring up the cluster and fail every rank on it.
  auto r = sh(kTools + "/aapc-bench -t 8-two-switch --sizes 4K --schedules auto bogus --mpi none -o " + (kLogs / "bench-bogus").string());
  INFO(r.text);
  CHECK(r.status != 0);
  CHECK(r.text.find("--schedules: 'bogus' is not a schedule") != std::string::npos);
  CHECK(r.text.find("exited with") == std::string::npos);
  CHECK(nothing_left());
}

TEST_CASE("aapc-bench stopped by SIGTERM or Ctrl-C takes its emulated cluster down") {
  for (const int sig : {SIGTERM, SIGINT}) {
    sh(kEmu + " down");
    fs::create_directories(kLogs);
    Proc p;
    p.log = (kLogs / ("bench-signal-" + std::to_string(sig) + ".log")).string();
    // A sweep long enough to be stopped while it runs.
    p.pid = aapc::tools::spawn({kTools + "/aapc-bench", "-t", "8-two-switch", "--sizes", "64K", "--schedules", "tree", "linear", "--mpi", "none", "--repeat", "9",
                                "--no-plot", "-o", (kLogs / "bench-signal").string()},
                               {p.log, {}, false});
    bool up = false;
    for (int i = 0; i < 600 && !up; ++i) {
      std::this_thread::sleep_for(100ms);
      up = sh(kEmu + " status").text.find("aapcd on n7") != std::string::npos;  // the daemons run: the sweep is under way
    }
    REQUIRE(up);
    ::kill(p.pid, sig);
    REQUIRE(wait_for(p, 60s));
    INFO(p.output());
    CHECK(p.status == 128 + sig);  // it dies of the signal, as a shell expects
    CHECK(nothing_left());
  }
}

TEST_CASE("aapc-emu's daemons keep no descriptor of whoever started them: a lock taken around `aapc-emu start` is free once it returns") {
  fs::create_directories(kLogs);
  const std::string lock = (kLogs / "start.lock").string();
  sh(kEmu + " down");
  struct Down {
    ~Down() { sh(kEmu + " down"); }
  } down_at_the_end;
  REQUIRE(sh(kEmu + " up 8-one-switch").status == 0);
  const Sh started = sh("flock " + lock + " " + kEmu + " start");
  INFO(started.text);
  CHECK(started.status == 0);
  CHECK(sh("pgrep -x aapcd").status == 0);
  CHECK(sh("flock -n " + lock + " true").status == 0);  // held by a daemon, it would be busy until `down`
}

TEST_CASE("nothing is left behind: namespaces, interfaces, sockets, daemons") {
  {
    Cluster c("8-two-switch");
    require_all_ok(everywhere(exchange(1000, "auto", "auto", 1)), "one exchange");
  }
  CHECK(nothing_left());
  // Even after a crash of aapc-emu itself: down finds what it made by name.
  REQUIRE(sh(kEmu + " up 8-one-switch").status == 0);
  fs::remove(aapc::tools::kEmuStateFile);
  REQUIRE(sh(kEmu + " down").status == 0);
  CHECK(nothing_left());
}

int main(int argc, char** argv) {
  if (::geteuid() != 0) {
    std::cerr << "the cluster suite needs root (network namespaces, bridges); skipped\n";
    return 77;
  }
  int rc = Catch::Session().run(argc, argv);
  sh(kEmu + " down");
  fs::remove_all(kLogs);
  return rc;
}
