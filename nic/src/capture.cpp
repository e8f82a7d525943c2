#include "aapc/nic/capture.hpp"

#include <pcap/pcap.h>
#include <rte_mbuf.h>
#include <rte_mbuf_dyn.h>

#include <ctime>

namespace aapc::nic {
namespace {

// A frame offered for sending but refused (backpressure) is offered again later; this flag
// keeps it from being captured twice.
std::uint64_t captured_flag() {
  static const std::uint64_t flag = [] {
    rte_mbuf_dynflag desc{};
    snprintf(desc.name, sizeof desc.name, "%s", "aapc_captured");
    int bit = rte_mbuf_dynflag_register(&desc);
    return bit < 0 ? 0ULL : (1ULL << bit);
  }();
  return flag;
}

}  // namespace

CapturePort::CapturePort(Port& inner, const CaptureOptions& options) : inner_(inner), snaplen_(options.snaplen) {
  pcap_ = pcap_open_dead_with_tstamp_precision(DLT_EN10MB, options.snaplen, PCAP_TSTAMP_PRECISION_NANO);
  if (pcap_ == nullptr) throw NicError("capture: libpcap could not start a capture");
  dumper_ = pcap_dump_open(pcap_, options.path.c_str());
  if (dumper_ == nullptr) {
    std::string why = pcap_geterr(pcap_);
    pcap_close(pcap_);
    throw NicError("capture: cannot write " + options.path + ": " + why);
  }
  captured_flag();
}

CapturePort::~CapturePort() {
  if (dumper_ != nullptr) pcap_dump_close(dumper_);
  if (pcap_ != nullptr) pcap_close(pcap_);
}

void CapturePort::write(rte_mbuf** pkts, std::uint16_t n, bool sending) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const std::uint64_t flag = captured_flag();
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = pkts[i];
    if (sending) {
      if (flag != 0 && (m->ol_flags & flag) != 0) continue;  // offered before, refused, captured then
      m->ol_flags |= flag;
    } else {
      m->ol_flags &= ~flag;  // a frame sent by a tap of this process arrives with the mark
    }
    pcap_pkthdr h{};
    h.ts.tv_sec = now.tv_sec;
    h.ts.tv_usec = now.tv_nsec;  // nanoseconds: the file is opened with nanosecond precision
    h.len = rte_pktmbuf_pkt_len(m);
    h.caplen = std::min<std::uint32_t>(rte_pktmbuf_data_len(m), static_cast<std::uint32_t>(snaplen_));
    pcap_dump(reinterpret_cast<u_char*>(dumper_), &h, rte_pktmbuf_mtod(m, const u_char*));
    ++captured_;
  }
}

std::uint16_t CapturePort::rx_burst(rte_mbuf** pkts, std::uint16_t n) {
  std::uint16_t got = inner_.rx_burst(pkts, n);
  write(pkts, got, false);
  return got;
}

std::uint16_t CapturePort::tx_burst(rte_mbuf** pkts, std::uint16_t n) {
  write(pkts, n, true);
  return inner_.tx_burst(pkts, n);
}

void CapturePort::flush() { pcap_dump_flush(dumper_); }

}  // namespace aapc::nic
