// An in-process fabric for the vdev suite: N engines in one process, each on a real DPDK
// net_ring port, joined by a small software L2 switch that forwards by destination MAC, with
// an optional per-port rate and queue limit. Everything runs in the calling thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "aapc/core/engine.hpp"
#include "aapc/nic/capture.hpp"
#include "aapc/nic/eth_port.hpp"
#include "aapc/nic/fault.hpp"
#include "aapc/nic/io_lcore.hpp"
#include "aapc/sched/schedule.hpp"

struct rte_ring;

namespace aapc::test {

// Starts the EAL for this test process (once): no hugepages, no PCI, in memory.
void start_eal();

struct FabricOptions {
  int nodes = 4;
  int mtu = 1500;
  std::uint64_t port_rate_bps = 0;  // switch output rate per port; 0 = unlimited
  std::size_t queue_limit = 0;      // frames queued per switch output; 0 = ring size
  std::optional<nic::FaultOptions> faults;  // on every node's port (seed varied per node)
  std::string capture_dir;          // when set: node i writes capture_dir/node<i>.pcap
  int capture_snaplen = 65535;
  unsigned pool_size = 4095;
  std::function<void(engine::EngineConfig&)> tune;  // adjust each engine's configuration
  // This node's engine is polled at most once per `late_period`, like a daemon that a busy
  // host wakes late (-1: none).
  int late_node = -1;
  std::chrono::microseconds late_period{0};
  // This node's engine sleeps as aapcd's does on a port with a descriptor: after a poll that
  // moved nothing, until its next_event(), or a frame on its ring unless receive_wait_until()
  // lets frames wait (-1: none). Fabric::sleeps() counts its sleeps.
  int sleeping_node = -1;
  // run_exchange() gives every send block a registered region (nic/extmem.hpp): the engines
  // send its payload without copying it.
  bool zero_copy = false;
  // One I/O lcore (nic/io_lcore.hpp, not pinned) takes every node's bursts and checks what
  // they receive (engine::integrity_hook), while the engines run in the calling thread.
  bool io_lcore = false;
  // Transmit queues of every node's port (1-4). With io_lcore, queue 0 is the I/O lcore's
  // and each further queue has an lcore of its own (shared by the nodes); the switch takes
  // from every queue in turn, so frames of different queues may pass each other.
  int tx_queues = 1;
  // The switch drops each frame of ours (its header decoded) for which this says true: a
  // loss chosen by the test, frame by frame.
  std::function<bool(int src, int dst, const engine::Header& h)> drop;
};

inline FabricOptions nodes(int n) {
  FabricOptions o;
  o.nodes = n;
  return o;
}

class Fabric {
 public:
  explicit Fabric(const FabricOptions& options);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int size() const { return static_cast<int>(nodes_.size()); }
  engine::Engine& engine(int i) { return *nodes_[static_cast<std::size_t>(i)].engine; }
  nic::FaultPort* faults(int i) { return nodes_[static_cast<std::size_t>(i)].faults.get(); }
  nic::EthPort& eth(int i) { return *nodes_[static_cast<std::size_t>(i)].eth; }
  nic::CapturePort* capture(int i) { return nodes_[static_cast<std::size_t>(i)].capture.get(); }
  nic::OffloadPort* offload(int i) { return nodes_[static_cast<std::size_t>(i)].offload.get(); }
  static nic::MacAddr mac(int rank);

  // Cuts a node off: the switch drops everything from and to it.
  void unplug(int i) { unplugged_[static_cast<std::size_t>(i)] = true; }
  // Connects it again.
  void plug(int i) { unplugged_[static_cast<std::size_t>(i)] = false; }
  // Puts a frame, as bytes, on node i's receive ring, as if the switch had delivered it (a
  // forger on the wire).
  void inject(int i, std::span<const std::uint8_t> frame);
  // One pass of the switch and of every engine; true when anything moved.
  bool step();
  // Steps until done() or the deadline; false on the deadline.
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds deadline);
  // Steps until nothing moves for `quiet` (frames in flight have landed).
  void settle(std::chrono::milliseconds quiet = std::chrono::milliseconds(50));

  std::uint64_t switch_drops() const { return switch_drops_; }
  std::uint64_t sleeps(int i) const { return nodes_[static_cast<std::size_t>(i)].sleeps; }
  std::uint64_t switched() const { return switched_; }
  // Frames switched whose payload was an external buffer (a chained frame whose last segment
  // is attached to a sender's memory): frames sent without a copy.
  std::uint64_t switched_external() const { return switched_external_; }
  bool zero_copy() const { return options_.zero_copy; }

 private:
  struct Node {
    rte_ring* to_node = nullptr;    // the switch puts frames here: the port's rx ring
    std::vector<rte_ring*> from_node;  // the port's tx rings, one per queue
    std::unique_ptr<nic::EthPort> eth;
    std::unique_ptr<nic::FaultPort> faults;
    std::unique_ptr<nic::CapturePort> capture;
    std::unique_ptr<nic::OffloadPort> offload;   // with FabricOptions::io_lcore
    std::unique_ptr<engine::FrameKey> key;       // the engine's, for the lcore's check
    std::unique_ptr<engine::Engine> engine;
    std::vector<struct rte_mbuf*> out_queue;  // switch output waiting for the rate limit
    double tokens = 0;
    std::chrono::steady_clock::time_point polled{};
    // FabricOptions::sleeping_node: asleep until wake_at, or a frame unless deaf_until.
    std::chrono::steady_clock::time_point wake_at{}, deaf_until{};
    std::uint64_t sleeps = 0;
  };
  bool chosen_loss(int src, int dst, struct rte_mbuf* m) const;  // FabricOptions::drop
  std::vector<Node> nodes_;
  std::unique_ptr<nic::IoLcore> io_;  // FabricOptions::io_lcore
  std::vector<std::unique_ptr<nic::IoLcore>> tx_io_;  // transmit queues 1.. (FabricOptions::tx_queues)
  std::vector<bool> unplugged_;
  FabricOptions options_;
  std::uint64_t switch_drops_ = 0, switched_ = 0, switched_external_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

// The byte k of the block src -> dst of exchange x: every block differs from every other.
inline std::uint8_t pattern(int src, int dst, std::uint32_t x, std::uint64_t k) {
  return static_cast<std::uint8_t>(k * 131 + (k >> 8) * 7 + static_cast<std::uint64_t>(src) * 17 + static_cast<std::uint64_t>(dst) * 29 + x * 53);
}

struct ExchangeRun {
  std::vector<engine::ExchangeReport> reports;  // by rank
  bool finished = false;                        // every engine reported
  bool byte_exact = false;                      // every receive buffer holds the pattern
  std::string first_mismatch;
  std::chrono::nanoseconds elapsed{};
  // With FabricOptions::zero_copy: frames attached to the send blocks, and those still in
  // flight when the run gave up waiting for them (its buffers are then kept, never freed).
  std::uint64_t attached = 0, in_flight_left = 0;
  bool send_intact = true;  // every send buffer still holds its pattern after the run
};

// Runs `schedule` as exchange `id` on the fabric with blocks of `block` bytes (sizes[src][dst]
// when given), checks every received byte.
ExchangeRun run_exchange(Fabric& fabric, const sched::Schedule& schedule, std::uint32_t id, std::uint64_t block,
                         std::chrono::milliseconds deadline = std::chrono::milliseconds(60'000),
                         const std::vector<std::vector<std::uint64_t>>* sizes = nullptr);

}  // namespace aapc::test
