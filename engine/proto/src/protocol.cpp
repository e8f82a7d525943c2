#include "aapc/proto/protocol.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
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

// Decodes the payload as `M` when the header's type is one of M's; false when it is not.
template <typename M>
bool decode_as(const Header& h, Reader& r, DecodedRequest& d) {
  for (const RequestType& t : M::kTypes) {
    if (static_cast<std::uint16_t>(t.type) != h.type) continue;
    M m{};
    Decoder io(r, t.type);
    M::fields(m, io);
    if (r.done()) {
      d.request = std::move(m);
    } else {
      d.error = std::string("malformed ") + t.name;
    }
    return true;
  }
  return false;
}

template <typename... M>
bool decode_any(const Header& h, Reader& r, DecodedRequest& d, std::type_identity<std::variant<M...>> /*requests*/) {
  return (decode_as<M>(h, r, d) || ...);
}

// No two requests claim one type: the type alone says what the payload is.
template <typename... M>
constexpr bool types_distinct(std::type_identity<std::variant<M...>> /*requests*/) {
  std::array<Type, (std::size(M::kTypes) + ...)> all{};
  std::size_t n = 0;
  ((std::ranges::for_each(M::kTypes, [&](const RequestType& t) { all[n++] = t.type; })), ...);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j)
      if (all[i] == all[j]) return false;
  return true;
}
static_assert(types_distinct(std::type_identity<AnyRequest>{}), "two requests of one type");

}  // namespace

DecodedRequest decode_request(const std::vector<std::uint8_t>& msg) {
  auto h = header_of(msg);
  if (!h) return {Header{}, false, std::nullopt, "not an aapc request"};
  if (h->version != kVersion)
    return {*h, false, std::nullopt, "protocol version " + std::to_string(h->version) + " (this aapcd speaks " + std::to_string(kVersion) + ")"};
  Reader r = payload_of(msg);
  DecodedRequest d{*h, true, std::nullopt, {}};
  if (!decode_any(*h, r, d, std::type_identity<AnyRequest>{})) d.error = "unknown request type " + std::to_string(h->type);
  return d;
}

std::optional<std::uint8_t> group_slot(const std::vector<std::uint64_t>& free, int lowest_member) {
  constexpr std::size_t kGroupOnes = kGroupSlots - 1;  // slots 1..255; 0 is the cluster's
  const std::size_t start = static_cast<std::size_t>(std::max(lowest_member, 0)) % kGroupOnes;
  for (std::size_t k = 0; k < kGroupOnes; ++k) {
    const std::size_t s = 1 + (start + k) % kGroupOnes;
    if (s / 64 < free.size() && ((free[s / 64] >> (s % 64)) & 1U) != 0) return static_cast<std::uint8_t>(s);
  }
  return std::nullopt;
}

}  // namespace aapc::proto
