#include "aapc/nic/eth_port.hpp"

#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <set>

#include "aapc/nic/af_packet.hpp"
#include "aapc/nic/eal.hpp"

namespace aapc::nic {

extern const unsigned char kAapcXdpObject[];  // nic/bpf/aapc_xdp.c, compiled (aapc_xdp_object.cpp)
extern const std::size_t kAapcXdpObject_size;

std::string mac_string(const MacAddr& mac) {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
  return buf;
}

namespace {

[[noreturn]] void fail(const std::string& device, const std::string& step, int rc) {
  throw NicError("port " + device + ": " + step + " failed: " + rte_strerror(rc < 0 ? -rc : rc));
}

// "net_af_packet0,iface=veth0" -> "net_af_packet0"
std::string device_name(const std::string& device) { return device.substr(0, device.find(',')); }

// The sockets of this process of address family `domain`: AF_PACKET (DPDK's af_packet driver
// opens one per queue pair), AF_XDP (net_af_xdp, one per queue).
std::set<int> sockets_of(int domain) {
  std::set<int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(e.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    int have = 0;
    socklen_t len = sizeof have;
    if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &have, &len) == 0 && have == domain) out.insert(fd);
  }
  return out;
}

// The sockets in `now` that are not in `before`, or the only one there is.
std::vector<int> fresh_sockets(const std::set<int>& before, const std::set<int>& now) {
  std::vector<int> fresh;
  std::set_difference(now.begin(), now.end(), before.begin(), before.end(), std::back_inserter(fresh));
  if (fresh.empty() && now.size() == 1) fresh.push_back(*now.begin());
  return fresh;
}

// Interface request `request` on kernel interface `iface` (named in `ifr`, which carries the
// answer), through a socket of its own; 0, or the errno it failed with.
int interface_ioctl(const std::string& iface, unsigned long request, ifreq& ifr) {
  const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (s < 0) return errno;
  iface.copy(ifr.ifr_name, sizeof ifr.ifr_name - 1);
  const int err = ::ioctl(s, request, &ifr) == 0 ? 0 : errno;
  ::close(s);
  return err;
}

// The MTU of kernel interface `iface`, or -1 when it cannot be read (no such interface: the
// probe says so).
int interface_mtu(const std::string& iface) {
  ifreq ifr{};
  return interface_ioctl(iface, SIOCGIFMTU, ifr) == 0 ? ifr.ifr_mtu : -1;
}

// How many queues an AF_XDP socket may bind to on kernel interface `iface`: its combined
// channels (ethtool -l), or one where it has none (veth, for one), as DPDK's net_af_xdp counts
// them; -1 when that cannot be read.
int interface_queues(const std::string& iface) {
  ethtool_channels channels{};
  channels.cmd = ETHTOOL_GCHANNELS;
  ifreq ifr{};
  ifr.ifr_data = reinterpret_cast<char*>(&channels);
  if (const int err = interface_ioctl(iface, SIOCETHTOOL, ifr); err != 0) return err == EOPNOTSUPP ? 1 : -1;
  return channels.max_combined == 0 ? 1 : static_cast<int>(channels.max_combined);
}

// net_af_packet: its ring slot and the kernel interface under it must both take frames of the
// MTU, or frames are cut short on receive and dropped on send without a word.
void check_af_packet(const std::string& device, const std::string& name, int mtu) {
  const unsigned slot = af_packet_frame_size(device);
  if (af_packet_max_mtu(slot) < mtu)
    throw NicError("port " + name + ": its ring slots (framesz=" + std::to_string(slot) + ") hold frames of an MTU up to " +
                   std::to_string(af_packet_max_mtu(slot)) + ", less than the MTU " + std::to_string(mtu) +
                   "; leave framesz, blocksz and framecnt out of the device to have them sized for the MTU");
  const std::string iface = devarg(device, "iface").value_or("");
  if (const int have = interface_mtu(iface); have >= 0 && have < mtu)
    throw NicError("port " + name + ": interface " + iface + " has MTU " + std::to_string(have) + ", less than the MTU " +
                   std::to_string(mtu) + " of the topology; raise it (ip link set " + iface + " mtu " + std::to_string(mtu) +
                   ", and on the switch ports) or lower the topology's mtu");
}

// Software drivers that report a nominal 1518-byte frame limit (DPDK 22.11) but take whatever
// their ring or buffers hold: af_packet (checked by check_af_packet) and memif (it chains
// buffers, and the engine linearizes chained frames).
bool nominal_frame_limit(const std::string& driver) { return driver == "net_af_packet" || driver == "net_memif"; }

bool is_af_xdp(const std::string& device) { return device.rfind("net_af_xdp", 0) == 0; }

// A pool of mbufs laid end to end, none moved to the start of a page. net_af_xdp hands the
// pool's memory to the kernel as the AF_XDP socket's UMEM, sized as if its objects were
// packed (mbufs x object size, DPDK 22.11). A default pool keeps objects from crossing page
// boundaries: without hugepages, on 4 KiB pages, each 2,368-byte mbuf then takes a page of its
// own, and every mbuf past the first ~58% lies outside the UMEM. The kernel refuses those as
// invalid descriptors: frames sent from them never leave, and the fill queue loses each one
// given to it, until the port receives nothing (seen once mbufs cycle through the whole pool,
// as with separate receive and send lcores). AF_XDP reads virtual addresses, so the pool
// needs no IOVA-contiguous objects. nullptr (rte_errno set) where it cannot be made.
rte_mempool* packed_pool(const std::string& name, unsigned size, std::uint16_t data_room) {
  rte_pktmbuf_pool_private priv{};
  priv.mbuf_data_room_size = data_room;
  rte_mempool* pool = rte_mempool_create_empty(name.c_str(), size, sizeof(rte_mbuf) + data_room, 256, sizeof priv,
                                               static_cast<int>(rte_socket_id()), RTE_MEMPOOL_F_NO_IOVA_CONTIG);
  if (pool == nullptr) return nullptr;
  if (rte_mempool_set_ops_byname(pool, rte_mbuf_best_mempool_ops(), nullptr) != 0) {
    rte_mempool_free(pool);
    return nullptr;
  }
  rte_pktmbuf_pool_init(pool, &priv);
  if (const int rc = rte_mempool_populate_default(pool); rc < 0) {
    rte_mempool_free(pool);
    rte_errno = -rc;
    return nullptr;
  }
  rte_mempool_obj_iter(pool, rte_pktmbuf_init, nullptr);
  return pool;
}

}  // namespace

rte_mempool* frame_pool(const std::string& device, std::uint16_t port, int mtu, unsigned pool_size) {
  unsigned data_room = static_cast<unsigned>(mtu) + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN + RTE_PKTMBUF_HEADROOM + 64;
  if (is_af_packet(device)) data_room = std::max(data_room, af_packet_mbuf_data(af_packet_frame_size(device)) + RTE_PKTMBUF_HEADROOM);
  data_room = std::max<unsigned>(data_room, RTE_MBUF_DEFAULT_BUF_SIZE);
  if (data_room > UINT16_MAX) throw NicError("port " + device + ": frames of MTU " + std::to_string(mtu) + " do not fit an mbuf");
  // Pools outlive ports: a port id used again, by a device of another MTU, needs its own pool.
  const std::string pool_name = "aapc_pool_" + std::to_string(port) + "_" + std::to_string(data_room);
  if (rte_mempool* pool = rte_mempool_lookup(pool_name.c_str()); pool != nullptr) return pool;
  rte_mempool* pool = is_af_xdp(device) ? packed_pool(pool_name, pool_size, static_cast<std::uint16_t>(data_room))
                                         : rte_pktmbuf_pool_create(pool_name.c_str(), pool_size, 256, 0, static_cast<std::uint16_t>(data_room),
                                                                   static_cast<int>(rte_socket_id()));
  if (pool == nullptr)
    throw NicError("port " + device_name(device) + ": cannot create a pool of " + std::to_string(pool_size) + " mbufs of " +
                   std::to_string(data_room) + " bytes (" + rte_strerror(rte_errno) + "); give the EAL more memory (-m) or use fewer mbufs");
  return pool;
}

void configure_for_mtu(const std::string& name, const rte_eth_dev_info& info, int mtu, rte_eth_conf& conf) {
  conf = rte_eth_conf{};
  const std::uint32_t overhead = info.max_mtu != UINT16_MAX && info.max_rx_pktlen > info.max_mtu ? info.max_rx_pktlen - info.max_mtu
                                                                                                   : RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
  const auto want = static_cast<std::uint32_t>(mtu);
  if (want >= info.min_mtu && want <= info.max_mtu && want + overhead <= info.max_rx_pktlen) {
    conf.rxmode.mtu = want;
  } else if (!nominal_frame_limit(info.driver_name)) {
    const std::uint32_t limit = std::min<std::uint32_t>(info.max_mtu, info.max_rx_pktlen > overhead ? info.max_rx_pktlen - overhead : 0);
    throw NicError("port " + name + ": the device (" + info.driver_name + ") takes an MTU of at most " + std::to_string(limit) +
                   " (frames up to " + std::to_string(info.max_rx_pktlen) + " bytes), less than the topology's mtu " +
                   std::to_string(mtu) + "; lower the topology's mtu or use a NIC that takes jumbo frames");
  }
  if (mtu > RTE_ETHER_MTU && (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_SCATTER) != 0) conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_SCATTER;
  // Chained frames are sent for jumbo frames and for payload sent without a copy.
  if ((mtu > RTE_ETHER_MTU || zero_copy_driver(info.driver_name, info.tx_offload_capa)) &&
      (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0)
    conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
}

std::string with_queues(const std::string& device, std::uint16_t queues) {
  if (queues <= 1) return device;
  const std::string n = std::to_string(queues);
  if (device.rfind("net_af_packet", 0) == 0 && !devarg(device, "qpairs")) return device + ",qpairs=" + n;
  if (device.rfind("net_af_xdp", 0) == 0 && !devarg(device, "queue_count")) return device + ",queue_count=" + n;
  return device;
}

std::string with_memif_buffers(const std::string& device, int mtu) {
  constexpr int kDefault = 2048;  // DPDK 22.11's bsize
  const int frame = mtu + static_cast<int>(RTE_ETHER_HDR_LEN);
  if (device.rfind("net_memif", 0) != 0 || devarg(device, "bsize") || frame <= kDefault) return device;
  return device + ",bsize=" + std::to_string((frame + 1023) / 1024 * 1024);
}

bool zero_copy_driver(const std::string& driver, std::uint64_t tx_offload_capa) {
  if (driver == "net_ring") return true;
  // Not memif: it copies every frame into its shared rings anyway, and attached payloads
  // arrived broken over its default buffers (aapc-engine-bench --memif at MTU 4000: 855,340
  // frames dropped as bad_length; see with_memif_buffers).
  return driver == "net_af_packet" && (tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
}

std::unique_ptr<EthPort> EthPort::open(const PortOptions& options) {
  if (!eal_running()) throw NicError("port " + options.device + ": the DPDK EAL is not running (call eal_init first)");
  if (options.queues == 0) throw NicError("port " + options.device + ": a port needs at least one queue");
  // af_packet's ring sized for the MTU, unless the device string sizes it; the queues asked for.
  const std::string device = with_queues(
      with_memif_buffers(with_af_packet_ring(options.device, options.mtu, static_cast<unsigned>(::getpagesize())), options.mtu), options.queues);
  std::string name = device_name(device);
  if (is_af_packet(device)) check_af_packet(device, name, options.mtu);
  const std::set<int> packet_before = sockets_of(AF_PACKET), xdp_before = sockets_of(AF_XDP);
  std::uint16_t port = 0;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &port) != 0) {
    int rc = rte_dev_probe(device.c_str());
    if (rc != 0)
      throw NicError("port " + device + ": no such device and probing it failed (" + rte_strerror(-rc) +
                     "); name a virtual device like net_af_packet0,iface=IFACE or a PCI address bound to a DPDK driver");
    if (rte_eth_dev_get_port_by_name(name.c_str(), &port) != 0)
      throw NicError("port " + device + ": probed, but no ethdev named " + name + " appeared");
  }

  std::unique_ptr<EthPort> p(new EthPort());
  p->port_id_ = port;
  p->name_ = name;
  p->mtu_ = options.mtu;

  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(port, &info); rc != 0) fail(name, "reading device info", rc);

  p->driver_ = info.driver_name;
  p->pool_ = frame_pool(device, port, options.mtu, options.pool_size);
  p->zero_copy_tx_ = zero_copy_driver(info.driver_name, info.tx_offload_capa);
  rte_eth_conf conf{};
  configure_for_mtu(name, info, options.mtu, conf);
  if (info.max_tx_queues < options.queues)
    throw NicError("port " + name + ": the device (" + info.driver_name + ") has " + std::to_string(info.max_tx_queues) +
                   " transmit queue(s), fewer than the " + std::to_string(options.queues) +
                   " asked for (one per sending I/O lcore); give fewer sending CPUs, or a device with more queues");
  p->tx_queues_ = options.queues;
  p->rx_queues_ = std::max<std::uint16_t>(1, std::min(options.queues, info.max_rx_queues));
  rte_eth_dev_stop(port);  // a port reopened after a failure
  if (int rc = rte_eth_dev_configure(port, p->rx_queues_, p->tx_queues_, &conf); rc != 0) fail(name, "configuring", rc);
  std::uint16_t rxd = options.rx_descriptors, txd = options.tx_descriptors;
  rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
  int socket = rte_eth_dev_socket_id(port);
  if (socket < 0) socket = static_cast<int>(rte_socket_id());
  for (std::uint16_t q = 0; q < p->rx_queues_; ++q)
    if (int rc = rte_eth_rx_queue_setup(port, q, rxd, static_cast<unsigned>(socket), nullptr, p->pool_); rc != 0) fail(name, "rx queue setup", rc);
  for (std::uint16_t q = 0; q < p->tx_queues_; ++q)
    if (int rc = rte_eth_tx_queue_setup(port, q, txd, static_cast<unsigned>(socket), nullptr); rc != 0) fail(name, "tx queue setup", rc);
  if (options.mac) {
    rte_ether_addr addr{};
    std::copy(options.mac->begin(), options.mac->end(), addr.addr_bytes);
    if (int rc = rte_eth_dev_default_mac_addr_set(port, &addr); rc != 0 && rc != -ENOTSUP) fail(name, "setting the MAC address", rc);
  }
  if (int rc = rte_eth_dev_start(port); rc != 0) fail(name, "starting", rc);
  if (options.promiscuous) rte_eth_promiscuous_enable(port);  // not every device can; that is fine
  rte_ether_addr addr{};
  rte_eth_macaddr_get(port, &addr);
  std::copy(std::begin(addr.addr_bytes), std::end(addr.addr_bytes), p->mac_.begin());
  if (options.mac) p->mac_ = *options.mac;  // devices that cannot change MAC still send ours
  // net_af_packet and net_af_xdp: the sockets this port opened, one per queue pair (or the
  // only one there is, when the EAL probed it). af_packet's mmap'ed receive ring, and an
  // AF_XDP socket's receive ring, make poll(2) report POLLIN while a frame waits for the
  // driver, so an idle daemon (or I/O lcore) can sleep until one arrives.
  const std::string driver = info.driver_name;
  if (driver == "net_af_packet") p->wait_fds_ = fresh_sockets(packet_before, sockets_of(AF_PACKET));
  if (driver == "net_af_xdp") p->wait_fds_ = fresh_sockets(xdp_before, sockets_of(AF_XDP));
  // A socket per queue pair; anything else (another port opened meanwhile) is not ours to sleep on.
  if (p->wait_fds_.size() != std::max(p->rx_queues_, p->tx_queues_)) p->wait_fds_.clear();
  return p;
}

std::optional<IfaceDriver> parse_iface_driver(const std::string& name) {
  for (IfaceDriver d : {IfaceDriver::kAuto, IfaceDriver::kAfXdp, IfaceDriver::kAfPacket})
    if (name == iface_driver_name(d)) return d;
  return std::nullopt;
}

const char* iface_driver_name(IfaceDriver driver) {
  switch (driver) {
    case IfaceDriver::kAfXdp:
      return "af_xdp";
    case IfaceDriver::kAfPacket:
      return "af_packet";
    case IfaceDriver::kAuto:
      break;
  }
  return "auto";
}

std::string iface_device(const std::string& iface, IfaceDriver driver, std::uint16_t queues) {
  // busy_budget=0: no preferred busy polling, which costs a system call on every receive
  // poll of an idle port; the engine polls often enough.
  if (driver == IfaceDriver::kAfXdp)
    return "net_af_xdp0,iface=" + iface + ",start_queue=0,queue_count=" + std::to_string(std::max<std::uint16_t>(queues, 1)) + ",busy_budget=0";
  return with_queues("net_af_packet0,iface=" + iface, queues);
}

namespace {

// Our XDP program (nic/bpf/aapc_xdp.c) in a memory file, named by a path the driver can open
// while the file is held.
class XdpProgramFile {
 public:
  XdpProgramFile() : fd_(::memfd_create("aapc_xdp.o", MFD_CLOEXEC)) {
    if (fd_ >= 0 && ::write(fd_, kAapcXdpObject, kAapcXdpObject_size) == static_cast<ssize_t>(kAapcXdpObject_size)) return;
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw NicError("cannot hold the XDP program in a memory file: " + why);
  }
  ~XdpProgramFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  XdpProgramFile(const XdpProgramFile&) = delete;
  XdpProgramFile& operator=(const XdpProgramFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// Removes a virtual device that was probed but could not be opened, so that nothing of it
// (an XDP program on the interface, a socket) stays behind.
void remove_failed(const std::string& device) {
  const std::string name = device_name(device);
  std::uint16_t port = 0;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &port) == 0) {
    rte_eth_dev_stop(port);
    rte_eth_dev_close(port);
  }
  rte_eal_hotplug_remove("vdev", name.c_str());
}

// An XDP program of ours that a daemon killed before it could remove it left on `iface`: the
// driver attaches its program only where none is (and would fall back to af_packet).
// Programs of others are left alone.
void remove_stale_program(const std::string& iface) {
  const int ifindex = static_cast<int>(::if_nametoindex(iface.c_str()));
  __u32 id = 0;
  if (ifindex == 0 || bpf_xdp_query_id(ifindex, 0, &id) != 0 || id == 0) return;
  const int fd = bpf_prog_get_fd_by_id(id);
  if (fd < 0) return;
  bpf_prog_info info{};
  __u32 len = sizeof info;
  const bool ours = bpf_obj_get_info_by_fd(fd, &info, &len) == 0 && std::string(info.name) == "aapc_xdp";
  ::close(fd);
  if (ours) bpf_xdp_detach(ifindex, 0, nullptr);
}

}  // namespace

IfacePort open_iface(const std::string& iface, IfaceDriver driver, PortOptions options) {
  if (iface.empty() || iface.size() >= IFNAMSIZ || iface.find_first_of(",= ") != std::string::npos)
    throw NicError("interface '" + iface + "' is not an interface name");
  // Said here, once: each driver's probe of a missing interface fails with words of its own.
  if (::if_nametoindex(iface.c_str()) == 0)
    throw NicError("no interface '" + iface + "' here (`ip link` lists this machine's; --iface takes one of them)");
  std::string passed_over;
  if (driver != IfaceDriver::kAfPacket) {
    const std::string device = iface_device(iface, IfaceDriver::kAfXdp, options.queues);
    try {
      // An AF_XDP socket is bound to one queue of the interface: it needs as many.
      if (const int have = interface_queues(iface); have >= 0 && have < options.queues)
        throw NicError("interface " + iface + " offers AF_XDP " + std::to_string(have) + " queue(s) (combined channels), fewer than the " +
                       std::to_string(options.queues) + " asked for (one per sending CPU); give it more (ethtool -L " + iface + " combined " +
                       std::to_string(options.queues) + ") or give fewer sending CPUs");
      // Ours, not libxdp's default program: that one would take every frame of the queue,
      // IP included, away from the kernel.
      const XdpProgramFile program;
      remove_stale_program(iface);
      options.device = device + ",xdp_prog=" + program.path();
      return {EthPort::open(options), device, IfaceDriver::kAfXdp, {}};
    } catch (const NicError& e) {
      remove_failed(options.device);
      if (driver == IfaceDriver::kAfXdp) throw;
      passed_over = e.what();
    }
  }
  options.device = iface_device(iface, IfaceDriver::kAfPacket, options.queues);
  return {EthPort::open(options), options.device, IfaceDriver::kAfPacket, passed_over};
}

EthPort::~EthPort() {
  rte_eth_dev_stop(port_id_);
  rte_eth_dev_close(port_id_);
}

std::uint16_t EthPort::rx_burst(rte_mbuf** pkts, std::uint16_t n) {
  if (rx_queues_ == 1) return rte_eth_rx_burst(port_id_, 0, pkts, n);
  // Every queue in turn, a different one first each time, so that none waits behind another.
  std::uint16_t got = 0;
  for (std::uint16_t i = 0; i < rx_queues_ && got < n; ++i) {
    got = static_cast<std::uint16_t>(got + rte_eth_rx_burst(port_id_, rx_next_, pkts + got, static_cast<std::uint16_t>(n - got)));
    rx_next_ = static_cast<std::uint16_t>((rx_next_ + 1) % rx_queues_);
  }
  return got;
}

std::uint16_t EthPort::tx_burst(rte_mbuf** pkts, std::uint16_t n) { return rte_eth_tx_burst(port_id_, 0, pkts, n); }

std::uint16_t EthPort::tx_burst_on(std::uint16_t queue, rte_mbuf** pkts, std::uint16_t n) {
  return queue < tx_queues_ ? rte_eth_tx_burst(port_id_, queue, pkts, n) : 0;
}

std::uint64_t EthPort::link_speed_bps() const {
  rte_eth_link link{};
  if (rte_eth_link_get_nowait(port_id_, &link) != 0 || link.link_speed == RTE_ETH_SPEED_NUM_NONE ||
      link.link_speed == RTE_ETH_SPEED_NUM_UNKNOWN)
    return 0;
  return static_cast<std::uint64_t>(link.link_speed) * 1'000'000ULL;
}

EthPort::DeviceStats EthPort::device_stats() const {
  rte_eth_stats s{};
  rte_eth_stats_get(port_id_, &s);
  return {s.ipackets, s.opackets, s.imissed, s.ierrors, s.oerrors};
}

}  // namespace aapc::nic
