// aapcd: the aapc daemon of one node. Owns the port, serves clients on a Unix socket.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <iostream>

#include "aapc/core/engine.hpp"
#include "aapc/daemon/daemon.hpp"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// Where and how the engine runs: I/O lcores, the barrier's radix, DPDK's own arguments.
void add_cpu_options(CLI::App& app, aapc::engine::DaemonConfig& cfg, std::vector<std::string>& eal_args) {
  app.add_option("--io-cores", cfg.io_cores,
                 "CPUs for I/O lcores, which take the port's bursts and the check of every received frame off the engine's core: one CPU "
                 "(receive and send there), two (receive on the first, send on the second), or more (receive on the first, and send "
                 "on each of the others through a transmit queue of its own, where one core cannot fill the link; the port needs as "
                 "many queues), e.g. --io-cores 2,3 or 2,3,4")
      ->delimiter(',')
      ->expected(1, 17)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--barrier-radix", cfg.barrier_radix,
                 "radix of the dissemination barrier (0: chosen by the number of machines); every daemon of the cluster must use the same")
      ->capture_default_str()
      ->check([](const std::string& v) { return v == "0" || CLI::Range(2, 4096)(std::string(v)).empty() ? std::string() : "0, or 2 to 4096"; });
  app.add_option("--stream-bytes", cfg.stream_bytes,
                 "an exchange that receives at least this many bytes, in frames of 4096 bytes of payload or more, writes them around the CPU "
                 "caches (non-temporal stores), which would not keep them; default: from this machine's caches (" +
                     std::to_string(aapc::engine::default_stream_bytes() >> 20) + " MiB here)")
      ->check([](const std::string& v) { return v.starts_with('-') ? std::string("a number of bytes, 0 or more") : std::string(); });
  app.add_option("--eal", eal_args, "further DPDK EAL arguments, e.g. --eal=-l3 to run the engine on CPU 3 alone (default: any CPU this process may use)");
  app.add_option("--eal-memory-mb", cfg.eal.memory_mb, "EAL memory without hugepages")->capture_default_str();
}

// The cluster key and the AEAD of this node's tags (aapc/wire/auth.hpp, wire.hpp).
// What one client or uid may hold of the daemon (daemon_quotas.cpp); root and ours are limited
// per client only.
void add_quota_options(CLI::App& app, aapc::engine::DaemonConfig& cfg) {
  const auto positive = CLI::Range(std::size_t{1}, std::size_t{1} << 20);
  app.add_option("--max-clients-per-uid", cfg.max_clients_per_uid, "connections one uid may hold (not root or ours)")->capture_default_str();
  app.add_option("--max-exchanges", cfg.max_exchanges,
                 "collectives running here at once, of all clients; more are refused (an MPI job runs one or more for each communicator "
                 "whose leader on this machine is in a collective)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-exchanges-per-client", cfg.max_exchanges_per_client, "collectives one client may have running or not yet collected")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-exchanges-per-uid", cfg.max_exchanges_per_uid, "the same for all clients of one uid together (not root or ours)")
      ->capture_default_str()
      ->check(positive);
  app.add_option_function<std::uint32_t>(
         "--max-timeout-ms", [&cfg](std::uint32_t ms) { cfg.max_timeout = std::chrono::milliseconds(ms); },
         "the longest timeout a collective may ask for (default 3600000; 0 asks for one derived from the size, which is not capped)")
      ->check(CLI::Range(std::uint32_t{1}, UINT32_MAX));
  app.add_option("--max-buffers-per-uid", cfg.max_buffers_per_uid, "buffers the clients of one uid may register (not root or ours)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-buffer-bytes-per-uid", cfg.max_buffer_bytes_per_uid, "bytes of buffers the clients of one uid may register (not root or ours)")
      ->capture_default_str();
  app.add_option("--max-buffers-others", cfg.max_buffers_others,
                 "buffers all uids but root and ours may register together (each is a memory map, and maps are limited: vm.max_map_count)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-plans", cfg.max_plans, "schedules kept per group and for the cluster (the least recently used goes)")
      ->capture_default_str()
      ->check(positive);
}

void add_key_options(CLI::App& app, aapc::engine::DaemonConfig& cfg) {
  app.add_option("--cluster-key", cfg.cluster_key,
                 "file of the cluster key (32 bytes or 64 hex digits, mode 0600, the same on every node): frames carry a keyed MAC, "
                 "and frames without a valid one are dropped");
  app.add_option("--cipher", cfg.cipher,
                 "the MAC of this node's frames with a cluster key: auto (aes-256-gcm where the CPU has AES-NI, else chacha20-poly1305), "
                 "aes-256-gcm or chacha20-poly1305; every node checks both")
      ->capture_default_str();
}

// The port from --iface, --vdev or --pci into cfg; false unless exactly one names it.
bool choose_port(aapc::engine::DaemonConfig& cfg, std::vector<std::string> vdevs, const std::string& pci) {
  // A bare interface name given as the device (AAPC_PORT=eth1 in the systemd unit's
  // environment) is --iface: AF_XDP where it can be.
  if (vdevs.size() == 1 && vdevs.front().find_first_of(",=:") == std::string::npos && vdevs.front().rfind("net_", 0) != 0 && cfg.iface.empty()) {
    cfg.iface = vdevs.front();
    vdevs.clear();
  }
  if (static_cast<int>(!vdevs.empty()) + static_cast<int>(!pci.empty()) + static_cast<int>(!cfg.iface.empty()) != 1) return false;
  if (!vdevs.empty()) {
    cfg.device = vdevs.front();
    if (cfg.device.rfind("net_af_packet", 0) == 0 && cfg.device.find("qdisc_bypass") == std::string::npos)
      cfg.device += ",qdisc_bypass=0";  // go through the kernel's qdisc, where the emulation shapes the link
  } else if (!pci.empty()) {
    cfg.device = pci;
    cfg.eal.no_pci = false;
    cfg.eal.extra.push_back("--allow=" + pci);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapcd: the aapc daemon of one node. It owns the port, runs all-to-all exchanges as raw Ethernet frames in the\n"
               "order a schedule prescribes, and serves applications on a Unix socket."};
  aapc::engine::DaemonConfig cfg;
  std::vector<std::string> vdevs;
  std::string pci, level = "info";
  int rank = -1, deadline_ms = 1500;
  std::vector<std::string> eal_args;
  app.add_option("--topology,-t", cfg.topology, "topology file (DOT) listing every machine's MAC")->required();
  app.add_option("--vdev", vdevs, "the port as a DPDK virtual device, e.g. net_af_packet0,iface=eth0, or an interface name alone, which is --iface (for af_packet qdisc_bypass=0 is added, and a ring "
                 "sized for the topology's MTU unless framesz, blocksz or framecnt are given)");
  app.add_option("--iface", cfg.iface, "the port as a kernel interface, e.g. eth1, opened through --iface-driver");
  app.add_option("--iface-driver", cfg.iface_driver, "auto (AF_XDP where the interface takes it, else af_packet), af_xdp or af_packet")
      ->check(CLI::IsMember({"auto", "af_xdp", "af_packet"}))
      ->capture_default_str();
  app.add_option("--pci", pci, "the port as a PCI address bound to a DPDK driver, e.g. 0000:03:00.0");
  app.add_option("--rank", rank, "this node's rank (default: the machine whose MAC is the port's)");
  app.add_option("--socket", cfg.socket_path, "control socket (its directory is made 0750)")->capture_default_str();
  app.add_option("--socket-group", cfg.socket_group, "group allowed to use the socket (mode 0660)");
  std::string mode = "0660";
  app.add_option("--socket-mode", mode, "permissions of the socket file (octal)")->capture_default_str();
  app.add_option("--allow-uid", cfg.allow_uids, "further uids allowed besides root, ours and members of --socket-group (opens the socket to every local user, "
                 "o+rw, and its directory for search, o+x: the daemon itself turns away every uid not allowed)");
  add_quota_options(app, cfg);
  int hello_ms = 5000;
  app.add_option("--hello-timeout-ms", hello_ms, "a client that says no HELLO this long after connecting is closed")->capture_default_str();
  app.add_option("--capture", cfg.capture_path, "write every frame sent and received to this pcap file");
  app.add_option("--capture-snaplen", cfg.capture_snaplen, "bytes kept per captured frame (64: headers; 65535: whole frames)")->capture_default_str();
  app.add_option("--pace", cfg.pace, "pacing: auto (this machine's link rate from the topology), off, or a rate like 1Gbit")->capture_default_str();
  app.add_option("--faults", cfg.faults, "inject faults on the port, for tests: drop=0.01,dup=0.001,corrupt=...,seed=N");
  app.add_option("--peer-deadline-ms", deadline_ms, "a peer silent this long (not even answering PINGs) fails the exchange and is held dead until heard from")->capture_default_str();
  add_key_options(app, cfg);
  add_cpu_options(app, cfg, eal_args);
  app.add_option("--log-level", level, "trace, debug, info, warn, error")->capture_default_str()->take_last();
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] aapcd %l: %v");
  if (!choose_port(cfg, vdevs, pci)) {
    std::cerr << "aapcd: name the port with exactly one of --iface (a kernel interface), --vdev or --pci\n";
    return 2;
  }
  if (rank >= 0) cfg.rank = rank;
  try {
    cfg.socket_mode = static_cast<unsigned>(std::stoul(mode, nullptr, 8));
  } catch (const std::exception&) {
    std::cerr << "aapcd: --socket-mode " << mode << " is not an octal mode like 0660\n";
    return 2;
  }
  cfg.peer_deadline = std::chrono::milliseconds(deadline_ms);
  cfg.hello_timeout = std::chrono::milliseconds(hello_ms);
  cfg.eal.extra.insert(cfg.eal.extra.end(), eal_args.begin(), eal_args.end());
  cfg.eal.program = "aapcd";

  try {
    auto daemon = aapc::engine::Daemon::create(cfg);
    spdlog::info("serving as {}", daemon->describe());
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    std::signal(SIGPIPE, SIG_IGN);
    int rc = daemon->run(g_stop);
    spdlog::info("stopped");
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "aapcd: " << e.what() << "\n";
    return 1;
  }
}
