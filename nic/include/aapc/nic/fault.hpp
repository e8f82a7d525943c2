// A fault injector wrapping any port: seeded and deterministic. The kernel of the test
// machines has no netem, so this is how every loss, duplication, reordering and corruption
// test is made.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "aapc/nic/port.hpp"

namespace aapc::nic {

enum class Direction : std::uint8_t { kRx = 1, kTx = 2, kBoth = 3 };

struct Fault {
  double rate = 0;  // probability per frame, 0..1
  Direction direction = Direction::kBoth;
};

struct FaultOptions {
  std::uint64_t seed = 1;
  Fault drop, duplicate, reorder, corrupt, truncate;
  int reorder_depth = 3;  // a reordered frame is held back behind this many later frames
  // Parses "drop=0.01,dup=0.001,reorder=0.01:tx,corrupt=0.001:rx,truncate=0.001,seed=7".
  static FaultOptions parse(const std::string& spec);
  bool any() const;
};

struct FaultCounts {
  std::uint64_t dropped = 0, duplicated = 0, reordered = 0, corrupted = 0, truncated = 0;
  std::uint64_t total() const { return dropped + duplicated + reordered + corrupted + truncated; }
};

class FaultPort final : public PortDecorator {
 public:
  FaultPort(Port& inner, const FaultOptions& options);
  ~FaultPort() override;
  FaultPort(const FaultPort&) = delete;
  FaultPort& operator=(const FaultPort&) = delete;

  std::uint16_t rx_burst(rte_mbuf** pkts, std::uint16_t n) override;
  std::uint16_t tx_burst(rte_mbuf** pkts, std::uint16_t n) override;

  const FaultCounts& rx_counts() const { return counts_[0]; }
  const FaultCounts& tx_counts() const { return counts_[1]; }

 private:
  struct Held {
    rte_mbuf* frame;
    int after;  // released once this many later frames went by (or the line goes quiet)
  };
  struct Lane {
    std::mt19937_64 rng;
    std::deque<Held> held;
    int quiet_calls = 0;
  };
  // Applies the faults of one direction to `in`, appending the survivors to `out`.
  void apply(int lane, rte_mbuf** in, std::uint16_t n, std::vector<rte_mbuf*>& out);
  bool hits(Lane& lane, const Fault& fault, Direction dir);
  void flush_tx();

  FaultOptions options_;
  std::array<Lane, 2> lanes_;  // 0 = rx, 1 = tx
  std::array<FaultCounts, 2> counts_{};
  std::vector<rte_mbuf*> rx_ready_;
  std::deque<rte_mbuf*> tx_queue_;
  std::vector<rte_mbuf*> scratch_;
  std::vector<rte_mbuf*> tx_out_;
};

}  // namespace aapc::nic
