// A DPDK ethdev as a Port: a PCI NIC, or net_af_packet, net_pcap, net_ring, net_memif,
// net_tap, net_null. One rx and one tx queue, or several (PortOptions::queues), and a mempool
// of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "aapc/nic/port.hpp"

struct rte_eth_conf;
struct rte_eth_dev_info;

namespace aapc::nic {

struct PortOptions {
  // The ethdev: a name that exists ("net_ring0", made with --vdev or rte_eth_from_rings), a
  // device to probe ("net_af_packet0,iface=veth0", "net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap",
  // a PCI address "0000:03:00.0").
  std::string device;
  unsigned pool_size = 8191;  // mbufs
  // Bytes of Ethernet payload per frame. Above 1500: the NIC must take it (else open() fails
  // naming its limit); for net_af_packet the ring is sized for it (framesz, blocksz, framecnt
  // added to the device unless given) and the kernel interface's MTU must be at least this.
  int mtu = 1500;
  std::optional<MacAddr> mac;  // set this MAC on the device (otherwise keep its own)
  std::uint16_t rx_descriptors = 1024;
  std::uint16_t tx_descriptors = 1024;
  bool promiscuous = true;
  // Transmit queues, each for a thread of its own (io_lcore.hpp), and as many receive queues
  // as the device has up to this (rx_burst polls them all). net_af_packet and net_af_xdp get
  // qpairs= or queue_count= added to the device unless it gives them; a device with fewer
  // transmit queues fails to open, naming how many it has.
  std::uint16_t queues = 1;
};

// The configuration of device `name` (what rte_eth_dev_info_get says of it) for frames of
// `mtu` bytes of payload: rxmode.mtu where the device takes it (checked as the ethdev layer
// does, against max_mtu and max_rx_pktlen), else a NicError naming the device's limit;
// af_packet and memif, whose 1518-byte limit is nominal in DPDK 22.11, keep the default. For
// jumbo frames, scattered receive where offered (a NIC whose receive buffers are smaller than
// our mbufs then chains them, and the engine linearizes them) and multi-segment send.
void configure_for_mtu(const std::string& name, const rte_eth_dev_info& info, int mtu, rte_eth_conf& conf);

// The pool EthPort::open gives `device` (port id `port`): `size` mbufs that each hold a whole
// frame of the MTU (and, for af_packet, a whole ring slot, which its receive queue setup
// insists on); for net_af_xdp laid end to end, as the UMEM it becomes assumes. Pools outlive
// ports: the same one again for the same port id and frame size. Throws NicError.
rte_mempool* frame_pool(const std::string& device, std::uint16_t port, int mtu, unsigned size);

class EthPort final : public Port {
 public:
  // Probes (if needed), configures and starts the device. Throws NicError.
  static std::unique_ptr<EthPort> open(const PortOptions& options);
  ~EthPort() override;
  EthPort(const EthPort&) = delete;
  EthPort& operator=(const EthPort&) = delete;

  std::uint16_t rx_burst(rte_mbuf** pkts, std::uint16_t n) override;
  std::uint16_t tx_burst(rte_mbuf** pkts, std::uint16_t n) override;
  std::uint16_t tx_queue_count() const override { return tx_queues_; }
  std::uint16_t tx_burst_on(std::uint16_t queue, rte_mbuf** pkts, std::uint16_t n) override;
  std::uint16_t rx_queue_count() const { return rx_queues_; }
  rte_mempool* pool() const override { return pool_; }
  MacAddr mac() const override { return mac_; }
  int mtu() const override { return mtu_; }
  std::uint64_t link_speed_bps() const override;
  std::string name() const override { return name_; }
  // net_af_packet and net_af_xdp: their socket, which polls readable when its receive ring
  // holds frames; -1 with several receive queues (a socket each: wait_fds()).
  int wait_fd() const override { return wait_fds_.size() == 1 ? wait_fds_.front() : -1; }
  std::vector<int> wait_fds() const override { return wait_fds_; }
  // Software devices that read chained frames segment by segment (net_ring hands the mbufs
  // over as they are; af_packet copies each segment): see zero_copy_driver().
  bool zero_copy_tx() const override { return zero_copy_tx_; }
  bool directions_apart() const override { return true; }  // rx and tx queues apart
  std::uint16_t port_id() const { return port_id_; }
  const std::string& driver() const { return driver_; }  // "net_af_xdp", "net_ice", ...

  // Statistics as the device counts them.
  struct DeviceStats {
    std::uint64_t rx_frames = 0, tx_frames = 0, rx_missed = 0, rx_errors = 0, tx_errors = 0;
  };
  DeviceStats device_stats() const;

 private:
  EthPort() = default;
  std::uint16_t port_id_ = 0;
  std::string name_;
  std::string driver_;
  rte_mempool* pool_ = nullptr;
  MacAddr mac_{};
  int mtu_ = 1500;
  std::vector<int> wait_fds_;
  bool zero_copy_tx_ = false;
  std::uint16_t rx_queues_ = 1, tx_queues_ = 1;
  std::uint16_t rx_next_ = 0;  // the receive queue polled first next time
};

// How a kernel interface (aapcd --iface) is reached: AF_XDP (net_af_xdp: the kernel hands
// frames to a ring in our memory, no socket buffer on the way) where it can be, else
// net_af_packet. docs/design.md, "Fast links", says why AF_XDP comes first.
enum class IfaceDriver { kAuto, kAfXdp, kAfPacket };
std::optional<IfaceDriver> parse_iface_driver(const std::string& name);  // auto, af_xdp, af_packet
const char* iface_driver_name(IfaceDriver driver);

// The DPDK device string that opens kernel interface `iface` through `driver` (not kAuto),
// with `queues` queue pairs.
std::string iface_device(const std::string& iface, IfaceDriver driver, std::uint16_t queues = 1);

// `device` with `queues` queue pairs asked of net_af_packet (qpairs=) and net_af_xdp
// (queue_count=) unless it names them; other devices as they are.
std::string with_queues(const std::string& device, std::uint16_t queues);

struct IfacePort {
  std::unique_ptr<EthPort> port;
  std::string device;       // the device string that opened it
  IfaceDriver driver;       // kAfXdp or kAfPacket
  std::string passed_over;  // kAuto fell back to af_packet: why AF_XDP could not open it
};

// Opens kernel interface `iface` (options.device is ignored). kAuto: AF_XDP, and net_af_packet
// where AF_XDP cannot open it (no driver or no XDP for the interface, an MTU beyond AF_XDP's
// page-sized frames). Throws NicError when no driver asked for can open it.
IfacePort open_iface(const std::string& iface, IfaceDriver driver, PortOptions options);

// A memif device string whose buffers hold a whole frame of the MTU (bsize added unless
// given). Frames chained over memif's default 2,048-byte buffers arrived broken at MTU 9000
// (DPDK 22.11, aapc-engine-bench --memif: millions dropped as bad_length).
std::string with_memif_buffers(const std::string& device, int mtu);

// Drivers that may send frames whose payload is an external buffer in the sender's memory:
// software devices without DMA (a PCI NIC would need the memory registered and mapped for
// DMA, which is not done), net_ring always, af_packet where it offers multi-segment send.
bool zero_copy_driver(const std::string& driver, std::uint64_t tx_offload_capa);

}  // namespace aapc::nic
