// A narrow port interface that works in bursts (docs/design.md, "The parts"): one implementation for every
// DPDK ethdev, and wrappers that inject faults or capture frames.
//
// Thread safety: a port is used by one thread at a time (the engine's poll loop).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

struct rte_mbuf;
struct rte_mempool;

namespace aapc::nic {

using MacAddr = std::array<std::uint8_t, 6>;
std::string mac_string(const MacAddr& mac);

// Setup failures (EAL, port configuration, files): the message says what to do.
class NicError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Port {
 public:
  virtual ~Port() = default;
  // Receives up to n frames into pkts; the caller owns (and frees) them.
  virtual std::uint16_t rx_burst(rte_mbuf** pkts, std::uint16_t n) = 0;
  // Offers n frames; returns how many the port took (and will free). The caller keeps the
  // rest: a full transmit ring is backpressure, not an error.
  virtual std::uint16_t tx_burst(rte_mbuf** pkts, std::uint16_t n) = 0;
  // Transmit queues: a DPDK ethdev opened with several (PortOptions::queues) sends on each
  // from a thread of its own (an I/O lcore per queue, io_lcore.hpp), where one core cannot
  // fill the link. tx_burst() sends on the first. Wrappers have one: they keep state across
  // frames.
  virtual std::uint16_t tx_queue_count() const { return 1; }
  // tx_burst() on transmit queue `queue` (below tx_queue_count()).
  virtual std::uint16_t tx_burst_on(std::uint16_t queue, rte_mbuf** pkts, std::uint16_t n) { return queue == 0 ? tx_burst(pkts, n) : 0; }
  // Pool to allocate frames for this port from.
  virtual rte_mempool* pool() const = 0;
  virtual MacAddr mac() const = 0;
  virtual int mtu() const = 0;
  // Link speed in bit/s as the device reports it; 0 when unknown (virtual devices).
  virtual std::uint64_t link_speed_bps() const = 0;
  virtual std::string name() const = 0;
  // A descriptor that polls readable when frames wait to be received, for sleeping in
  // poll(2) instead of spinning; -1 when the device has none (poll it).
  virtual int wait_fd() const { return -1; }
  // Descriptors that together poll readable when frames wait on any of the port's receive
  // queues (one per queue); empty when the device has none. An I/O lcore sleeps on them.
  virtual std::vector<int> wait_fds() const {
    if (const int fd = wait_fd(); fd >= 0) return {fd};
    return {};
  }
  // True when the port takes chained frames whose segments may be external buffers (the
  // sender's own memory, extmem.hpp) and moves them without DMA: the engine may then send
  // payload without copying it.
  virtual bool zero_copy_tx() const { return false; }
  // True when one thread may receive while another sends (an I/O lcore for each direction,
  // io_lcore.hpp): a DPDK ethdev's rx and tx queues are apart; a wrapper that keeps state
  // across the two directions is not.
  virtual bool directions_apart() const { return false; }
  // The ol_flags bit set on a received frame whose integrity was checked before rx_burst
  // returned it (on an I/O lcore, io_lcore.hpp); 0 when none is. Wrappers do not pass it on:
  // what a wrapper does to a frame after the check (the fault injector) would not be seen.
  virtual std::uint64_t rx_verified_flag() const { return 0; }
  // The ol_flags bit of a frame given to tx_burst with its CRC (and tag) not yet computed,
  // which a hook computes before the device sends it (io_lcore.hpp); 0 when none does.
  virtual std::uint64_t tx_seal_flag() const { return 0; }
};

// A port wrapped around another (the fault injector, the capture tap): everything but the
// bursts is the inner port's, and the name says what was added. The inner port must outlive
// the wrapper.
class PortDecorator : public Port {
 public:
  rte_mempool* pool() const override { return inner_.pool(); }
  MacAddr mac() const override { return inner_.mac(); }
  int mtu() const override { return inner_.mtu(); }
  std::uint64_t link_speed_bps() const override { return inner_.link_speed_bps(); }
  int wait_fd() const override { return inner_.wait_fd(); }
  std::vector<int> wait_fds() const override { return inner_.wait_fds(); }
  bool zero_copy_tx() const override { return inner_.zero_copy_tx(); }
  std::string name() const override { return inner_.name() + suffix_; }

 protected:
  PortDecorator(Port& inner, std::string suffix) : inner_(inner), suffix_(std::move(suffix)) {}

  Port& inner_;

 private:
  std::string suffix_;  // "+faults", "+capture"
};

}  // namespace aapc::nic
