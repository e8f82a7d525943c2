// aapc-engine-bench --port-rate (port_rate.cpp): one node's send and receive rate per kind of
// port for a kernel interface, on a pair of network namespaces.
#pragma once

#include <string>
#include <vector>

namespace aapc::port_rate {

// One side of a trial, run by the benchmark in a namespace of its own (--port-rate-node).
struct NodeOptions {
  std::string role;    // "tx" or "rx"
  std::string driver;  // "af_xdp" or "af_packet"
  int mtu = 1500;
  double seconds = 2;  // the sender's time; the receiver waits this long and more
  std::string ready;   // rx: the file it makes once its port is open
};
int node(const NodeOptions& options);

// Every port kind of `drivers`, `repeat` trials each, interleaved; prints medians and spreads.
// `self`: this executable, run again in each namespace. Needs root. Throws on failure.
int bench(const std::string& self, int mtu, double seconds, int repeat, const std::vector<std::string>& drivers);

}  // namespace aapc::port_rate
