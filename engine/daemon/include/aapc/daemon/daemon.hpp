// The daemon core: one per node, owns the port, serves clients on a Unix socket and runs
// their exchanges on the engine. tools/aapcd.cpp is a thin main over this.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aapc/nic/eal.hpp"

namespace aapc::engine {

struct DaemonConfig {
  std::string topology;                 // topology file (or a shipped name)
  std::string device;                   // ethdev: "net_af_packet0,iface=eth0", "0000:03:00.0", ...
  // Instead of device: a kernel interface, opened through iface_driver (nic::IfaceDriver's
  // names: "auto" is AF_XDP, else af_packet; "af_xdp"; "af_packet").
  std::string iface;
  std::string iface_driver = "auto";
  std::optional<int> rank;              // default: the rank whose MAC is the port's
  std::string socket_path = "/run/aapc/aapcd.sock";
  unsigned socket_mode = 0660;          // the directory is made 0750
  std::string socket_group;             // group of socket and directory (default: ours)
  std::vector<uid_t> allow_uids;        // besides root, our own uid and members of socket_group
  std::string capture_path;             // write every frame to this pcap file
  int capture_snaplen = 64;
  std::string faults;                   // fault injector spec, for tests ("drop=0.01")
  std::string pace = "auto";            // "auto": the machine's link rate; "off"; or a rate
  std::chrono::milliseconds peer_deadline{1'500};  // EngineConfig::peer_deadline
  // A file with the cluster key (auth.hpp), the same on every node: frames carry a keyed MAC
  // and frames without a valid one are dropped. Empty: no key.
  std::string cluster_key;
  // The AEAD of this node's tags (wire.hpp): "auto" (AES-256-GCM where the CPU has AES-NI and
  // PCLMUL, ChaCha20-Poly1305 otherwise), "aes-256-gcm" or "chacha20-poly1305". A node checks
  // both; a cluster with nodes that lack AES-NI must run every node with chacha20-poly1305.
  std::string cipher = "auto";
  std::size_t max_clients = 64;
  // Connections one uid may hold; root and the daemon's own uid are not limited, and the last
  // few of max_clients are kept for them, so other users cannot lock them out.
  std::size_t max_clients_per_uid = 16;
  // A client that has not said HELLO within this time is closed.
  std::chrono::milliseconds hello_timeout{5'000};
  std::uint64_t max_buffer_bytes = 1ULL << 36;  // per buffer
  std::size_t max_exchanges = 256;              // running at once (EngineConfig::max_live_exchanges)
  // Quotas, so that one user cannot deny service to the others (docs/design.md, "Jobs kept
  // apart"). Collectives one client has running or not yet collected (WAIT), and all clients of
  // one uid together (root and the daemon's uid are not limited per uid):
  std::size_t max_exchanges_per_client = 64;
  std::size_t max_exchanges_per_uid = 128;
  // The longest timeout a START may give (0 asks for one derived from the size, never capped).
  std::chrono::milliseconds max_timeout{3'600'000};
  // Buffers registered by the clients of one uid (not root or ours), by count and bytes, and
  // by all such uids together: every buffer is a memory map of this process, and maps are
  // limited (vm.max_map_count, 65,530 by default), so root's must still fit.
  std::size_t max_buffers_per_uid = 4096;
  std::uint64_t max_buffer_bytes_per_uid = 1ULL << 40;
  std::size_t max_buffers_others = 32768;
  // Schedules kept per group (and the cluster's), by plan spec; the least recently used goes.
  std::size_t max_plans = 64;
  // I/O lcores (nic/io_lcore.hpp): empty, the engine's thread drives the
  // port; one CPU, a thread pinned there receives and sends for it and checks every received
  // frame's CRC (and tag); two, one thread receives (and checks) on the first and one sends
  // on the second; more, one receives on the first and one sends on each of the others, on a
  // transmit queue of its own (the port is opened with that many queues).
  std::vector<int> io_cores;
  // Radix of the dissemination barrier (0: sched::barrier_radix's choice for the machines of
  // the world or group). Every daemon of the cluster must use the same.
  int barrier_radix = 0;
  // EngineConfig::stream_bytes (unset: from this machine's caches).
  std::optional<std::uint64_t> stream_bytes;
  nic::EalOptions eal;
};

class Daemon {
 public:
  // Loads the topology, starts the EAL and the port, finds our rank and opens the socket.
  // Throws std::runtime_error with the reason (e.g. our MAC is not in the topology).
  static std::unique_ptr<Daemon> create(const DaemonConfig& config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves until `stop` is set (SIGTERM), then aborts what runs, tells the peers, cleans up.
  int run(const std::atomic<bool>& stop);

  int rank() const;
  std::string describe() const;  // one line for the log: rank, machine, MAC, port, epoch

 private:
  Daemon();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace aapc::engine
