// The daemon's control socket: a Unix SOCK_SEQPACKET socket with owner/group permissions,
// clients admitted by their credentials (daemon_admission.cpp), their requests decoded once
// and dispatched.
#include <fcntl.h>
#include <grp.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <type_traits>
#include <variant>

#include "daemon_impl.hpp"

namespace aapc::engine {

namespace fs = std::filesystem;

void Daemon::Impl::open_socket() {
  const gid_t gid = socket_dir();
  socket_gid = gid;
  bind_socket(gid);
  watch_socket_and_port();
}

// The socket's directory, made 0750 when missing; the group of --socket-group, if given.
// With --allow-uid the uids it names must reach the socket, whatever their groups: the
// directory is opened to others for search (o+x) and the socket for connecting (o+rw), and
// admission (daemon_admission.cpp) turns away every other user at once.
gid_t Daemon::Impl::socket_dir() const {
  fs::path dir = fs::path(cfg.socket_path).parent_path();
  std::error_code ec;
  if (!dir.empty() && !fs::exists(dir)) {
    fs::create_directories(dir, ec);
    if (ec) fail("cannot create " + dir.string() + ": " + ec.message());
    ::chmod(dir.c_str(), 0750);
  }
  struct stat st{};
  if (!cfg.allow_uids.empty() && !dir.empty() && ::stat(dir.c_str(), &st) == 0 && (st.st_mode & S_IXOTH) == 0) {
    if (::chmod(dir.c_str(), (st.st_mode & 07777) | S_IXOTH) != 0)
      fail("--allow-uid: cannot let other users reach the socket through " + dir.string() + " (chmod o+x: " + std::strerror(errno) +
           "); give --socket a path in a directory they can search");
    spdlog::info("--allow-uid: {} made searchable by others (o+x) so that the allowed uids reach the socket", dir.string());
  }
  gid_t gid = static_cast<gid_t>(-1);
  if (!cfg.socket_group.empty()) {
    group* g = ::getgrnam(cfg.socket_group.c_str());
    if (g == nullptr) fail("--socket-group " + cfg.socket_group + ": no such group");
    gid = g->gr_gid;
    if (!dir.empty()) (void)::chown(dir.c_str(), static_cast<uid_t>(-1), gid);
  }
  return gid;
}

void Daemon::Impl::bind_socket(gid_t gid) {
  listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd < 0) fail(std::string("socket: ") + std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (cfg.socket_path.size() >= sizeof addr.sun_path) fail("--socket path too long");
  std::memcpy(addr.sun_path, cfg.socket_path.c_str(), cfg.socket_path.size());
  if (fs::exists(cfg.socket_path)) {
    // A daemon that still answers owns it; a stale file (after a crash) is replaced.
    int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    bool alive = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(probe);
    if (alive) fail("another aapcd already serves " + cfg.socket_path + "; stop it or give --socket another path");
    if (!fs::is_socket(cfg.socket_path)) fail(cfg.socket_path + " exists and is not a socket; remove it or give --socket another path");
    ::unlink(cfg.socket_path.c_str());
  }
  mode_t old = ::umask(0177);
  int rc = ::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0) fail("cannot bind " + cfg.socket_path + ": " + std::strerror(errno));
  bound = true;
  ::chmod(cfg.socket_path.c_str(), cfg.allow_uids.empty() ? cfg.socket_mode : cfg.socket_mode | S_IROTH | S_IWOTH);
  if (gid != static_cast<gid_t>(-1)) (void)::chown(cfg.socket_path.c_str(), static_cast<uid_t>(-1), gid);
  if (::listen(listen_fd, 16) != 0) fail(std::string("listen: ") + std::strerror(errno));
}

void Daemon::Impl::watch_socket_and_port() {
  epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
  // Frames arriving wake the loop too, when the port can say so (net_af_packet).
  // (An I/O lcore receives from the device: the engine's port then has no descriptor.)
  if (int fd = offload ? offload->wait_fd() : eth->wait_fd(); fd >= 0) {
    epoll_event pev{};
    pev.events = EPOLLIN;
    pev.data.fd = fd;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &pev) == 0) port_fd = fd;
  }
}

// --- clients ------------------------------------------------------------------------------
void Daemon::Impl::reply_error(int fd, std::uint32_t request, Errc code, const std::string& message) {
  proto::send_message(fd, proto::message(proto::ErrorReply{static_cast<std::uint32_t>(code), message}, request));
}

void Daemon::Impl::accept_clients() {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      ::close(fd);
      continue;
    }
    if (auto admitted = admission(fd, cred); !admitted) {
      refuse_connection(fd, cred, admitted.error().code(), admitted.error().message());
      continue;
    }
    ClientState c;
    c.fd = fd;
    c.uid = cred.uid;
    c.pid = cred.pid;
    c.connected = Clock::now();
    clients[fd] = std::move(c);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    spdlog::info("client pid {} (uid {}) connected", cred.pid, cred.uid);
  }
}

void Daemon::Impl::close_client_resources(ClientState& c) {
  for (auto& [id, m] : c.buffers) unmapper.release(std::move(m));
  c.buffers.clear();
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
}

// The client went away: its exchanges are aborted (the peers are told), then its memory is
// released; the engine no longer touches the buffers of an aborted exchange. When the last
// client that ran exchanges is gone, this node's part of the session is over: peers still
// waiting in a later collective are told, and the numbering starts over under a new epoch.
void Daemon::Impl::drop_client(int fd) {
  auto it = clients.find(fd);
  if (it == clients.end()) return;
  ClientState& c = it->second;
  const std::string reason = "the client of rank " + std::to_string(rank) + " went away";
  for (std::uint32_t id : c.exchanges) {
    auto ex = exchanges.find(id);
    if (ex != exchanges.end() && !ex->second.report) {
      spdlog::warn("client pid {} went away during exchange {}: aborting it", c.pid, id);
      engine->abort(id, reason);
    }
    exchanges.erase(id);
  }
  const bool was_in_session = c.started;
  release_rank(c);
  std::vector<std::uint32_t> owned;
  for (const auto& [slot, g] : groups)
    if (g.client == fd) owned.push_back(slot);
  for (std::uint32_t slot : owned) close_group(slot, reason);
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  close_client_resources(c);
  spdlog::info("client pid {} disconnected", c.pid);
  clients.erase(it);
  for (auto w = waiting_join.begin(); w != waiting_join.end();) w = w->client == fd ? waiting_join.erase(w) : std::next(w);
  for (auto w = waiting_counts.begin(); w != waiting_counts.end();) w = w->client == fd ? waiting_counts.erase(w) : std::next(w);
  if (was_in_session && std::none_of(clients.begin(), clients.end(), [](const auto& e) { return e.second.started; })) {
    // This node's part of the session is over: a peer may be waiting in the collective we
    // would have started next. The next session agrees on its ids anew.
    // Peers whose clients go on calling get each later collective refused at once, not at
    // its deadline, until this node's next session.
    engine->abort_unstarted(next_id, reason, {}, true);
    engine->close_slot(kWorldSlot, next_id, reason);
    next_id = next_id_of(next_id);
    joined = false;
  }
}

// Serves one request; false when there was none to read.
bool Daemon::Impl::serve_client(int fd) {
  std::vector<std::uint8_t> msg;
  int passed_fd = -1;
  bool truncated = false;
  switch (proto::recv_message(fd, msg, passed_fd, truncated)) {
    case proto::Received::kNothing: return false;
    case proto::Received::kClosed: drop_client(fd); return true;
    case proto::Received::kMessage: break;
  }
  if (truncated) {
    if (passed_fd >= 0) ::close(passed_fd);
    auto h = proto::header_of(msg);
    reply_error(fd, h ? h->request : 0, Errc::kProtocol, "request larger than " + std::to_string(proto::kMaxMessage) + " bytes");
    return true;
  }
  proto::DecodedRequest d = proto::decode_request(msg);
  ClientState& c = clients[fd];
  if (!d.request) {
    if (passed_fd >= 0) ::close(passed_fd);
    reply_error(fd, d.header.request, Errc::kProtocol, d.error);
    return true;
  }
  const std::uint32_t request = d.header.request;
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, proto::RegisterRequest>) {
          register_buffer(c, request, m, passed_fd);
          passed_fd = -1;
        } else {
          serve(c, request, m);
        }
      },
      *d.request);
  if (passed_fd >= 0) ::close(passed_fd);
  return true;
}

}  // namespace aapc::engine
