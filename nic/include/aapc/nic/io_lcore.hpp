// I/O lcores: more than one core for a port when one is not enough.
//
// The engine builds, checks and places every payload byte on its own core. An I/O lcore takes
// the port's bursts off that core: it receives from the device into a ring the engine drains,
// and sends what the engine put into a second ring. On each side it runs a hook over the
// frames: on receive the engine's integrity check (the CRC, or the cluster key's tag: the pass
// over every received byte besides the copy into place), on send the sealing of frames the
// engine left unsealed (their CRC and tag). One lcore may serve both directions of several
// ports, or two lcores one direction each (separate RX and TX lcores). On a port of several
// transmit queues (Port::tx_queue_count), each queue has a ring and an lcore of its own, and
// the engine's frames go to the queue of their destination: every destination's frames leave
// in the order the engine sent them (the protocol reads a block's LAST frame as the end of a
// pass), while a node sending to many destinations at once (the paced shuffle) uses every
// queue's core.
//
//   OffloadPort port(eth);                 // what the engine is given instead of `eth`
//   IoLcore rx({.core = 2}), tx({.core = 3});
//   rx.serve_rx(port, check);  tx.serve_tx(port, seal);
//   rx.start();  tx.start();               // before the engine polls; stopped by destruction
//   IoLcore tx1({.core = 4});  tx1.serve_tx(port, seal, 1);  // queue 1 of a port of two
//
// The rings are single-producer single-consumer (rte_ring), so the engine's thread stays the
// only user of its side. A port served in both directions by two lcores is used by two
// threads at once, its receive queue by one and its transmit queue by the other: DPDK ethdevs
// allow that (EthPort); the fault injector and the capture tap, which keep state across the
// two directions, must be served by one lcore (serve_tx refuses otherwise).
//
// An lcore that has found nothing to do for a while sleeps in poll(2) on the devices it
// receives from (Port::wait_fds) and on a doorbell (an eventfd) that the engine rings when it
// puts frames into the ring of a sleeping lcore; the engine sleeps on the OffloadPort's own
// doorbell (wait_fd, arm_wait), which the receiving lcore rings. So an idle daemon leaves its
// cores to others, as one without I/O lcores does: emulated clusters put many daemons on few
// cores, and the nodes of a real one run the application beside aapcd.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "aapc/nic/port.hpp"

struct rte_ring;

namespace aapc::nic {

// Runs on the I/O lcore over every burst: received, before the engine sees it; or taken from
// the engine, before the device does. On receive it may set `flag`
// (OffloadPort::rx_verified_flag()) in a frame's ol_flags; the lcore clears that bit first on
// every frame, so nothing from the wire arrives with it set. On send it finishes the frames
// that carry `flag` (OffloadPort::tx_seal_flag()) and clears it.
struct FrameHook {
  void (*fn)(rte_mbuf** frames, std::uint16_t n, std::uint64_t flag, const void* context) = nullptr;
  const void* context = nullptr;
};

class IoLcore;

// The port the engine uses when an I/O lcore serves `inner`: its bursts go through rings.
// Everything else is the inner port's. The inner port must outlive it, and the lcores that
// serve it must be stopped (destroyed) before it is.
class OffloadPort final : public PortDecorator {
 public:
  // A transmit ring for each of the inner port's transmit queues.
  explicit OffloadPort(Port& inner, unsigned ring_size = 4096);
  ~OffloadPort() override;
  OffloadPort(const OffloadPort&) = delete;
  OffloadPort& operator=(const OffloadPort&) = delete;

  // From the rx ring when an lcore receives for this port, else from the inner port.
  std::uint16_t rx_burst(rte_mbuf** pkts, std::uint16_t n) override;
  // Into the tx ring when an lcore sends for this port (a full ring is backpressure), else to
  // the inner port. With several queues, each frame into the ring of its destination's
  // queue (tx_queue_of), in order, up to the first whose ring is full.
  std::uint16_t tx_burst(rte_mbuf** pkts, std::uint16_t n) override;
  // The transmit queue of frames to destination MAC `dst` among `queues`.
  static std::uint16_t tx_queue_of(const std::uint8_t* dst, std::uint16_t queues);
  // With an lcore receiving: a doorbell (eventfd) it rings when it puts frames into the ring
  // while the engine sleeps, announced by arm_wait().
  int wait_fd() const override { return rx_.lcore != nullptr ? rx_bell_ : inner_.wait_fd(); }
  std::vector<int> wait_fds() const override { return rx_.lcore != nullptr ? Port::wait_fds() : inner_.wait_fds(); }
  // Before the engine sleeps on wait_fd(): false when frames wait already (do not sleep);
  // true when the receiving lcore will ring once it has put some in. disarm_wait() after.
  bool arm_wait();
  void disarm_wait() { engine_asleep_.store(false, std::memory_order_relaxed); }

  // The ol_flags bit an FrameHook sets on a frame it has verified (a DPDK dynamic flag,
  // registered once per process); 0 when no lcore receives for this port or no hook runs.
  std::uint64_t rx_verified_flag() const override { return rx_.hooked ? rx_flag_ : 0; }
  // The ol_flags bit of a frame that the tx lcore's hook is to seal before it leaves; 0 when
  // no lcore sends for this port or no hook runs.
  std::uint64_t tx_seal_flag() const override;
  // Frames sent to the tx rings and not yet taken by the device.
  std::uint32_t tx_pending() const;
  // Its transmit queues (and rings): the inner port's; each needs an lcore (serve_tx).
  std::uint16_t tx_queues() const { return tx_queues_; }

 private:
  friend class IoLcore;
  struct Side {
    const IoLcore* lcore = nullptr;  // who serves this direction (or transmit queue), if any
    bool hooked = false;             // and runs a hook on it
  };
  struct TxQueue {
    rte_ring* ring = nullptr;
    Side side;
    std::atomic<std::uint32_t> held{0};  // frames its lcore took from the ring and holds
  };
  // tx_burst() over several queues: how many of the n frames went into their queues' rings,
  // in order, up to the first that a full ring refused; `touched` gets a bit per queue that
  // took some.
  std::uint16_t spread(rte_mbuf** pkts, std::uint16_t n, std::uint64_t& touched);
  // After frames went into queue q's ring: wakes its lcore if it sleeps.
  void wake(std::uint16_t q) const;
  // The receiving lcore, after frames went into the rx ring: rings the engine if it sleeps.
  void wake_engine();
  rte_ring* rx_ring_ = nullptr;
  int rx_bell_ = -1;                              // eventfd: the engine sleeps on it
  std::atomic<bool> engine_asleep_{false};        // armed: the receiving lcore must ring
  std::atomic<bool> rx_rung_{false};              // rung, not yet read: rx_burst reads it
  std::uint64_t rx_flag_ = 0, tx_flag_ = 0;
  Side rx_;
  std::unique_ptr<TxQueue[]> tx_;  // one per transmit queue of the inner port
  std::uint16_t tx_queues_ = 1;
};

struct IoLcoreOptions {
  int core = -1;  // pin the lcore's thread to this CPU; -1: leave its affinity as inherited
  std::string name = "aapc-io";
};

class IoLcore {
 public:
  explicit IoLcore(IoLcoreOptions options = {});
  ~IoLcore();  // stop()
  IoLcore(const IoLcore&) = delete;
  IoLcore& operator=(const IoLcore&) = delete;

  // Before start(): this lcore receives for `port` or sends for it (on transmit queue
  // `queue`), running `hook` on each burst. A direction (a transmit queue) is served by one
  // lcore. Throws NicError when a port is served twice, when it has no such queue, or in both
  // directions by two lcores while its inner port keeps state across them.
  void serve_rx(OffloadPort& port, FrameHook hook = {});
  void serve_tx(OffloadPort& port, FrameHook hook = {}, std::uint16_t queue = 0);
  // Starts the thread (registered with DPDK, so that mempool caches serve it). Throws
  // NicError when the EAL is not running, the core does not exist, or a port it sends for has
  // a transmit queue that no lcore serves (its frames would never leave).
  void start();
  // Sends what the tx rings still hold (up to a second), frees what is left and what was
  // received but not taken, and joins the thread. Idempotent.
  void stop();

  // Times this lcore slept in poll(2) for want of work, and times its doorbell woke it, so
  // far (tests look at them).
  std::uint64_t naps() const { return naps_.load(std::memory_order_relaxed); }
  std::uint64_t doorbells() const { return doorbells_.load(std::memory_order_relaxed); }

 private:
  friend class OffloadPort;
  struct Rx {
    OffloadPort* port;
    FrameHook hook;
    std::vector<rte_mbuf*> held;  // received, not yet in the ring (it was full)
  };
  struct Tx {
    OffloadPort* port;
    FrameHook hook;
    std::uint16_t queue;
    std::vector<rte_mbuf*> held;  // taken from the ring, not yet by the device
  };
  // serve_rx() and serve_tx(): this lcore takes `side` of `port` (`other` is its other side).
  void claim(OffloadPort& port, OffloadPort::Side& side, const OffloadPort::Side& other, FrameHook hook, const char* what);
  void run();
  bool poll_rx(Rx& rx);
  bool poll_tx(Tx& tx);
  // Nothing was done for a while: sleep until a device it receives from has frames, the
  // engine rings, or a while passes.
  void nap();
  // The engine put frames into a ring of this lcore: wakes it if it sleeps (any thread).
  void wake() const;

  IoLcoreOptions options_;
  std::vector<Rx> rx_;
  std::vector<Tx> tx_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  int bell_ = -1;                      // eventfd: written to wake the lcore from nap()
  std::vector<pollfd> nap_fds_;        // its doorbell, then its receiving devices' sockets
  bool polled_only_ = false;           // a device it receives from has none: nap in short sleeps
  std::atomic<bool> asleep_{false};  // in nap(), or about to be: wake() must ring
  std::atomic<std::uint64_t> naps_{0}, doorbells_{0};
};

}  // namespace aapc::nic
