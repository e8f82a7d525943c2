#include "aapc/client.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "aapc/proto/protocol.hpp"
#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/spec.hpp"

namespace aapc {

namespace {

constexpr const char* kDefaultSocket = "/run/aapc/aapcd.sock";

std::string socket_path(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("AAPC_SOCKET"); env != nullptr && env[0] != '\0') return env;
  return kDefaultSocket;
}

// The job of MPICH's Hydra that started this process, or empty. Hydra sets no variable that
// tells its jobs apart, but each rank is a child (or a descendant, through a wrapper script) of
// the job's hydra_pmi_proxy on its machine, and every proxy of one mpiexec is given that
// mpiexec's control address (--control-port HOST:PORT, a listening socket of its own) and the
// process group (--pgid). Their pair names the job on every machine while it runs.
std::string hydra_job() {
  pid_t pid = ::getppid();
  for (int depth = 0; depth < 8 && pid > 1; ++depth) {
    const std::string proc = "/proc/" + std::to_string(pid);
    std::ifstream stat_file(proc + "/stat");
    std::string line;
    std::getline(stat_file, line);
    const auto close = line.rfind(')');  // "PID (COMM) STATE PPID ...": COMM may hold spaces
    if (close == std::string::npos) return "";
    if (line.substr(line.find('(') + 1, close - line.find('(') - 1) == "hydra_pmi_proxy") {
      std::ifstream in(proc + "/cmdline");
      std::vector<std::string> argv;
      for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
      std::string port, pgid;
      for (std::size_t i = 0; i + 1 < argv.size(); ++i) {
        if (argv[i] == "--control-port") port = argv[i + 1];
        if (argv[i] == "--pgid") pgid = argv[i + 1];
      }
      return port.empty() ? "" : "hydra:" + port + "/" + pgid;
    }
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    rest >> state >> pid;
  }
  return "";
}

// The job this process belongs to, as its launcher names it: the cluster's collectives run only
// among the clients of one job (docs/design.md, "Jobs kept apart"). $AAPC_JOB when set, else
// PMIx's namespace (Open MPI, and MPICH or Slurm over PMIx), else Slurm's job and step, else
// Hydra's (hydra_job); empty when none is known (the clients of one uid are then one job).
std::string job_id() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  if (auto j = env("AAPC_JOB"); !j.empty()) return j;
  if (auto j = env("PMIX_NAMESPACE"); !j.empty()) return "pmix:" + j;
  if (auto j = env("SLURM_JOB_ID"); !j.empty()) return "slurm:" + j + "." + env("SLURM_STEP_ID");
  static const std::string hydra = hydra_job();  // the process's ancestors, read once, not at every connection
  return hydra;
}

Result<int> open_socket(const std::string& path) {
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return Error(Errc::kIo, std::string("cannot create a socket: ") + std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    ::close(s);
    return Error(Errc::kInvalidArgument, "socket path too long: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int e = errno;
    ::close(s);
    if (e == ENOENT)
      return Error(Errc::kIo, "no aapcd at " + path + ": is the daemon running? (set AAPC_SOCKET to its socket)");
    if (e == EACCES)
      return Error(Errc::kPermission, "permission denied on " + path +
                                          ": the socket is for the daemon's user and group (run as root, or join its group)");
    return Error(Errc::kIo, "cannot connect to aapcd at " + path + ": " + std::strerror(e));
  }
  return s;
}

// The reply of type `Reply` to a request named `what`, or the daemon's error.
template <typename Reply>
Result<Reply> reply_as(const std::vector<std::uint8_t>& msg, const char* what) {
  const auto type = static_cast<proto::Type>(proto::header_of(msg)->type);
  proto::Reader r = proto::payload_of(msg);
  if (type == proto::Type::kError) {
    proto::ErrorReply e;
    if (!proto::decode(r, e)) return Error(Errc::kProtocol, "aapcd sent a malformed error reply");
    return Error(static_cast<Errc>(e.code), e.message);
  }
  Reply reply;
  if (type != Reply::kType || !proto::decode(r, reply)) return Error(Errc::kProtocol, std::string("aapcd answered ") + what + " oddly");
  return reply;
}

}  // namespace

struct Connection {
  std::string path;
  int sock = -1;
  std::uint32_t next_request = 1;
  std::atomic<std::uint32_t> generation{1};  // grows when we reconnect to a restarted daemon
  ClusterInfo info;
  // One request and its reply at a time, the reconnect after a broken one included: the
  // Clients, Buffers and Requests of one connection may be used by different threads
  // (libaapc-mpi's progress thread starts and waits for exchanges while the program's thread
  // opens groups). Recursive: call() reconnects through hello().
  std::recursive_mutex mutex;
  // Replies read while another one was awaited, by request id (reply_to), and the posted
  // requests whose replies nobody will collect (forget).
  std::map<std::uint32_t, std::vector<std::uint8_t>> early;
  std::set<std::uint32_t> dropped;

  ~Connection() {
    if (sock >= 0) ::close(sock);
  }

  Error lost() const { return Error(Errc::kIo, "lost the connection to aapcd at " + path); }

  Result<void> hello() {
    auto reply = round_trip(proto::message(proto::HelloRequest{"aapc-client 1", job_id()}, next_request++), -1);
    if (!reply) return reply.error();
    auto h = reply_as<proto::HelloReply>(*reply, "HELLO");
    if (!h) return h.error();
    ClusterInfo i;
    i.rank = static_cast<int>(h->rank);
    i.size = static_cast<int>(h->size);
    i.epoch = h->epoch;
    i.mtu = static_cast<int>(h->mtu);
    i.peak_bps = h->peak_bps;
    i.machine = h->machine;
    i.topology = h->topology;
    info = i;
    return {};
  }

  // One request and its reply on the current socket.
  Result<std::vector<std::uint8_t>> round_trip(const std::vector<std::uint8_t>& msg, int fd) {
    if (sock < 0) return lost();
    // A failed send is not the end: a daemon that refused us left its reason to read.
    (void)proto::send_message(sock, msg, fd);
    auto reply = reply_to(proto::header_of(msg)->request, std::nullopt);
    if (!reply) return reply.error();
    return std::move(**reply);
  }

  // A request whose reply is read later (answer()), while other requests come and go: a RUN,
  // answered when its exchange ends (Options::one_message_start). Its request id, and the
  // connection's generation it was sent on.
  struct Posted {
    std::uint32_t request = 0, generation = 0;
  };
  template <typename M>
  Result<Posted> post(const M& request) {
    std::lock_guard<std::recursive_mutex> hold(mutex);
    if (sock < 0) return lost();
    const Posted p{next_request++, generation};
    (void)proto::send_message(sock, proto::message(request, p.request), -1);  // a refusal is read as its reply
    return p;
  }

  // The reply to `request`, read now or before, waited for up to `bound` (for ever without
  // one): nullopt when it did not come in time. Replies to other requests that come first are
  // kept for them; one to no request (0: the daemon closing the connection) answers any.
  Result<std::optional<std::vector<std::uint8_t>>> reply_to(std::uint32_t request, std::optional<std::chrono::microseconds> bound) {
    std::lock_guard<std::recursive_mutex> hold(mutex);
    if (auto it = early.find(request); it != early.end()) {
      std::vector<std::uint8_t> reply = std::move(it->second);
      early.erase(it);
      return std::optional(std::move(reply));
    }
    const auto until = std::chrono::steady_clock::now() + bound.value_or(std::chrono::microseconds(0));
    for (;;) {
      if (sock < 0) return lost();
      if (bound) {
        const auto left = std::max(std::chrono::steady_clock::duration(0), until - std::chrono::steady_clock::now());
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
        const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
        pollfd p{sock, POLLIN, 0};
        const int n = ::ppoll(&p, 1, &ts, nullptr);
        if (n == 0) return std::optional<std::vector<std::uint8_t>>();
        if (n < 0 && errno == EINTR) continue;
      }
      std::vector<std::uint8_t> reply;
      int rfd = -1;
      bool truncated = false;
      if (proto::recv_message(sock, reply, rfd, truncated) != proto::Received::kMessage)
        return lost();
      if (rfd >= 0) ::close(rfd);
      if (truncated || !proto::header_of(reply)) return Error(Errc::kProtocol, "aapcd sent a malformed reply");
      const std::uint32_t of = proto::header_of(reply)->request;
      if (of == request || of == 0) return std::optional(std::move(reply));
      if (dropped.erase(of) == 0) early[of] = std::move(reply);
    }
  }

  // A posted request's answer is not wanted: dropped when it comes (its Request went away).
  void forget(const Posted& p) {
    std::lock_guard<std::recursive_mutex> hold(mutex);
    if (p.generation == generation && early.erase(p.request) == 0) dropped.insert(p.request);
  }

  // A request that needs no answer, if `of_generation` is still the connection's (best effort).
  template <typename M>
  void tell(const M& request, std::uint32_t of_generation) {
    std::lock_guard<std::recursive_mutex> hold(mutex);
    if (of_generation == generation) (void)round_trip(proto::message(request, next_request++), -1);
  }

  // A request; a broken connection is looked into: a restarted daemon is reported as such.
  template <typename M>
  Result<std::vector<std::uint8_t>> call(const M& request, int fd = -1) {
    std::lock_guard<std::recursive_mutex> hold(mutex);
    auto reply = round_trip(proto::message(request, next_request++), fd);
    if (reply) return reply;
    if (reply.error().code() != Errc::kIo) return reply;
    return broke();
  }

  // The reply to a posted request (post()), waited for as reply_to() does; a broken
  // connection is looked into as call() does.
  Result<std::optional<std::vector<std::uint8_t>>> answer(const Posted& p, std::optional<std::chrono::microseconds> bound) {
    std::lock_guard<std::recursive_mutex> hold(mutex);
    if (p.generation != generation) return Error(Errc::kIo, "the connection to aapcd broke while the exchange ran; its outcome is lost");
    auto reply = reply_to(p.request, bound);
    if (reply || reply.error().code() != Errc::kIo) return reply;
    return broke();
  }

  // The connection broke: reconnects to tell a restart from a daemon that is gone.
  Error broke() {
    const std::uint32_t old_epoch = info.epoch;
    if (sock >= 0) ::close(sock);
    sock = -1;
    early.clear();  // the old socket's: their requests are lost with it
    dropped.clear();
    auto s = open_socket(path);
    if (!s) return Error(Errc::kIo, "aapcd at " + path + " is gone (" + s.error().message() + ")");
    sock = *s;
    if (auto h = hello(); !h) return h.error();
    ++generation;
    if (info.epoch != old_epoch)
      return Error(Errc::kDaemonRestarted, "aapcd restarted (epoch " + std::to_string(old_epoch) + " -> " + std::to_string(info.epoch) +
                                               "): exchanges in flight are lost and buffers must be allocated again");
    return Error(Errc::kIo, "the connection to aapcd at " + path + " broke; reconnected, please retry");
  }
};

// --- Buffer -------------------------------------------------------------------------------

Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    conn_ = std::move(o.conn_);
    id_ = o.id_;
    generation_ = o.generation_;
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (data_ == nullptr) return;
  ::munmap(data_, size_);
  data_ = nullptr;
  if (conn_) conn_->tell(proto::FreeRequest{id_}, generation_);  // best effort: the daemon also frees on disconnect
  conn_.reset();
}

// --- Request ------------------------------------------------------------------------------

namespace {

Result<Stats> stats_from(const std::vector<std::uint8_t>& reply) {
  auto done = reply_as<proto::DoneReply>(reply, "WAIT");
  if (!done) return done.error();
  if (!done->ok) return Error(static_cast<Errc>(done->code), done->message);
  Stats s;
  s.exchange = done->exchange;
  s.schedule = done->schedule;
  s.sync = done->sync;
  s.seconds = static_cast<double>(done->duration_ns) / 1e9;
  s.bytes_sent = done->bytes_sent;
  s.bytes_received = done->bytes_received;
  s.retransmissions = done->retransmissions;
  s.sync_wait_seconds = static_cast<double>(done->wait_ns) / 1e9;
  s.daemon_cpu_seconds = static_cast<double>(done->cpu_ns) / 1e9;
  for (const auto& [start, end] : done->rounds) s.rounds.push_back({static_cast<double>(start) / 1e9, static_cast<double>(end) / 1e9});
  return s;
}

}  // namespace

// A one-message start's request and connection generation (Connection::post); the last copy
// of its Request tells the connection when its answer was never read.
struct PostedStart {
  std::shared_ptr<Connection> conn;
  Connection::Posted at;
  bool answered = false;  // read, by this Request or a copy of it
  PostedStart(std::shared_ptr<Connection> c, Connection::Posted p) : conn(std::move(c)), at(p) {}
  PostedStart(const PostedStart&) = delete;
  PostedStart& operator=(const PostedStart&) = delete;
  ~PostedStart() {
    if (!answered) conn->forget(at);
  }
};

Result<Stats> Request::wait() {
  if (result_) return *result_;
  if (!conn_) return Error(Errc::kInvalidArgument, "this request was never started");
  if (posted_) return *posted_result(std::nullopt);
  auto reply = conn_->call(proto::WaitRequest{id_, true});
  if (!reply) return reply.error();
  result_ = stats_from(*reply);
  return *result_;
}

std::optional<Result<Stats>> Request::test() { return wait_for(std::chrono::microseconds(0)); }

std::optional<Result<Stats>> Request::posted_result(std::optional<std::chrono::microseconds> bound) {
  if (posted_->answered) return Result<Stats>(Error(Errc::kInvalidArgument, "a copy of this request has taken its result"));
  auto reply = conn_->answer(posted_->at, bound);
  if (!reply) result_ = Result<Stats>(reply.error());
  else if (!*reply) return std::nullopt;
  else result_ = stats_from(**reply);
  if (*result_) id_ = (*result_)->exchange;
  posted_->answered = true;
  posted_.reset();
  return result_;
}

std::optional<Result<Stats>> Request::wait_for(std::chrono::microseconds bound) {
  if (result_) return result_;
  if (!conn_) return Result<Stats>(Error(Errc::kInvalidArgument, "this request was never started"));
  if (posted_) return posted_result(std::max(bound, std::chrono::microseconds(0)));
  const auto us = static_cast<std::uint32_t>(std::clamp<std::int64_t>(bound.count(), 0, UINT32_MAX));
  auto reply = conn_->call(proto::WaitRequest{id_, us > 0, us});
  if (!reply) return Result<Stats>(reply.error());
  if (proto::header_of(*reply)->type == static_cast<std::uint16_t>(proto::Type::kRunning)) return std::nullopt;
  result_ = stats_from(*reply);
  return result_;
}

// --- Groups -------------------------------------------------------------------------------

// An open group; the last copy of its Client closes it at the daemon.
struct GroupHandle {
  std::shared_ptr<Connection> conn;
  std::uint32_t generation = 0;
  std::uint8_t slot = 0;
  std::vector<int> members;
  int rank = -1;
  bool everywhere = false;  // open on every member (else its close tells nobody: GroupCloseRequest::tell)
  ~GroupHandle() {
    if (conn) conn->tell(proto::GroupCloseRequest{slot, everywhere}, generation);  // best effort: closed on disconnect too
  }
};

namespace {

constexpr int kGroupTries = 8;  // a slot taken under us by another client of a member: try again

// Whether `members` can make a group of this client's; kInvalidArgument with why not.
Result<void> members_fit(const std::vector<int>& members, int me, int size) {
  auto invalid = [](const std::string& why) { return Error(Errc::kInvalidArgument, "open_group: " + why); };
  if (members.size() < 2) return invalid("a group needs at least 2 members");
  std::vector<bool> seen(static_cast<std::size_t>(size), false);
  for (int r : members) {
    if (r < 0 || r >= size) return invalid("member " + std::to_string(r) + " is not a rank of the cluster (0.." + std::to_string(size - 1) + ")");
    if (seen[static_cast<std::size_t>(r)]) return invalid("member " + std::to_string(r) + " is named twice");
    seen[static_cast<std::size_t>(r)] = true;
  }
  if (!seen[static_cast<std::size_t>(me)]) return invalid("the members do not include this machine (rank " + std::to_string(me) + ")");
  return {};
}

}  // namespace

Result<Client> Client::open_group(const std::vector<int>& members, const Reduce& reduce) const {
  // Every step reduces, whatever happened here, so that all members reach the same outcome:
  // a problem of ours offers no slot (or a failed open), which fails the group everywhere.
  std::optional<Error> mine;
  if (group_) mine = Error(Errc::kInvalidArgument, "open groups from the cluster's client, not from a group's");
  if (auto fit = members_fit(members, conn_->info.rank, conn_->info.size); !fit) mine = fit.error();
  for (int attempt = 0; attempt < kGroupTries; ++attempt) {
    std::vector<std::uint64_t> free(proto::kGroupSlots / 64, 0), next(1, 0);
    proto::GroupQueryReply here;
    if (!mine) {
      auto reply = conn_->call(proto::GroupQueryRequest{});
      auto query = reply ? reply_as<proto::GroupQueryReply>(*reply, "GROUP_QUERY") : Result<proto::GroupQueryReply>(reply.error());
      if (query) here = *query;
      else mine = query.error();
      if (query) free = here.free;
    }
    reduce(free, ReduceOp::kAnd);
    const auto slot = proto::group_slot(free, members.empty() ? 0 : *std::min_element(members.begin(), members.end()));
    if (!slot) return mine ? *mine : Error(Errc::kBusy, "open_group: no group slot is free at every member's daemon, or a member could not open the group (a daemon has 255 slots; groups close when their clients go)");
    if (!mine) next[0] = here.next[*slot];
    reduce(next, ReduceOp::kMax);
    std::optional<Error> opened_error = mine;
    if (!mine) {
      proto::GroupOpenRequest open{*slot, static_cast<std::uint32_t>(next[0]), {}};
      for (int r : members) open.members.push_back(static_cast<std::uint32_t>(r));
      auto reply = conn_->call(open);
      if (!reply) opened_error = reply.error();
      else if (proto::header_of(*reply)->type != static_cast<std::uint16_t>(proto::Type::kOk)) opened_error = reply_as<proto::ErrorReply>(*reply, "GROUP_OPEN").error();
    }
    auto handle = std::make_shared<GroupHandle>();
    if (!opened_error) {
      handle->conn = conn_;
      handle->generation = conn_->generation;
      handle->slot = *slot;
      handle->members = members;
      handle->rank = static_cast<int>(std::find(members.begin(), members.end(), conn_->info.rank) - members.begin());
    }
    std::vector<std::uint64_t> ok(1, opened_error ? 0 : 1);
    reduce(ok, ReduceOp::kAnd);
    if (ok[0] == 1) {
      handle->everywhere = true;
      Client g = *this;
      g.group_ = std::move(handle);
      return g;
    }
    handle.reset();  // closes it where it opened
    if (mine) return *mine;
    if (opened_error && opened_error->code() != Errc::kBusy) mine = opened_error;  // told to all at the next try
  }
  return mine ? *mine : Error(Errc::kBusy, "open_group: another member's daemon refused the group " + std::to_string(kGroupTries) + " times");
}

std::vector<int> Client::members() const {
  if (group_) return group_->members;
  std::vector<int> all(static_cast<std::size_t>(size()));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return all;
}

// --- Client -------------------------------------------------------------------------------

Result<Client> Client::try_connect(const std::string& socket) {
  auto conn = std::make_shared<Connection>();
  conn->path = socket_path(socket);
  auto s = open_socket(conn->path);
  if (!s) return s.error();
  conn->sock = *s;
  if (auto h = conn->hello(); !h) return h.error();
  Client c;
  c.conn_ = std::move(conn);
  return c;
}

Client Client::connect(const std::string& socket) {
  auto c = try_connect(socket);
  if (!c) throw Exception(c.error());
  return std::move(c.value());
}

int Client::rank() const { return group_ ? group_->rank : conn_->info.rank; }
int Client::size() const { return group_ ? static_cast<int>(group_->members.size()) : conn_->info.size; }
const ClusterInfo& Client::info() const { return conn_->info; }

Buffer Client::allocate(std::size_t bytes) {
  if (bytes == 0) throw Exception(Error(Errc::kInvalidArgument, "a buffer needs at least one byte"));
  // Sealed against shrinking and growing once sized: the daemon maps it, and a file shrunk
  // under a mapping kills whoever touches the lost pages (aapcd refuses unsealable files).
  int fd = ::memfd_create("aapc-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw Exception(Error(Errc::kIo, std::string("memfd_create failed: ") + std::strerror(errno)));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    ::close(fd);
    throw Exception(Error(Errc::kIo, "cannot size a buffer of " + std::to_string(bytes) + " bytes: " + std::strerror(e)));
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int e = errno;
    ::close(fd);
    throw Exception(Error(Errc::kIo, std::string("cannot seal a buffer's memory file: ") + std::strerror(e)));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    throw Exception(Error(Errc::kIo, "cannot map a buffer of " + std::to_string(bytes) + " bytes: " + std::strerror(e)));
  }
  auto reply = conn_->call(proto::RegisterRequest{bytes}, fd);
  ::close(fd);
  auto fail = [&](Error e) {
    ::munmap(p, bytes);
    throw Exception(std::move(e));
  };
  if (!reply) fail(reply.error());
  auto registered = reply_as<proto::RegisterReply>(*reply, "REGISTER");
  if (!registered) fail(registered.error());
  Buffer b;
  b.id_ = registered->buffer;
  b.conn_ = conn_;
  b.generation_ = conn_->generation;
  b.data_ = static_cast<std::uint8_t*>(p);
  b.size_ = bytes;
  return b;
}

// A START on its way: the protocol's request, named in client.hpp without the protocol.
struct StartMessage {
  proto::StartRequest request;
};

// The spec of aapc/sched/spec.hpp for `o`: Options::group is written after the name of an
// algorithm that takes a parameter (the registry's row says) when the name gives none.
StartMessage Client::start_message(int kind, const Options& o) const {
  StartMessage m;
  m.request.kind = static_cast<proto::Kind>(kind);
  const std::string schedule = sched::takes_parameter(o.schedule) ? o.schedule + ":" + std::to_string(std::max(1, o.group)) : o.schedule;
  m.request.spec = sched::join_spec(schedule, o.sync);
  m.request.timeout_ms = static_cast<std::uint32_t>(o.timeout.count());
  if (group_) m.request.group = group_->slot;
  return m;
}

namespace {

std::vector<proto::Block> blocks_of(const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs) {
  std::vector<proto::Block> out(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) out[i] = {displs[i], counts[i]};
  return out;
}

}  // namespace

Result<Request> Client::start_alltoall(const Buffer& send, Buffer& recv, std::size_t block, const Options& options) {
  StartMessage m = start_message(static_cast<int>(proto::Kind::kAlltoall), options);
  m.request.block = block;  // the size once: the daemon lays block d at d x block
  return start(send, recv, m, options.one_message_start);
}

Result<Stats> Client::alltoall(const Buffer& send, Buffer& recv, std::size_t block, const Options& options) {
  StartMessage m = start_message(static_cast<int>(proto::Kind::kAlltoall), options);
  m.request.block = block;
  m.request.run = true;  // START and WAIT in one round trip to the daemon
  if (auto checked = check_blocks(send, recv, m); !checked) return checked.error();
  return run(m);
}

Result<Request> Client::start_alltoallv(const Buffer& send, const std::vector<std::size_t>& send_counts,
                                        const std::vector<std::size_t>& send_displs, Buffer& recv, const std::vector<std::size_t>& recv_counts,
                                        const std::vector<std::size_t>& recv_displs, const Options& options) {
  const auto n = static_cast<std::size_t>(size());
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n || recv_displs.size() != n)
    return Error(Errc::kInvalidArgument, "counts and displacements need one entry per rank (" + std::to_string(n) + ")");
  StartMessage m = start_message(static_cast<int>(proto::Kind::kAlltoallv), options);
  m.request.sends = blocks_of(send_counts, send_displs);
  m.request.recvs = blocks_of(recv_counts, recv_displs);
  return start(send, recv, m, options.one_message_start);
}

Result<Request> Client::start(const Buffer& send, Buffer& recv, StartMessage& message, bool one_message) {
  if (auto checked = check_blocks(send, recv, message); !checked) return checked.error();
  if (!one_message) return send_start(message);
  message.request.run = true;  // answered once, when the exchange is over
  auto posted = conn_->post(message.request);
  if (!posted) return posted.error();
  Request req;
  req.conn_ = conn_;
  req.posted_ = std::make_shared<PostedStart>(conn_, *posted);
  return req;
}

Result<Stats> Client::run(const StartMessage& message) {
  auto reply = conn_->call(message.request);
  if (!reply) return reply.error();
  return stats_from(*reply);
}

Result<void> Client::check_blocks(const Buffer& send, const Buffer& recv, StartMessage& message) const {
  for (const Buffer* b : {&send, &recv}) {
    if (!*b) return Error(Errc::kInvalidArgument, "a buffer is empty (moved from, or never allocated)");
    if (b->conn_ != conn_ || b->generation_ != conn_->generation)
      return Error(Errc::kDaemonRestarted, "a buffer was registered with a daemon that has since restarted; allocate it again");
  }
  proto::StartRequest& m = message.request;
  for (std::size_t i = 0; i < static_cast<std::size_t>(size()); ++i) {
    if (!proto::fits(m.send_block(i), send.size()))
      return Error(Errc::kInvalidArgument, "send block " + std::to_string(i) + " runs past the end of the send buffer");
    if (!proto::fits(m.recv_block(i), recv.size()))
      return Error(Errc::kInvalidArgument, "receive block " + std::to_string(i) + " runs past the end of the receive buffer");
  }
  m.send_buffer = send.id_;
  m.recv_buffer = recv.id_;
  return {};
}

Result<Request> Client::send_start(const StartMessage& message) {
  auto reply = conn_->call(message.request);
  if (!reply) return reply.error();
  auto started = reply_as<proto::StartedReply>(*reply, "START");
  if (!started) return started.error();
  Request req;
  req.conn_ = conn_;
  req.id_ = started->exchange;
  return req;
}

Result<Stats> Client::alltoallv(const Buffer& send, const std::vector<std::size_t>& send_counts, const std::vector<std::size_t>& send_displs,
                                Buffer& recv, const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_displs,
                                const Options& options) {
  auto r = start_alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, options);
  if (!r) return r.error();
  return r->wait();
}

Result<void> Client::barrier() {
  StartMessage m = start_message(static_cast<int>(proto::Kind::kBarrier), Options{});
  m.request.run = true;
  auto done = run(m);
  if (!done) return done.error();
  return {};
}

Result<std::string> Client::status() {
  auto reply = conn_->call(proto::StatusRequest{});
  if (!reply) return reply.error();
  auto status = reply_as<proto::StatusReply>(*reply, "STATUS");
  if (!status) return status.error();
  return status->json;
}

}  // namespace aapc
