#include "aapc/nic/eth_port.hpp"

#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <set>

#include "aapc/nic/eal.hpp"

namespace aapc::nic {

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

// The AF_PACKET sockets of this process (DPDK's af_packet driver opens one per queue pair).
std::set<int> packet_sockets() {
  std::set<int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(e.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    int domain = 0;
    socklen_t len = sizeof domain;
    if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_PACKET) out.insert(fd);
  }
  return out;
}

}  // namespace

std::unique_ptr<EthPort> EthPort::open(const PortOptions& options) {
  if (!eal_running()) throw NicError("port " + options.device + ": the DPDK EAL is not running (call eal_init first)");
  std::string name = device_name(options.device);
  const std::set<int> sockets_before = packet_sockets();
  std::uint16_t port = 0;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &port) != 0) {
    int rc = rte_dev_probe(options.device.c_str());
    if (rc != 0)
      throw NicError("port " + options.device + ": no such device and probing it failed (" + rte_strerror(-rc) +
                     "); name a virtual device like net_af_packet0,iface=IFACE or a PCI address bound to a DPDK driver");
    if (rte_eth_dev_get_port_by_name(name.c_str(), &port) != 0)
      throw NicError("port " + options.device + ": probed, but no ethdev named " + name + " appeared");
  }

  std::unique_ptr<EthPort> p(new EthPort());
  p->port_id_ = port;
  p->name_ = name;
  p->mtu_ = options.mtu;

  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(port, &info); rc != 0) fail(name, "reading device info", rc);

  // Frames up to the MTU plus the Ethernet header must fit in one mbuf.
  // (and at least DPDK's default: af_packet wants room for a whole 2048-byte ring frame).
  const unsigned data_room = std::max<unsigned>(static_cast<unsigned>(options.mtu) + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN + RTE_PKTMBUF_HEADROOM + 64,
                                                RTE_MBUF_DEFAULT_BUF_SIZE);
  std::string pool_name = "aapc_pool_" + std::to_string(port);
  p->pool_ = rte_mempool_lookup(pool_name.c_str());
  if (p->pool_ == nullptr)
    p->pool_ = rte_pktmbuf_pool_create(pool_name.c_str(), options.pool_size, 256, 0, static_cast<std::uint16_t>(data_room),
                                       static_cast<int>(rte_socket_id()));
  if (p->pool_ == nullptr)
    throw NicError("port " + name + ": cannot create a pool of " + std::to_string(options.pool_size) + " mbufs (" +
                   rte_strerror(rte_errno) + "); give the EAL more memory (-m) or use fewer mbufs");

  rte_eth_conf conf{};
  if (info.max_mtu >= static_cast<std::uint16_t>(options.mtu)) conf.rxmode.mtu = static_cast<std::uint32_t>(options.mtu);
  rte_eth_dev_stop(port);  // a port reopened after a failure
  if (int rc = rte_eth_dev_configure(port, 1, 1, &conf); rc != 0) fail(name, "configuring", rc);
  std::uint16_t rxd = options.rx_descriptors, txd = options.tx_descriptors;
  rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
  int socket = rte_eth_dev_socket_id(port);
  if (socket < 0) socket = static_cast<int>(rte_socket_id());
  if (int rc = rte_eth_rx_queue_setup(port, 0, rxd, static_cast<unsigned>(socket), nullptr, p->pool_); rc != 0) fail(name, "rx queue setup", rc);
  if (int rc = rte_eth_tx_queue_setup(port, 0, txd, static_cast<unsigned>(socket), nullptr); rc != 0) fail(name, "tx queue setup", rc);
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
  // net_af_packet with one queue pair: its socket is the one this port opened (or the only one
  // there is, when the EAL probed it). Its mmap'ed receive ring makes poll(2) report POLLIN
  // while a frame waits for the driver, so an idle daemon can sleep until one arrives.
  if (std::string(info.driver_name) == "net_af_packet") {
    std::set<int> now = packet_sockets(), fresh;
    std::set_difference(now.begin(), now.end(), sockets_before.begin(), sockets_before.end(), std::inserter(fresh, fresh.end()));
    if (fresh.size() == 1) {
      p->wait_fd_ = *fresh.begin();
    } else if (fresh.empty() && now.size() == 1) {
      p->wait_fd_ = *now.begin();
    }
  }
  return p;
}

EthPort::~EthPort() {
  rte_eth_dev_stop(port_id_);
  rte_eth_dev_close(port_id_);
}

std::uint16_t EthPort::rx_burst(rte_mbuf** pkts, std::uint16_t n) { return rte_eth_rx_burst(port_id_, 0, pkts, n); }

std::uint16_t EthPort::tx_burst(rte_mbuf** pkts, std::uint16_t n) { return rte_eth_tx_burst(port_id_, 0, pkts, n); }

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
