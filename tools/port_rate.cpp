// aapc-engine-bench --port-rate: how fast one node's port sends and receives, per kind of port
// for a kernel interface (af_packet, AF_XDP), measured side by side on a pair of network
// namespaces joined by one unshaped veth pair. One process sends frames of the MTU as fast as
// its port takes them, one core (or a thread per transmit queue, --port-rate-queues); another,
// on the other core, receives them. The figures are what a node can put on a link at most,
// whatever the schedule (docs/design.md, "Fast links").
#include "port_rate.hpp"

#include <CLI/CLI.hpp>

#include <rte_ether.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "aapc/nic/eal.hpp"
#include "aapc/nic/eth_port.hpp"
#include "common/procutil.hpp"

namespace aapc::port_rate {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const std::string kTx = "aapc-rate-tx", kRx = "aapc-rate-rx";  // aapc-emu down removes these too
constexpr std::uint16_t kBurst = 32;
// aapc's EtherType: the XDP program under an AF_XDP port hands only these to its socket and
// passes every other frame to the kernel (with 0x88B6 the AF_XDP receiver saw none, and the
// benchmark said 100% lost). Only the benchmark's own namespaces see them.
constexpr std::uint16_t kEtherType = 0x88b5;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The bytes of one of the benchmark's frames: the MTU and the Ethernet header.
std::uint32_t frame_len(int mtu) { return static_cast<std::uint32_t>(mtu) + RTE_ETHER_HDR_LEN; }

std::unique_ptr<nic::EthPort> open_node_port(const std::string& driver, int mtu, int cpu, int queues) {
  nic::EalOptions eal;
  eal.program = "aapc-port-rate";
  eal.file_prefix = "aapc-rate-" + std::to_string(::getpid());
  eal.pin_main = cpu;
  nic::eal_init(eal);
  nic::PortOptions po;
  po.mtu = mtu;
  po.queues = static_cast<std::uint16_t>(queues);
  const auto kind = nic::parse_iface_driver(driver);
  if (!kind || *kind == nic::IfaceDriver::kAuto) throw std::runtime_error("--driver " + driver + ": af_xdp or af_packet");
  return nic::open_iface("aapc0", *kind, po).port;
}

struct Sent {
  std::uint64_t frames = 0, refused = 0;
  double seconds = 0;
};

// One sending thread: frames of the MTU on transmit queue `queue`, for `seconds`, as fast as
// the port takes them.
Sent send_on(nic::EthPort& port, std::uint16_t queue, int mtu, double seconds) {
  const std::uint32_t frame = frame_len(mtu);
  std::array<rte_mbuf*, kBurst> burst{};
  Sent out;
  const auto start = Clock::now();
  double elapsed = 0;
  while ((elapsed = seconds_since(start)) < seconds) {
    if (rte_pktmbuf_alloc_bulk(port.pool(), burst.data(), kBurst) != 0) continue;  // the driver still holds them
    for (rte_mbuf* m : burst) {
      auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
      std::fill(std::begin(eth->dst_addr.addr_bytes), std::end(eth->dst_addr.addr_bytes), 0xff);
      const nic::MacAddr mac = port.mac();
      std::copy(mac.begin(), mac.end(), eth->src_addr.addr_bytes);
      eth->ether_type = rte_cpu_to_be_16(kEtherType);
      m->data_len = static_cast<std::uint16_t>(frame);
      m->pkt_len = frame;
    }
    const std::uint16_t sent = port.tx_burst_on(queue, burst.data(), kBurst);
    out.frames += sent;
    out.refused += kBurst - sent;
    for (std::uint16_t i = sent; i < kBurst; ++i) rte_pktmbuf_free(burst[i]);
  }
  out.seconds = elapsed;
  return out;
}

// The sender: a thread per transmit queue (the first is this one), as aapcd's sending I/O
// lcores are; the figures are their sums, over the longest thread's time.
nlohmann::json send(nic::EthPort& port, int mtu, double seconds) {
  std::vector<Sent> sent(port.tx_queue_count());
  std::vector<std::thread> threads;
  for (std::uint16_t q = 1; q < port.tx_queue_count(); ++q)
    threads.emplace_back([&, q] {
      const bool registered = rte_thread_register() == 0;  // a mempool cache of its own
      sent[q] = send_on(port, q, mtu, seconds);
      if (registered) rte_thread_unregister();
    });
  sent[0] = send_on(port, 0, mtu, seconds);
  for (auto& t : threads) t.join();
  Sent all;
  for (const Sent& s : sent) {
    all.frames += s.frames;
    all.refused += s.refused;
    all.seconds = std::max(all.seconds, s.seconds);
  }
  return {{"frames", all.frames}, {"bytes", all.frames * frame_len(mtu)}, {"seconds", all.seconds}, {"refused", all.refused}, {"queues", sent.size()}};
}

// The receiver: every frame until none came for half a second after the first, or the
// deadline. The time is from the first frame to the last.
nlohmann::json receive(nic::EthPort& port, double deadline_s) {
  std::array<rte_mbuf*, kBurst> burst{};
  std::uint64_t frames = 0, bytes = 0;
  const auto start = Clock::now();
  Clock::time_point first{}, last{};
  while (seconds_since(start) < deadline_s && (frames == 0 || seconds_since(last) < 0.5)) {
    const std::uint16_t n = port.rx_burst(burst.data(), kBurst);
    if (n == 0) continue;
    last = Clock::now();
    if (frames == 0) first = last;
    frames += n;
    for (std::uint16_t i = 0; i < n; ++i) {
      bytes += burst[i]->pkt_len;
      rte_pktmbuf_free(burst[i]);
    }
  }
  return {{"frames", frames}, {"bytes", bytes}, {"seconds", std::chrono::duration<double>(last - first).count()}};
}

void must(const std::vector<std::string>& argv) {
  const auto out = tools::run(argv);
  if (out.status != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw std::runtime_error("`" + cmd + "` failed: " + out.text);
  }
}

// The two namespaces and their cable; removed when this goes out of scope, also on failure.
// One queue each way: a veth gives AF_XDP one queue however many it has (no combined
// channels), and with more, frames sent on a second queue arrive on a second receive queue,
// where the AF_XDP socket of queue 0 never sees them. af_packet's queue pairs (its sockets)
// need no queues of the interface.
struct Namespaces {
  explicit Namespaces(int mtu) {
    remove();
    must({"ip", "netns", "add", kTx});
    must({"ip", "netns", "add", kRx});
    must({"ip", "-n", kTx, "link", "add", "aapc0", "type", "veth", "peer", "name", "aapc0", "netns", kRx});
    for (const auto& ns : {kTx, kRx}) {
      tools::run({"ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.aapc0.disable_ipv6=1"});
      must({"ip", "-n", ns, "link", "set", "aapc0", "mtu", std::to_string(mtu), "up"});
    }
  }
  ~Namespaces() { remove(); }
  Namespaces(const Namespaces&) = delete;
  Namespaces& operator=(const Namespaces&) = delete;
  static void remove() {
    for (const auto& ns : {kTx, kRx}) tools::run({"ip", "netns", "del", ns});
  }
};

nlohmann::json last_json_line(const std::string& text) {
  std::istringstream in(text);
  nlohmann::json found;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.front() == '{') found = nlohmann::json::parse(line, nullptr, false);
  if (found.is_discarded() || found.is_null()) throw std::runtime_error("no figures from a node; its output:\n" + text);
  return found;
}

struct Trial {
  double send_bps = 0, send_fps = 0, recv_bps = 0, recv_fps = 0, lost = 0;
};

// One trial of `driver` with `queues`: the receiver first, ready before the sender starts.
Trial trial(const std::string& self, const std::string& driver, int queues, int mtu, double seconds) {
  const fs::path dir = fs::temp_directory_path() / ("aapc-port-rate-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Removed {  // also when a node fails (a kind that cannot run here)
    fs::path dir;
    ~Removed() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } removed{dir};
  const fs::path ready = dir / "ready", log = dir / "rx.log";
  fs::remove(ready);
  const std::string secs = std::to_string(seconds), q = std::to_string(queues);
  const pid_t rx = tools::spawn({"ip", "netns", "exec", kRx, self, "--port-rate-node", "rx", "--port-rate-driver", driver, "--mtu", std::to_string(mtu),
                                 "--port-rate-seconds", secs, "--port-rate-ready", ready.string(), "--port-rate-queues", q},
                                {log.string(), {}, false});
  const auto wait_from = Clock::now();
  while (!fs::exists(ready)) {
    int status = 0;
    if (::waitpid(rx, &status, WNOHANG) == rx || seconds_since(wait_from) > 30) {
      ::kill(rx, SIGKILL);
      throw std::runtime_error("the receiver (" + driver + ") did not open its port; its log:\n" + tools::run({"cat", log.string()}).text);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto tx = tools::run({"ip", "netns", "exec", kTx, self, "--port-rate-node", "tx", "--port-rate-driver", driver, "--mtu", std::to_string(mtu),
                              "--port-rate-seconds", secs, "--port-rate-queues", q});
  int status = 0;
  ::waitpid(rx, &status, 0);
  std::ifstream in(log);
  const std::string rx_text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (tx.status != 0) throw std::runtime_error("the sender (" + driver + ") failed:\n" + tx.text);
  const auto s = last_json_line(tx.text), r = last_json_line(rx_text);
  Trial t;
  const double ss = s["seconds"].get<double>(), rs = std::max(r["seconds"].get<double>(), 1e-9);
  t.send_bps = s["bytes"].get<double>() * 8 / ss;
  t.send_fps = s["frames"].get<double>() / ss;
  t.recv_bps = r["bytes"].get<double>() * 8 / rs;
  t.recv_fps = r["frames"].get<double>() / rs;
  const double sent = s["frames"].get<double>();
  t.lost = sent > 0 ? 1.0 - r["frames"].get<double>() / sent : 0;
  return t;
}

// Median and spread of one figure over the trials.
std::string figure(std::vector<double> v, double scale, int precision) {
  std::sort(v.begin(), v.end());
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << v[v.size() / 2] / scale << " (" << v.front() / scale << "-" << v.back() / scale << ")";
  return o.str();
}

}  // namespace

int node(const NodeOptions& o) {
  try {
    const bool tx = o.role == "tx";
    auto port = open_node_port(o.driver, o.mtu, tx ? 0 : 1, o.queues);
    nlohmann::json out;
    if (tx) {
      out = send(*port, o.mtu, o.seconds);
    } else {
      std::ofstream(o.ready) << "ready\n";
      out = receive(*port, o.seconds + 10);
    }
    out["driver"] = port->driver();
    std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "aapc-engine-bench --port-rate-node " << o.role << ": " << e.what() << "\n";
    return 1;
  }
}

int bench(const std::string& self, int mtu, double seconds, int repeat, const std::vector<std::string>& drivers, const std::vector<int>& queues) {
  if (::geteuid() != 0) throw std::runtime_error("--port-rate needs root: it makes two network namespaces and a veth pair");
  Namespaces spaces(mtu);
  std::cout << "port rate: frames of MTU " << mtu << " from one namespace to another over one veth pair, unshaped, " << seconds << " s a trial, "
            << repeat << " trials per port kind, interleaved; medians (min-max)\n";
  // "af_xdp" with one queue, "af_xdp x2" with a sending thread on each of two.
  struct Kind {
    std::string driver, label;
    int queues;
  };
  std::vector<Kind> kinds;
  for (int q : queues)
    for (const auto& d : drivers) kinds.push_back({d, q == 1 ? d : d + " x" + std::to_string(q), q});
  std::map<std::string, std::vector<Trial>> trials;
  std::map<std::string, std::string> failed;  // a kind that cannot run here (AF_XDP on a veth of several queues), and why
  for (int r = 0; r < repeat; ++r)
    for (const auto& k : kinds) {
      if (failed.count(k.label) != 0) continue;
      try {
        trials[k.label].push_back(trial(self, k.driver, k.queues, mtu, seconds));
        std::cerr << "  " << k.label << " trial " << r + 1 << "/" << repeat << " done\n";
      } catch (const std::exception& e) {
        failed[k.label] = e.what();
      }
    }
  for (const auto& [label, why] : failed) std::cout << label << ": could not run: " << why << "\n";
  std::erase_if(kinds, [&](const Kind& k) { return failed.count(k.label) != 0; });
  if (kinds.empty()) throw std::runtime_error("no port kind could run");
  std::cout << std::left << std::setw(14) << "port" << std::setw(22) << "send Gbit/s" << std::setw(22) << "send Mframes/s" << std::setw(22)
            << "receive Gbit/s" << std::setw(22) << "receive Mframes/s" << "lost %\n";
  std::map<std::string, double> median_send;
  for (const auto& k : kinds) {
    std::vector<double> sb, sf, rb, rf, lost;
    for (const auto& t : trials[k.label]) {
      sb.push_back(t.send_bps);
      sf.push_back(t.send_fps);
      rb.push_back(t.recv_bps);
      rf.push_back(t.recv_fps);
      lost.push_back(t.lost * 100);
    }
    std::cout << std::left << std::setw(14) << k.label << std::setw(22) << figure(sb, 1e9, 2) << std::setw(22) << figure(sf, 1e6, 3) << std::setw(22)
              << figure(rb, 1e9, 2) << std::setw(22) << figure(rf, 1e6, 3) << figure(lost, 1, 1) << "\n";
    std::sort(sb.begin(), sb.end());
    median_send[k.label] = sb[sb.size() / 2];
  }
  // Ratios against af_packet with one queue, measured in the same run.
  if (const auto base = median_send.find("af_packet"); base != median_send.end() && base->second > 0)
    for (const auto& k : kinds)
      if (k.label != base->first)
        std::cout << k.label << " sends " << std::fixed << std::setprecision(2) << median_send[k.label] / base->second
                  << "x what af_packet sends (medians)\n";
  return 0;
}

void add_options(CLI::App& app, Options& o) {
  app.add_flag("--port-rate", o.bench,
               "instead: one node's send and receive rate per port kind for a kernel interface (af_packet, AF_XDP), side by side on a pair of "
               "network namespaces (needs root; hold /tmp/aapc-cluster.lock so no emulated cluster runs beside it)");
  app.add_option("--port-rate-kinds", o.kinds, "with --port-rate: the port kinds")->check(CLI::IsMember({"af_packet", "af_xdp"}))->capture_default_str();
  app.add_option("--port-rate-seconds", o.node.seconds, "with --port-rate: seconds of sending per trial")->check(CLI::Range(0.1, 60.0))->capture_default_str();
  app.add_option("--port-rate-queues", o.queues,
                 "with --port-rate: numbers of transmit queues to try, each with a sending thread of its own (as aapcd --io-cores with more "
                 "than two CPUs), e.g. 1 2 4")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--port-rate-node", o.node.role, "(internal) one side of a --port-rate trial")->check(CLI::IsMember({"tx", "rx"}))->group("");
  app.add_option("--port-rate-driver", o.node.driver, "(internal)")->group("");
  app.add_option("--port-rate-ready", o.node.ready, "(internal)")->group("");
}

int run(Options o, int mtu, int repeat) {
  o.node.mtu = mtu;
  if (!o.node.role.empty()) {
    o.node.queues = o.queues.front();  // one number for a node (the benchmark passes it)
    return node(o.node);
  }
  try {
    return bench(fs::read_symlink("/proc/self/exe").string(), mtu, o.node.seconds, repeat, o.kinds, o.queues);
  } catch (const std::exception& e) {
    std::cerr << "aapc-engine-bench: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace aapc::port_rate
