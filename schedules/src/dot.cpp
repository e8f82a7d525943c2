#include "aapc/sched/dot.hpp"

#include <graphviz/cgraph.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace aapc::sched {
namespace {

// cgraph reports syntax errors through a global callback; collect them per parse.
std::string g_cgraph_errors;  // guarded by g_cgraph_mutex
std::mutex g_cgraph_mutex;

int collect_error(char* message) {
  g_cgraph_errors += message;
  return 0;
}

std::map<std::string, std::string> attributes(Agraph_t* g, int kind, void* object) {
  std::map<std::string, std::string> out;
  for (Agsym_t* sym = agnxtattr(g, kind, nullptr); sym != nullptr; sym = agnxtattr(g, kind, sym)) {
    const char* value = agxget(object, sym);
    if (value != nullptr && value[0] != '\0') out.emplace(sym->name, value);
  }
  return out;
}

std::string strip(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

TopologySpec read_dot(std::string_view text, const std::string& source) {
  std::lock_guard<std::mutex> lock(g_cgraph_mutex);
  g_cgraph_errors.clear();
  agusererrf previous = agseterrf(collect_error);
  agseterr(AGERR);
  std::string buffer(text);
  Agraph_t* g = agmemread(buffer.c_str());
  agseterrf(previous);
  if (g == nullptr) {
    std::string why = strip(g_cgraph_errors);
    throw TopologyError(source + ": not a valid DOT graph" + (why.empty() ? std::string() : ": " + why));
  }
  TopologySpec spec;
  spec.source = source;
  spec.directed = agisdirected(g) != 0;
  spec.graph_attrs = attributes(g, AGRAPH, g);
  if (const char* name = agnameof(g); name != nullptr && spec.graph_attrs.count("name") == 0) spec.graph_attrs["name"] = name;
  for (Agnode_t* n = agfstnode(g); n != nullptr; n = agnxtnode(g, n))
    spec.nodes.push_back({agnameof(n), attributes(g, AGNODE, n)});
  for (Agnode_t* n = agfstnode(g); n != nullptr; n = agnxtnode(g, n))
    for (Agedge_t* e = agfstout(g, n); e != nullptr; e = agnxtout(g, e))
      spec.edges.push_back({agnameof(agtail(e)), agnameof(aghead(e)), attributes(g, AGEDGE, e)});
  agclose(g);
  return spec;
}

std::string topologies_dir() {
  // Explicit choice, then the installed copy, then the source tree (running from a build).
  if (const char* env = std::getenv("AAPC_TOPOLOGIES"); env != nullptr && env[0] != '\0') return env;
  if (std::filesystem::is_directory(AAPC_INSTALLED_TOPOLOGIES_DIR)) return AAPC_INSTALLED_TOPOLOGIES_DIR;
  return AAPC_SOURCE_TOPOLOGIES_DIR;
}

Topology load_topology(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file(path);
  if (!fs::exists(file)) {
    fs::path shipped = fs::path(topologies_dir()) / path;
    if (shipped.extension() != ".dot") shipped += ".dot";
    if (path.find('/') == std::string::npos && fs::exists(shipped)) {
      file = shipped;
    } else {
      throw TopologyError(path + ": no such file (nor a shipped topology of that name in " + topologies_dir() +
                          "; `aapc-sched list` shows them)");
    }
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw TopologyError(file.string() + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return Topology::from_spec(read_dot(text.str(), file.string()));
}

std::string to_dot(const Topology& t, std::optional<std::uint64_t> rate) {
  std::ostringstream out;
  out << "graph \"" << (t.name().empty() ? "cluster" : t.name()) << "\" {\n";
  if (t.mtu() != kDefaultMtu) out << "  mtu=" << t.mtu() << ";\n";
  for (Rank r = 0; r < t.machine_count(); ++r) {
    const Node& n = t.machine(r);
    out << "  \"" << n.name << "\" [mac=\"" << n.mac.str() << "\"];\n";
  }
  for (const Node& n : t.nodes()) {
    if (n.kind != NodeKind::kSwitch) continue;
    out << "  \"" << n.name << "\"";
    if (n.buffer_bytes != 0) out << " [buffer=" << n.buffer_bytes << "]";
    out << ";\n";
  }
  for (const Link& l : t.links()) {
    out << "  \"" << t.node(l.a).name << "\" -- \"" << t.node(l.b).name << "\"";
    const std::uint64_t bps = rate.value_or(l.rate_bps);
    if (bps != kDefaultRateBps) out << " [rate=\"" << format_rate(bps) << "\"]";
    out << ";\n";
  }
  out << "}\n";
  return out.str();
}

}  // namespace aapc::sched
