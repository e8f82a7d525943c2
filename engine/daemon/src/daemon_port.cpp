// The daemon's port: the ethdev, the decorators asked for (faults, capture), our rank, the
// pace, and the engine over them.
#include <spdlog/spdlog.h>

#include "aapc/sched/dot.hpp"
#include "aapc/wire/auth.hpp"
#include "daemon_impl.hpp"

namespace aapc::engine {

void Daemon::Impl::open_port() {
  // The key is read before the EAL starts: a bad key file fails at once.
  if (!cfg.cluster_key.empty()) {
    auto loaded = load_cluster_key(cfg.cluster_key);
    if (!loaded) fail(loaded.error().message());
    key = *loaded;
    if (cfg.cipher == "auto") {
      key->cipher = fastest_cipher();
    } else if (auto c = parse_cipher(cfg.cipher)) {
      if (*c == Cipher::kAes256Gcm && !aes_gcm_available())
        fail("--cipher aes-256-gcm: this CPU lacks AES-NI or PCLMUL; run every node with --cipher chacha20-poly1305");
      key->cipher = *c;
    } else {
      fail("--cipher " + cfg.cipher + ": not auto, aes-256-gcm or chacha20-poly1305");
    }
    spdlog::info("frames are tagged with {} under the cluster key", cipher_name(key->cipher));
  } else {
    spdlog::warn("NO CLUSTER KEY (--cluster-key): frames are not authenticated, and any host on the segment can forge data into "
                 "every job; make one with `head -c 32 /dev/urandom > /etc/aapc/cluster.key && chmod 600 /etc/aapc/cluster.key`, copy "
                 "it to every node and give it to every aapcd");
  }
  nic::eal_init(cfg.eal);
  nic::PortOptions po;
  po.device = cfg.device;
  po.mtu = topo.mtu();
  po.queues = sending_lcores();
  if (cfg.rank) po.mac = nic::MacAddr(topo.machine(*cfg.rank).mac.bytes);
  if (cfg.iface.empty()) {
    eth = nic::EthPort::open(po);
  } else {
    open_iface(po);
  }
  rank = rank_of_port();
  nic::Port& port = offload_port(decorate_port());
  choose_pace();
  if (const std::uint64_t smallest = sched::smallest_switch_buffer(topo); smallest != 0) slack_buffer = smallest;
  EngineConfig ec;
  ec.rank = rank;
  for (sched::Rank r = 0; r < topo.machine_count(); ++r) ec.peers.push_back(topo.machine(r).mac.bytes);
  ec.mtu = topo.mtu();
  ec.peer_deadline = cfg.peer_deadline;
  ec.pace_bps = pace_bps;
  // The slowest link bounds the deadline derived for exchanges given none.
  for (const auto& link : topo.links())
    if (link.rate_bps != 0 && (ec.link_bps == 0 || link.rate_bps < ec.link_bps)) ec.link_bps = link.rate_bps;
  ec.key = key;
  ec.max_live_exchanges = cfg.max_exchanges;
  if (cfg.stream_bytes) ec.stream_bytes = *cfg.stream_bytes;
  engine = std::make_unique<Engine>(port, ec);
  engine->on_peer_restart = [](Rank peer) { spdlog::warn("peer rank {} restarted: running exchanges with it failed", peer); };
  start_io_lcores();
  engine->announce();
}

// --iface: AF_XDP, or af_packet where AF_XDP cannot open the interface (said loudly: it caps
// what one node sends; docs/design.md, "Fast links").
void Daemon::Impl::open_iface(const nic::PortOptions& po) {
  const auto driver = nic::parse_iface_driver(cfg.iface_driver);
  if (!driver) fail("--iface-driver " + cfg.iface_driver + ": not auto, af_xdp or af_packet");
  auto opened = nic::open_iface(cfg.iface, *driver, po);
  eth = std::move(opened.port);
  cfg.device = opened.device;
  if (!opened.passed_over.empty())
    spdlog::warn("interface {}: AF_XDP could not open it, so af_packet carries it (about 2 Gbit/s a core): {}", cfg.iface, opened.passed_over);
}

// --io-cores: the lcores that send, each on a transmit queue of the port (one, also where a
// single lcore both receives and sends).
std::uint16_t Daemon::Impl::sending_lcores() const {
  return cfg.io_cores.size() > 2 ? static_cast<std::uint16_t>(cfg.io_cores.size() - 1) : 1;
}

// The engine learns from its port whether received frames come checked: the lcores serve the
// port before the engine is made over it, and start after.

nic::Port& Daemon::Impl::offload_port(nic::Port& port) {
  if (cfg.io_cores.empty()) return port;
  const std::uint16_t senders = sending_lcores();
  if (senders > 1 && port.tx_queue_count() < senders)
    fail("--io-cores with " + std::to_string(senders) + " sending CPUs: " + port.name() + " sends on " + std::to_string(port.tx_queue_count()) +
         " queue (--faults and --capture see every frame in one stream); give one or two CPUs with them");
  offload = std::make_unique<nic::OffloadPort>(port);
  const bool apart = cfg.io_cores.size() >= 2;
  io_lcores.push_back(std::make_unique<nic::IoLcore>(nic::IoLcoreOptions{cfg.io_cores[0], apart ? "aapcd-rx" : "aapcd-io"}));
  for (std::uint16_t q = 0; apart && q < senders; ++q)
    io_lcores.push_back(std::make_unique<nic::IoLcore>(
        nic::IoLcoreOptions{cfg.io_cores[q + 1U], senders > 1 ? "aapcd-tx" + std::to_string(q) : std::string("aapcd-tx")}));
  try {
    io_lcores.front()->serve_rx(*offload, integrity_hook(key ? &*key : nullptr));
    // The passes over every byte are shared out: the engine copies payloads in and out; the
    // receiving lcore checks CRCs (and tags). Sealing goes to the sending lcores when they have
    // CPUs of their own, or without a key (a CRC costs less than a copy); with one CPU and a key,
    // the engine keeps the tag of what it sends, which weighs as much as checking a received one.
    const bool seal_there = apart || !key;
    for (std::uint16_t q = 0; q < senders; ++q)
      io_lcores[apart ? q + 1U : 0U]->serve_tx(*offload, seal_there ? seal_hook(key ? &*key : nullptr) : nic::FrameHook{}, q);
  } catch (const nic::NicError& e) {
    fail(std::string("--io-cores: ") + e.what());
  }
  return *offload;
}

void Daemon::Impl::start_io_lcores() {
  try {
    for (auto& l : io_lcores) l->start();
  } catch (const nic::NicError& e) {
    fail(std::string("--io-cores: ") + e.what());
  }
}

// --rank, or the machine of the topology whose MAC the port has.
int Daemon::Impl::rank_of_port() const {
  if (cfg.rank) return *cfg.rank;
  sched::Mac m{eth->mac()};
  auto r = topo.rank_of_mac(m);
  if (!r)
    fail("the port " + cfg.device + " has MAC " + m.str() + ", which no machine of " + topo.source() +
         " has; fix the topology's mac attribute for this machine, or give --rank");
  return *r;
}

// The port the engine uses: the ethdev, under the fault injector and the capture when asked.
nic::Port& Daemon::Impl::decorate_port() {
  nic::Port* port = eth.get();
  if (!cfg.faults.empty()) {
    faults = std::make_unique<nic::FaultPort>(*port, nic::FaultOptions::parse(cfg.faults));
    port = faults.get();
  }
  if (!cfg.capture_path.empty()) {
    capture = std::make_unique<nic::CapturePort>(*port, nic::CaptureOptions{cfg.capture_path, cfg.capture_snaplen});
    port = capture.get();
  }
  return *port;
}

// --pace: "auto" is the rate of this machine's link, so the engine rather than a switch queue
// decides what goes first.
void Daemon::Impl::choose_pace() {
  if (cfg.pace == "auto") {
    const sched::Node& me = topo.machine(rank);
    pace_bps = me.links.empty() ? 0 : topo.links()[static_cast<std::size_t>(me.links[0])].rate_bps;
  } else if (cfg.pace != "off") {
    auto bps = sched::parse_rate(cfg.pace);
    if (!bps) fail("--pace " + cfg.pace + ": not a rate like 100Mbit (or auto, off)");
    pace_bps = *bps;
  }
}

}  // namespace aapc::engine
