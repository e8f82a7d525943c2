#include "aapc/proto/protocol.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

namespace aapc::proto {

bool send_message(int sock, const std::vector<std::uint8_t>& msg, int fd) {
  iovec iov{const_cast<std::uint8_t*>(msg.data()), msg.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  for (;;) {
    ssize_t n = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(msg.size())) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

Received recv_message(int sock, std::vector<std::uint8_t>& msg, int& fd, bool& truncated) {
  // Received into a buffer kept from call to call and never cleared: sizing `msg` to the
  // largest message every time would zero a megabyte per request.
  thread_local std::unique_ptr<std::uint8_t[]> buffer(new std::uint8_t[kMaxMessage]);
  fd = -1;
  truncated = false;
  iovec iov{buffer.get(), kMaxMessage};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Received::kNothing;
  if (n <= 0) return Received::kClosed;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int x;
      std::memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof x);
      if (fd < 0) {
        fd = x;
      } else {
        ::close(x);  // one descriptor per message; more are closed, not leaked
      }
    }
  }
  truncated = (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  msg.assign(buffer.get(), buffer.get() + n);
  return Received::kMessage;
}

}  // namespace aapc::proto

namespace aapc::proto {

// --- encode and decode, field by field in the same order --------------------------------------

namespace {

constexpr std::size_t kMaxName = 4096;      // names and specs
constexpr std::size_t kMaxText = 65536;     // error messages
constexpr std::size_t kMaxSpec = 256;

void put_blocks(Writer& w, const std::vector<Block>& blocks) {
  for (const auto& b : blocks) w.put(b.offset).put(b.length);
}

void get_blocks(Reader& r, std::vector<Block>& blocks, std::uint32_t count) {
  blocks.resize(count);
  for (auto& b : blocks) {
    b.offset = r.get<std::uint64_t>();
    b.length = r.get<std::uint64_t>();
  }
}

}  // namespace

void encode(Writer& w, const HelloRequest& m) {
  w.str(m.client);
  if (!m.job.empty()) w.str(m.job);
}
bool decode(Reader& r, HelloRequest& m) {
  m.client = r.str(kMaxName);
  if (r.ok() && !r.at_end()) {
    m.job = r.str(kMaxName);
    if (m.job.empty()) return false;  // sent only when not empty
  }
  return r.done();
}

void encode(Writer& w, const HelloReply& m) {
  w.put(m.rank).put(m.size).put(m.epoch).put(m.mtu).put(m.peak_bps);
  w.str(m.machine).str(m.topology);
}
bool decode(Reader& r, HelloReply& m) {
  m.rank = r.get<std::uint32_t>();
  m.size = r.get<std::uint32_t>();
  m.epoch = r.get<std::uint32_t>();
  m.mtu = r.get<std::uint32_t>();
  m.peak_bps = r.get<double>();
  m.machine = r.str(kMaxName);
  m.topology = r.str(kMaxName);
  return r.done();
}

void encode(Writer& w, const RegisterRequest& m) { w.put(m.size); }
bool decode(Reader& r, RegisterRequest& m) {
  m.size = r.get<std::uint64_t>();
  return r.done();
}

void encode(Writer& w, const RegisterReply& m) { w.put(m.buffer); }
bool decode(Reader& r, RegisterReply& m) {
  m.buffer = r.get<std::uint32_t>();
  return r.done();
}

void encode(Writer& w, const FreeRequest& m) { w.put(m.buffer); }
bool decode(Reader& r, FreeRequest& m) {
  m.buffer = r.get<std::uint32_t>();
  return r.done();
}

void encode(Writer& w, const StartRequest& m) {
  w.put(static_cast<std::uint8_t>(m.kind)).str(m.spec).put(m.timeout_ms);
  if (m.kind != Kind::kBarrier) {
    w.put(m.send_buffer).put(m.recv_buffer);
    if (m.kind == Kind::kAlltoall) {
      w.put(m.block);
    } else {
      w.put(static_cast<std::uint32_t>(m.sends.size()));
      put_blocks(w, m.sends);
      put_blocks(w, m.recvs);
    }
  }
  if (m.group != 0) w.put(m.group);
}
bool decode(Reader& r, StartRequest& m) {
  const auto kind = r.get<std::uint8_t>();
  m.spec = r.str(kMaxSpec);
  m.timeout_ms = r.get<std::uint32_t>();
  if (!r.ok() || kind < static_cast<std::uint8_t>(Kind::kAlltoall) || kind > static_cast<std::uint8_t>(Kind::kBarrier)) return false;
  m.kind = static_cast<Kind>(kind);
  if (m.kind != Kind::kBarrier) {
    m.send_buffer = r.get<std::uint32_t>();
    m.recv_buffer = r.get<std::uint32_t>();
    if (m.kind == Kind::kAlltoall) {
      m.block = r.get<std::uint64_t>();
    } else {
      // Sends and receives: as many of each, 16 bytes a block.
      const auto count = r.get<std::uint32_t>();
      if (!r.fits(2ULL * count, 2 * sizeof(std::uint64_t))) return false;
      get_blocks(r, m.sends, count);
      get_blocks(r, m.recvs, count);
    }
  }
  if (r.ok() && !r.at_end()) {
    m.group = r.get<std::uint8_t>();
    if (m.group == 0) return false;  // sent only when not 0
  }
  return r.done();
}

void encode(Writer& w, const StartedReply& m) { w.put(m.exchange).str(m.schedule).str(m.sync); }
bool decode(Reader& r, StartedReply& m) {
  m.exchange = r.get<std::uint32_t>();
  m.schedule = r.str(kMaxName);
  m.sync = r.str(kMaxName);
  return r.done();
}

void encode(Writer& w, const WaitRequest& m) { w.put(m.exchange); }
bool decode(Reader& r, WaitRequest& m) {
  m.exchange = r.get<std::uint32_t>();
  return r.done();
}

void encode(Writer& w, const DoneReply& m) {
  w.put(m.exchange).put(static_cast<std::uint8_t>(m.ok ? 1 : 2)).put(m.code).str(m.message);
  w.str(m.schedule).str(m.sync);
  w.put(m.duration_ns).put(m.bytes_sent).put(m.bytes_received).put(m.retransmissions);
  w.put(m.wait_ns).put(m.cpu_ns);
  w.put(static_cast<std::uint32_t>(m.rounds.size()));
  for (const auto& [start, end] : m.rounds) w.put(start).put(end);
}
bool decode(Reader& r, DoneReply& m) {
  m.exchange = r.get<std::uint32_t>();
  const auto state = r.get<std::uint8_t>();
  m.ok = state == 1;
  m.code = r.get<std::uint32_t>();
  m.message = r.str(kMaxText);
  m.schedule = r.str(kMaxName);
  m.sync = r.str(kMaxName);
  m.duration_ns = r.get<std::int64_t>();
  m.bytes_sent = r.get<std::uint64_t>();
  m.bytes_received = r.get<std::uint64_t>();
  m.retransmissions = r.get<std::uint64_t>();
  m.wait_ns = r.get<std::int64_t>();
  m.cpu_ns = r.get<std::int64_t>();
  const auto rounds = r.get<std::uint32_t>();
  if (!r.fits(rounds, 2 * sizeof(std::int64_t)) || (state != 1 && state != 2)) return false;
  m.rounds.resize(rounds);
  for (auto& [start, end] : m.rounds) {
    start = r.get<std::int64_t>();
    end = r.get<std::int64_t>();
  }
  return r.done();
}

void encode(Writer&, const StatusRequest&) {}
bool decode(Reader& r, StatusRequest&) { return r.done(); }

void encode(Writer& w, const StatusReply& m) { w.str(m.json); }
bool decode(Reader& r, StatusReply& m) {
  m.json = r.str(kMaxMessage);
  return r.done();
}

void encode(Writer& w, const ErrorReply& m) { w.put(m.code).str(m.message); }
bool decode(Reader& r, ErrorReply& m) {
  m.code = r.get<std::uint32_t>();
  m.message = r.str(kMaxText);
  return r.done();
}

void encode(Writer&, const EmptyReply&) {}

void encode(Writer&, const GroupQueryRequest&) {}
bool decode(Reader& r, GroupQueryRequest&) { return r.done(); }

void encode(Writer& w, const GroupQueryReply& m) {
  for (std::size_t i = 0; i < kGroupSlots / 64; ++i) w.put(i < m.free.size() ? m.free[i] : 0);
  for (std::size_t s = 0; s < kGroupSlots; ++s) w.put(s < m.next.size() ? m.next[s] : 0);
}
bool decode(Reader& r, GroupQueryReply& m) {
  m.free.resize(kGroupSlots / 64);
  for (auto& word : m.free) word = r.get<std::uint64_t>();
  m.next.resize(kGroupSlots);
  for (auto& seq : m.next) seq = r.get<std::uint32_t>();
  return r.done();
}

void encode(Writer& w, const GroupOpenRequest& m) {
  w.put(m.slot).put(m.first).put(static_cast<std::uint32_t>(m.members.size()));
  for (std::uint32_t rank : m.members) w.put(rank);
}
bool decode(Reader& r, GroupOpenRequest& m) {
  m.slot = r.get<std::uint8_t>();
  m.first = r.get<std::uint32_t>();
  const auto count = r.get<std::uint32_t>();
  if (!r.fits(count, sizeof(std::uint32_t))) return false;
  m.members.resize(count);
  for (auto& rank : m.members) rank = r.get<std::uint32_t>();
  return r.done();
}

void encode(Writer& w, const GroupCloseRequest& m) { w.put(m.slot).put(static_cast<std::uint8_t>(m.tell ? 1 : 0)); }
bool decode(Reader& r, GroupCloseRequest& m) {
  m.slot = r.get<std::uint8_t>();
  const auto tell = r.get<std::uint8_t>();
  m.tell = tell == 1;
  return tell <= 1 && r.done();
}

std::optional<Overlap> find_overlap(const std::vector<Range>& sends, const std::vector<Range>& recvs) {
  struct Item {
    Range range;
    bool send;
  };
  std::vector<Item> all;
  all.reserve(sends.size() + recvs.size());
  for (const Range& r : sends)
    if (r.end > r.begin) all.push_back({r, true});
  for (const Range& r : recvs)
    if (r.end > r.begin) all.push_back({r, false});
  std::sort(all.begin(), all.end(), [](const Item& a, const Item& b) { return a.range.begin < b.range.begin; });
  // By start: a range overlaps one of the other side that started before it iff that side's
  // furthest end so far lies past its start.
  std::optional<Range> furthest_send, furthest_recv;
  for (const Item& it : all) {
    std::optional<Range>& other = it.send ? furthest_recv : furthest_send;
    if (other && other->end > it.range.begin) return it.send ? Overlap{it.range, *other} : Overlap{*other, it.range};
    std::optional<Range>& mine = it.send ? furthest_send : furthest_recv;
    if (!mine || it.range.end > mine->end) mine = it.range;
  }
  return std::nullopt;
}

// --- the daemon's side: any request ------------------------------------------------------------

namespace {

template <typename M>
DecodedRequest decoded(const Header& h, Reader& r, M m, const char* name) {
  DecodedRequest d{h, true, std::nullopt, {}};
  if (decode(r, m)) {
    d.request = std::move(m);
  } else {
    d.error = std::string("malformed ") + name;
  }
  return d;
}

}  // namespace

DecodedRequest decode_request(const std::vector<std::uint8_t>& msg) {
  auto h = header_of(msg);
  if (!h) return {Header{}, false, std::nullopt, "not an aapc request"};
  if (h->version != kVersion)
    return {*h, false, std::nullopt, "protocol version " + std::to_string(h->version) + " (this aapcd speaks " + std::to_string(kVersion) + ")"};
  Reader r = payload_of(msg);
  switch (static_cast<Type>(h->type)) {
    case Type::kHello: return decoded(*h, r, HelloRequest{}, "HELLO");
    case Type::kRegister: return decoded(*h, r, RegisterRequest{}, "REGISTER (it carries a size and nothing else)");
    case Type::kFree: return decoded(*h, r, FreeRequest{}, "FREE");
    case Type::kStart: return decoded(*h, r, StartRequest{}, "START");
    case Type::kRun: {
      StartRequest run;
      run.run = true;
      return decoded(*h, r, run, "RUN");
    }
    case Type::kWait: return decoded(*h, r, WaitRequest{0, true}, "WAIT");
    case Type::kTest: return decoded(*h, r, WaitRequest{0, false}, "TEST");
    case Type::kStatus: return decoded(*h, r, StatusRequest{}, "STATUS");
    case Type::kGroupQuery: return decoded(*h, r, GroupQueryRequest{}, "GROUP_QUERY");
    case Type::kGroupOpen: return decoded(*h, r, GroupOpenRequest{}, "GROUP_OPEN");
    case Type::kGroupClose: return decoded(*h, r, GroupCloseRequest{}, "GROUP_CLOSE");
    default: return {*h, true, std::nullopt, "unknown request type " + std::to_string(h->type)};
  }
}

}  // namespace aapc::proto
