#include "protocol.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

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
