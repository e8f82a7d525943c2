// What a client can do to aapcd through its socket and its shared
// memory (findings 1, 2, 3 and 9). Each case runs a Daemon in this process on a ring port,
// as rank 0 of two machines whose rank 1 never answers: collectives there fail after the peer
// deadline, which is all most cases need. Those that run collectives put a second Daemon on
// the other end of a pair of rings. Cases about other users need root (setresuid in a forked
// child); without it they say so and pass.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_ring.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <thread>

#include "skip.hpp"
#include "aapc/client.hpp"
#include "aapc/daemon/daemon.hpp"
#include "aapc/proto/protocol.hpp"
#include "fabric.hpp"
#include "group_reduce.hpp"
#include "ring_ports.hpp"

using namespace aapc;
using namespace std::chrono_literals;
using test::open_both;
using test::open_in;
using test::ThreadReduce;
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_daemons{0};
constexpr uid_t kNobody = 65534;

// A Daemon serving in a thread of this process, on a socket in a fresh directory. Its port
// is `device`, or one that nothing ever reaches.
struct LocalDaemon {
  fs::path dir;
  std::string socket;
  std::unique_ptr<engine::Daemon> daemon;
  std::atomic<bool> stop{false};
  std::thread thread;

  explicit LocalDaemon(const std::function<void(engine::DaemonConfig&)>& tune = {}, const std::string& device = "", int rank = 0) {
    test::start_eal();
    spdlog::set_level(spdlog::level::warn);
    char tmpl[] = "/tmp/aapc-daemon-XXXXXX";
    dir = ::mkdtemp(tmpl);
    ::chmod(dir.c_str(), 0755);  // the socket's own checks are under test, not the directory's
    std::ofstream(dir / "two.dot") << "graph \"two\" {\n  edge [rate=\"100Mbit\"];\n  n0 [mac=\"02:00:00:00:00:01\"];\n"
                                       "  n1 [mac=\"02:00:00:00:00:02\"];\n  s0 [buffer=\"64K\"];\n  s0 -- n0;\n  s0 -- n1;\n}\n";
    engine::DaemonConfig cfg;
    cfg.topology = (dir / "two.dot").string();
    if (device.empty()) {
      const std::string base = "ld" + std::to_string(g_daemons++);
      cfg.device = test::ring_port(base, test::ring(base + "rx"), test::ring(base + "tx"));
    } else {
      cfg.device = device;
    }
    cfg.rank = rank;
    socket = cfg.socket_path = (dir / "aapcd.sock").string();
    cfg.socket_mode = 0666;
    cfg.pace = "off";
    cfg.peer_deadline = 300ms;
    if (tune) tune(cfg);
    socket = cfg.socket_path;
    try {
      daemon = engine::Daemon::create(cfg);
    } catch (...) {
      fs::remove_all(dir);  // a refused configuration leaves nothing behind in /tmp
      throw;
    }
    thread = std::thread([this] { daemon->run(stop); });
  }
  ~LocalDaemon() {
    stop = true;
    thread.join();
    daemon.reset();
    fs::remove_all(dir);
  }
  LocalDaemon(const LocalDaemon&) = delete;
  LocalDaemon& operator=(const LocalDaemon&) = delete;
};

// Two daemons, ranks 0 and 1, on the two ends of a pair of rings.
struct DaemonPair {
  std::unique_ptr<LocalDaemon> d[2];
  explicit DaemonPair(const std::function<void(engine::DaemonConfig&)>& tune = {}) {
    test::start_eal();
    const std::string base = "dp" + std::to_string(g_daemons++);
    rte_ring* to[2] = {test::ring(base + "to0"), test::ring(base + "to1")};
    for (int i = 0; i < 2; ++i) d[i] = std::make_unique<LocalDaemon>(tune, test::ring_port(base + "n" + std::to_string(i), to[i], to[1 - i]), i);
  }
};

// A connection that speaks the protocol by hand.
struct Raw {
  int fd = -1;
  explicit Raw(const std::string& path) {
    fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~Raw() {
    if (fd >= 0) ::close(fd);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  // The next message within `timeout`; nullopt on none or end of file.
  std::optional<std::vector<std::uint8_t>> next(std::chrono::milliseconds timeout = 3000ms) const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return std::nullopt;
    std::vector<std::uint8_t> msg;
    int passed = -1;
    bool truncated = false;
    if (proto::recv_message(fd, msg, passed, truncated) != proto::Received::kMessage) return std::nullopt;
    return msg;
  }
  template <typename M>
  std::optional<std::vector<std::uint8_t>> call(const M& m, int pass = -1) const {
    proto::send_message(fd, proto::message(m, 7), pass);
    return next();
  }
  // True when the daemon closed the connection (within `timeout`).
  bool closed(std::chrono::milliseconds timeout = 3000ms) const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
    char c;
    return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
  }
};

proto::Type type_of(const std::vector<std::uint8_t>& msg) { return static_cast<proto::Type>(proto::header_of(msg)->type); }

// The error a reply carries; code 0 and "" when it is not an error.
proto::ErrorReply error_of(const std::optional<std::vector<std::uint8_t>>& msg) {
  proto::ErrorReply e;
  if (!msg || type_of(*msg) != proto::Type::kError) return e;
  proto::Reader r = proto::payload_of(*msg);
  proto::decode(r, e);
  return e;
}

// A DONE reply's outcome; nullopt when `msg` is no DONE.
std::optional<proto::DoneReply> done_of(const std::optional<std::vector<std::uint8_t>>& msg) {
  proto::DoneReply d;
  if (!msg || type_of(*msg) != proto::Type::kDone) return std::nullopt;
  proto::Reader r = proto::payload_of(*msg);
  if (!proto::decode(r, d)) return std::nullopt;
  return d;
}

std::optional<std::uint32_t> registered(const std::optional<std::vector<std::uint8_t>>& msg) {
  proto::RegisterReply m;
  if (!msg || type_of(*msg) != proto::Type::kRegisterReply) return std::nullopt;
  proto::Reader r = proto::payload_of(*msg);
  if (!proto::decode(r, m)) return std::nullopt;
  return m.buffer;
}

int memfd(std::size_t bytes, unsigned flags) {
  int fd = ::memfd_create("test-buffer", MFD_CLOEXEC | flags);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  return fd;
}

nlohmann::json status_of(Client& c) {
  auto s = c.status();
  REQUIRE(s);
  return nlohmann::json::parse(*s);
}

bool root() { return ::geteuid() == 0; }
constexpr const char* kNotRoot = "not root: the cases of other uids (setresuid) need it";

// Runs `body` in a child as uid and gid 65534 with the supplementary `groups`; its exit status.
// The child may talk to the parent through `ready` (it writes a byte) and `go` (it reads one).
struct Child {
  pid_t pid = -1;
  int ready[2] = {-1, -1}, go[2] = {-1, -1};

  Child(const std::vector<gid_t>& groups, const std::function<int(Child&)>& body) {
    REQUIRE(::pipe(ready) == 0);
    REQUIRE(::pipe(go) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (::setgroups(groups.size(), groups.data()) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
          ::setresuid(kNobody, kNobody, kNobody) != 0)
        ::_exit(100);
      ::_exit(body(*this));
    }
  }
  void signal_ready() const { (void)::write(ready[1], "r", 1); }
  void wait_go() const {
    char c;
    (void)::read(go[0], &c, 1);
  }
  bool wait_ready() const {
    pollfd p{ready[0], POLLIN, 0};
    char c;
    return ::poll(&p, 1, 10000) == 1 && ::read(ready[0], &c, 1) == 1;
  }
  void let_go() const { (void)::write(go[1], "g", 1); }
  int status() {
    int st = 0;
    ::waitpid(pid, &st, 0);
    for (int f : {ready[0], ready[1], go[0], go[1]}) ::close(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 200;
  }
};

// 0 when a Client connects and reads the status, 1 when refused with a message naming the
// reason `why`, 2 otherwise.
int try_client(const std::string& socket, const std::string& why) {
  auto c = Client::try_connect(socket);
  if (c) return c->status() ? 0 : 2;
  return c.error().message().find(why) != std::string::npos ? 1 : 2;
}

// A Child's body: holds `count` connections, is refused the next as busy with `why` in the
// message, and keeps them until let go. Exits 2 where one of them was refused, 3 where the next
// was not refused so.
std::function<int(Child&)> holds_then_refused(const std::string& socket, int count, const std::string& why) {
  return [=](Child& self) {
    std::vector<Client> held;
    for (int i = 0; i < count; ++i) {
      auto c = Client::try_connect(socket);
      if (!c) return 2;
      held.push_back(std::move(*c));
    }
    auto next = Client::try_connect(socket);
    if (next || next.error().code() != Errc::kBusy || next.error().message().find(why) == std::string::npos) return 3;
    self.signal_ready();
    self.wait_go();
    return 0;
  };
}

// `count` connections of this process, each required to succeed.
std::vector<Client> connections(const std::string& socket, int count) {
  std::vector<Client> all;
  for (int i = 0; i < count; ++i) {
    auto c = Client::try_connect(socket);
    REQUIRE(c);
    all.push_back(std::move(*c));
  }
  return all;
}

}  // namespace

TEST_CASE("a registered buffer's memory file cannot shrink or grow under aapcd") {
  LocalDaemon d;
  Raw raw(d.socket);
  REQUIRE(raw.fd >= 0);
  REQUIRE(raw.call(proto::HelloRequest{"test", ""}));

  // Sealable and not yet sealed: aapcd seals it, and the client can no longer shrink it.
  int fd = memfd(8192, MFD_ALLOW_SEALING);
  CHECK(registered(raw.call(proto::RegisterRequest{8192}, fd)));
  errno = 0;
  CHECK(::ftruncate(fd, 0) == -1);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(fd, 1 << 20) == -1);
  CHECK((::fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW));
  ::close(fd);

  // Not sealable: refused, saying how to make one that is.
  fd = memfd(4096, 0);
  auto e = error_of(raw.call(proto::RegisterRequest{4096}, fd));
  CHECK(e.code == static_cast<std::uint32_t>(Errc::kInvalidArgument));
  CHECK_THAT(e.message, Catch::Contains("MFD_ALLOW_SEALING"));
  CHECK(::ftruncate(fd, 0) == 0);  // it stays the client's to shrink: aapcd never mapped it
  ::close(fd);

  // Sealed against seals but not against shrinking: refused too.
  fd = memfd(4096, MFD_ALLOW_SEALING);
  REQUIRE(::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL) == 0);
  CHECK_THAT(error_of(raw.call(proto::RegisterRequest{4096}, fd)).message, Catch::Contains("cannot be sealed"));
  ::close(fd);

  // Smaller than the size asked for: refused.
  fd = memfd(4096, MFD_ALLOW_SEALING);
  CHECK_THAT(error_of(raw.call(proto::RegisterRequest{8192}, fd)).message, Catch::Contains("at least 8192 bytes"));
  ::close(fd);
}

TEST_CASE("a client's buffers are sealed, so shrinking one through /proc fails", "[root]") {
  LocalDaemon d;
  Client c = Client::connect(d.socket);
  Buffer b = c.allocate(1 << 16);
  // The attack of the finding: the mapping's file, reopened through /proc/self/map_files.
  char path[128];
  std::snprintf(path, sizeof path, "/proc/self/map_files/%lx-%lx", reinterpret_cast<unsigned long>(b.data()),
                reinterpret_cast<unsigned long>(b.data() + b.size()));
  int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    AAPC_SKIP(std::string("cannot open ") + path + " (" + std::strerror(errno) + "): needs CAP_SYS_ADMIN");
  }
  errno = 0;
  CHECK(::ftruncate(fd, 0) == -1);
  CHECK(errno == EPERM);
  ::close(fd);
  // aapcd still serves, and the buffer is whole.
  std::memset(b.data(), 0x5a, b.size());
  CHECK(c.status());
}

// Block d of rank r's send buffer: bytes r*16 + d + i.
void fill(Buffer& b, int rank, std::size_t block) {
  for (std::size_t i = 0; i < b.size(); ++i) b.data()[i] = static_cast<std::uint8_t>(rank * 16 + static_cast<int>(i / block) + static_cast<int>(i));
}
// Whether block s of `recv` is what rank s sent to rank `me`.
bool received(const Buffer& recv, int me, std::size_t block) {
  for (std::size_t i = 0; i < recv.size(); ++i) {
    const auto src = static_cast<int>(i / block);
    if (recv.data()[i] != static_cast<std::uint8_t>(src * 16 + me + static_cast<int>(me * block + i % block))) return false;
  }
  return true;
}

// Both ranks' alltoall of 2 x `block` bytes at once, from clients x (rank 0) and y (rank 1).
std::pair<Result<Stats>, Result<Stats>> alltoall_both(Client& x, Buffer& sx, Buffer& rx, Client& y, Buffer& sy, Buffer& ry, const Options& o = {},
                                                      std::size_t block = 64) {
  fill(sx, 0, block);
  fill(sy, 1, block);
  std::memset(rx.data(), 0, rx.size());
  std::memset(ry.data(), 0, ry.size());
  Result<Stats> other = Error(Errc::kInternal, "not run");
  std::thread t([&] { other = y.alltoall(sy, ry, block, o); });
  auto mine = x.alltoall(sx, rx, block, o);
  t.join();
  return {mine, other};
}

// New clients on both daemons of `pair` run `times` alltoalls: each must succeed on both ranks.
void fresh_clients_exchange(DaemonPair& pair, int times = 1) {
  Client x = Client::connect(pair.d[0]->socket), y = Client::connect(pair.d[1]->socket);
  Buffer sx = x.allocate(128), rx = x.allocate(128), sy = y.allocate(128), ry = y.allocate(128);
  for (int i = 0; i < times; ++i) {
    auto [a, b] = alltoall_both(x, sx, rx, y, sy, ry);
    CHECK(a);
    CHECK(b);
  }
}

TEST_CASE("while one client holds the rank, another's collectives are refused at once") {
  DaemonPair pair;
  auto a = std::make_unique<Client>(Client::connect(pair.d[0]->socket));
  auto p = std::make_unique<Client>(Client::connect(pair.d[1]->socket));
  Client b = Client::connect(pair.d[0]->socket);
  Client watcher = Client::connect(pair.d[0]->socket);
  Buffer sa = a->allocate(128), ra = a->allocate(128), sp = p->allocate(128), rp = p->allocate(128);
  Buffer sb = b.allocate(128), rb = b.allocate(128);
  CHECK(status_of(watcher)["rank_holder"].is_null());

  // a's collective with p: a holds rank 0 from then on.
  auto [ok_a, ok_p] = alltoall_both(*a, sa, ra, *p, sp, rp);
  REQUIRE(ok_a);
  REQUIRE(ok_p);
  CHECK(received(ra, 0, 64));
  CHECK(received(rp, 1, 64));
  CHECK(status_of(watcher)["rank_holder"]["pid"] == ::getpid());

  // b is refused at once, for every collective, with who holds the rank; nothing reaches the
  // cluster, so a and p go on as before.
  const auto t0 = std::chrono::steady_clock::now();
  Options bounded;
  bounded.timeout = 2000ms;  // were it to start (it must not), it would fail rather than hang
  auto second = b.alltoall(sb, rb, 64, bounded);
  REQUIRE(!second);
  REQUIRE(second.error().code() == Errc::kBusy);  // (else the barrier below, which has no timeout, would hang)
  CHECK_THAT(second.error().message(), Catch::Contains("rank 0 on n0 is in use by pid " + std::to_string(::getpid())));
  CHECK(std::chrono::steady_clock::now() - t0 < 200ms);
  CHECK(b.barrier().error().code() == Errc::kBusy);
  CHECK(b.alltoallv(sb, {64, 64}, {0, 64}, rb, {64, 64}, {0, 64}, bounded).error().code() == Errc::kBusy);
  CHECK(b.status());  // reading the state stays open to everyone
  auto [again_a, again_p] = alltoall_both(*a, sa, ra, *p, sp, rp);
  REQUIRE(again_a);
  REQUIRE(again_p);
  CHECK(received(ra, 0, 64));
  CHECK(received(rp, 1, 64));

  // a goes away: the rank is free, and b's collectives run (with a new client on rank 1).
  a.reset();
  p.reset();
  sa = Buffer();
  ra = Buffer();
  sp = Buffer();
  rp = Buffer();
  std::this_thread::sleep_for(50ms);
  CHECK(status_of(watcher)["rank_holder"].is_null());
  Client q = Client::connect(pair.d[1]->socket);
  Buffer sq = q.allocate(128), rq = q.allocate(128);
  auto [ok_b, ok_q] = alltoall_both(b, sb, rb, q, sq, rq);
  REQUIRE(ok_b);
  REQUIRE(ok_q);
  CHECK(received(rb, 0, 64));
  CHECK(received(rq, 1, 64));
}

TEST_CASE("two groups of both machines, two clients each, run with the cluster's own collective at once, byte-exact") {
  DaemonPair pair;
  // The cluster's collective holds each rank for its client; groups are other clients'.
  Client w0 = Client::connect(pair.d[0]->socket), w1 = Client::connect(pair.d[1]->socket);
  Buffer sw0 = w0.allocate(128), rw0 = w0.allocate(128), sw1 = w1.allocate(128), rw1 = w1.allocate(128);
  REQUIRE(alltoall_both(w0, sw0, rw0, w1, sw1, rw1).first);
  // Group x in cluster order, group y reversed: y's rank 0 is cluster rank 1.
  const std::vector<std::vector<int>> members = {{0, 1}, {1, 0}};
  ThreadReduce reduce_x(2), reduce_y(2);
  std::atomic<int> failures{0};
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      const int group = k / 2, cluster_rank = k % 2;
      Client c = Client::connect(pair.d[cluster_rank]->socket);
      auto g = open_in(c, members[static_cast<std::size_t>(group)], group == 0 ? reduce_x : reduce_y);
      if (!g) {
        errors[static_cast<std::size_t>(k)] = g.error().message();
        ++failures;
        return;
      }
      const int me = g->rank();
      Buffer s = c.allocate(128), r = c.allocate(128);
      for (int it = 0; it < 20; ++it) {
        fill(s, me, 64);
        std::memset(r.data(), 0, r.size());
        auto done = g->alltoall(s, r, 64);
        if (!done || !received(r, me, 64)) {
          errors[static_cast<std::size_t>(k)] = done ? "bytes differ" : done.error().message();
          ++failures;
          return;
        }
      }
      if (!g->barrier()) ++failures;
    });
  }
  // Meanwhile the cluster's collectives go on.
  for (int it = 0; it < 10; ++it) {
    auto [a, b] = alltoall_both(w0, sw0, rw0, w1, sw1, rw1);
    CHECK(a);
    CHECK(b);
    CHECK(received(rw0, 0, 64));
  }
  for (auto& t : threads) t.join();
  INFO(errors[0] << " | " << errors[1] << " | " << errors[2] << " | " << errors[3]);
  CHECK(failures == 0);
  CHECK(status_of(w0)["groups"].empty());  // closed with their clients
}

TEST_CASE("32 collectives of four groups' clients run at once on one daemon, byte-exact") {
  // An MPI job's communicators each have a leader on every machine, and a leader runs up to 8
  // exchanges at once (libaapc-mpi's kMostRunning): four communicators split by local rank,
  // at four ranks a machine, make 32. The daemon ran 16 and refused the 17th (busy), and the
  // program got an error. Rank 1's clients start only once rank 0's have started all of
  // theirs, so that rank 0's daemon runs all 32 at once: blocks beyond the eager size wait for
  // their receiver's READY.
  DaemonPair pair;
  constexpr int kGroups = 4, kEach = 8;
  constexpr std::size_t kBlock = 32 * 1024;
  const auto byte = [](int src, int dst, int call, std::size_t i) { return static_cast<std::uint8_t>(src * 31 + dst * 7 + call * 13 + static_cast<int>(i)); };
  std::vector<std::unique_ptr<ThreadReduce>> reduces;
  for (int g = 0; g < kGroups; ++g) reduces.push_back(std::make_unique<ThreadReduce>(2));
  std::latch rank0_started(kGroups);
  std::mutex m;
  std::vector<std::string> errors;
  const auto note = [&](const std::string& e) {
    std::lock_guard lock(m);
    errors.push_back(e);
  };
  std::vector<std::thread> threads;
  for (int k = 0; k < 2 * kGroups; ++k) {
    threads.emplace_back([&, k] {
      const int group = k / 2, me = k % 2;
      bool counted = me == 1;
      const auto started = [&] {
        if (!counted) rank0_started.count_down();
        counted = true;
      };
      Client c = Client::connect(pair.d[me]->socket);
      auto g = open_in(c, {0, 1}, *reduces[static_cast<std::size_t>(group)]);
      if (!g) {
        note(g.error().message());
        return started();
      }
      std::vector<Buffer> sends, recvs;
      std::vector<Request> requests;
      for (int i = 0; i < kEach; ++i) {
        sends.push_back(c.allocate(2 * kBlock));
        recvs.push_back(c.allocate(2 * kBlock));
        for (std::size_t b = 0; b < 2 * kBlock; ++b) sends.back().data()[b] = byte(me, static_cast<int>(b / kBlock), group * kEach + i, b % kBlock);
      }
      if (me == 1) rank0_started.wait();
      for (int i = 0; i < kEach; ++i) {
        auto r = g->start_alltoall(sends[static_cast<std::size_t>(i)], recvs[static_cast<std::size_t>(i)], kBlock);
        if (!r) {
          note("rank " + std::to_string(me) + ", group " + std::to_string(group) + ", call " + std::to_string(i) + ": " + r.error().message());
          break;
        }
        requests.push_back(std::move(*r));
      }
      started();
      for (std::size_t i = 0; i < requests.size(); ++i) {
        auto done = requests[i].wait();
        if (!done) {
          note(done.error().message());
          continue;
        }
        for (std::size_t b = 0; b < 2 * kBlock; ++b)
          if (recvs[i].data()[b] != byte(static_cast<int>(b / kBlock), me, group * kEach + static_cast<int>(i), b % kBlock)) {
            note("rank " + std::to_string(me) + ", group " + std::to_string(group) + ", call " + std::to_string(i) + ": byte " + std::to_string(b) + " differs");
            break;
          }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::string all;
  for (const auto& e : errors) all += e + "\n";
  INFO(all);
  CHECK(errors.empty());
}

TEST_CASE("a group's ranks are its members' order; one member's bad list fails the group on every member") {
  DaemonPair pair;
  Client a = Client::connect(pair.d[0]->socket), b = Client::connect(pair.d[1]->socket);
  ThreadReduce reduce(2);
  Result<Client> ga = Error(Errc::kInternal, "not run"), gb = Error(Errc::kInternal, "not run");
  std::thread t([&] { gb = open_in(b, {1, 1}, reduce); });
  ga = open_in(a, {0, 1}, reduce);
  t.join();
  REQUIRE(!ga);
  REQUIRE(!gb);
  CHECK_THAT(gb.error().message(), Catch::Contains("member 1 is named twice"));
  CHECK(ga.error().code() == Errc::kBusy);
  CHECK(status_of(a)["groups"].empty());
  // Then a good one opens, in the members' order.
  std::thread t2([&] { gb = open_in(b, {1, 0}, reduce); });
  ga = open_in(a, {1, 0}, reduce);
  t2.join();
  REQUIRE(ga);
  REQUIRE(gb);
  CHECK(ga->rank() == 1);
  CHECK(gb->rank() == 0);
  CHECK(ga->size() == 2);
  CHECK(ga->members() == std::vector<int>{1, 0});
  CHECK(a.rank() == 0);  // the cluster's client is unchanged
  CHECK(status_of(a)["groups"].size() == 1);
}

TEST_CASE("when a group's client closes it and goes away, its peer's next collective of the group fails at once, naming it") {
  DaemonPair pair;
  Client a = Client::connect(pair.d[0]->socket);
  auto b = std::make_unique<Client>(Client::connect(pair.d[1]->socket));
  auto [ga, gb] = open_both(a, {0, 1}, *b, {0, 1});
  REQUIRE(ga);
  REQUIRE(gb);
  gb = Error(Errc::kInternal, "gone");  // closes the group at rank 1
  b.reset();  // and rank 1's client exits without calling the collective
  std::this_thread::sleep_for(100ms);
  Buffer s = a.allocate(128), r = a.allocate(128);
  const auto t0 = std::chrono::steady_clock::now();
  auto done = ga->alltoall(s, r, 64);
  REQUIRE(!done);
  CHECK_THAT(done.error().message(), Catch::Contains("the client of rank 1 closed group slot"));
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);  // not the exchange's deadline
}

TEST_CASE("after a rank's client exits, every later collective of its peers fails at once, naming it, until a new client joins") {
  DaemonPair pair;
  auto x = std::make_unique<Client>(Client::connect(pair.d[0]->socket));
  Buffer sx = x->allocate(128), rx = x->allocate(128);
  {
    Client y = Client::connect(pair.d[1]->socket);
    Buffer sy = y.allocate(128), ry = y.allocate(128);
    auto [a, b] = alltoall_both(*x, sx, rx, y, sy, ry);
    REQUIRE(a);
    REQUIRE(b);
  }  // rank 1's client exits
  std::this_thread::sleep_for(100ms);
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = x->alltoall(sx, rx, 64);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message(), Catch::Contains("the client of rank 1 went away"));
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);  // not the derived deadline (seconds)
  }
  // The job ends; the next one starts a new session on both ranks.
  sx = Buffer();
  rx = Buffer();
  x.reset();
  std::this_thread::sleep_for(100ms);
  fresh_clients_exchange(pair);
}

TEST_CASE("a first collective refused for want of a free slot fails its peers at once and leaves no half-joined session behind") {
  DaemonPair pair([](engine::DaemonConfig& cfg) { cfg.max_exchanges = 1; });
  // Rank 0's one slot is taken by a group barrier that rank 1 never joins.
  auto g0 = std::make_unique<Raw>(pair.d[0]->socket);
  Raw g1(pair.d[1]->socket);
  const proto::GroupOpenRequest open{5, 1, {0, 1}};
  REQUIRE(type_of(*g0->call(open)) == proto::Type::kOk);
  REQUIRE(type_of(*g1.call(open)) == proto::Type::kOk);
  proto::StartRequest barrier;
  barrier.kind = proto::Kind::kBarrier;
  barrier.group = 5;
  REQUIRE(type_of(*g0->call(barrier)) == proto::Type::kStarted);
  {
    Client x = Client::connect(pair.d[0]->socket), y = Client::connect(pair.d[1]->socket);
    Buffer sx = x.allocate(128), rx = x.allocate(128), sy = y.allocate(128), ry = y.allocate(128);
    const auto t0 = std::chrono::steady_clock::now();
    auto [a, b] = alltoall_both(x, sx, rx, y, sy, ry);
    REQUIRE_FALSE(a);
    CHECK_THAT(a.error().message(), Catch::Contains("--max-exchanges"));
    REQUIRE_FALSE(b);
    CHECK_THAT(b.error().message(), Catch::Contains("rank 0 could not start it"));
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);  // not rank 1's deadline
  }  // that job ends
  g0.reset();  // and the barrier's client: the slot is free
  std::this_thread::sleep_for(100ms);
  fresh_clients_exchange(pair, 2);
}

// Two daemons, and a group of both machines in slot 5 opened by raw clients: r0 at rank 0, r1
// at rank 1.
struct GroupOfTwo {
  DaemonPair pair;
  Raw r0{pair.d[0]->socket};
  std::unique_ptr<Raw> r1 = std::make_unique<Raw>(pair.d[1]->socket);
  const proto::GroupOpenRequest open{5, 1, {0, 1}};
  GroupOfTwo() {
    REQUIRE(type_of(*r0.call(open)) == proto::Type::kOk);
    REQUIRE(type_of(*r1->call(open)) == proto::Type::kOk);
  }
};

// GROUP_QUERY's reply to `raw`.
proto::GroupQueryReply group_query(const Raw& raw) {
  auto query = raw.call(proto::GroupQueryRequest{});
  REQUIRE(query);
  proto::GroupQueryReply q;
  proto::Reader rq = proto::payload_of(*query);
  REQUIRE(proto::decode(rq, q));
  return q;
}

TEST_CASE("a group's client that exits without closing it: its peer's next collective fails at once; GROUP_OPEN is checked") {
  GroupOfTwo g;
  // What GROUP_OPEN refuses: a slot in use, slot 0, a group without us, ranks out of range,
  // and a first sequence that this node has used already.
  CHECK(error_of(g.r0.call(g.open)).code == static_cast<std::uint32_t>(Errc::kBusy));
  CHECK_THAT(error_of(g.r0.call(proto::GroupOpenRequest{0, 1, {0, 1}})).message, Catch::Contains("slot 0 is the whole cluster's"));
  CHECK_THAT(error_of(g.r0.call(proto::GroupOpenRequest{6, 1, {1, 1}})).message, Catch::Contains("do not include this machine"));
  CHECK_THAT(error_of(g.r0.call(proto::GroupOpenRequest{6, 1, {0, 9}})).message, Catch::Contains("rank 9 is not a machine"));
  CHECK_THAT(error_of(g.r0.call(proto::GroupOpenRequest{6, 1u << 24, {0, 1}})).message, Catch::Contains("does not fit in 24 bits"));
  g.r1.reset();  // rank 1's client exits: no GROUP_CLOSE
  std::this_thread::sleep_for(100ms);
  proto::StartRequest barrier;
  barrier.kind = proto::Kind::kBarrier;
  barrier.run = true;
  barrier.group = 5;
  const auto t0 = std::chrono::steady_clock::now();
  auto reply = g.r0.call(barrier);
  REQUIRE(reply);
  // Refused at the start: the peer's ABORT of that very id came first.
  CHECK(error_of(reply).code == static_cast<std::uint32_t>(Errc::kPeerAborted));
  CHECK_THAT(error_of(reply).message, Catch::Contains("the client of rank 1 went away"));
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  // Closed, the slot is free again, and its next first sequence is past the ids used.
  REQUIRE(type_of(*g.r0.call(proto::GroupCloseRequest{5})) == proto::Type::kOk);
  const proto::GroupQueryReply q = group_query(g.r0);
  CHECK(((q.free[0] >> 5) & 1U) == 1U);
  CHECK(q.next[5] == 3);  // the barrier's id and the one the close used up
  CHECK_THAT(error_of(g.r0.call(proto::GroupOpenRequest{5, 2, {0, 1}})).message, Catch::Contains("comes before 3"));
}

// A barrier in group `slot` from two raw clients (RUN), both done.
void barrier_both(const Raw& x, const Raw& y, std::uint8_t slot) {
  proto::StartRequest barrier;
  barrier.kind = proto::Kind::kBarrier;
  barrier.run = true;
  barrier.group = slot;
  proto::send_message(x.fd, proto::message(barrier, 8));
  proto::send_message(y.fd, proto::message(barrier, 8));
  for (const Raw* r : {&x, &y}) {
    auto reply = r->next();
    REQUIRE(reply);
    INFO(error_of(reply).message);
    CHECK(type_of(*reply) == proto::Type::kDone);
  }
}

TEST_CASE("a group whose member's client went away never runs with a client that opens the slot at that member later") {
  GroupOfTwo g;
  barrier_both(g.r0, *g.r1, 5);
  g.r1.reset();  // rank 1's client exits without closing the group
  std::this_thread::sleep_for(100ms);
  // Another client at rank 1 opens slot 5 for the same machines, from the first id its daemon
  // allows, and calls barriers in it: its ids are those of rank 0's next collectives.
  Raw other(g.pair.d[1]->socket);
  REQUIRE(type_of(*other.call(proto::GroupOpenRequest{5, group_query(other).next[5], {0, 1}})) == proto::Type::kOk);
  proto::StartRequest barrier;
  barrier.kind = proto::Kind::kBarrier;
  barrier.run = true;
  barrier.group = 5;
  barrier.timeout_ms = 1000;
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    proto::send_message(other.fd, proto::message(barrier, 8));
    const auto t0 = std::chrono::steady_clock::now();
    auto reply = g.r0.call(barrier);
    REQUIRE(reply);
    // Never run with the other client: rank 0's group lost rank 1 for good.
    const auto ours = done_of(reply);
    INFO((ours ? ours->message : error_of(reply).message));
    CHECK(!(ours && ours->ok));
    // The first names the departure; a later one may name the other client's own failure
    // (its exchange of that id timed out at rank 1 and was aborted), never a success.
    CHECK_THAT(ours ? ours->message : error_of(reply).message, Catch::Contains(call == 0 ? "the client of rank 1 went away" : "rank 1"));
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    auto theirs = done_of(other.next(5000ms));
    REQUIRE(theirs);
    CHECK_FALSE(theirs->ok);
  }
}

TEST_CASE("a WAIT with a bound is answered RUNNING once the bound passed, and DONE as soon as the exchange ends") {
  GroupOfTwo g;
  proto::StartRequest barrier;
  barrier.kind = proto::Kind::kBarrier;
  barrier.group = 5;
  barrier.timeout_ms = 10000;
  auto started = g.r0.call(barrier);  // rank 1 does not call yet: it runs here
  REQUIRE(started);
  REQUIRE(type_of(*started) == proto::Type::kStarted);
  proto::StartedReply s;
  proto::Reader rs = proto::payload_of(*started);
  REQUIRE(proto::decode(rs, s));
  auto t0 = std::chrono::steady_clock::now();
  auto running = g.r0.call(proto::WaitRequest{s.exchange, true, 50'000});
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE(running);
  CHECK(type_of(*running) == proto::Type::kRunning);
  CHECK(took >= 50ms);
  CHECK(took < 1s);
  // Rank 1 calls now: a WAIT bounded at 10 s is answered at the end, not at its bound.
  barrier.run = true;
  proto::send_message(g.r1->fd, proto::message(barrier, 8));
  t0 = std::chrono::steady_clock::now();
  auto done = done_of(g.r0.call(proto::WaitRequest{s.exchange, true, 10'000'000}));
  REQUIRE(done);
  CHECK(done->ok);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  auto theirs = done_of(g.r1->next(5000ms));
  REQUIRE(theirs);
  CHECK(theirs->ok);
}

TEST_CASE("a one-message start returns before its peer starts; its request reads the one answer, past other requests' replies") {
  DaemonPair pair;
  Client x = Client::connect(pair.d[0]->socket), y = Client::connect(pair.d[1]->socket);
  constexpr std::size_t kBlock = 64;
  Buffer sx[2] = {x.allocate(2 * kBlock), x.allocate(2 * kBlock)}, rx[2] = {x.allocate(2 * kBlock), x.allocate(2 * kBlock)};
  Buffer sy[2] = {y.allocate(2 * kBlock), y.allocate(2 * kBlock)}, ry[2] = {y.allocate(2 * kBlock), y.allocate(2 * kBlock)};
  for (int k = 0; k < 2; ++k) {
    fill(sx[k], 0, kBlock);
    fill(sy[k], 1, kBlock);
  }
  Options o;
  o.one_message_start = true;
  // Rank 1 starts nothing yet. A START answered at once would wait here for the session's join.
  std::vector<Request> mine;
  for (int k = 0; k < 2; ++k) {
    auto a = x.start_alltoall(sx[k], rx[k], kBlock, o);
    REQUIRE(a);
    CHECK(a->id() == 0);  // not known until the answer
    mine.push_back(std::move(*a));
  }
  CHECK_FALSE(mine[0].test());
  CHECK_FALSE(mine[1].wait_for(20ms));
  CHECK(x.status());  // a request of its own meanwhile, answered as ever
  std::vector<Request> theirs;
  for (int k = 0; k < 2; ++k) {
    auto b = y.start_alltoall(sy[k], ry[k], kBlock, o);
    REQUIRE(b);
    theirs.push_back(std::move(*b));
  }
  // The second first: its answer is read past the first's, which is kept for its own wait.
  for (int k : {1, 0}) {
    auto a = mine[static_cast<std::size_t>(k)].wait();
    auto b = theirs[static_cast<std::size_t>(k)].wait();
    REQUIRE(a);
    REQUIRE(b);
    CHECK(mine[static_cast<std::size_t>(k)].id() == a->exchange);
    CHECK(received(rx[k], 0, kBlock));
    CHECK(received(ry[k], 1, kBlock));
  }
  CHECK(mine[0].id() != mine[1].id());
  // A start the daemon refuses fails at its wait, with the daemon's words.
  o.schedule = "no-such-schedule";
  auto refused = x.start_alltoall(sx[0], rx[0], kBlock, o);
  REQUIRE(refused);
  auto why = refused->wait();
  REQUIRE_FALSE(why);
  CHECK_THAT(why.error().message(), Catch::Contains("no-such-schedule"));
  // Requests dropped unread: their answers, when they come, are not taken for later ones'.
  o.schedule = "auto";
  for (int k = 0; k < 2; ++k) {
    auto gone_x = x.start_alltoall(sx[k], rx[k], kBlock, o);
    auto gone_y = y.start_alltoall(sy[k], ry[k], kBlock, o);
    REQUIRE(gone_x);
    REQUIRE(gone_y);
  }
  auto [a, b] = alltoall_both(x, sx[0], rx[0], y, sy[0], ry[0]);
  CHECK(a);
  CHECK(b);
  CHECK(received(rx[0], 0, kBlock));
  CHECK(received(ry[0], 1, kBlock));
}

TEST_CASE("a group taken back because it did not open on every member tells nobody; its slot's ids are not used up") {
  // Rank 0's client opened slot 5, which rank 1 holds for another group (raced in between
  // GROUP_QUERY and GROUP_OPEN): rank 0 takes it back. Two other clients then open slot 5 from
  // the same first id and run a barrier. Had the take-back told rank 1, that ABORT would have
  // hit the other group's first exchange.
  DaemonPair pair;
  Raw a(pair.d[0]->socket), b(pair.d[1]->socket), c(pair.d[0]->socket);
  const proto::GroupOpenRequest open{5, 1, {0, 1}};
  REQUIRE(type_of(*a.call(open)) == proto::Type::kOk);
  REQUIRE(type_of(*a.call(proto::GroupCloseRequest{5, false})) == proto::Type::kOk);
  REQUIRE(type_of(*b.call(open)) == proto::Type::kOk);
  std::this_thread::sleep_for(50ms);
  REQUIRE(type_of(*c.call(open)) == proto::Type::kOk);
  barrier_both(b, c, 5);
  // A sequence already used here is "busy": the slot moved on since the members' query.
  CHECK(error_of(a.call(proto::GroupOpenRequest{6, 1, {0, 1}})).code == 0);
  REQUIRE(type_of(*a.call(proto::GroupCloseRequest{6, true})) == proto::Type::kOk);
  CHECK(error_of(a.call(proto::GroupOpenRequest{6, 1, {0, 1}})).code == static_cast<std::uint32_t>(Errc::kBusy));
}

TEST_CASE("open_group tries again when a member's slot is taken between the members' query and their open") {
  DaemonPair pair;
  Client a = Client::connect(pair.d[0]->socket), b = Client::connect(pair.d[1]->socket);
  Raw other(pair.d[1]->socket);  // another client of rank 1, which takes the slot first
  ThreadReduce reduce(2);
  int step = 0;
  std::uint32_t raced = 0;
  auto racing = [&](std::vector<std::uint64_t>& words, ReduceOp op) {
    reduce(words, op);
    if (step++ == 0) {  // a's first reduce: the free slots, agreed
      for (raced = 1; ((words[raced / 64] >> (raced % 64)) & 1U) == 0; ++raced) {
      }
      REQUIRE(type_of(*other.call(proto::GroupOpenRequest{static_cast<std::uint8_t>(raced), 1, {0, 1}})) == proto::Type::kOk);
    }
  };
  Result<Client> ga = Error(Errc::kInternal, "not run"), gb = Error(Errc::kInternal, "not run");
  std::thread t([&] { gb = open_in(b, {0, 1}, reduce); });
  ga = a.open_group({0, 1}, racing);
  t.join();
  REQUIRE(ga);
  REQUIRE(gb);
  auto groups = status_of(a)["groups"];
  REQUIRE(groups.size() == 1);
  CHECK(groups[0]["slot"] != raced);  // the second try took another slot
  std::thread tb([&] { CHECK(gb->barrier()); });
  CHECK(ga->barrier());
  tb.join();
  // Rank 0 took its open of the raced slot back without a word and without using an id: the
  // other client's group there runs from id 1 with a partner on rank 0.
  Raw partner(pair.d[0]->socket);
  REQUIRE(type_of(*partner.call(proto::GroupOpenRequest{static_cast<std::uint8_t>(raced), 1, {0, 1}})) == proto::Type::kOk);
  barrier_both(other, partner, static_cast<std::uint8_t>(raced));
}

TEST_CASE("a group closed after the session's client went away does not hide that from the session's next collective") {
  DaemonPair pair;
  Client w0 = Client::connect(pair.d[0]->socket);
  auto w1 = std::make_unique<Client>(Client::connect(pair.d[1]->socket));
  Buffer s0 = w0.allocate(128), r0 = w0.allocate(128), s1 = w1->allocate(128), r1 = w1->allocate(128);
  REQUIRE(alltoall_both(w0, s0, r0, *w1, s1, r1).first);
  Client a0 = Client::connect(pair.d[0]->socket);
  auto a1 = std::make_unique<Client>(Client::connect(pair.d[1]->socket));
  auto [g0, g1] = open_both(a0, {0, 1}, *a1, {0, 1});
  REQUIRE(g1);
  s1 = Buffer();
  r1 = Buffer();
  w1.reset();  // rank 1's session is over: its daemon tells rank 0's of the next collective
  std::this_thread::sleep_for(50ms);
  g1 = Error(Errc::kInternal, "closed");  // and then of the group's
  std::this_thread::sleep_for(50ms);
  auto next = w0.alltoall(s0, r0, 64);
  REQUIRE(!next);
  CHECK_THAT(next.error().message(), Catch::Contains("the client of rank 1 went away"));
}

TEST_CASE("aapcd runs alltoall with the combining schedules, and refuses them for alltoallv") {
  DaemonPair pair;
  Client a = Client::connect(pair.d[0]->socket), p = Client::connect(pair.d[1]->socket);
  Buffer sa = a.allocate(128), ra = a.allocate(128), sp = p.allocate(128), rp = p.allocate(128);
  for (const char* schedule : {"bruck", "hypercube"}) {
    INFO(schedule);
    Options o;
    o.schedule = schedule;
    auto [ok_a, ok_p] = alltoall_both(a, sa, ra, p, sp, rp, o);
    REQUIRE(ok_a);
    REQUIRE(ok_p);
    CHECK(ok_a->schedule == schedule);
    CHECK(received(ra, 0, 64));
    CHECK(received(rp, 1, 64));
  }
  Options bruck;
  bruck.schedule = "bruck";
  bruck.timeout = 2000ms;
  auto v = a.alltoallv(sa, {64, 64}, {0, 64}, ra, {64, 64}, {0, 64}, bruck);
  REQUIRE(!v);
  CHECK(v.error().code() == Errc::kInvalidArgument);
  CHECK_THAT(v.error().message(), Catch::Contains("it runs alltoall, not alltoallv"));
}

TEST_CASE("send and receive blocks in the same memory are refused") {
  LocalDaemon d;
  // Two buffers of one memory file are one memory.
  Raw raw(d.socket);
  REQUIRE(raw.call(proto::HelloRequest{"test", ""}));
  int fd = memfd(128, MFD_ALLOW_SEALING);
  auto b1 = registered(raw.call(proto::RegisterRequest{128}, fd));
  auto b2 = registered(raw.call(proto::RegisterRequest{128}, fd));
  ::close(fd);
  REQUIRE(b1);
  REQUIRE(b2);
  proto::StartRequest start;
  start.send_buffer = *b1;
  start.recv_buffer = *b2;
  start.block = 64;
  auto e = error_of(raw.call(start));
  CHECK(e.code == static_cast<std::uint32_t>(Errc::kInvalidArgument));
  CHECK_THAT(e.message, Catch::Contains("both buffers map one memory file"));

  // One buffer for both.
  Client c = Client::connect(d.socket);
  Buffer buf = c.allocate(128);
  auto same = c.alltoall(buf, buf, 64);
  REQUIRE(!same);
  CHECK(same.error().code() == Errc::kInvalidArgument);
  CHECK_THAT(same.error().message(), Catch::Contains("send block 0 (bytes 0..64) and receive block 0 (bytes 0..64) are the same memory"));
  // One byte in common is enough.
  auto one = c.alltoallv(buf, {32, 32}, {0, 32}, buf, {32, 32}, {63, 95});
  REQUIRE(!one);
  CHECK_THAT(one.error().message(), Catch::Contains("send block 1 (bytes 32..64) and receive block 0 (bytes 63..95)"));
  // Disjoint halves of one buffer are fine: this START goes on to the (failing) collective.
  auto halves = c.alltoallv(buf, {32, 32}, {0, 32}, buf, {32, 32}, {64, 96});
  REQUIRE(!halves);
  CHECK(halves.error().message().find("same memory") == std::string::npos);
}

TEST_CASE("a client that says no HELLO is closed after the timeout") {
  LocalDaemon d([](engine::DaemonConfig& cfg) { cfg.hello_timeout = 200ms; });
  Client greeted = Client::connect(d.socket);
  Raw silent(d.socket);
  REQUIRE(silent.fd >= 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto e = error_of(silent.next(3000ms));
  CHECK(std::chrono::steady_clock::now() - t0 >= 150ms);
  CHECK(e.code == static_cast<std::uint32_t>(Errc::kTimeout));
  CHECK_THAT(e.message, Catch::Contains("no HELLO within 200 ms"));
  CHECK(silent.closed());
  // The client that said HELLO stays, and is the only one left.
  std::this_thread::sleep_for(300ms);
  CHECK(status_of(greeted)["clients"] == 1);
}

TEST_CASE("members of --socket-group may use the socket", "[root]") {
  if (!root()) AAPC_SKIP(kNotRoot);
  group* users = ::getgrnam("users");
  if (users == nullptr) {
    AAPC_SKIP("no group 'users' here");
  }
  const gid_t gid = users->gr_gid;
  LocalDaemon d([](engine::DaemonConfig& cfg) { cfg.socket_group = "users"; });
  Child member({gid}, [&](Child&) { return try_client(d.socket, "may not use"); });
  CHECK(member.status() == 0);
  Child stranger({}, [&](Child&) { return try_client(d.socket, "may not use"); });
  CHECK(stranger.status() == 1);
}

TEST_CASE("--allow-uid alone lets that uid in, with the socket's default mode in a directory aapcd made; others stay out", "[root]") {
  if (!root()) AAPC_SKIP(kNotRoot);
  LocalDaemon d([](engine::DaemonConfig& cfg) {
    cfg.socket_path = (fs::path(cfg.socket_path).parent_path() / "run" / "aapcd.sock").string();  // made by aapcd, 0750
    cfg.socket_mode = 0660;
    cfg.allow_uids = {kNobody};
  });
  Child allowed({}, [&](Child&) { return try_client(d.socket, "may not use"); });
  CHECK(allowed.status() == 0);
  LocalDaemon other([](engine::DaemonConfig& cfg) {
    cfg.socket_path = (fs::path(cfg.socket_path).parent_path() / "run" / "aapcd.sock").string();
    cfg.socket_mode = 0660;
    cfg.allow_uids = {kNobody - 1};
  });
  Child stranger({}, [&](Child&) { return try_client(other.socket, "may not use"); });
  CHECK(stranger.status() == 1);
}

TEST_CASE("a collective's timeout over the daemon's cap is refused, naming the cap and its option") {
  LocalDaemon d([](engine::DaemonConfig& cfg) { cfg.max_timeout = 60s; });
  Client c = Client::connect(d.socket);
  Buffer s = c.allocate(128), r = c.allocate(128);
  Options o;
  o.timeout = std::chrono::milliseconds(UINT32_MAX);  // 49 days
  auto res = c.alltoall(s, r, 64, o);
  REQUIRE_FALSE(res);
  CHECK(res.error().code() == Errc::kBusy);
  CHECK_THAT(res.error().message(), Catch::Contains("--max-timeout-ms"));
  CHECK(status_of(c)["exchanges"].empty());
}

TEST_CASE("one client's collectives running or not yet collected are capped; once collected it may start more") {
  DaemonPair pair([](engine::DaemonConfig& cfg) { cfg.max_exchanges_per_client = 3; });
  Client x = Client::connect(pair.d[0]->socket), y = Client::connect(pair.d[1]->socket);
  Buffer sx = x.allocate(128), rx = x.allocate(128), sy = y.allocate(128), ry = y.allocate(128);
  std::vector<Request> rq_x, rq_y;
  for (int i = 0; i < 3; ++i) {
    // Each START is answered once the ids are agreed: the first needs both ranks at once.
    Result<Request> b = Error(Errc::kInternal, "not run");
    std::thread t([&] { b = y.start_alltoall(sy, ry, 64); });
    auto a = x.start_alltoall(sx, rx, 64);
    t.join();
    REQUIRE(a);
    REQUIRE(b);
    rq_x.push_back(std::move(*a));
    rq_y.push_back(std::move(*b));
  }
  auto refused = x.start_alltoall(sx, rx, 64);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == Errc::kBusy);
  CHECK_THAT(refused.error().message(), Catch::Contains("--max-exchanges-per-client"));
  for (auto& q : rq_x) CHECK(q.wait());
  for (auto& q : rq_y) CHECK(q.wait());
  auto [a, b] = alltoall_both(x, sx, rx, y, sy, ry);
  CHECK(a);
  CHECK(b);
}

TEST_CASE("the schedules a daemon keeps are capped; the least recently used goes, and a spec planned again still runs") {
  DaemonPair pair([](engine::DaemonConfig& cfg) { cfg.max_plans = 4; });
  Client x = Client::connect(pair.d[0]->socket), y = Client::connect(pair.d[1]->socket);
  Buffer sx = x.allocate(128), rx = x.allocate(128), sy = y.allocate(128), ry = y.allocate(128);
  for (int k : {1, 2, 3, 4, 5, 6, 1}) {
    Options o;
    o.schedule = "tree";
    o.sync = "sender-partial:" + std::to_string(k);
    auto [a, b] = alltoall_both(x, sx, rx, y, sy, ry, o);
    INFO(o.sync);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(received(rx, 0, 64));
  }
  CHECK(status_of(x)["plans"] == 4);
}

TEST_CASE("one uid's registered buffers are capped by count and bytes; root's are not", "[root]") {
  if (!root()) AAPC_SKIP(kNotRoot);
  LocalDaemon d([](engine::DaemonConfig& cfg) {
    cfg.allow_uids = {kNobody};
    cfg.max_buffers_per_uid = 4;
    cfg.max_buffer_bytes_per_uid = 1 << 20;
  });
  std::vector<Buffer> kept;  // a Buffer frees itself when it goes
  auto refusal = [&](Client& c, std::size_t bytes) -> std::string {
    try {
      kept.push_back(c.allocate(bytes));
      return "";
    } catch (const Exception& e) {
      return e.error().message();
    }
  };
  Child user({}, [&](Child&) {
    Client c = Client::connect(d.socket);
    for (int i = 0; i < 4; ++i)
      if (!refusal(c, 4096).empty()) return 2;
    if (refusal(c, 4096).find("--max-buffers-per-uid") == std::string::npos) return 3;
    Client other = Client::connect(d.socket);  // the cap is the uid's, not the connection's
    if (refusal(other, 4096).find("--max-buffers-per-uid") == std::string::npos) return 4;
    return 0;
  });
  CHECK(user.status() == 0);
  Child big({}, [&](Child&) {
    Client c = Client::connect(d.socket);
    if (!refusal(c, 768 << 10).empty()) return 2;
    return refusal(c, 512 << 10).find("--max-buffer-bytes-per-uid") != std::string::npos ? 0 : 3;
  });
  CHECK(big.status() == 0);
  Client mine = Client::connect(d.socket);
  for (int i = 0; i < 8; ++i) CHECK(refusal(mine, 4096).empty());
  kept.clear();
}

TEST_CASE("refused users are answered and closed at once, and cannot lock root out", "[root]") {
  if (!root()) AAPC_SKIP(kNotRoot);
  LocalDaemon d;
  // 70 connections of a uid that may not use aapcd, more than its 64 slots, held open.
  Child refused({}, [&](Child& self) {
    std::vector<std::unique_ptr<Raw>> conns;
    for (int i = 0; i < 70; ++i) conns.push_back(std::make_unique<Raw>(d.socket));
    self.signal_ready();
    self.wait_go();
    for (const auto& r : conns) {
      auto e = error_of(r->next(1000ms));
      if (e.code != static_cast<std::uint32_t>(Errc::kPermission) || e.message.find("may not use") == std::string::npos) return 2;
      if (!r->closed(1000ms)) return 3;
    }
    return 0;
  });
  REQUIRE(refused.wait_ready());
  CHECK(try_client(d.socket, "") == 0);
  refused.let_go();
  CHECK(refused.status() == 0);
}

TEST_CASE("one uid holds at most its limit of connections, and root keeps a slot", "[root]") {
  if (!root()) AAPC_SKIP(kNotRoot);
  LocalDaemon d([](engine::DaemonConfig& cfg) {
    cfg.allow_uids = {kNobody};
    cfg.max_clients_per_uid = 3;
    cfg.max_clients = 8;
  });
  Child user({}, holds_then_refused(d.socket, 3, "limit per uid"));
  REQUIRE(user.wait_ready());
  // Root is not limited per uid, and the last of the 8 slots are kept for it.
  const std::vector<Client> mine = connections(d.socket, 5);
  user.let_go();
  CHECK(user.status() == 0);
}

TEST_CASE("other users leave the last slots to root", "[root]") {
  if (!root()) AAPC_SKIP(kNotRoot);
  LocalDaemon d([](engine::DaemonConfig& cfg) {
    cfg.allow_uids = {kNobody};
    cfg.max_clients = 6;
  });
  Child user({}, holds_then_refused(d.socket, 2, "other than root"));
  REQUIRE(user.wait_ready());
  const std::vector<Client> mine = connections(d.socket, 4);
  CHECK(!Client::try_connect(d.socket));  // all 6 taken
  user.let_go();
  CHECK(user.status() == 0);
}

TEST_CASE("aapc status names the peers the engine holds dead") {
  DaemonPair pair;
  Client c = Client::connect(pair.d[0]->socket);
  Buffer s = c.allocate(128), r = c.allocate(128);
  Client p = Client::connect(pair.d[1]->socket);
  Buffer sp = p.allocate(128), rp = p.allocate(128);
  auto [ok_c, ok_p] = alltoall_both(c, s, r, p, sp, rp);
  REQUIRE(ok_c);
  REQUIRE(ok_p);
  CHECK(status_of(c)["dead_peers"].empty());
  pair.d[1].reset();  // rank 1's daemon stops (its client still there: nothing tells rank 0)
  auto silent = c.alltoall(s, r, 64);
  REQUIRE(!silent);
  CHECK(silent.error().code() == Errc::kPeerSilent);
  auto dead = status_of(c)["dead_peers"];
  REQUIRE(dead.size() == 1);
  CHECK(dead[0]["rank"] == 1);
  CHECK(dead[0]["machine"] == "n1");
}

TEST_CASE("daemons with I/O lcores (--io-cores) on one CPU or two exchange byte-exact, the frames checked there") {
  for (const std::vector<int>& cores : {std::vector<int>{0}, std::vector<int>{0, 0}}) {
    INFO("--io-cores with " << cores.size() << " CPU(s)");
    DaemonPair pair([&](engine::DaemonConfig& cfg) { cfg.io_cores = cores; });
    Client a = Client::connect(pair.d[0]->socket), p = Client::connect(pair.d[1]->socket);
    Buffer sa = a.allocate(128 * 1024), ra = a.allocate(128 * 1024), sp = p.allocate(128 * 1024), rp = p.allocate(128 * 1024);
    for (int round = 0; round < 3; ++round) {
      auto [ok_a, ok_p] = alltoall_both(a, sa, ra, p, sp, rp, {}, 64 * 1024);
      REQUIRE(ok_a);
      REQUIRE(ok_p);
      CHECK(received(ra, 0, 64 * 1024));
      CHECK(received(rp, 1, 64 * 1024));
    }
    for (Client* c : {&a, &p}) {
      const auto counters = status_of(*c)["counters"];
      CHECK(counters["rx_prechecked"].get<std::uint64_t>() > 0);
      CHECK(counters["rx_prechecked"] == counters["frames_received"]);
    }
  }
  // Two sending CPUs on a device of one transmit queue, or a CPU that does not exist: a clear
  // refusal at start.
  CHECK_THROWS_WITH(LocalDaemon([](engine::DaemonConfig& cfg) { cfg.io_cores = {0, 0, 0}; }),
                    Catch::Contains("1 transmit queue(s), fewer than the 2 asked for (one per sending I/O lcore)"));
  CHECK_THROWS_WITH(LocalDaemon([](engine::DaemonConfig& cfg) { cfg.io_cores = {4096}; }), Catch::Contains("no CPU 4096"));
}

TEST_CASE("a group closed while a collective of it waits for its alltoallv's agreement: that collective is refused, the daemon lives on") {
  // Rank 0's raw client opens group slot 5, starts a forced-CGM alltoallv there (its counts are
  // agreed first; rank 1 never joins), then a barrier of the group, which waits for that
  // agreement, and closes the group.
  DaemonPair pair;
  Raw x(pair.d[0]->socket);
  REQUIRE(x.call(proto::HelloRequest{"test", ""}));
  REQUIRE(type_of(*x.call(proto::GroupOpenRequest{5, 1, {0, 1}})) == proto::Type::kOk);
  const int s = memfd(128, MFD_ALLOW_SEALING), r = memfd(128, MFD_ALLOW_SEALING);
  auto sb = registered(x.call(proto::RegisterRequest{128}, s));
  auto rb = registered(x.call(proto::RegisterRequest{128}, r));
  ::close(s);
  ::close(r);
  REQUIRE(sb);
  REQUIRE(rb);
  proto::StartRequest v;
  v.kind = proto::Kind::kAlltoallv;
  v.spec = "cgm";
  v.send_buffer = *sb;
  v.recv_buffer = *rb;
  v.sends = v.recvs = {{0, 64}, {64, 64}};
  v.timeout_ms = 2000;
  v.group = 5;
  auto started = x.call(v);
  REQUIRE(started);
  INFO(error_of(started).message);
  REQUIRE(type_of(*started) == proto::Type::kStarted);
  proto::StartRequest barrier;
  barrier.kind = proto::Kind::kBarrier;
  barrier.group = 5;
  proto::send_message(x.fd, proto::message(barrier, 8));
  CHECK(!x.next(100ms));  // it waits for the agreement: no STARTED yet
  proto::send_message(x.fd, proto::message(proto::GroupCloseRequest{5, true}, 9));
  auto refused = x.next();
  REQUIRE(refused);
  CHECK(error_of(refused).code == static_cast<std::uint32_t>(Errc::kAborted));
  CHECK_THAT(error_of(refused).message, Catch::Contains("group slot 5 closed before this collective started"));
  auto closed = x.next();
  REQUIRE(closed);
  CHECK(type_of(*closed) == proto::Type::kOk);
  // The agreement's gather fails (rank 1 never took part) after its deadline; the daemon still
  // serves, and the barrier is never started.
  std::this_thread::sleep_for(2500ms);
  fresh_clients_exchange(pair);
}

// libaapc-mpi's progress thread starts and waits for exchanges on a connection while the
// program's thread opens groups on it (found by CI: "aapcd answered GROUP_QUERY oddly", then
// "aapcd answered WAIT oddly", when two requests' replies crossed). Two threads, each with
// its own copy of one Client, ask at once: every reply must be its own request's.
TEST_CASE("two threads on one connection each get their own replies") {
  LocalDaemon d;
  Client c = Client::connect(d.socket);
  std::atomic<int> wrong{0};
  std::string first_wrong;
  std::mutex first_lock;
  auto note = [&](const std::string& what) {
    std::lock_guard<std::mutex> hold(first_lock);
    if (wrong++ == 0) first_wrong = what;
  };
  auto asker = [&](Client mine, bool allocating) {
    for (int i = 0; i < 400; ++i) {
      if (allocating) {
        try {
          Buffer b = mine.allocate(4096);
          if (b.size() != 4096) note("a buffer of " + std::to_string(b.size()) + " bytes");
        } catch (const Exception& e) {
          note(e.what());
        }
      } else if (auto s = mine.status(); !s) {
        note(s.error().message());
      } else if (s->find("\"rank\"") == std::string::npos) {
        note("a status without a rank: " + s->substr(0, 80));
      }
    }
  };
  std::thread a(asker, c, true), b(asker, c, false);
  a.join();
  b.join();
  INFO("first wrong reply: " << first_wrong);
  CHECK(wrong == 0);
  CHECK(c.status());
}
