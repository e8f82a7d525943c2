#include "aapc/engine/daemon.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <variant>

#include "aapc/engine/engine.hpp"
#include "aapc/nic/capture.hpp"
#include "aapc/nic/eth_port.hpp"
#include "aapc/nic/fault.hpp"
#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/tree.hpp"
#include "protocol.hpp"

namespace aapc::engine {
namespace {

namespace fs = std::filesystem;

struct Mapping {
  std::uint8_t* data = nullptr;
  std::uint64_t size = 0;
};

struct ClientState {
  int fd = -1;
  uid_t uid = 0;
  pid_t pid = 0;
  std::uint32_t next_buffer = 1;
  bool started = false;  // has run exchanges: part of the cluster's current session
  std::string refused;   // why this client may not use the daemon (answered to its first request)
  std::map<std::uint32_t, Mapping> buffers;
  std::set<std::uint32_t> exchanges;  // running or finished, not yet collected
};

struct ExchangeRecord {
  int client = -1;  // fd of the owner
  std::string schedule, sync;
  std::set<std::uint32_t> buffers;
  std::int64_t cpu_ns = 0;  // process CPU time at the start, then spent during the exchange
  std::optional<ExchangeReport> report;
  std::vector<std::uint32_t> waiters;  // request ids of WAITs to answer
};

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

std::int64_t cpu_now() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

}  // namespace

struct Daemon::Impl {
  DaemonConfig cfg;
  sched::Topology topo;
  std::unique_ptr<sched::TreeModel> model;
  int rank = -1;
  std::unique_ptr<nic::EthPort> eth;
  std::unique_ptr<nic::FaultPort> faults;
  std::unique_ptr<nic::CapturePort> capture;
  std::unique_ptr<Engine> engine;
  int listen_fd = -1;
  bool bound = false;  // the socket file is ours to remove (not another daemon's we refused)
  int epoll_fd = -1;
  int port_fd = -1;  // in epoll_fd: readable when frames wait (else the port is polled)
  std::map<int, ClientState> clients;
  std::map<std::uint32_t, ExchangeRecord> exchanges;
  std::map<std::string, std::shared_ptr<const sched::Schedule>> schedules;  // by "algo/sync"
  std::uint32_t next_id = 1;
  bool joined = false;  // the cluster agreed on ids for the current session
  struct Prepared;
  std::deque<Prepared> waiting_join;  // STARTs until it has
  std::uint64_t pace_bps = 0;

  ~Impl() {
    for (auto& [fd, c] : clients) close_client_resources(c);
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (listen_fd >= 0) ::close(listen_fd);
    if (bound) ::unlink(cfg.socket_path.c_str());
    engine.reset();
    capture.reset();
    faults.reset();
    eth.reset();
  }

  // --- setup --------------------------------------------------------------------------------

  void open_port() {
    nic::eal_init(cfg.eal);
    nic::PortOptions po;
    po.device = cfg.device;
    po.mtu = topo.mtu();
    if (cfg.rank) po.mac = nic::MacAddr(topo.machine(*cfg.rank).mac.bytes);
    eth = nic::EthPort::open(po);
    nic::MacAddr mac = eth->mac();
    sched::Mac m{mac};
    if (cfg.rank) {
      rank = *cfg.rank;
    } else {
      auto r = topo.rank_of_mac(m);
      if (!r)
        fail("the port " + cfg.device + " has MAC " + m.str() + ", which no machine of " + topo.source() +
             " has; fix the topology's mac attribute for this machine, or give --rank");
      rank = *r;
    }
    nic::Port* port = eth.get();
    if (!cfg.faults.empty()) {
      faults = std::make_unique<nic::FaultPort>(*port, nic::FaultOptions::parse(cfg.faults));
      port = faults.get();
    }
    if (!cfg.capture_path.empty()) {
      capture = std::make_unique<nic::CapturePort>(*port, nic::CaptureOptions{cfg.capture_path, cfg.capture_snaplen});
      port = capture.get();
    }
    EngineConfig ec;
    ec.rank = rank;
    for (sched::Rank r = 0; r < topo.machine_count(); ++r) ec.peers.push_back(topo.machine(r).mac.bytes);
    ec.mtu = topo.mtu();
    ec.peer_deadline = cfg.peer_deadline;
    if (cfg.pace == "auto") {
      const sched::Node& me = topo.machine(rank);
      pace_bps = me.links.empty() ? 0 : topo.links()[static_cast<std::size_t>(me.links[0])].rate_bps;
    } else if (cfg.pace != "off") {
      auto bps = sched::parse_rate(cfg.pace);
      if (!bps) fail("--pace " + cfg.pace + ": not a rate like 100Mbit (or auto, off)");
      pace_bps = *bps;
    }
    ec.pace_bps = pace_bps;
    engine = std::make_unique<Engine>(*port, ec);
    engine->on_peer_restart = [](Rank peer) { spdlog::warn("peer rank {} restarted: running exchanges with it failed", peer); };
    engine->announce();
  }

  void open_socket() {
    fs::path path(cfg.socket_path);
    fs::path dir = path.parent_path();
    std::error_code ec;
    if (!dir.empty() && !fs::exists(dir)) {
      fs::create_directories(dir, ec);
      if (ec) fail("cannot create " + dir.string() + ": " + ec.message());
      ::chmod(dir.c_str(), 0750);
    }
    gid_t gid = static_cast<gid_t>(-1);
    if (!cfg.socket_group.empty()) {
      group* g = ::getgrnam(cfg.socket_group.c_str());
      if (g == nullptr) fail("--socket-group " + cfg.socket_group + ": no such group");
      gid = g->gr_gid;
      if (!dir.empty()) (void)::chown(dir.c_str(), static_cast<uid_t>(-1), gid);
    }
    listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_fd < 0) fail(std::string("socket: ") + std::strerror(errno));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (cfg.socket_path.size() >= sizeof addr.sun_path) fail("--socket path too long");
    std::memcpy(addr.sun_path, cfg.socket_path.c_str(), cfg.socket_path.size());
    if (fs::exists(path)) {
      // A daemon that still answers owns it; a stale file (after a crash) is replaced.
      int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      bool alive = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      ::close(probe);
      if (alive) fail("another aapcd already serves " + cfg.socket_path + "; stop it or give --socket another path");
      if (!fs::is_socket(path)) fail(cfg.socket_path + " exists and is not a socket; remove it or give --socket another path");
      ::unlink(cfg.socket_path.c_str());
    }
    mode_t old = ::umask(0177);
    int rc = ::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::umask(old);
    if (rc != 0) fail("cannot bind " + cfg.socket_path + ": " + std::strerror(errno));
    bound = true;
    ::chmod(cfg.socket_path.c_str(), cfg.socket_mode);
    if (gid != static_cast<gid_t>(-1)) (void)::chown(cfg.socket_path.c_str(), static_cast<uid_t>(-1), gid);
    if (::listen(listen_fd, 16) != 0) fail(std::string("listen: ") + std::strerror(errno));
    epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
    // Frames arriving wake the loop too, when the port can say so (net_af_packet).
    if (int fd = eth->wait_fd(); fd >= 0) {
      epoll_event pev{};
      pev.events = EPOLLIN;
      pev.data.fd = fd;
      if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &pev) == 0) port_fd = fd;
    }
  }

  // --- clients ------------------------------------------------------------------------------

  bool allowed(uid_t uid) const {
    if (uid == 0 || uid == ::geteuid()) return true;
    return std::find(cfg.allow_uids.begin(), cfg.allow_uids.end(), uid) != cfg.allow_uids.end();
  }

  static void reply_error(int fd, std::uint32_t request, Errc code, const std::string& message) {
    proto::send_message(fd, proto::message(proto::ErrorReply{static_cast<std::uint32_t>(code), message}, request));
  }

  void accept_clients() {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        ::close(fd);
        continue;
      }
      std::string refused;
      if (!allowed(cred.uid)) {
        spdlog::warn("refused a client of uid {} (pid {}): not root, not our uid, not in --allow-uid", cred.uid, cred.pid);
        refused = "uid " + std::to_string(cred.uid) + " may not use this aapcd (run as root or as the daemon's user, or start aapcd with --allow-uid)";
      }
      if (clients.size() >= cfg.max_clients) {
        reply_error(fd, 0, Errc::kBusy, "aapcd serves " + std::to_string(clients.size()) + " clients already (the limit)");
        ::close(fd);
        continue;
      }
      ClientState c;
      c.fd = fd;
      c.uid = cred.uid;
      c.pid = cred.pid;
      c.refused = refused;
      clients[fd] = std::move(c);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
      spdlog::info("client pid {} (uid {}) connected", cred.pid, cred.uid);
    }
  }

  void close_client_resources(ClientState& c) {
    for (auto& [id, m] : c.buffers) ::munmap(m.data, m.size);
    c.buffers.clear();
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  }

  // The client went away: its exchanges are aborted (the peers are told), then its memory is
  // released; the engine no longer touches the buffers of an aborted exchange.
  // The client went away: its exchanges are aborted (the peers are told), then its memory is
  // released; the engine no longer touches the buffers of an aborted exchange. When the last
  // client that ran exchanges is gone, this node's part of the session is over: peers still
  // waiting in a later collective are told, and the numbering starts over under a new epoch.
  void drop_client(int fd) {
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
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    close_client_resources(c);
    spdlog::info("client pid {} disconnected", c.pid);
    clients.erase(it);
    for (auto w = waiting_join.begin(); w != waiting_join.end();) w = w->client == fd ? waiting_join.erase(w) : std::next(w);
    if (was_in_session && std::none_of(clients.begin(), clients.end(), [](const auto& e) { return e.second.started; })) {
      // This node's part of the session is over: a peer may be waiting in the collective we
      // would have started next. The next session agrees on its ids anew.
      engine->abort_unstarted(next_id, reason);
      ++next_id;
      joined = false;
    }
  }

  // Serves one request; false when there was none to read.
  bool serve_client(int fd) {
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
    if (d.ours && !c.refused.empty()) {
      // Answered, then dropped: closing before its request is read would lose the reason.
      if (passed_fd >= 0) ::close(passed_fd);
      reply_error(fd, d.header.request, Errc::kPermission, c.refused);
      drop_client(fd);
      return true;
    }
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

  void serve(ClientState& c, std::uint32_t request, const proto::HelloRequest&) { hello(c, request); }
  void serve(ClientState& c, std::uint32_t request, const proto::FreeRequest& m) { free_buffer(c, request, m); }
  void serve(ClientState& c, std::uint32_t request, const proto::StartRequest& m) { start_or_join(c, request, m); }
  void serve(ClientState& c, std::uint32_t request, const proto::WaitRequest& m) { wait(c, request, m); }
  void serve(ClientState& c, std::uint32_t request, const proto::StatusRequest&) { status(c, request); }

  void hello(ClientState& c, std::uint32_t request) {
    proto::HelloReply m;
    m.rank = static_cast<std::uint32_t>(rank);
    m.size = static_cast<std::uint32_t>(topo.machine_count());
    m.epoch = engine->epoch();
    m.mtu = static_cast<std::uint32_t>(topo.mtu());
    m.peak_bps = model->peak_aggregate_bps();
    m.machine = topo.machine(rank).name;
    m.topology = topo.name();
    proto::send_message(c.fd, proto::message(m, request));
  }

  void register_buffer(ClientState& c, std::uint32_t request, const proto::RegisterRequest& m, int fd) {
    const std::uint64_t size = m.size;
    auto refuse = [&](Errc code, const std::string& why) {
      if (fd >= 0) ::close(fd);
      reply_error(c.fd, request, code, why);
    };
    if (fd < 0) return refuse(Errc::kInvalidArgument, "REGISTER without a memory file descriptor");
    if (size == 0 || size > cfg.max_buffer_bytes)
      return refuse(Errc::kInvalidArgument, "buffer size " + std::to_string(size) + " is not between 1 and " + std::to_string(cfg.max_buffer_bytes));
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) < size)
      return refuse(Errc::kInvalidArgument, "the descriptor is not a memory file of at least " + std::to_string(size) + " bytes");
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return refuse(Errc::kIo, std::string("cannot map the buffer: ") + std::strerror(errno));
    std::uint32_t id = c.next_buffer++;
    c.buffers[id] = {static_cast<std::uint8_t*>(p), size};
    proto::send_message(c.fd, proto::message(proto::RegisterReply{id}, request));
  }

  bool buffer_busy(std::uint32_t client_fd, std::uint32_t buffer) const {
    for (const auto& [id, ex] : exchanges)
      if (ex.client == static_cast<int>(client_fd) && !ex.report && ex.buffers.count(buffer) != 0) return true;
    return false;
  }

  void free_buffer(ClientState& c, std::uint32_t request, const proto::FreeRequest& m) {
    const std::uint32_t id = m.buffer;
    auto it = c.buffers.find(id);
    if (it == c.buffers.end()) return reply_error(c.fd, request, Errc::kInvalidArgument, "no buffer " + std::to_string(id));
    if (buffer_busy(static_cast<std::uint32_t>(c.fd), id))
      return reply_error(c.fd, request, Errc::kBusy, "buffer " + std::to_string(id) + " is in use by a running exchange");
    ::munmap(it->second.data, it->second.size);
    c.buffers.erase(it);
    proto::send_message(c.fd, proto::message(proto::EmptyReply{proto::Type::kOk}, request));
  }

  std::shared_ptr<const sched::Schedule> schedule(const sched::AlgorithmSpec& algo, const sched::SyncSpec& sync) {
    std::string key = sched::format_plan_spec(algo, sync);
    auto it = schedules.find(key);
    if (it != schedules.end()) return it->second;
    auto s = std::make_shared<const sched::Schedule>(sched::plan_sync(topo, sched::make_schedule(topo, algo), sync));
    schedules[key] = s;
    return s;
  }

  // A START checked and ready to run but for its id.
  struct Prepared {
    int client = -1;
    std::uint32_t request = 0;
    std::shared_ptr<const sched::Schedule> plan;
    std::vector<SendBlock> send;
    std::vector<RecvBlock> recv;
    std::uint32_t timeout_ms = 0;
    ExchangeRecord rec;
  };

  // A request is checked at once; the first exchange of a session then waits until the
  // cluster agreed on exchange ids.
  void start_or_join(ClientState& c, std::uint32_t request, const proto::StartRequest& m) {
    auto p = prepare(c, request, m);
    if (!p) return;
    if (!joined) {
      if (!engine->joining()) engine->start_join(next_id);
      waiting_join.push_back(std::move(*p));
      return;
    }
    launch(std::move(*p));
  }

  void joins() {
    auto result = engine->join_result();
    if (!result) return;
    auto waiting = std::move(waiting_join);
    waiting_join.clear();
    if (!*result) {
      for (const auto& p : waiting)
        if (clients.count(p.client) != 0) reply_error(p.client, p.request, result->error().code(), result->error().message());
      return;
    }
    next_id = result->value();
    joined = true;
    spdlog::info("session agreed: exchanges from id {}", next_id);
    for (auto& p : waiting)
      if (clients.count(p.client) != 0) launch(std::move(p));
  }

  void launch(Prepared p) {
    ClientState& c = clients[p.client];
    const std::uint32_t id = next_id;
    ExchangeSpec spec = exchange_spec(*p.plan, rank, id);
    if (!p.send.empty()) {
      spec.send = std::move(p.send);
      spec.recv = std::move(p.recv);
    }
    spec.timeout = std::chrono::milliseconds(p.timeout_ms);
    auto started = engine->start(std::move(spec));
    ++next_id;  // a collective's id is used up, started or not
    if (!started) return reply_error(c.fd, p.request, started.error().code(), started.error().message());
    p.rec.cpu_ns = cpu_now();
    exchanges[id] = std::move(p.rec);
    c.exchanges.insert(id);
    c.started = true;
    proto::send_message(c.fd, proto::message(proto::StartedReply{id, exchanges[id].schedule, exchanges[id].sync}, p.request));
  }

  std::optional<Prepared> prepare(ClientState& c, std::uint32_t request, const proto::StartRequest& m) {
    Prepared p;
    p.client = c.fd;
    p.request = request;
    p.timeout_ms = m.timeout_ms;
    p.rec.client = c.fd;
    if (m.kind == proto::Kind::kBarrier) {
      p.plan = std::make_shared<const sched::Schedule>(sched::barrier_schedule(topo.machine_count()));
      p.rec.schedule = "barrier";
      p.rec.sync = "tokens";
    } else if (auto error = place_blocks(c, m, p)) {
      reply_error(c.fd, request, Errc::kInvalidArgument, *error);
      return std::nullopt;
    } else if (auto plan_error = plan(m, p)) {
      reply_error(c.fd, request, Errc::kInvalidArgument, *plan_error);
      return std::nullopt;
    }
    return p;
  }

  // The blocks of `m` in the client's buffers, checked like wire fields; why not, if not.
  std::optional<std::string> place_blocks(const ClientState& c, const proto::StartRequest& m, Prepared& p) const {
    const auto n = static_cast<std::size_t>(topo.machine_count());
    if (m.kind == proto::Kind::kAlltoallv && m.sends.size() != n)
      return "the request has " + std::to_string(m.sends.size()) + " blocks; the cluster has " + std::to_string(n) + " ranks";
    auto sb = c.buffers.find(m.send_buffer), rb = c.buffers.find(m.recv_buffer);
    if (sb == c.buffers.end() || rb == c.buffers.end()) return "START names a buffer this client has not registered";
    const Mapping& sm = sb->second;
    const Mapping& rm = rb->second;
    for (std::size_t i = 0; i < n; ++i) {
      const proto::Block s = m.send_block(i), r = m.recv_block(i);
      if (!proto::fits(s, sm.size))
        return "send block " + std::to_string(i) + " (offset " + std::to_string(s.offset) + ", " + std::to_string(s.length) +
               " bytes) runs past the end of the " + std::to_string(sm.size) + "-byte send buffer";
      if (!proto::fits(r, rm.size))
        return "receive block " + std::to_string(i) + " (offset " + std::to_string(r.offset) + ", " + std::to_string(r.length) +
               " bytes) runs past the end of the " + std::to_string(rm.size) + "-byte receive buffer";
      p.send.push_back({sm.data + s.offset, s.length});
      p.recv.push_back({rm.data + r.offset, r.length});
    }
    p.rec.buffers = {m.send_buffer, m.recv_buffer};
    return std::nullopt;
  }

  // The schedule of `m`'s spec. Every rank must pick the same one: an alltoall's block size is
  // the same on all of them (the collective's contract), an alltoallv's largest block is not,
  // so it gets the choice for large blocks.
  std::optional<std::string> plan(const proto::StartRequest& m, Prepared& p) {
    try {
      const sched::Choice choice = sched::choose(*model, m.spec, m.kind == proto::Kind::kAlltoall ? m.block : sched::kAnyBlockSize);
      p.plan = schedule(choice.algorithm, choice.sync);
    } catch (const std::exception& e) {
      return e.what();
    }
    p.rec.schedule = p.plan->algorithm;
    p.rec.sync = p.plan->sync.name();
    return std::nullopt;
  }

  void send_done(int fd, std::uint32_t request, std::uint32_t id, const ExchangeRecord& rec) {
    const ExchangeReport& rep = *rec.report;
    proto::DoneReply m;
    m.exchange = id;
    m.ok = rep.state == ExchangeState::kDone;
    m.code = static_cast<std::uint32_t>(rep.code);
    m.message = rep.error;
    m.schedule = rec.schedule;
    m.sync = rec.sync;
    m.duration_ns = rep.duration_ns;
    m.bytes_sent = rep.counters.data_bytes_sent;
    m.bytes_received = rep.counters.data_bytes_received;
    m.retransmissions = rep.counters.retransmitted_frames;
    m.wait_ns = rep.counters.wait_ns;
    m.cpu_ns = rec.cpu_ns;
    for (const auto& rt : rep.counters.rounds) m.rounds.emplace_back(rt.start_ns, rt.end_ns);
    proto::send_message(fd, proto::message(m, request));
  }

  void wait(ClientState& c, std::uint32_t request, const proto::WaitRequest& m) {
    const std::uint32_t id = m.exchange;
    auto it = exchanges.find(id);
    if (it == exchanges.end() || it->second.client != c.fd)
      return reply_error(c.fd, request, Errc::kInvalidArgument, "no exchange " + std::to_string(id) + " of this client");
    if (it->second.report) {
      send_done(c.fd, request, id, it->second);
      exchanges.erase(it);
      c.exchanges.erase(id);
      return;
    }
    if (m.block) {
      it->second.waiters.push_back(request);
    } else {
      proto::send_message(c.fd, proto::message(proto::EmptyReply{proto::Type::kRunning}, request));
    }
  }

  void status(ClientState& c, std::uint32_t request) {
    const EngineCounters& k = engine->counters();
    nlohmann::json drops = nlohmann::json::object();
    for (int d = 1; d < kDropReasons; ++d)
      if (k.drops[static_cast<std::size_t>(d)] > 0) drops[std::string(drop_reason_name(static_cast<DropReason>(d)))] = k.drops[static_cast<std::size_t>(d)];
    nlohmann::json live = nlohmann::json::array();
    for (const auto& [id, ex] : exchanges) live.push_back({{"id", id}, {"schedule", ex.schedule}, {"sync", ex.sync}, {"finished", ex.report.has_value()}});
    nlohmann::json j = {
        {"rank", rank},
        {"size", topo.machine_count()},
        {"machine", topo.machine(rank).name},
        {"mac", topo.machine(rank).mac.str()},
        {"topology", topo.source()},
        {"port", cfg.device},
        {"epoch", engine->epoch()},
        {"pace_bps", pace_bps},
        {"peak_aggregate_bps", model->peak_aggregate_bps()},
        {"next_exchange", next_id},
        {"clients", clients.size()},
        {"exchanges", live},
        {"counters",
         {{"frames_received", k.frames_received},
          {"bytes_received", k.bytes_received},
          {"frames_sent", k.frames_sent},
          {"bytes_sent", k.bytes_sent},
          {"tx_refused", k.tx_refused},
          {"alloc_failures", k.alloc_failures},
          {"early_frames", k.early_frames},
          {"drops", drops}}},
    };
    if (capture) j["capture"] = {{"path", cfg.capture_path}, {"frames", capture->frames_captured()}};
    proto::send_message(c.fd, proto::message(proto::StatusReply{j.dump(2)}, request));
  }

  // --- the loop -------------------------------------------------------------------------------

  void collect_finished() {
    for (auto& rep : engine->take_finished()) {
      auto it = exchanges.find(rep.id);
      if (it == exchanges.end()) continue;  // its client went away
      if (rep.state == ExchangeState::kFailed) spdlog::warn("exchange {} failed: {}", rep.id, rep.error);
      it->second.report = rep;
      it->second.cpu_ns = cpu_now() - it->second.cpu_ns;
      for (std::uint32_t request : it->second.waiters) send_done(it->second.client, request, rep.id, it->second);
      if (!it->second.waiters.empty()) {
        clients[it->second.client].exchanges.erase(rep.id);
        exchanges.erase(it);
      }
    }
    joins();
  }

  void service(int timeout_ms) {
    epoll_event events[16];
    int n = ::epoll_wait(epoll_fd, events, 16, timeout_ms);
    // Clients that left first (what they sent before leaving is still served): a session
    // must end before the next one's requests are.
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == listen_fd || (events[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) == 0) continue;
      while (clients.count(fd) != 0 && serve_client(fd)) {
      }  // ends with the client dropped
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == listen_fd) {
        accept_clients();
      } else if (clients.count(fd) != 0) {
        serve_client(fd);
      }
    }
  }
};

Daemon::Daemon() : impl_(std::make_unique<Impl>()) {}
Daemon::~Daemon() = default;

std::unique_ptr<Daemon> Daemon::create(const DaemonConfig& config) {
  std::unique_ptr<Daemon> d(new Daemon());
  Impl& m = *d->impl_;
  m.cfg = config;
  m.topo = sched::load_topology(config.topology);
  m.model = std::make_unique<sched::TreeModel>(m.topo);
  if (config.rank && (*config.rank < 0 || *config.rank >= m.topo.machine_count()))
    fail("--rank " + std::to_string(*config.rank) + ": " + m.topo.source() + " has ranks 0.." + std::to_string(m.topo.machine_count() - 1));
  m.open_port();
  m.open_socket();
  return d;
}

int Daemon::rank() const { return impl_->rank; }

std::string Daemon::describe() const {
  const Impl& m = *impl_;
  return "rank " + std::to_string(m.rank) + " of " + std::to_string(m.topo.machine_count()) + " (" + m.topo.machine(m.rank).name + ", " +
         m.topo.machine(m.rank).mac.str() + ") on " + m.cfg.device + ", epoch " + std::to_string(m.engine->epoch()) + ", pacing " +
         (m.pace_bps > 0 ? sched::format_rate(m.pace_bps) : "off") + (m.port_fd >= 0 ? ", idles in poll(2) on the port" : ", idles polling the port") +
         ", socket " + m.cfg.socket_path;
}

namespace {

// Sleeps until the epoll set (clients, and the port when it has a descriptor) has something,
// or `until`; nanosecond timeouts, which epoll_wait lacks, through ppoll on the epoll fd.
void sleep_in(int epoll_fd, Clock::time_point until) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now()).count();
  if (ns <= 0) return;
  pollfd p{epoll_fd, POLLIN, 0};
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  ::ppoll(&p, 1, &ts, nullptr);
}

}  // namespace

int Daemon::run(const std::atomic<bool>& stop) {
  Impl& m = *impl_;
  // Short sleeps must be short: the default 50 us of timer slack would double them.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  unsigned idle = 0;
  auto next_service = Clock::now();
  while (!stop.load(std::memory_order_relaxed)) {
    bool busy = m.engine->poll();
    m.collect_finished();
    const auto now = Clock::now();
    if (m.engine->quiet()) {
      idle = 0;
      m.service(5);  // nothing to send: wait for a client or a frame (without a port fd, polled every 5 ms)
      continue;
    }
    // An exchange runs: look at the clients once a millisecond (sooner when woken by one).
    if (now >= next_service) {
      m.service(0);
      next_service = now + std::chrono::milliseconds(1);
    }
    if (busy) {
      idle = 0;
      continue;
    }
    if (m.port_fd >= 0) {
      // Sleep until a frame or a client comes, or the engine has something to send or time
      // out: many daemons share few cores in emulation, and spinning ones starve the rest.
      sleep_in(m.epoll_fd, std::min(m.engine->next_event(Clock::now()), next_service));
      next_service = std::min(next_service, Clock::now());
    } else if (++idle > 16) {
      std::this_thread::sleep_for(std::chrono::microseconds(idle > 2000 ? 200 : 30));
    }
  }
  // Shutting down: abort what runs and let the ABORT frames leave.
  spdlog::info("shutting down");
  for (auto& [id, ex] : m.exchanges)
    if (!ex.report) m.engine->abort(id, "aapcd of rank " + std::to_string(m.rank) + " is shutting down");
  for (int i = 0; i < 200 && !m.engine->quiet(); ++i) m.engine->poll();
  for (int i = 0; i < 50; ++i) m.engine->poll();
  m.collect_finished();
  return 0;
}

}  // namespace aapc::engine
