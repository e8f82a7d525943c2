// A process's doorbell: see aapc/mpi/bell.hpp.
#include "aapc/mpi/bell.hpp"
#include "aapc/mpi/env.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace aapc::mpi::bell {

namespace {

// The bell of process `pid`: "\0aapc-mpi-bell.PID".
sockaddr_un address(int pid, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "aapc-mpi-bell." + std::to_string(pid);
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

struct Bell {
  std::mutex m;
  int pid = -1;  // whose it is: a forked child makes its own
  int fd = -1;   // bound to our name; -1 when none could be
  int out = -1;  // for ringing others
};

Bell& bell() {
  static Bell* b = new Bell;  // never destroyed: MPI may call in after exit handlers
  return *b;
}

// Our bell's socket, made on first use (or after a fork); -1 when there is none.
int ours(Bell& b) {
  std::lock_guard<std::mutex> hold(b.m);
  const int me = static_cast<int>(::getpid());
  if (b.pid == me) return b.fd;
  b.pid = me;  // a child's copies of the parent's sockets stay the parent's
  b.fd = b.out = -1;
  if (env_off("AAPC_MPI_BELL")) return -1;
  b.out = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  socklen_t len = 0;
  const sockaddr_un a = address(me, len);
  if (s >= 0 && ::bind(s, reinterpret_cast<const sockaddr*>(&a), len) == 0) {
    b.fd = s;
  } else if (s >= 0) {
    ::close(s);
  }
  return b.fd;
}

}  // namespace

void open() { (void)ours(bell()); }

void ring(int pid) {
  Bell& b = bell();
  (void)ours(b);
  if (b.out < 0 || pid <= 0) return;
  socklen_t len = 0;
  const sockaddr_un a = address(pid, len);
  const char ding = 1;
  (void)::sendto(b.out, &ding, 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&a), len);
}

bool pause(std::chrono::microseconds most) {
  const int fd = ours(bell());
  if (fd < 0) {
    std::this_thread::sleep_for(most);
    return false;
  }
  pollfd p{fd, POLLIN, 0};
  const timespec due{static_cast<time_t>(most.count() / 1'000'000), static_cast<long>(most.count() % 1'000'000) * 1000L};
  if (::ppoll(&p, 1, &due, nullptr) <= 0) return false;
  char sink[64];
  while (::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
  }
  return true;
}

}  // namespace aapc::mpi::bell
