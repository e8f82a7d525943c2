// STATUS: the daemon's state and counters as JSON text, for `aapc status` and people.
#include <nlohmann/json.hpp>

#include "daemon_impl.hpp"

namespace aapc::engine {

namespace {

// The fit of the tree's phases (null while none), and each weighed schedule's reach by the
// smallest block of its sizes.
nlohmann::json measured_json(const sched::Measured& m, std::size_t exchanges) {
  if (!m.any_known()) return nullptr;
  nlohmann::json j = {{"fill", m.known() ? nlohmann::json(m.fill) : nlohmann::json(nullptr)},
                      {"hand_over_us", m.known() ? nlohmann::json(m.hand_over_s * 1e6) : nlohmann::json(nullptr)},
                      {"reach", nlohmann::json::object()}};
  if (exchanges > 0) j["exchanges"] = exchanges;
  for (std::size_t c = 0; c < sched::kReachCells; ++c)
    if (m.reach[c] > 0) j["reach"][sched::reach_cell_schedule(c)][std::to_string(sched::reach_cell_block(c))] = m.reach[c];
  return j;
}

}  // namespace

void Daemon::Impl::status(ClientState& c, std::uint32_t request) {
  const EngineCounters& k = engine->counters();
  nlohmann::json drops = nlohmann::json::object();
  for (int d = 1; d < kDropReasons; ++d)
    if (k.drops[static_cast<std::size_t>(d)] > 0) drops[std::string(drop_reason_name(static_cast<DropReason>(d)))] = k.drops[static_cast<std::size_t>(d)];
  nlohmann::json live = nlohmann::json::array();
  for (const auto& [id, ex] : exchanges) live.push_back({{"id", id}, {"schedule", ex.schedule}, {"sync", ex.sync}, {"finished", ex.report.has_value()}});
  // Peers the engine holds dead: collectives with them fail at once until they come back.
  nlohmann::json dead = nlohmann::json::array();
  for (sched::Rank r = 0; r < topo.machine_count(); ++r)
    if (r != rank && engine->peer_dead(static_cast<Rank>(r))) dead.push_back({{"rank", r}, {"machine", topo.machine(r).name}});
  nlohmann::json open_groups = nlohmann::json::array();
  for (const auto& [slot, g] : groups)
    open_groups.push_back({{"slot", slot}, {"members", g.members}, {"rank", g.me}, {"pid", clients.count(g.client) != 0 ? clients.at(g.client).pid : 0},
                           {"next_exchange", g.next_id}});
  nlohmann::json held = nullptr;
  if (holder.client >= 0) held = {{"pid", holder.pid}, {"uid", holder.uid}, {"job", holder.job}};
  nlohmann::json j = {
      {"rank", rank},
      {"size", topo.machine_count()},
      {"machine", topo.machine(rank).name},
      {"mac", topo.machine(rank).mac.str()},
      {"topology", topo.source()},
      {"port", cfg.device},
      {"port_driver", eth->driver()},
      // Transmit queues, each with its sending I/O lcore where --io-cores gives more than two.
      {"port_queues", {{"transmit", eth->tx_queue_count()}, {"receive", eth->rx_queue_count()}}},
      {"io_cores", cfg.io_cores},
      // The highest send and receive rates over 50 ms while exchanges ran, frame bytes.
      {"port_peak", {{"send_bps", static_cast<std::uint64_t>(rates.peak_send_bps)}, {"receive_bps", static_cast<std::uint64_t>(rates.peak_receive_bps)}}},
      {"epoch", engine->epoch()},
      {"pace_bps", pace_bps},
      // What this node's last exchanges measured, and what the session's ranks agreed on (`auto`
      // weighs the tree's phases and the schedules of sched::kWeighed with it): null while none.
      {"phases_measured", measured_json(own_measure(), measures.size())},
      {"phases_agreed", measured_json(agreed, 0)},
      // Frames tagged with the cluster key, and its cipher; null: unauthenticated.
      {"authentication", key ? nlohmann::json(std::string(cipher_name(key->cipher))) : nlohmann::json(nullptr)},
      {"peak_aggregate_bps", world->model.peak_aggregate_bps()},
      {"next_exchange", next_id},
      {"plans", world->cached.size()},  // cached for the cluster's collectives (--max-plans)
      {"clients", clients.size()},
      {"rank_holder", held},
      {"groups", open_groups},
      {"dead_peers", dead},
      {"exchanges", live},
      {"counters",
       {{"frames_received", k.frames_received},
        {"bytes_received", k.bytes_received},
        {"frames_sent", k.frames_sent},
        {"bytes_sent", k.bytes_sent},
        {"tx_refused", k.tx_refused},
        {"alloc_failures", k.alloc_failures},
        {"zero_copy_frames", k.zero_copy_frames},
        {"rx_prechecked", k.rx_prechecked},
        {"early_frames", k.early_frames},
        {"drops", drops}}},
  };
  if (capture) j["capture"] = {{"path", cfg.capture_path}, {"frames", capture->frames_captured()}};
  proto::send_message(c.fd, proto::message(proto::StatusReply{j.dump(2)}, request));
}

void Daemon::Impl::sample_rates(Clock::time_point now, bool running) {
  const EngineCounters& k = engine->counters();
  if (!running) {
    rates.start = {};
    return;
  }
  if (rates.start == Clock::time_point{}) {
    rates.start = now;
    rates.sent = k.bytes_sent;
    rates.received = k.bytes_received;
    return;
  }
  const double s = std::chrono::duration<double>(now - rates.start).count();
  if (now - rates.start < kRateWindow) return;
  rates.peak_send_bps = std::max(rates.peak_send_bps, static_cast<double>(k.bytes_sent - rates.sent) * 8 / s);
  rates.peak_receive_bps = std::max(rates.peak_receive_bps, static_cast<double>(k.bytes_received - rates.received) * 8 / s);
  rates.start = now;
  rates.sent = k.bytes_sent;
  rates.received = k.bytes_received;
}

}  // namespace aapc::engine
