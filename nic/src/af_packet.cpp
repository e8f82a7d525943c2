#include "aapc/nic/af_packet.hpp"

#include <linux/if_packet.h>

#include <algorithm>
#include <bit>

namespace aapc::nic {

namespace {

// Where the kernel puts a received frame in its slot (tpacket_rcv): the Ethernet header ends
// at TPACKET_ALIGN(tp_hdrlen + 16), tp_hdrlen being TPACKET2_HDRLEN for TPACKET_V2, DPDK's.
constexpr unsigned kRxFrameEnd = TPACKET_ALIGN(TPACKET2_HDRLEN + 16);
constexpr unsigned kVlanTag = 4;  // a tag the NIC leaves in the frame
// What the driver keeps of a slot for frame data: the slot less the tpacket2 header.
constexpr unsigned kSlotHeader = TPACKET2_HDRLEN - sizeof(sockaddr_ll);
constexpr unsigned kJumboFrameCount = 256;  // at MTU 9000: 2.3 MB of frames, 3 MiB of ring each way

unsigned round_up(unsigned n, unsigned to) { return (n + to - 1) / to * to; }

}  // namespace

bool is_af_packet(const std::string& device) { return device.rfind("net_af_packet", 0) == 0 || device.rfind("eth_af_packet", 0) == 0; }

std::optional<std::string> devarg(const std::string& device, const std::string& key) {
  std::size_t at = device.find(',');
  while (at != std::string::npos) {
    const std::size_t start = at + 1;
    at = device.find(',', start);
    const std::string kv = device.substr(start, at == std::string::npos ? std::string::npos : at - start);
    if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=') return kv.substr(key.size() + 1);
  }
  return std::nullopt;
}

int af_packet_max_mtu(unsigned frame_size) {
  return frame_size > kRxFrameEnd + kVlanTag ? static_cast<int>(frame_size - kRxFrameEnd - kVlanTag) : 0;
}

AfPacketRing af_packet_ring(int mtu, unsigned page_size) {
  AfPacketRing ring;
  ring.block_size = page_size;  // DPDK's default: a page
  if (mtu <= af_packet_max_mtu(ring.frame_size)) return ring;
  // Frames tile blocks, blocks are whole pages: a power of two within a page (pages are powers
  // of two), whole pages beyond one.
  const unsigned need = kRxFrameEnd + kVlanTag + static_cast<unsigned>(std::max(mtu, 0));
  if (need <= page_size) {
    ring.frame_size = std::bit_ceil(need);
  } else {
    ring.frame_size = round_up(need, page_size);
    ring.block_size = ring.frame_size;
  }
  ring.frame_count = kJumboFrameCount;
  return ring;
}

std::string with_af_packet_ring(const std::string& device, int mtu, unsigned page_size) {
  if (!is_af_packet(device) || devarg(device, "framesz") || devarg(device, "blocksz") || devarg(device, "framecnt")) return device;
  const AfPacketRing ring = af_packet_ring(mtu, page_size);
  if (ring.frame_size == AfPacketRing{}.frame_size) return device;
  return device + ",framesz=" + std::to_string(ring.frame_size) + ",blocksz=" + std::to_string(ring.block_size) +
         ",framecnt=" + std::to_string(ring.frame_count);
}

unsigned af_packet_frame_size(const std::string& device) {
  if (auto v = devarg(device, "framesz")) {
    try {
      return static_cast<unsigned>(std::stoul(*v));
    } catch (const std::exception&) {
      return 0;  // the driver refuses it too
    }
  }
  return AfPacketRing{}.frame_size;
}

unsigned af_packet_mbuf_data(unsigned frame_size) { return frame_size > kSlotHeader ? frame_size - kSlotHeader : 0; }

}  // namespace aapc::nic
