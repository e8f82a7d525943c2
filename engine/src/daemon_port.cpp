// The daemon's port: the ethdev, the decorators asked for (faults, capture), our rank, the
// pace, and the engine over them.
#include <spdlog/spdlog.h>

#include "aapc/engine/auth.hpp"
#include "aapc/sched/dot.hpp"
#include "daemon_impl.hpp"

namespace aapc::engine {

void Daemon::Impl::open_port() {
  std::optional<FrameKey> key;  // read before the EAL starts: a bad key file fails at once
  if (!cfg.cluster_key.empty()) {
    auto loaded = load_cluster_key(cfg.cluster_key);
    if (!loaded) fail(loaded.error().message());
    key = *loaded;
  }
  nic::eal_init(cfg.eal);
  nic::PortOptions po;
  po.device = cfg.device;
  po.mtu = topo.mtu();
  if (cfg.rank) po.mac = nic::MacAddr(topo.machine(*cfg.rank).mac.bytes);
  eth = nic::EthPort::open(po);
  rank = rank_of_port();
  nic::Port& port = decorate_port();
  choose_pace();
  if (const std::uint64_t smallest = sched::smallest_switch_buffer(topo); smallest != 0) slack_buffer = smallest;
  EngineConfig ec;
  ec.rank = rank;
  for (sched::Rank r = 0; r < topo.machine_count(); ++r) ec.peers.push_back(topo.machine(r).mac.bytes);
  ec.mtu = topo.mtu();
  ec.peer_deadline = cfg.peer_deadline;
  ec.pace_bps = pace_bps;
  // The slowest link bounds the deadline derived for exchanges given none (issue 15, finding 6).
  for (const auto& link : topo.links())
    if (link.rate_bps != 0 && (ec.link_bps == 0 || link.rate_bps < ec.link_bps)) ec.link_bps = link.rate_bps;
  ec.key = key;
  engine = std::make_unique<Engine>(port, ec);
  engine->on_peer_restart = [](Rank peer) { spdlog::warn("peer rank {} restarted: running exchanges with it failed", peer); };
  engine->announce();
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
