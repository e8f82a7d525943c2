// A capture tap: every frame sent and received through a port, written to a pcap file with
// nanosecond timestamps through libpcap. Off unless a port is wrapped in one.
#pragma once

#include <cstdint>
#include <string>

#include "aapc/nic/port.hpp"

struct pcap;
struct pcap_dumper;

namespace aapc::nic {

struct CaptureOptions {
  std::string path;
  int snaplen = 65535;  // bytes kept of each frame; 128 keeps the headers
};

class CapturePort final : public Port {
 public:
  // Opens (truncates) the file; throws NicError when it cannot.
  CapturePort(Port& inner, const CaptureOptions& options);
  ~CapturePort() override;
  CapturePort(const CapturePort&) = delete;
  CapturePort& operator=(const CapturePort&) = delete;

  std::uint16_t rx_burst(rte_mbuf** pkts, std::uint16_t n) override;
  std::uint16_t tx_burst(rte_mbuf** pkts, std::uint16_t n) override;
  rte_mempool* pool() const override { return inner_.pool(); }
  MacAddr mac() const override { return inner_.mac(); }
  int mtu() const override { return inner_.mtu(); }
  std::uint64_t link_speed_bps() const override { return inner_.link_speed_bps(); }
  std::string name() const override { return inner_.name() + "+capture"; }

  std::uint64_t frames_captured() const { return captured_; }
  void flush();

 private:
  void write(rte_mbuf** pkts, std::uint16_t n, bool sending);

  Port& inner_;
  pcap* pcap_ = nullptr;
  pcap_dumper* dumper_ = nullptr;
  int snaplen_;
  std::uint64_t captured_ = 0;
};

}  // namespace aapc::nic
