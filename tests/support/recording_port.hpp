// A port that keeps every frame it is given to send, whole (chained mbufs read in one piece),
// and receives nothing: a test sees exactly what went out (the fault injector's survivors, the
// zero-copy frames' bytes).
#pragma once

#include <rte_mbuf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "aapc/nic/port.hpp"

namespace aapc::test {

// A frame's bytes in one piece, however many mbufs it is chained from.
inline std::vector<std::uint8_t> frame_bytes(const rte_mbuf* m) {
  std::vector<std::uint8_t> f(rte_pktmbuf_pkt_len(m));
  const void* p = rte_pktmbuf_read(m, 0, static_cast<std::uint32_t>(f.size()), f.data());
  if (p != f.data()) std::memcpy(f.data(), p, f.size());
  return f;
}

class RecordingPort final : public nic::Port {
 public:
  explicit RecordingPort(rte_mempool* pool) : pool_(pool) {}
  std::uint16_t rx_burst(rte_mbuf**, std::uint16_t) override { return 0; }
  std::uint16_t tx_burst(rte_mbuf** pkts, std::uint16_t n) override {
    for (std::uint16_t i = 0; i < n; ++i) {
      frames.push_back(frame_bytes(pkts[i]));
      rte_pktmbuf_free(pkts[i]);
    }
    return n;
  }
  rte_mempool* pool() const override { return pool_; }
  nic::MacAddr mac() const override { return {}; }
  int mtu() const override { return 1500; }
  std::uint64_t link_speed_bps() const override { return 0; }
  std::string name() const override { return "recorder"; }
  std::vector<std::vector<std::uint8_t>> frames;

 private:
  rte_mempool* pool_;
};

}  // namespace aapc::test
