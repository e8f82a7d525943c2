// The loopback interface of the calling thread's network namespace (one the test made with
// unshare(CLONE_NEWNET), so it is the test's to reconfigure), for tests over net_af_packet.
#pragma once

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace aapc::test {

// Brings `lo` up, at `mtu` if it is not 0. False if the kernel refused.
inline bool loopback_up(int mtu = 0) {
  const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (s < 0) return false;
  ifreq ifr{};
  std::strcpy(ifr.ifr_name, "lo");
  ifr.ifr_mtu = mtu;
  bool ok = (mtu == 0 || ::ioctl(s, SIOCSIFMTU, &ifr) == 0) && ::ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  ok = ok && ::ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
  ::close(s);
  return ok;
}

}  // namespace aapc::test
