// Quotas: what one client, or the clients of one uid, may hold of a shared daemon, so that no
// user can deny service to the others (docs/design.md, "Jobs kept apart"). Each refusal names
// the cap and the aapcd option that sets it. Root and the daemon's own uid are limited only
// per client.
#include <unistd.h>

#include <algorithm>

#include "daemon_impl.hpp"

namespace aapc::engine {

bool Daemon::Impl::limited(const ClientState& c) const { return c.uid != 0 && c.uid != ::geteuid(); }

std::size_t Daemon::Impl::in_flight(const ClientState& c) const {
  auto mine = [&](const Prepared& p) { return p.client == c.fd; };
  return c.exchanges.size() + static_cast<std::size_t>(std::count_if(waiting_join.begin(), waiting_join.end(), mine)) +
         static_cast<std::size_t>(std::count_if(waiting_counts.begin(), waiting_counts.end(), mine));
}

namespace {

// A cap reached, with the option that sets it.
Error busy(std::string why) { return Error(Errc::kBusy, std::move(why)); }

}  // namespace

Result<void> Daemon::Impl::start_quota(const ClientState& c, const proto::StartRequest& m) const {
  if (std::chrono::milliseconds(m.timeout_ms) > cfg.max_timeout)
    return busy("a timeout of " + std::to_string(m.timeout_ms) + " ms is over this aapcd's cap of " + std::to_string(cfg.max_timeout.count()) +
                " ms (aapcd --max-timeout-ms); give a shorter one, or 0 to have one derived from the exchange's size");
  if (in_flight(c) >= cfg.max_exchanges_per_client)
    return busy("this client has " + std::to_string(in_flight(c)) + " collectives running or not yet collected, the most one client may (aapcd " +
                "--max-exchanges-per-client); wait for some first");
  if (!limited(c)) return {};
  std::size_t of_uid = 0;
  for (const auto& [fd, other] : clients)
    if (other.uid == c.uid) of_uid += in_flight(other);
  if (of_uid >= cfg.max_exchanges_per_uid)
    return busy("uid " + std::to_string(c.uid) + " has " + std::to_string(of_uid) +
                " collectives running or not yet collected on this machine, the most one uid may (aapcd --max-exchanges-per-uid); wait for some first");
  return {};
}

Result<void> Daemon::Impl::buffer_quota(const ClientState& c, std::uint64_t size) const {
  if (!limited(c)) return {};
  std::size_t count = 0, others = 0;
  std::uint64_t bytes = 0;
  for (const auto& [fd, other] : clients) {
    if (!limited(other)) continue;
    others += other.buffers.size();
    if (other.uid != c.uid) continue;
    count += other.buffers.size();
    for (const auto& [id, b] : other.buffers) bytes += b.size;
  }
  const std::string uid = "uid " + std::to_string(c.uid);
  if (count >= cfg.max_buffers_per_uid)
    return busy(uid + " has " + std::to_string(count) + " buffers registered here, the most one uid may (aapcd --max-buffers-per-uid); free some first");
  if (bytes + size > cfg.max_buffer_bytes_per_uid)
    return busy(uid + " has " + std::to_string(bytes) + " bytes of buffers registered here; " + std::to_string(size) + " more would pass the cap of " +
                std::to_string(cfg.max_buffer_bytes_per_uid) + " (aapcd --max-buffer-bytes-per-uid); free some first");
  if (others >= cfg.max_buffers_others)
    return busy("users other than root hold " + std::to_string(others) + " buffers here, the most they may together (aapcd --max-buffers-others), " +
                "so that root's still map; try again when some are freed");
  return {};
}

}  // namespace aapc::engine
