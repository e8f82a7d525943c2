// A capture tap: every frame sent and received through a port, written to a pcap file with
// nanosecond timestamps through libpcap. Off unless a port is wrapped in one.
//
// The polling thread only copies records into a buffer; a writer thread of the tap's own
// writes full buffers to the file, so the file system's cost stays off the data path. When
// the writer falls behind, the polling thread waits: no frame goes unrecorded.
#pragma once

#include <cstdint>
#include <ctime>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "aapc/nic/port.hpp"

struct pcap;
struct pcap_dumper;

namespace aapc::nic {

struct CaptureOptions {
  std::string path;
  // Bytes kept of each frame. The default keeps the Ethernet and aapc headers (58 bytes),
  // all that traces need; 65535 keeps whole frames, at about 2.6 times the engine's work at
  // 10 Gbit/s, since every byte is written a second time.
  int snaplen = 64;
};

class CapturePort final : public PortDecorator {
 public:
  // Opens (truncates) the file; throws NicError when it cannot.
  CapturePort(Port& inner, const CaptureOptions& options);
  ~CapturePort() override;
  CapturePort(const CapturePort&) = delete;
  CapturePort& operator=(const CapturePort&) = delete;

  std::uint16_t rx_burst(rte_mbuf** pkts, std::uint16_t n) override;
  std::uint16_t tx_burst(rte_mbuf** pkts, std::uint16_t n) override;

  std::uint64_t frames_captured() const { return captured_; }
  // Writes out everything recorded so far and waits until it is in the file (also done when
  // the tap is destroyed).
  void flush();

 private:
  void write(rte_mbuf** pkts, std::uint16_t n, bool sending);
  void hand_over();  // passes the current buffer to the writer
  static timespec timestamp();
  void writer();

  pcap* pcap_ = nullptr;
  pcap_dumper* dumper_ = nullptr;
  int snaplen_;
  std::uint64_t captured_ = 0;
  std::vector<std::uint8_t> buffer_;  // being filled by the polling thread
  std::size_t used_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::vector<std::uint8_t>> full_;   // waiting for the writer
  std::vector<std::vector<std::uint8_t>> spare_;  // written, ready to refill
  bool writing_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace aapc::nic
