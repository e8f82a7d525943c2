// Ports at an MTU, without a device: the af_packet devargs EthPort derives must be ones the
// kernel (packet_set_ring) and DPDK 22.11's driver accept and hold whole frames of the MTU; a
// device's configuration follows what it says it takes.
#include <catch2/catch.hpp>
#include <linux/if_packet.h>
#include <rte_ethdev.h>

#include <string>

#include "aapc/nic/af_packet.hpp"
#include "aapc/nic/eth_port.hpp"

using namespace aapc::nic;

namespace {

// What the kernel's packet_set_ring and DPDK's rte_eth_from_packet/rx_queue_setup demand of a
// ring, for frames of `mtu` bytes of payload (and a VLAN tag) received whole.
void check_valid(const AfPacketRing& r, int mtu, unsigned page) {
  INFO("mtu " << mtu << ", page " << page << ": framesz " << r.frame_size << " blocksz " << r.block_size << " framecnt " << r.frame_count);
  CHECK(r.block_size % page == 0);               // kernel: PAGE_ALIGNED(tp_block_size)
  CHECK(r.frame_size % TPACKET_ALIGNMENT == 0);  // kernel
  CHECK(r.frame_size >= TPACKET2_HDRLEN);        // kernel: tp_frame_size >= tp_hdrlen
  REQUIRE(r.frame_size <= r.block_size);         // DPDK: frame size exceeds block size
  // DPDK finds frame i at map + i * framesz: frames must tile blocks with no gap.
  CHECK(r.block_size % r.frame_size == 0);
  const unsigned per_block = r.block_size / r.frame_size;
  CHECK(r.frame_count % per_block == 0);  // kernel: frames_per_block * tp_block_nr == tp_frame_nr
  CHECK(r.frame_count / per_block > 0);   // DPDK: blockcount
  // tpacket_rcv puts the Ethernet header's end at TPACKET_ALIGN(TPACKET2_HDRLEN + 16) and cuts
  // what does not fit the slot.
  CHECK(TPACKET_ALIGN(TPACKET2_HDRLEN + 16) + static_cast<unsigned>(mtu) + 4 <= r.frame_size);
  CHECK(af_packet_max_mtu(r.frame_size) >= mtu);
  // The driver sends frames up to the slot less its tpacket2 header.
  CHECK(af_packet_mbuf_data(r.frame_size) >= static_cast<unsigned>(mtu) + 14);
  CHECK(af_packet_mbuf_data(r.frame_size) + 128 <= 65535);  // an mbuf's data room is 16 bits
}

}  // namespace

TEST_CASE("af_packet ring for MTU 9000: valid, and a 9014-byte frame fits its slot") {
  const AfPacketRing r = af_packet_ring(9000, 4096);
  check_valid(r, 9000, 4096);
  CHECK(r.frame_size == 12288);
  CHECK(r.block_size == 12288);
  CHECK(r.frame_count == 256);
  // DPDK's default slot would cut the frame: the failure this ring is for.
  CHECK(af_packet_max_mtu(AfPacketRing{}.frame_size) < 9000);
}

TEST_CASE("af_packet ring: valid for every MTU a topology may have, on 4K, 16K and 64K pages") {
  for (unsigned page : {4096U, 16384U, 65536U})
    for (int mtu = 256; mtu <= 9216; mtu += 37) check_valid(af_packet_ring(mtu, page), mtu, page);
}

TEST_CASE("af_packet ring: DPDK's default up to where its 2048-byte slot holds the frame") {
  CHECK(af_packet_ring(1500, 4096).frame_size == 2048);
  CHECK(af_packet_ring(1500, 4096).frame_count == 512);
  CHECK(af_packet_ring(af_packet_max_mtu(2048), 4096).frame_size == 2048);
  CHECK(af_packet_ring(af_packet_max_mtu(2048) + 1, 4096).frame_size == 4096);
}

TEST_CASE("af_packet devargs derived from the MTU") {
  const std::string dev = "net_af_packet0,iface=aapc0,qdisc_bypass=0";
  CHECK(with_af_packet_ring(dev, 1500, 4096) == dev);
  const std::string jumbo = with_af_packet_ring(dev, 9000, 4096);
  CHECK(jumbo == dev + ",framesz=12288,blocksz=12288,framecnt=256");
  CHECK(devarg(jumbo, "framesz") == "12288");
  CHECK(devarg(jumbo, "blocksz") == "12288");
  CHECK(devarg(jumbo, "framecnt") == "256");
  CHECK(devarg(jumbo, "iface") == "aapc0");
  CHECK(af_packet_frame_size(jumbo) == 12288);
  CHECK(af_packet_frame_size(dev) == 2048);
  // A ring the user sized is left alone (EthPort::open then checks that it holds the MTU).
  const std::string own = "net_af_packet0,iface=eth1,framesz=4096";
  CHECK(with_af_packet_ring(own, 9000, 4096) == own);
  CHECK(af_packet_max_mtu(af_packet_frame_size(own)) < 9000);
  // Other devices are not af_packet's business.
  CHECK(with_af_packet_ring("net_ring0", 9000, 4096) == "net_ring0");
  CHECK(with_af_packet_ring("0000:03:00.0", 9000, 4096) == "0000:03:00.0");
  CHECK(is_af_packet("eth_af_packet1,iface=x"));
}

TEST_CASE("devarg parsing") {
  CHECK(devarg("net_x0", "iface") == std::nullopt);
  CHECK(devarg("net_x0,iface=", "iface") == "");
  CHECK(devarg("net_x0,ifacex=a,iface=b", "iface") == "b");
  CHECK(devarg("net_x0,xiface=a", "iface") == std::nullopt);
}

// configure_for_mtu, with device information as drivers report it (no device needed).
namespace {

rte_eth_dev_info device(const char* driver, std::uint16_t max_mtu, std::uint32_t max_rx_pktlen, std::uint64_t rx_capa = 0,
                        std::uint64_t tx_capa = 0) {
  rte_eth_dev_info info{};
  info.driver_name = driver;
  info.min_mtu = 68;
  info.max_mtu = max_mtu;
  info.max_rx_pktlen = max_rx_pktlen;
  info.rx_offload_capa = rx_capa;
  info.tx_offload_capa = tx_capa;
  return info;
}

}  // namespace

TEST_CASE("a NIC that cannot take the MTU is refused, naming its limit") {
  rte_eth_conf conf{};
  auto small = device("net_e1000_em", 1500, 1518);
  CHECK_THROWS_WITH(configure_for_mtu("0000:03:00.0", small, 9000, conf),
                    Catch::Contains("net_e1000_em") && Catch::Contains("takes an MTU of at most 1500") && Catch::Contains("mtu 9000"));
  configure_for_mtu("0000:03:00.0", small, 1500, conf);
  CHECK(conf.rxmode.mtu == 1500);
  // A limit in max_rx_pktlen only (max_mtu left at UINT16_MAX): 18 bytes of Ethernet overhead.
  auto pktlen = device("net_x", UINT16_MAX, 9000);
  CHECK_THROWS_WITH(configure_for_mtu("p", pktlen, 9000, conf), Catch::Contains("at most 8982"));
}

TEST_CASE("a jumbo NIC gets the MTU, scattered receive and multi-segment send where offered") {
  rte_eth_conf conf{};
  auto jumbo = device("net_ixgbe", 9702, 9728, RTE_ETH_RX_OFFLOAD_SCATTER, RTE_ETH_TX_OFFLOAD_MULTI_SEGS);
  configure_for_mtu("0000:03:00.0", jumbo, 9000, conf);
  CHECK(conf.rxmode.mtu == 9000);
  CHECK((conf.rxmode.offloads & RTE_ETH_RX_OFFLOAD_SCATTER) != 0);
  CHECK((conf.txmode.offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0);
  configure_for_mtu("0000:03:00.0", jumbo, 1500, conf);  // standard frames: no offloads asked
  CHECK(conf.rxmode.mtu == 1500);
  CHECK(conf.rxmode.offloads == 0);
  CHECK(conf.txmode.offloads == 0);
  auto plain = device("net_virtio", 9702, 9728);  // offers neither: asks for neither
  configure_for_mtu("p", plain, 9000, conf);
  CHECK(conf.rxmode.mtu == 9000);
  CHECK(conf.rxmode.offloads == 0);
  CHECK(conf.txmode.offloads == 0);
}

TEST_CASE("af_packet's and memif's nominal 1518-byte limit does not stop jumbo frames") {
  rte_eth_conf conf{};
  for (const char* driver : {"net_af_packet", "net_memif"}) {
    INFO(driver);
    CHECK_NOTHROW(configure_for_mtu("p", device(driver, UINT16_MAX, 1518), 9000, conf));
    CHECK(conf.rxmode.mtu == 0);  // the ethdev default (1500), which their limit allows
  }
}

TEST_CASE("payloads are attached without a copy on net_ring and af_packet, not on memif or a PCI NIC") {
  const std::uint64_t segs = RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
  CHECK(zero_copy_driver("net_ring", 0));
  CHECK(zero_copy_driver("net_af_packet", segs));
  CHECK_FALSE(zero_copy_driver("net_af_packet", 0));
  // memif broke frames whose attached payload spans its buffers (aapc-engine-bench --memif).
  CHECK_FALSE(zero_copy_driver("net_memif", segs));
  CHECK_FALSE(zero_copy_driver("net_ice", segs));  // would need the memory mapped for DMA
}

TEST_CASE("memif gets buffers that hold a whole frame of the MTU, unless its device string sizes them") {
  CHECK(with_memif_buffers("net_memif0,role=server", 1500) == "net_memif0,role=server");
  CHECK(with_memif_buffers("net_memif0,role=server", 9000) == "net_memif0,role=server,bsize=9216");
  CHECK(with_memif_buffers("net_memif0,bsize=16384", 9000) == "net_memif0,bsize=16384");
  CHECK(with_memif_buffers("net_af_packet0,iface=x", 9000) == "net_af_packet0,iface=x");
}
