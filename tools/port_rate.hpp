// aapc-engine-bench --port-rate (port_rate.cpp): one node's send and receive rate per kind of
// port for a kernel interface, on a pair of network namespaces.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace aapc::port_rate {

// One side of a trial, run by the benchmark in a namespace of its own (--port-rate-node).
struct NodeOptions {
  std::string role;    // "tx" or "rx"
  std::string driver;  // "af_xdp" or "af_packet"
  int mtu = 1500;
  double seconds = 2;  // the sender's time; the receiver waits this long and more
  std::string ready;   // rx: the file it makes once its port is open
  int queues = 1;      // queue pairs of the port; tx: a sending thread on each
};
int node(const NodeOptions& options);

// aapc-engine-bench's options of this mode (--port-rate and its own), and the mode when asked:
// the benchmark, or one side of a trial (--port-rate-node).
struct Options {
  bool bench = false;
  NodeOptions node;
  std::vector<std::string> kinds = {"af_packet", "af_xdp"};
  std::vector<int> queues = {1};  // each kind with each of these numbers of sending queues
  bool asked() const { return bench || !node.role.empty(); }
};
void add_options(CLI::App& app, Options& options);
int run(Options options, int mtu, int repeat);  // the exit status

// Every port kind of `drivers` with each number of `queues`, `repeat` trials each,
// interleaved; prints medians and spreads. `self`: this executable, run again in each
// namespace. Needs root. Throws on failure.
int bench(const std::string& self, int mtu, double seconds, int repeat, const std::vector<std::string>& drivers, const std::vector<int>& queues);

}  // namespace aapc::port_rate
