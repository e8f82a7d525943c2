#include "aapc/client.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "protocol.hpp"

namespace aapc {

namespace {

constexpr const char* kDefaultSocket = "/run/aapc/aapcd.sock";

std::string socket_path(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("AAPC_SOCKET"); env != nullptr && env[0] != '\0') return env;
  return kDefaultSocket;
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

Error error_from(proto::Reader& r) {
  auto code = static_cast<Errc>(r.get<std::uint32_t>());
  std::string message = r.str(65536);
  if (!r.ok()) return Error(Errc::kProtocol, "aapcd sent a malformed error reply");
  return Error(code, message);
}

}  // namespace

struct Connection {
  std::string path;
  int sock = -1;
  std::uint32_t next_request = 1;
  std::uint32_t generation = 1;  // grows when we reconnect to a restarted daemon
  ClusterInfo info;

  ~Connection() {
    if (sock >= 0) ::close(sock);
  }

  Result<void> hello() {
    proto::Writer w(proto::Type::kHello, next_request++);
    w.str("aapc-client 1");
    auto reply = exchange_raw(w.done(), -1);
    if (!reply) return reply.error();
    proto::Reader r(reply->data() + sizeof(proto::Header), reply->size() - sizeof(proto::Header));
    auto h = *proto::header_of(*reply);
    if (h.type == static_cast<std::uint16_t>(proto::Type::kError)) return error_from(r);
    if (h.type != static_cast<std::uint16_t>(proto::Type::kHelloReply)) return Error(Errc::kProtocol, "aapcd answered HELLO oddly");
    ClusterInfo i;
    i.rank = static_cast<int>(r.get<std::uint32_t>());
    i.size = static_cast<int>(r.get<std::uint32_t>());
    i.epoch = r.get<std::uint32_t>();
    i.mtu = static_cast<int>(r.get<std::uint32_t>());
    i.peak_bps = r.get<double>();
    i.machine = r.str();
    i.topology = r.str();
    if (!r.ok()) return Error(Errc::kProtocol, "aapcd sent a malformed HELLO reply");
    info = i;
    return {};
  }

  // One request and its reply on the current socket.
  Result<std::vector<std::uint8_t>> exchange_raw(const std::vector<std::uint8_t>& msg, int fd) {
    if (sock < 0) return Error(Errc::kIo, "lost the connection to aapcd at " + path);
    // A failed send is not the end: a daemon that refused us left its reason to read.
    (void)proto::send_message(sock, msg, fd);
    std::vector<std::uint8_t> reply;
    int rfd = -1;
    bool truncated = false;
    if (proto::recv_message(sock, reply, rfd, truncated) != proto::Received::kMessage)
      return Error(Errc::kIo, "lost the connection to aapcd at " + path);
    if (rfd >= 0) ::close(rfd);
    if (truncated || !proto::header_of(reply)) return Error(Errc::kProtocol, "aapcd sent a malformed reply");
    return reply;
  }

  // A request; a broken connection is looked into: a restarted daemon is reported as such.
  Result<std::vector<std::uint8_t>> call(proto::Writer& w, int fd = -1) {
    auto reply = exchange_raw(w.done(), fd);
    if (reply) return reply;
    if (reply.error().code() != Errc::kIo) return reply;
    // Reconnect to tell a restart from a daemon that is gone.
    const std::uint32_t old_epoch = info.epoch;
    if (sock >= 0) ::close(sock);
    sock = -1;
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
  if (conn_ && generation_ == conn_->generation) {
    proto::Writer w(proto::Type::kFree, conn_->next_request++);
    w.put(id_);
    (void)conn_->exchange_raw(w.done(), -1);  // best effort: the daemon also frees on disconnect
  }
  conn_.reset();
}

// --- Request ------------------------------------------------------------------------------

namespace {

Result<Stats> stats_from(const std::vector<std::uint8_t>& reply) {
  auto h = *proto::header_of(reply);
  proto::Reader r(reply.data() + sizeof(proto::Header), reply.size() - sizeof(proto::Header));
  if (h.type == static_cast<std::uint16_t>(proto::Type::kError)) return error_from(r);
  if (h.type != static_cast<std::uint16_t>(proto::Type::kDone)) return Error(Errc::kProtocol, "aapcd answered oddly");
  Stats s;
  s.exchange = r.get<std::uint32_t>();
  auto state = r.get<std::uint8_t>();
  auto code = static_cast<Errc>(r.get<std::uint32_t>());
  std::string message = r.str(65536);
  s.schedule = r.str();
  s.sync = r.str();
  s.seconds = static_cast<double>(r.get<std::int64_t>()) / 1e9;
  s.bytes_sent = r.get<std::uint64_t>();
  s.bytes_received = r.get<std::uint64_t>();
  s.retransmissions = r.get<std::uint64_t>();
  s.sync_wait_seconds = static_cast<double>(r.get<std::int64_t>()) / 1e9;
  s.daemon_cpu_seconds = static_cast<double>(r.get<std::int64_t>()) / 1e9;
  auto rounds = r.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < rounds && r.ok(); ++i) {
    RoundTime t;
    t.start_s = static_cast<double>(r.get<std::int64_t>()) / 1e9;
    t.end_s = static_cast<double>(r.get<std::int64_t>()) / 1e9;
    s.rounds.push_back(t);
  }
  if (!r.ok()) return Error(Errc::kProtocol, "aapcd sent a malformed result");
  if (state != 1) return Error(code, message);
  return s;
}

}  // namespace

Result<Stats> Request::wait() {
  if (result_) return *result_;
  if (!conn_) return Error(Errc::kInvalidArgument, "this request was never started");
  proto::Writer w(proto::Type::kWait, conn_->next_request++);
  w.put(id_);
  auto reply = conn_->call(w);
  if (!reply) return reply.error();
  result_ = stats_from(*reply);
  return *result_;
}

std::optional<Result<Stats>> Request::test() {
  if (result_) return result_;
  if (!conn_) return Result<Stats>(Error(Errc::kInvalidArgument, "this request was never started"));
  proto::Writer w(proto::Type::kTest, conn_->next_request++);
  w.put(id_);
  auto reply = conn_->call(w);
  if (!reply) return Result<Stats>(reply.error());
  if (proto::header_of(*reply)->type == static_cast<std::uint16_t>(proto::Type::kRunning)) return std::nullopt;
  result_ = stats_from(*reply);
  return result_;
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

int Client::rank() const { return conn_->info.rank; }
int Client::size() const { return conn_->info.size; }
const ClusterInfo& Client::info() const { return conn_->info; }

Buffer Client::allocate(std::size_t bytes) {
  if (bytes == 0) throw Exception(Error(Errc::kInvalidArgument, "a buffer needs at least one byte"));
  int fd = ::memfd_create("aapc-buffer", MFD_CLOEXEC);
  if (fd < 0) throw Exception(Error(Errc::kIo, std::string("memfd_create failed: ") + std::strerror(errno)));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    ::close(fd);
    throw Exception(Error(Errc::kIo, "cannot size a buffer of " + std::to_string(bytes) + " bytes: " + std::strerror(e)));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    throw Exception(Error(Errc::kIo, "cannot map a buffer of " + std::to_string(bytes) + " bytes: " + std::strerror(e)));
  }
  proto::Writer w(proto::Type::kRegister, conn_->next_request++);
  w.put(static_cast<std::uint64_t>(bytes));
  auto reply = conn_->call(w, fd);
  ::close(fd);
  auto fail = [&](Error e) {
    ::munmap(p, bytes);
    throw Exception(std::move(e));
  };
  if (!reply) fail(reply.error());
  auto h = *proto::header_of(*reply);
  proto::Reader r(reply->data() + sizeof(proto::Header), reply->size() - sizeof(proto::Header));
  if (h.type == static_cast<std::uint16_t>(proto::Type::kError)) fail(error_from(r));
  Buffer b;
  b.id_ = r.get<std::uint32_t>();
  if (!r.ok() || h.type != static_cast<std::uint16_t>(proto::Type::kRegisterReply)) fail(Error(Errc::kProtocol, "aapcd answered REGISTER oddly"));
  b.conn_ = conn_;
  b.generation_ = conn_->generation;
  b.data_ = static_cast<std::uint8_t*>(p);
  b.size_ = bytes;
  return b;
}

namespace {

void put_options(proto::Writer& w, proto::Kind kind, const Options& o) {
  w.put(static_cast<std::uint8_t>(kind));
  w.str(o.schedule);
  w.put(static_cast<std::uint32_t>(o.group));
  w.str(o.sync);
  w.put(static_cast<std::uint32_t>(o.timeout.count()));
}

}  // namespace

Result<Request> Client::start_alltoall(const Buffer& send, Buffer& recv, std::size_t block, const Options& options) {
  const auto n = static_cast<std::size_t>(size());
  std::vector<std::size_t> counts(n, block), displs(n);
  for (std::size_t i = 0; i < n; ++i) displs[i] = i * block;
  return start_blocks(true, send, counts, displs, recv, counts, displs, options);
}

Result<Stats> Client::alltoall(const Buffer& send, Buffer& recv, std::size_t block, const Options& options) {
  auto r = start_alltoall(send, recv, block, options);
  if (!r) return r.error();
  return r->wait();
}

Result<Request> Client::start_alltoallv(const Buffer& send, const std::vector<std::size_t>& send_counts,
                                        const std::vector<std::size_t>& send_displs, Buffer& recv, const std::vector<std::size_t>& recv_counts,
                                        const std::vector<std::size_t>& recv_displs, const Options& options) {
  return start_blocks(false, send, send_counts, send_displs, recv, recv_counts, recv_displs, options);
}

Result<Request> Client::start_blocks(bool uniform, const Buffer& send, const std::vector<std::size_t>& send_counts,
                                     const std::vector<std::size_t>& send_displs, Buffer& recv, const std::vector<std::size_t>& recv_counts,
                                     const std::vector<std::size_t>& recv_displs, const Options& options) {
  const auto n = static_cast<std::size_t>(size());
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n || recv_displs.size() != n)
    return Error(Errc::kInvalidArgument, "counts and displacements need one entry per rank (" + std::to_string(n) + ")");
  for (const Buffer* b : {&send, static_cast<const Buffer*>(&recv)}) {
    if (!*b) return Error(Errc::kInvalidArgument, "a buffer is empty (moved from, or never allocated)");
    if (b->conn_ != conn_ || b->generation_ != conn_->generation)
      return Error(Errc::kDaemonRestarted, "a buffer was registered with a daemon that has since restarted; allocate it again");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (send_counts[i] > send.size() || send_displs[i] > send.size() - send_counts[i])
      return Error(Errc::kInvalidArgument, "send block " + std::to_string(i) + " runs past the end of the send buffer");
    if (recv_counts[i] > recv.size() || recv_displs[i] > recv.size() - recv_counts[i])
      return Error(Errc::kInvalidArgument, "receive block " + std::to_string(i) + " runs past the end of the receive buffer");
  }
  proto::Writer w(proto::Type::kStart, conn_->next_request++);
  put_options(w, uniform ? proto::Kind::kAlltoall : proto::Kind::kAlltoallv, options);
  w.put(send.id_);
  w.put(recv.id_);
  w.put(static_cast<std::uint32_t>(n));
  for (std::size_t i = 0; i < n; ++i) w.put(static_cast<std::uint64_t>(send_displs[i])).put(static_cast<std::uint64_t>(send_counts[i]));
  for (std::size_t i = 0; i < n; ++i) w.put(static_cast<std::uint64_t>(recv_displs[i])).put(static_cast<std::uint64_t>(recv_counts[i]));
  auto reply = conn_->call(w);
  if (!reply) return reply.error();
  auto h = *proto::header_of(*reply);
  proto::Reader r(reply->data() + sizeof(proto::Header), reply->size() - sizeof(proto::Header));
  if (h.type == static_cast<std::uint16_t>(proto::Type::kError)) return error_from(r);
  Request req;
  req.conn_ = conn_;
  req.id_ = r.get<std::uint32_t>();
  if (!r.ok() || h.type != static_cast<std::uint16_t>(proto::Type::kStarted)) return Error(Errc::kProtocol, "aapcd answered START oddly");
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
  proto::Writer w(proto::Type::kStart, conn_->next_request++);
  put_options(w, proto::Kind::kBarrier, Options{});
  auto reply = conn_->call(w);
  if (!reply) return reply.error();
  auto h = *proto::header_of(*reply);
  proto::Reader r(reply->data() + sizeof(proto::Header), reply->size() - sizeof(proto::Header));
  if (h.type == static_cast<std::uint16_t>(proto::Type::kError)) return error_from(r);
  Request req;
  req.conn_ = conn_;
  req.id_ = r.get<std::uint32_t>();
  auto done = req.wait();
  if (!done) return done.error();
  return {};
}

Result<std::string> Client::status() {
  proto::Writer w(proto::Type::kStatus, conn_->next_request++);
  auto reply = conn_->call(w);
  if (!reply) return reply.error();
  auto h = *proto::header_of(*reply);
  proto::Reader r(reply->data() + sizeof(proto::Header), reply->size() - sizeof(proto::Header));
  if (h.type == static_cast<std::uint16_t>(proto::Type::kError)) return error_from(r);
  std::string json = r.str(proto::kMaxMessage);
  if (!r.ok()) return Error(Errc::kProtocol, "aapcd answered STATUS oddly");
  return json;
}

}  // namespace aapc
