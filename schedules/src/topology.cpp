#include "aapc/sched/topology.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <numeric>
#include <set>
#include <unordered_map>

namespace aapc::sched {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

// Splits "12.5Gbit" into the number and the unit.
bool split_number(std::string_view text, double& value, std::string& unit) {
  text = trim(text);
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) != 0 || text[i] == '.')) ++i;
  if (i == 0) return false;
  std::string number(text.substr(0, i));
  if (std::count(number.begin(), number.end(), '.') > 1 || number.front() == '.' || number.back() == '.') return false;
  try {
    std::size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) return false;
  } catch (const std::exception&) {
    return false;
  }
  unit = lower(trim(text.substr(i)));
  return true;
}

[[noreturn]] void fail(const TopologySpec& spec, const std::string& what) {
  throw TopologyError(spec.source + ": " + what);
}

std::string attr(const std::map<std::string, std::string>& attrs, const std::string& key) {
  auto it = attrs.find(key);
  return it == attrs.end() ? std::string() : it->second;
}

}  // namespace

std::optional<Mac> Mac::parse(std::string_view text) {
  text = trim(text);
  if (text.size() != 17) return std::nullopt;
  Mac mac;
  for (std::size_t i = 0; i < 6; ++i) {
    if (i > 0) {
      char sep = text[i * 3 - 1];
      if (sep != ':' && sep != '-') return std::nullopt;
    }
    std::string_view hex = text.substr(i * 3, 2);
    unsigned value = 0;
    auto [ptr, ec] = std::from_chars(hex.data(), hex.data() + 2, value, 16);
    if (ec != std::errc() || ptr != hex.data() + 2) return std::nullopt;
    mac.bytes[i] = static_cast<std::uint8_t>(value);
  }
  return mac;
}

std::string Mac::str() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(17);
  for (std::size_t i = 0; i < 6; ++i) {
    if (i > 0) out.push_back(':');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xF]);
  }
  return out;
}

bool Mac::is_zero() const {
  return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

std::optional<std::uint64_t> parse_rate(std::string_view text) {
  double value = 0;
  std::string unit;
  if (!split_number(text, value, unit)) return std::nullopt;
  for (const char* suffix : {"/s", "ps"}) {
    std::string_view u(unit);
    if (u.size() > 2 && u.substr(u.size() - 2) == suffix) unit.resize(unit.size() - 2);
  }
  static const std::map<std::string, double> kUnits = {
      {"bit", 1.0}, {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"tbit", 1e12},
      {"kb", 1e3},  {"mb", 1e6},   {"gb", 1e9},   {"tb", 1e12}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) return std::nullopt;
  double bps = value * it->second;
  if (!(bps >= 1000.0) || bps > 1e15) return std::nullopt;  // below 1 kbit/s is a typo
  return static_cast<std::uint64_t>(std::llround(bps));
}

std::string format_rate(std::uint64_t bps) {
  struct Unit {
    std::uint64_t scale;
    const char* name;
  };
  for (Unit u : {Unit{1'000'000'000'000ULL, "Tbit"}, Unit{1'000'000'000ULL, "Gbit"}, Unit{1'000'000ULL, "Mbit"},
                 Unit{1'000ULL, "kbit"}}) {
    if (bps >= u.scale && bps % (u.scale / 10) == 0) {
      if (bps % u.scale == 0) return std::to_string(bps / u.scale) + u.name;
      return std::to_string(bps / u.scale) + "." + std::to_string((bps % u.scale) / (u.scale / 10)) + u.name;
    }
  }
  return std::to_string(bps) + "bit";
}

std::optional<std::uint64_t> parse_bytes(std::string_view text) {
  double value = 0;
  std::string unit;
  if (!split_number(text, value, unit)) return std::nullopt;
  static const std::map<std::string, double> kUnits = {
      {"", 1.0},           {"b", 1.0},           {"k", 1024.0},        {"kb", 1024.0},
      {"kib", 1024.0},     {"m", 1048576.0},     {"mb", 1048576.0},    {"mib", 1048576.0},
      {"g", 1073741824.0}, {"gb", 1073741824.0}, {"gib", 1073741824.0}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) return std::nullopt;
  double bytes = value * it->second;
  if (bytes < 0 || bytes > 1e15 || bytes != std::floor(bytes)) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

namespace {

// The graph attribute mtu, or the default.
int mtu_of(const TopologySpec& spec) {
  if (std::string mtu = attr(spec.graph_attrs, "mtu"); !mtu.empty()) {
    int value = 0;
    auto [ptr, ec] = std::from_chars(mtu.data(), mtu.data() + mtu.size(), value);
    if (ec != std::errc() || ptr != mtu.data() + mtu.size() || value < 256 || value > 9216)
      fail(spec, "graph attribute mtu=\"" + mtu + "\" is not an MTU between 256 and 9216 bytes");
    return value;
  }
  return kDefaultMtu;
}

// A node: a machine when it has a mac, else a switch.
Node node_of(const TopologySpec& spec, const TopologySpec::NodeSpec& ns) {
  Node n;
  n.name = ns.name;
  std::string mac = attr(ns.attrs, "mac");
  if (!mac.empty()) {
    n.kind = NodeKind::kMachine;
    auto parsed = Mac::parse(mac);
    if (!parsed) fail(spec, "machine '" + ns.name + "': mac=\"" + mac + "\" is not a MAC address like 02:00:00:00:00:01");
    if (parsed->is_multicast() || parsed->is_zero())
      fail(spec, "machine '" + ns.name + "': mac=\"" + mac + "\" is not a unicast address (first octet must be even, not all zero)");
    n.mac = *parsed;
  } else {
    n.kind = NodeKind::kSwitch;
    if (std::string buffer = attr(ns.attrs, "buffer"); !buffer.empty()) {
      auto bytes = parse_bytes(buffer);
      if (!bytes || *bytes == 0) fail(spec, "switch '" + ns.name + "': buffer=\"" + buffer + "\" is not a byte count like 65536 or 64K");
      n.buffer_bytes = *bytes;
    }
  }
  return n;
}

// A machine whose mac was forgotten parses as a switch, and the error
// used to be only "has 1 machine(s)". Such a node is named, with a free mac to give it.
std::string no_mac(const std::vector<Node>& nodes, const std::string& name) {
  std::set<Mac> used;
  for (const Node& n : nodes)
    if (n.kind == NodeKind::kMachine) used.insert(n.mac);
  Mac free;  // a suggestion: the first 02:00:00:00:xx:xx that no machine uses
  for (std::uint32_t k = 1; k < 0x10000; ++k) {
    free.bytes = {0x02, 0, 0, 0, static_cast<std::uint8_t>(k >> 8), static_cast<std::uint8_t>(k)};
    if (used.count(free) == 0) break;
  }
  return "machine '" + name + "' has no mac attribute; give it mac=\"" + free.str() + "\" (a node without mac is a switch)";
}

// A leaf without mac hanging off a switch connects nothing as a switch: most likely the
// machine that lacks its mac. (Random trees do have leaf switches, so this is only a hint.)
std::string missing_mac_hint(const TopologySpec& spec, const std::vector<Node>& nodes, const std::unordered_map<std::string, int>& by_name) {
  std::vector<int> degree(nodes.size(), 0), neighbour(nodes.size(), -1);
  for (const auto& es : spec.edges) {
    auto ia = by_name.find(es.a), ib = by_name.find(es.b);
    if (ia == by_name.end() || ib == by_name.end()) continue;  // reported with the links
    ++degree[static_cast<std::size_t>(ia->second)];
    ++degree[static_cast<std::size_t>(ib->second)];
    neighbour[static_cast<std::size_t>(ia->second)] = ib->second;
    neighbour[static_cast<std::size_t>(ib->second)] = ia->second;
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const int nb = neighbour[i];
    if (nodes[i].kind == NodeKind::kSwitch && degree[i] == 1 && nodes[static_cast<std::size_t>(nb)].kind == NodeKind::kSwitch &&
        degree[static_cast<std::size_t>(nb)] >= 2)
      return ": " + no_mac(nodes, nodes[i].name);
  }
  return "";
}

// Ranks only on machines, at least 2 machines and no more than the wire's 16-bit ranks allow.
void check_machines(const TopologySpec& spec, const std::vector<Node>& nodes, const std::unordered_map<std::string, int>& by_name) {
  for (const auto& ns : spec.nodes)
    if (attr(ns.attrs, "mac").empty() && !attr(ns.attrs, "rank").empty()) fail(spec, no_mac(nodes, ns.name) + ", and only machines have ranks");
  const auto machines = static_cast<std::size_t>(std::count_if(nodes.begin(), nodes.end(), [](const Node& n) { return n.kind == NodeKind::kMachine; }));
  if (machines > kMaxMachines)
    fail(spec, "has " + std::to_string(machines) + " machines; the wire's 16-bit rank fields allow at most " + std::to_string(kMaxMachines));
  if (machines < 2)
    fail(spec, "has " + std::to_string(machines) + " machine(s); an exchange needs at least 2 (a machine is a node with a mac attribute)" +
                   missing_mac_hint(spec, nodes, by_name));
}

// Ranks: order of declaration unless every machine has a rank attribute. `ranks` gets the
// node of every rank.
void assign_ranks(const TopologySpec& spec, std::vector<Node>& nodes, std::vector<int>& ranks) {
  std::vector<int> machines;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].kind == NodeKind::kMachine) machines.push_back(static_cast<int>(i));
  std::size_t with_rank = 0;
  for (int id : machines)
    if (!attr(spec.nodes[static_cast<std::size_t>(id)].attrs, "rank").empty()) ++with_rank;
  ranks.assign(machines.size(), -1);
  if (with_rank == 0) {
    for (std::size_t r = 0; r < machines.size(); ++r) {
      ranks[r] = machines[r];
      nodes[static_cast<std::size_t>(machines[r])].rank = static_cast<Rank>(r);
    }
  } else {
    for (int id : machines) {
      const auto& ns = spec.nodes[static_cast<std::size_t>(id)];
      std::string rank = attr(ns.attrs, "rank");
      if (rank.empty())
        fail(spec, "machine '" + ns.name + "' has no rank while other machines do; give every machine a rank or none");
      int value = -1;
      auto [ptr, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), value);
      if (ec != std::errc() || ptr != rank.data() + rank.size() || value < 0 || value >= static_cast<int>(machines.size()))
        fail(spec, "machine '" + ns.name + "': rank=\"" + rank + "\" is not a rank between 0 and " + std::to_string(machines.size() - 1));
      auto& slot = ranks[static_cast<std::size_t>(value)];
      if (slot != -1)
        fail(spec, "machines '" + nodes[static_cast<std::size_t>(slot)].name + "' and '" + ns.name + "' have the same rank " + rank);
      slot = id;
      nodes[static_cast<std::size_t>(id)].rank = value;
    }
  }
}

void check_macs(const TopologySpec& spec, const std::vector<Node>& nodes, const std::vector<int>& ranks) {
  std::map<Mac, int> macs;
  for (int id : ranks) {
    const Node& n = nodes[static_cast<std::size_t>(id)];
    auto [it, inserted] = macs.emplace(n.mac, id);
    if (!inserted)
      fail(spec, "machines '" + nodes[static_cast<std::size_t>(it->second)].name + "' and '" + n.name + "' have the same mac " + n.mac.str());
  }
}

// Links; a union-find names the edge that closes a cycle, and a node left unconnected.
void add_links(const TopologySpec& spec, const std::unordered_map<std::string, int>& by_name, std::vector<Node>& nodes, std::vector<Link>& links,
               const std::vector<int>& ranks) {
  std::vector<int> uf(nodes.size());
  std::iota(uf.begin(), uf.end(), 0);
  auto find = [&](int x) {
    while (uf[static_cast<std::size_t>(x)] != x) x = uf[static_cast<std::size_t>(x)] = uf[static_cast<std::size_t>(uf[static_cast<std::size_t>(x)])];
    return x;
  };
  for (const auto& es : spec.edges) {
    std::string label = "edge " + es.a + " -- " + es.b;
    auto ia = by_name.find(es.a), ib = by_name.find(es.b);
    if (ia == by_name.end() || ib == by_name.end()) fail(spec, label + " names a node that is not declared");
    Link link{ia->second, ib->second, kDefaultRateBps};
    if (std::string rate = attr(es.attrs, "rate"); !rate.empty()) {
      auto bps = parse_rate(rate);
      if (!bps) fail(spec, label + ": rate=\"" + rate + "\" is not a link rate like 100Mbit, 1Gbit or 10Gbit");
      link.rate_bps = *bps;
    }
    if (link.a == link.b) fail(spec, label + " links a node to itself; the graph must be a tree");
    int ra = find(link.a), rb = find(link.b);
    if (ra == rb)
      fail(spec, label + " closes a cycle; switched Ethernet forwards on a spanning tree, so the graph must be a tree (remove the redundant link)");
    uf[static_cast<std::size_t>(ra)] = rb;
    int index = static_cast<int>(links.size());
    nodes[static_cast<std::size_t>(link.a)].links.push_back(index);
    nodes[static_cast<std::size_t>(link.b)].links.push_back(index);
    links.push_back(link);
  }
  for (int id : ranks) {
    const Node& n = nodes[static_cast<std::size_t>(id)];
    if (n.links.size() > 1)
      fail(spec, "machine '" + n.name + "' has " + std::to_string(n.links.size()) + " links; a machine must be a leaf with exactly one link");
  }
  int root = find(ranks[0]);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (find(static_cast<int>(i)) != root)
      fail(spec, "node '" + nodes[i].name + "' is not connected to '" + nodes[static_cast<std::size_t>(ranks[0])].name +
                     "'; the graph must be connected");
  }
}

}  // namespace

std::uint64_t smallest_switch_buffer(const Topology& topology) {
  std::uint64_t buffer = 0;
  for (const Node& node : topology.nodes())
    if (node.kind == NodeKind::kSwitch) buffer = buffer == 0 ? buffer_or_default(node) : std::min(buffer, buffer_or_default(node));
  return buffer;
}

Topology Topology::from_spec(const TopologySpec& spec) {
  if (spec.directed) fail(spec, "the topology must be an undirected 'graph' (links are full duplex), not a 'digraph'");
  Topology t;
  t.source_ = spec.source;
  t.name_ = attr(spec.graph_attrs, "name");
  t.mtu_ = mtu_of(spec);
  std::unordered_map<std::string, int> by_name;
  for (const auto& ns : spec.nodes) {
    if (by_name.count(ns.name) != 0) fail(spec, "node '" + ns.name + "' is declared twice");
    by_name.emplace(ns.name, static_cast<int>(t.nodes_.size()));
    t.nodes_.push_back(node_of(spec, ns));
  }
  check_machines(spec, t.nodes_, by_name);
  assign_ranks(spec, t.nodes_, t.machines_);
  check_macs(spec, t.nodes_, t.machines_);
  add_links(spec, by_name, t.nodes_, t.links_, t.machines_);
  t.build_index();
  return t;
}

void Topology::build_index() {
  std::size_t n = nodes_.size();
  parent_.assign(n, -1);
  parent_link_.assign(n, -1);
  depth_.assign(n, 0);
  order_.clear();
  order_.reserve(n);
  std::vector<int> stack{0};
  std::vector<bool> seen(n, false);
  seen[0] = true;
  while (!stack.empty()) {
    int u = stack.back();
    stack.pop_back();
    order_.push_back(u);
    for (int l : nodes_[static_cast<std::size_t>(u)].links) {
      int v = links_[static_cast<std::size_t>(l)].other(u);
      if (seen[static_cast<std::size_t>(v)]) continue;
      seen[static_cast<std::size_t>(v)] = true;
      parent_[static_cast<std::size_t>(v)] = u;
      parent_link_[static_cast<std::size_t>(v)] = l;
      depth_[static_cast<std::size_t>(v)] = depth_[static_cast<std::size_t>(u)] + 1;
      stack.push_back(v);
    }
  }
}

std::optional<Rank> Topology::rank_of_mac(const Mac& mac) const {
  for (std::size_t r = 0; r < machines_.size(); ++r)
    if (nodes_[static_cast<std::size_t>(machines_[r])].mac == mac) return static_cast<Rank>(r);
  return std::nullopt;
}

std::optional<int> Topology::find_node(std::string_view name) const {
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].name == name) return static_cast<int>(i);
  return std::nullopt;
}

int Topology::switch_of(Rank r) const {
  const Node& n = machine(r);
  if (n.links.empty()) return -1;
  int other = links_[static_cast<std::size_t>(n.links[0])].other(machine_node(r));
  return nodes_[static_cast<std::size_t>(other)].kind == NodeKind::kSwitch ? other : -1;
}

bool Topology::single_switch() const {
  int s = switch_of(0);
  if (s < 0) return false;
  for (Rank r = 1; r < machine_count(); ++r)
    if (switch_of(r) != s) return false;
  return true;
}

int Topology::edge_from(int edge) const {
  const Link& l = links_[static_cast<std::size_t>(edge / 2)];
  return edge % 2 == 0 ? l.a : l.b;
}

int Topology::edge_to(int edge) const {
  const Link& l = links_[static_cast<std::size_t>(edge / 2)];
  return edge % 2 == 0 ? l.b : l.a;
}

std::string Topology::edge_name(int edge) const {
  return node(edge_from(edge)).name + "->" + node(edge_to(edge)).name;
}

void Topology::path(int u, int v, std::vector<int>& out) const {
  // Climb from both ends to the common ancestor: edges up from u go straight into `out`,
  // edges down to v are collected bottom-up and appended reversed.
  out.clear();
  std::vector<int>& up = out;
  thread_local std::vector<int> down;
  down.clear();
  while (depth_[static_cast<std::size_t>(u)] > depth_[static_cast<std::size_t>(v)]) {
    up.push_back(edge_id(parent_link_[static_cast<std::size_t>(u)], u));
    u = parent_[static_cast<std::size_t>(u)];
  }
  while (depth_[static_cast<std::size_t>(v)] > depth_[static_cast<std::size_t>(u)]) {
    down.push_back(edge_id(parent_link_[static_cast<std::size_t>(v)], parent_[static_cast<std::size_t>(v)]));
    v = parent_[static_cast<std::size_t>(v)];
  }
  while (u != v) {
    up.push_back(edge_id(parent_link_[static_cast<std::size_t>(u)], u));
    u = parent_[static_cast<std::size_t>(u)];
    down.push_back(edge_id(parent_link_[static_cast<std::size_t>(v)], parent_[static_cast<std::size_t>(v)]));
    v = parent_[static_cast<std::size_t>(v)];
  }
  out.insert(out.end(), down.rbegin(), down.rend());
}

std::vector<int> Topology::path(int u, int v) const {
  std::vector<int> out;
  path(u, v, out);
  return out;
}

bool one_rate(const Topology& topology) {
  const auto& links = topology.links();
  return std::all_of(links.begin(), links.end(), [&](const Link& l) { return l.rate_bps == links.front().rate_bps; });
}

std::vector<std::uint64_t> Topology::slowest_from(Rank src) const {
  // Depth-first from src's machine: a node's slowest is the lesser of its parent's (in this
  // walk) and the link between them.
  std::vector<std::uint64_t> at(nodes_.size(), 0), out(machines_.size(), 0);
  std::vector<int> stack{machine_node(src)};
  const Node& me = machine(src);
  at[static_cast<std::size_t>(stack.back())] = me.links.empty() ? 0 : links_[static_cast<std::size_t>(me.links.front())].rate_bps;
  std::vector<bool> seen(nodes_.size(), false);
  seen[static_cast<std::size_t>(stack.back())] = true;
  while (!stack.empty()) {
    const int u = stack.back();
    stack.pop_back();
    if (nodes_[static_cast<std::size_t>(u)].kind == NodeKind::kMachine) out[static_cast<std::size_t>(nodes_[static_cast<std::size_t>(u)].rank)] = at[static_cast<std::size_t>(u)];
    for (int l : nodes_[static_cast<std::size_t>(u)].links) {
      const Link& link = links_[static_cast<std::size_t>(l)];
      const int v = link.other(u);
      if (seen[static_cast<std::size_t>(v)]) continue;
      seen[static_cast<std::size_t>(v)] = true;
      at[static_cast<std::size_t>(v)] = std::min(at[static_cast<std::size_t>(u)], link.rate_bps);
      stack.push_back(v);
    }
  }
  return out;
}

Topology sub_topology(const Topology& topology, const std::vector<Rank>& members) {
  const std::string where = topology.source() + ", group of " + std::to_string(members.size()) + " machines: ";
  if (members.size() < 2) throw TopologyError(where + "a group needs at least 2 machines");
  std::vector<bool> kept_link(topology.links().size(), false), kept_node(topology.nodes().size(), false), member(static_cast<std::size_t>(topology.machine_count()), false);
  for (Rank r : members) {
    if (r < 0 || r >= topology.machine_count()) throw TopologyError(where + "rank " + std::to_string(r) + " is not a machine of the topology");
    if (member[static_cast<std::size_t>(r)]) throw TopologyError(where + "rank " + std::to_string(r) + " is named twice");
    member[static_cast<std::size_t>(r)] = true;
    for (int edge : topology.path_between(members.front(), r)) kept_link[static_cast<std::size_t>(edge / 2)] = true;
  }
  TopologySpec spec;
  spec.source = topology.source() + " (group)";
  spec.graph_attrs = {{"mtu", std::to_string(topology.mtu())}, {"name", topology.name()}};
  for (std::size_t l = 0; l < kept_link.size(); ++l) {
    if (!kept_link[l]) continue;
    const Link& link = topology.links()[l];
    kept_node[static_cast<std::size_t>(link.a)] = kept_node[static_cast<std::size_t>(link.b)] = true;
    spec.edges.push_back({topology.node(link.a).name, topology.node(link.b).name, {{"rate", format_rate(link.rate_bps)}}});
  }
  for (std::size_t i = 0; i < members.size(); ++i) {
    const Node& m = topology.machine(members[i]);
    spec.nodes.push_back({m.name, {{"mac", m.mac.str()}, {"rank", std::to_string(i)}}});
  }
  for (std::size_t id = 0; id < topology.nodes().size(); ++id) {
    const Node& n = topology.nodes()[id];
    if (!kept_node[id] || n.kind != NodeKind::kSwitch) continue;
    spec.nodes.push_back({n.name, {}});
    if (n.buffer_bytes != 0) spec.nodes.back().attrs["buffer"] = std::to_string(n.buffer_bytes);
  }
  return Topology::from_spec(spec);
}

}  // namespace aapc::sched
