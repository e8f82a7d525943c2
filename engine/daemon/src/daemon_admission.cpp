// Who may use the control socket, and for how long: root, the daemon's uid, --allow-uid and
// members of --socket-group may connect; other users are answered and closed at once, so they
// hold no slot. One uid holds at most max_clients_per_uid connections, and the last slots are
// kept for root and the daemon's uid; a client that says no HELLO in time is closed. And who
// holds this node's rank in the cluster's collectives (RankHolder).
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "daemon_impl.hpp"

namespace aapc::engine {

namespace {

// Slots of max_clients that only root and the daemon's uid may take.
constexpr std::size_t kPrivilegedReserve = 4;

bool privileged(uid_t uid) { return uid == 0 || uid == ::geteuid(); }

// The peer's supplementary groups when it connected (SO_PEERGROUPS, Linux 4.13), else those of
// its uid's passwd entry.
std::vector<gid_t> peer_groups(int fd, const ucred& cred) {
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) break;
    groups.resize(len / sizeof(gid_t) + 1);
  }
  groups.clear();
  passwd pw{}, *found = nullptr;
  std::vector<char> buf(16384);
  if (::getpwuid_r(cred.uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return groups;
  int count = 256;
  groups.resize(static_cast<std::size_t>(count));
  if (::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) count = 0;
  groups.resize(static_cast<std::size_t>(count));
  return groups;
}

}  // namespace

bool Daemon::Impl::allowed(int fd, const ucred& cred) const {
  if (privileged(cred.uid)) return true;
  if (std::find(cfg.allow_uids.begin(), cfg.allow_uids.end(), cred.uid) != cfg.allow_uids.end()) return true;
  if (socket_gid == static_cast<gid_t>(-1)) return false;
  if (cred.gid == socket_gid) return true;
  const std::vector<gid_t> unix_groups = peer_groups(fd, cred);
  return std::find(unix_groups.begin(), unix_groups.end(), socket_gid) != unix_groups.end();
}

// Why a client that just connected may not stay, if it may not.
Result<void> Daemon::Impl::admission(int fd, const ucred& cred) const {
  if (!allowed(fd, cred))
    return Error(Errc::kPermission, "uid " + std::to_string(cred.uid) +
                                        " may not use this aapcd (run as root or as the daemon's user, join --socket-group, or start "
                                        "aapcd with --allow-uid)");
  if (privileged(cred.uid)) {
    if (clients.size() >= cfg.max_clients)
      return Error(Errc::kBusy, "aapcd serves " + std::to_string(clients.size()) + " clients already (the limit)");
    return {};
  }
  const auto mine = static_cast<std::size_t>(std::count_if(clients.begin(), clients.end(), [&](const auto& e) { return e.second.uid == cred.uid; }));
  if (mine >= cfg.max_clients_per_uid)
    return Error(Errc::kBusy, "uid " + std::to_string(cred.uid) + " holds " + std::to_string(mine) +
                                  " connections to aapcd already (the limit per uid, aapcd --max-clients-per-uid); close some");
  const std::size_t open = cfg.max_clients > kPrivilegedReserve ? cfg.max_clients - kPrivilegedReserve : cfg.max_clients;
  if (clients.size() >= open)
    return Error(Errc::kBusy, "aapcd serves " + std::to_string(clients.size()) + " clients already (the limit for users other than root and the daemon's)");
  return {};
}

// Answers and closes at once. Shut down first, then drained: a peer cannot send more, and
// closing with nothing unread leaves it our answer to read (unread requests would make its
// read fail with ECONNRESET instead).
void Daemon::Impl::refuse_connection(int fd, const ucred& cred, Errc code, const std::string& why) {
  const auto now = Clock::now();
  if (now >= next_refusal_log) {
    spdlog::warn("refused a client of uid {} (pid {}): {}", cred.uid, cred.pid, why);
    next_refusal_log = now + std::chrono::seconds(1);
  }
  reply_error(fd, 0, code, why);
  ::shutdown(fd, SHUT_RDWR);
  char sink[256];
  while (::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
  }
  ::close(fd);
}

// Clients that connected and said no HELLO within cfg.hello_timeout; looked at every 50 ms.
void Daemon::Impl::close_idle_clients() {
  const auto now = Clock::now();
  if (now < next_idle_check) return;
  next_idle_check = now + std::chrono::milliseconds(50);
  std::vector<int> idle;
  for (const auto& [fd, c] : clients)
    if (!c.greeted && now - c.connected > cfg.hello_timeout) idle.push_back(fd);
  for (int fd : idle) {
    spdlog::warn("client pid {} said no HELLO within {} ms: closed", clients[fd].pid, cfg.hello_timeout.count());
    reply_error(fd, 0, Errc::kTimeout, "no HELLO within " + std::to_string(cfg.hello_timeout.count()) + " ms of connecting: closed");
    ::shutdown(fd, SHUT_RDWR);
    drop_client(fd);
  }
}

// Whether `c` may hold the rank: not while another client does.
Result<void> Daemon::Impl::rank_free_for(const ClientState& c) const {
  if (!holder.held_by_other_than(c.fd)) return {};
  return Error(Errc::kBusy, "rank " + std::to_string(rank) + " on " + topo.machine(rank).name + " is in use by pid " + std::to_string(holder.pid) +
                                " (uid " + std::to_string(holder.uid) +
                                "): one client per machine runs the cluster's collectives; wait for it to finish, or run in a group (Client::open_group)");
}

// The rank for `c`, which rank_free_for() let have it.
void Daemon::Impl::claim_rank(ClientState& c) {
  if (holder.client != c.fd) spdlog::info("client pid {} holds rank {} for collectives", c.pid, rank);
  holder = {c.fd, c.pid, c.uid, c.job};
}

void Daemon::Impl::release_rank(const ClientState& c) {
  if (holder.client != c.fd) return;
  spdlog::info("client pid {} released rank {}", c.pid, rank);
  holder = {};
}

}  // namespace aapc::engine
