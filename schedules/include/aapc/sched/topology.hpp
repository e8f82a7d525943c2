// Cluster topology: machines and switches joined by full-duplex links.
//
// A topology is always a tree (switched Ethernet forwards on a spanning tree), machines are
// leaves, and every machine has a rank 0..N-1. This header is pure C++: the DOT reader in
// dot.hpp produces a TopologySpec, and Topology::from_spec() validates it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace aapc::sched {

using Rank = int;

// A 48-bit Ethernet address.
struct Mac {
  std::array<std::uint8_t, 6> bytes{};

  // Parses "02:00:00:00:00:01" (also '-' separated); nullopt when malformed.
  static std::optional<Mac> parse(std::string_view text);
  std::string str() const;
  bool is_multicast() const { return (bytes[0] & 1U) != 0; }
  bool is_zero() const;
  friend bool operator==(const Mac&, const Mac&) = default;
  friend auto operator<=>(const Mac&, const Mac&) = default;
};

// Everything wrong with a topology is reported with this, naming the file and the node or
// edge at fault.
class TopologyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The raw content of a topology description, before validation.
struct TopologySpec {
  struct NodeSpec {
    std::string name;
    std::map<std::string, std::string> attrs;
  };
  struct EdgeSpec {
    std::string a, b;
    std::map<std::string, std::string> attrs;
  };
  std::string source = "<memory>";  // file name, for error messages
  bool directed = false;
  std::map<std::string, std::string> graph_attrs;
  std::vector<NodeSpec> nodes;  // in order of declaration
  std::vector<EdgeSpec> edges;
};

enum class NodeKind : std::uint8_t { kMachine, kSwitch };

struct Node {
  std::string name;
  NodeKind kind = NodeKind::kSwitch;
  Mac mac;                         // machines only
  Rank rank = -1;                  // machines only
  std::uint64_t buffer_bytes = 0;  // switches only; 0 = not given
  std::vector<int> links;          // indices into Topology::links()
};

struct Link {
  int a = -1, b = -1;           // node ids
  std::uint64_t rate_bps = 0;  // each direction
  int other(int node) const { return node == a ? b : a; }
};

// The wire's source and destination ranks are 16-bit fields (aapc/wire/wire.hpp, kMaxRanks);
// schedules/ includes no engine header, so the limit is repeated here.
inline constexpr std::size_t kMaxMachines = 0xFFFF;

inline constexpr std::uint64_t kDefaultRateBps = 1'000'000'000ULL;
inline constexpr int kDefaultMtu = 1500;
// A switch port's queue when the topology does not give one (`buffer` on a switch): what the
// emulated cluster shapes, and what `auto` assumes.
inline constexpr std::uint64_t kDefaultSwitchBufferBytes = 65536;
inline std::uint64_t buffer_or_default(const Node& a_switch) {
  return a_switch.buffer_bytes != 0 ? a_switch.buffer_bytes : kDefaultSwitchBufferBytes;
}

// Parses "100Mbit", "1Gbit", "2.5Gbit", "10000kbit" into bits per second.
std::optional<std::uint64_t> parse_rate(std::string_view text);
// Formats a rate the way topology files write it ("100Mbit").
std::string format_rate(std::uint64_t bps);
// Parses a byte count with an optional K/M/G (powers of 1024) suffix: "65536", "64K", "64KiB".
std::optional<std::uint64_t> parse_bytes(std::string_view text);

class Topology;
// Whether every link runs at one rate.
bool one_rate(const Topology& topology);

// A validated tree of machines and switches. Directed edges are numbered 2*link (a->b) and
// 2*link+1 (b->a).
class Topology {
 public:
  // Validates `spec`; throws TopologyError naming spec.source and the offending element.
  static Topology from_spec(const TopologySpec& spec);

  const std::string& source() const { return source_; }
  const std::string& name() const { return name_; }
  int mtu() const { return mtu_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Link>& links() const { return links_; }
  const Node& node(int id) const { return nodes_.at(static_cast<std::size_t>(id)); }

  int machine_count() const { return static_cast<int>(machines_.size()); }
  int switch_count() const { return static_cast<int>(nodes_.size() - machines_.size()); }
  // Node id of the machine with rank r.
  int machine_node(Rank r) const { return machines_.at(static_cast<std::size_t>(r)); }
  const Node& machine(Rank r) const { return node(machine_node(r)); }
  std::optional<Rank> rank_of_mac(const Mac& mac) const;
  std::optional<int> find_node(std::string_view name) const;
  // The switch a machine is plugged into (its only neighbour), or -1 for a machine cabled
  // straight to another machine.
  int switch_of(Rank r) const;
  // True when every machine hangs off the same switch.
  bool single_switch() const;

  int directed_edge_count() const { return 2 * static_cast<int>(links_.size()); }
  int edge_id(int link, int from_node) const { return 2 * link + (links_[static_cast<std::size_t>(link)].a == from_node ? 0 : 1); }
  int edge_from(int edge) const;
  int edge_to(int edge) const;
  std::string edge_name(int edge) const;  // "s0->s1"

  // Directed edges on the unique path from node u to node v, in order.
  std::vector<int> path(int u, int v) const;
  void path(int u, int v, std::vector<int>& out) const;
  std::vector<int> path_between(Rank src, Rank dst) const { return path(machine_node(src), machine_node(dst)); }
  // By rank: the rate of the slowest link on the path from `src` to each machine (for `src`
  // itself, its own link's). One walk of the tree.
  std::vector<std::uint64_t> slowest_from(Rank src) const;

  // The tree walked depth-first from node 0, once: the nodes in visiting order (parents before
  // their children) and each node's link to its parent (-1 for node 0). Path queries and
  // TreeModel's counts below each node build on it.
  const std::vector<int>& walk_order() const { return order_; }
  int parent_link(int node) const { return parent_link_[static_cast<std::size_t>(node)]; }

 private:
  void build_index();

  std::string source_;
  std::string name_;
  int mtu_ = kDefaultMtu;
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<int> machines_;  // by rank
  // Rooted at node 0 for path queries.
  std::vector<int> parent_;
  std::vector<int> parent_link_;
  std::vector<int> depth_;
  std::vector<int> order_;
};

// The tree that joins `members` (distinct ranks of `topology`, at least 2), for an exchange among
// them alone (groups): member i becomes rank i, and only the switches and links on
// paths between members remain, with their rates and buffers. A schedule free of contention
// on it is free of contention on the whole tree: its paths are the same edges. Throws
// TopologyError naming the member at fault.
Topology sub_topology(const Topology& topology, const std::vector<Rank>& members);

// The smallest switch buffer of the topology (buffer_or_default of each switch); 0 when it has
// no switch (two machines cabled together).
std::uint64_t smallest_switch_buffer(const Topology& topology);

}  // namespace aapc::sched
