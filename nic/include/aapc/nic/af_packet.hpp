// DPDK's net_af_packet at a given MTU: the ring its devargs describe (framesz, blocksz,
// framecnt) and what that ring holds. Pure functions of strings and numbers; no EAL needed.
//
// DPDK 22.11's driver reports max_rx_pktlen 1518 whatever its ring holds, so an MTU above
// 1500 cannot go through rte_eth_dev_configure's rxmode.mtu; what bounds the frame is the ring:
// the kernel truncates a received frame to its ring slot, and the driver drops a frame to send
// that is longer than its slot. The slot is what these functions size.
#pragma once

#include <optional>
#include <string>

namespace aapc::nic {

// The af_packet ring: frame_size bytes per frame (a slot), block_size bytes per block (a whole
// number of frames and of pages, since the driver indexes frames as map + i * frame_size),
// frame_count frames per direction. The defaults are DPDK's (its block is a page).
struct AfPacketRing {
  unsigned frame_size = 2048;
  unsigned block_size = 4096;
  unsigned frame_count = 512;
};

// True when the device string names net_af_packet ("net_af_packet0,iface=eth0", or the
// eth_af_packet alias).
bool is_af_packet(const std::string& device);

// The value of devarg `key` in "name,k1=v1,k2=v2", if present.
std::optional<std::string> devarg(const std::string& device, const std::string& key);

// The largest MTU (bytes of Ethernet payload, VLAN tag allowed for) whose frames a ring slot of
// frame_size bytes holds whole, on receive (tpacket2 header, sockaddr_ll, alignment before the
// frame) and on send.
int af_packet_max_mtu(unsigned frame_size);

// The ring for frames of `mtu` bytes of payload on a machine with pages of page_size bytes:
// DPDK's default when its 2048-byte slot suffices (MTU up to 1964), else 256 slots: a power of
// two of them per page where a frame fits a page, else one per block of whole pages (12288
// bytes at MTU 9000 on 4 KiB pages, 16384 on 16 or 64 KiB pages).
AfPacketRing af_packet_ring(int mtu, unsigned page_size);

// The device string with framesz, blocksz and framecnt for `mtu` added when it names
// net_af_packet, sets none of them, and the MTU needs more than DPDK's default; otherwise the
// string as it is (a ring the user chose is theirs; EthPort::open checks it holds the MTU).
std::string with_af_packet_ring(const std::string& device, int mtu, unsigned page_size);

// The ring slot of an af_packet device string: its framesz, or DPDK's default.
unsigned af_packet_frame_size(const std::string& device);

// Bytes of mbuf data (headroom excluded) the driver wants for a ring slot of frame_size bytes:
// its receive queue setup refuses a pool whose mbufs are smaller.
unsigned af_packet_mbuf_data(unsigned frame_size);

}  // namespace aapc::nic
