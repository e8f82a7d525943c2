#include "aapc/nic/capture.hpp"

#include <pcap/pcap.h>
#include <rte_mbuf.h>
#include <rte_mbuf_dyn.h>

#include <cstdio>
#include <cstring>
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

namespace {
constexpr std::uint32_t kHeadersSnaplen = 64;
// pcap's on-disk record header (what pcap_dump writes before each frame).
struct RecordHeader {
  std::uint32_t sec, nsec, caplen, len;
};
// Small buffers stay in cache while the polling thread fills them.
constexpr std::size_t kBufferBytes = 128 << 10;
constexpr std::size_t kBuffersInFlight = 8;  // 1 MiB at most between the data path and the file
}  // namespace

CapturePort::CapturePort(Port& inner, const CaptureOptions& options) : PortDecorator(inner, "+capture"), snaplen_(options.snaplen) {
  if (options.snaplen < 14 || options.snaplen > 262144) throw NicError("capture: snap length must be between 14 and 262144 bytes");
  pcap_ = pcap_open_dead_with_tstamp_precision(DLT_EN10MB, options.snaplen, PCAP_TSTAMP_PRECISION_NANO);
  if (pcap_ == nullptr) throw NicError("capture: libpcap could not start a capture");
  dumper_ = pcap_dump_open(pcap_, options.path.c_str());
  if (dumper_ == nullptr) {
    std::string why = pcap_geterr(pcap_);
    pcap_close(pcap_);
    throw NicError("capture: cannot write " + options.path + ": " + why);
  }
  captured_flag();
  buffer_.resize(kBufferBytes);
  thread_ = std::thread([this] { writer(); });
}

// The wall clock, read once per burst. Traces compare the captures of different daemons on
// one clock (aapc-trace --same-clock), so the stamp must be CLOCK_REALTIME itself: a TSC
// extrapolated from an anchor drifts by the error of DPDK's TSC rate, which DPDK rounds to
// 10 MHz when it measures it (up to 2,000 ppm: 2 ms a second, and daemons anchored at
// different moments disagree by that much). Through the vDSO the call costs tens of
// nanoseconds, once per burst.
timespec CapturePort::timestamp() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return t;
}

CapturePort::~CapturePort() {
  flush();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (dumper_ != nullptr) pcap_dump_close(dumper_);
  if (pcap_ != nullptr) pcap_close(pcap_);
}

void CapturePort::write(rte_mbuf** pkts, std::uint16_t n, bool sending) {
  if (n == 0) return;  // most polls find nothing
  const timespec now = timestamp();
  const std::uint64_t flag = captured_flag();
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = pkts[i];
    if (sending) {
      if (flag != 0 && (m->ol_flags & flag) != 0) continue;  // offered before, refused, captured then
      m->ol_flags |= flag;
    } else {
      m->ol_flags &= ~flag;  // a frame sent by a tap of this process arrives with the mark
    }
    // Records go in the format pcap_dump writes, batched into large buffers.
    RecordHeader h{static_cast<std::uint32_t>(now.tv_sec), static_cast<std::uint32_t>(now.tv_nsec), 0, rte_pktmbuf_pkt_len(m)};
    h.caplen = std::min<std::uint32_t>(rte_pktmbuf_pkt_len(m), static_cast<std::uint32_t>(snaplen_));
    if (used_ + sizeof h + h.caplen > buffer_.size()) hand_over();
    std::uint8_t* out = buffer_.data() + used_;
    std::memcpy(out, &h, sizeof h);
    const auto* frame = rte_pktmbuf_mtod(m, const std::uint8_t*);
    if (h.caplen > rte_pktmbuf_data_len(m)) {
      // A chained frame (jumbo frames received in pieces, a payload sent without a copy):
      // read across its segments.
      const void* whole = rte_pktmbuf_read(m, 0, h.caplen, out + sizeof h);
      if (whole != out + sizeof h) std::memcpy(out + sizeof h, whole, h.caplen);
    } else if (h.caplen == kHeadersSnaplen) {
      std::memcpy(out + sizeof h, frame, kHeadersSnaplen);  // the common case, a fixed-size copy
    } else {
      std::memcpy(out + sizeof h, frame, h.caplen);
    }
    used_ += sizeof h + h.caplen;
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

void CapturePort::hand_over() {
  if (used_ == 0) return;
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return full_.size() < kBuffersInFlight; });  // backpressure, not loss
  buffer_.resize(used_);
  full_.push_back(std::move(buffer_));
  if (!spare_.empty()) {
    buffer_ = std::move(spare_.back());
    spare_.pop_back();
  } else {
    buffer_ = std::vector<std::uint8_t>();
  }
  buffer_.resize(std::max<std::size_t>(kBufferBytes, static_cast<std::size_t>(snaplen_) + 64));
  used_ = 0;
  lock.unlock();
  cv_.notify_all();
}

void CapturePort::writer() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !full_.empty(); });
    if (full_.empty()) return;  // stop_ and nothing left
    std::vector<std::uint8_t> chunk = std::move(full_.front());
    full_.pop_front();
    writing_ = true;
    lock.unlock();
    std::fwrite(chunk.data(), 1, chunk.size(), pcap_dump_file(dumper_));
    lock.lock();
    writing_ = false;
    spare_.push_back(std::move(chunk));
    cv_.notify_all();
  }
}

void CapturePort::flush() {
  hand_over();
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return full_.empty() && !writing_; });
  pcap_dump_flush(dumper_);
}

}  // namespace aapc::nic
