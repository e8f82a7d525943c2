// aapc-sched: inspect topologies and the schedules of the papers.
//
//   aapc-sched info TOPO
//   aapc-sched show TOPO --algo ALGO [--sync SYNC] [--format text|json]
//   aapc-sched verify TOPO --algo ALGO [--sync SYNC]
//   aapc-sched list
//   aapc-sched algorithms [--markdown]
//   aapc-sched predict TOPO [--size 64K] [--rate R] [--algo ALGO] [--sync SYNC] [hand-over terms] [--json]
//   aapc-sched generate --machines N --switches S [--shape random|chain|star|one|two-level] [--seed X]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/dot.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/predict.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/tree.hpp"
#include "aapc/sched/verify.hpp"

using namespace aapc::sched;
using Json = nlohmann::ordered_json;

namespace {

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string link_name(const Topology& t, int link) {
  const Link& l = t.links()[static_cast<std::size_t>(link)];
  return t.node(l.a).name + "--" + t.node(l.b).name;
}

std::string mbps(double bps) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << bps / 1e6 << " Mbit/s";
  return out.str();
}

int cmd_info(const std::string& path) {
  Topology t = load_topology(path);
  TreeModel model(t);
  std::cout << "topology    " << t.source() << (t.name().empty() ? "" : " (" + t.name() + ")") << "\n";
  std::cout << "machines    " << t.machine_count() << "\n";
  std::cout << "switches    " << t.switch_count() << "\n";
  std::cout << "mtu         " << t.mtu() << "\n";
  std::cout << "root        " << (model.root() >= 0 ? t.node(model.root()).name : "(none: two machines on one cable)") << "\n";
  std::cout << "subtrees    ";
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < model.subtrees().size(); ++i) {
    const Subtree& st = model.subtrees()[i];
    std::vector<std::string> names;
    for (Rank r : st.machines) names.push_back(t.machine(r).name);
    parts.push_back("T" + std::to_string(i) + " via " + t.node(st.attach).name + ": " + std::to_string(st.machines.size()) + " {" +
                    join(names, ",") + "}");
  }
  std::cout << join(parts, "\n            ") << "\n";
  std::vector<std::string> bottlenecks;
  for (int l : model.bottleneck_links()) bottlenecks.push_back(link_name(t, l));
  std::cout << "bottlenecks " << join(bottlenecks, " ") << "\n";
  std::cout << "load        " << model.load() << " (phases of a contention-free schedule)\n";
  std::cout << "peak        " << mbps(model.peak_aggregate_bps()) << " aggregate = |M|(|M|-1)B/(|Mu||Mv|) on " << link_name(t, model.limiting_link())
            << " at " << format_rate(t.links()[static_cast<std::size_t>(model.limiting_link())].rate_bps) << "\n";
  if (!model.uniform_rates()) {  // what `auto` weighs where links differ in rate (choice.cpp)
    std::cout << "phases      the contention-free phases reach " << std::fixed << std::setprecision(1) << 100 * model.phase_efficiency()
              << "% of the limit at most (links differ in rate)\n";
    std::cout << "queue       " << std::setprecision(1) << model.unpaced_queue_blocks()
              << " blocks in the fullest switch port, estimated, where every machine sends without tokens\n";
  }
  return 0;
}

// The registry (aapc/sched/algorithms.def), one algorithm a line, or as docs/guide.md's table.
int cmd_algorithms(bool markdown) {
  if (markdown) {
    std::cout << algorithms_markdown();
    return 0;
  }
  std::size_t width = 0;
  for (const AlgorithmInfo& info : algorithms()) width = std::max(width, info.usage().size());
  for (const AlgorithmInfo& info : algorithms()) {
    const std::string usage = info.usage();
    std::cout << usage << std::string(width + 2 - usage.size(), ' ') << info.description;
    if (!info.param.empty()) std::cout << " (" << info.param << " = " << info.param_default << " by default)";
    if (info.input == AlgorithmInput::kPattern) std::cout << "; alltoallv only";
    std::cout << "\n";
  }
  return 0;
}

AlgorithmSpec algorithm_option(const std::string& algo) {
  auto spec = AlgorithmSpec::parse(algo);
  if (!spec) throw CLI::ValidationError("--algo", "unknown algorithm '" + algo + "'; one of: " + algorithm_usages(AlgorithmInput::kDense));
  return *spec;
}

SyncSpec sync_option(const std::string& sync) {
  auto spec = SyncSpec::parse(sync);
  if (!spec) throw CLI::ValidationError("--sync", "unknown sync variant '" + sync + "'; one of: " + join(SyncSpec::names(), ", "));
  return *spec;
}

Schedule build(const Topology& t, const std::string& algo, const std::string& sync) {
  return plan_sync(t, make_schedule(t, algorithm_option(algo)), sync_option(sync));
}

// The phase table laid out like the papers' Table 4: for the tree algorithm, global messages
// grouped by the sending subtree and local messages by subtree.
void print_phase_table(const Topology& t, const Schedule& s) {
  TreeModel model(t);
  const bool grouped = algorithm_of(s.algorithm) == Algorithm::kTree;
  const std::size_t k = model.subtrees().size();
  std::vector<std::string> header{"phase"};
  if (grouped) {
    for (std::size_t i = 0; i < k; ++i) header.push_back("T" + std::to_string(i) + " ->");
    for (std::size_t i = 0; i < k; ++i) header.push_back("T" + std::to_string(i) + " local");
  } else {
    header.push_back(s.packet_level ? "messages (packet slot)" : "messages");
  }
  std::vector<std::vector<std::string>> rows;
  for (std::size_t p = 0; p < s.phases.size(); ++p) {
    std::vector<std::string> row{std::to_string(p)};
    if (grouped) {
      std::vector<std::vector<std::string>> cells(2 * k);
      for (const Message& m : s.phases[p]) {
        auto si = static_cast<std::size_t>(model.subtree_of(m.src)), di = static_cast<std::size_t>(model.subtree_of(m.dst));
        cells[si == di ? k + si : si].push_back(t.machine(m.src).name + "->" + t.machine(m.dst).name);
      }
      for (auto& c : cells) row.push_back(join(c, " "));
    } else {
      std::vector<std::string> msgs;
      for (const Message& m : s.phases[p]) msgs.push_back(t.machine(m.src).name + "->" + t.machine(m.dst).name);
      row.push_back(join(msgs, " "));
    }
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) {
    width[c] = header[c].size();
    for (const auto& row : rows) width[c] = std::max(width[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) line += (c ? "  " : "") + row[c] + std::string(width[c] - row[c].size(), ' ');
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << "\n";
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
}

std::string sync_ref(const Topology& t, const Sync& sy, bool incoming) {
  Rank peer = incoming ? sy.from : sy.to;
  std::string who = sy.from == sy.to ? "self" : t.machine(peer).name;
  return "#" + std::to_string(sy.id) + (incoming ? "<" : ">") + who;
}

void print_programs(const Topology& t, const Schedule& s) {
  std::cout << "\nprograms (round: destinations [phase], at R each where a slower link caps the blocks; wait #id<from; emit #id>to after "
               "the sends; on receipt from X emit):\n";
  for (const Program& prog : s.programs) {
    std::cout << t.machine(prog.rank).name << ":\n";
    for (std::size_t r = 0; r < prog.rounds.size(); ++r) {
      const Round& round = prog.rounds[r];
      std::vector<std::string> sends, waits, emits;
      for (const Send& send : round.sends) sends.push_back(t.machine(send.dst).name + "[" + std::to_string(send.phase) + "]");
      for (auto id : round.waits) waits.push_back(sync_ref(t, s.syncs[id], true));
      for (auto id : round.emits) emits.push_back(sync_ref(t, s.syncs[id], false));
      std::cout << "  " << std::setw(3) << r << ": " << (sends.empty() ? std::string("(sync)") : join(sends, " ")) << (round.dummy ? " dummy" : "");
      if (round.rate_bps > 0) std::cout << " at " << format_rate(round.rate_bps) << " each";
      if (!waits.empty()) std::cout << "  wait " << join(waits, " ");
      if (!emits.empty()) std::cout << "  emit " << join(emits, " ");
      std::cout << "\n";
    }
    for (const auto& [src, ids] : prog.on_receive) {
      std::vector<std::string> emits;
      for (auto id : ids) emits.push_back(sync_ref(t, s.syncs[id], false));
      std::cout << "  on receipt from " << t.machine(src).name << ": emit " << join(emits, " ") << "\n";
    }
  }
}

// A combining schedule's steps: what each message gathers (Bruck's index algorithm, the
// hypercube of Sur/Jin/Panda), the blocks named origin->dest.
void print_combine(const Topology& t, const Schedule& s) {
  std::cout << "\nsteps (to: the blocks of the message, origin->dest; a step starts once the previous step's message is here):\n";
  for (Rank i = 0; i < s.machines; ++i) {
    std::cout << t.machine(i).name << ":\n";
    const auto& steps = s.combine[static_cast<std::size_t>(i)];
    for (std::size_t k = 0; k < steps.size(); ++k) {
      std::vector<std::string> pieces;
      for (const CombinePiece& piece : steps[k].send) pieces.push_back(t.machine(piece.origin).name + "->" + t.machine(piece.dest).name);
      std::cout << "  " << std::setw(3) << k << ": to " << t.machine(steps[k].to).name << " " << pieces.size() << " blocks: " << join(pieces, " ")
                << "\n";
    }
  }
}

// One node's steps of a combining schedule, as `show --format json` lists them.
Json combine_node_json(const Topology& t, const Schedule& s, Rank i) {
  Json steps = Json::array();
  for (const CombineStep& step : s.combine[static_cast<std::size_t>(i)]) {
    Json pieces = Json::array();
    for (const CombinePiece& piece : step.send) pieces.push_back(Json::array({t.machine(piece.origin).name, t.machine(piece.dest).name}));
    steps.push_back({{"to", t.machine(step.to).name}, {"from", t.machine(step.from).name}, {"send", pieces}});
  }
  return {{"machine", t.machine(i).name}, {"steps", steps}};
}

void print_sync_stats(const Schedule& s) {
  const SyncStats& st = s.sync_stats;
  std::cout << "\nsync " << s.sync.name() << ":\n";
  std::cout << "  contending message pairs to order (the dependence graph): " << st.contending_pairs << "\n";
  std::cout << "  consecutive users of a directed edge:                   " << st.consecutive_pairs << "\n";
  std::cout << "  after removing redundant synchronisations:              " << st.tokens << " tokens on the wire, " << st.local_waits
            << " local waits\n";
  if (st.barriers > 0) std::cout << "  barriers: " << st.barriers << " (" << st.barrier_tokens << " of the tokens)\n";
  if (st.dummy_messages > 0) std::cout << "  dummy messages: " << st.dummy_messages << "\n";
}

// Writes one JSON object member by member, each element of a large array as nlohmann's dump(2)
// would write it inside the whole document: the bytes are those of the document, but only one
// phase or program is ever held (a plan of 1,024 machines is hundreds of megabytes of JSON).
class JsonStream {
 public:
  explicit JsonStream(std::ostream& out) : out_(out) { out_ << "{"; }
  void field(const std::string& key, const Json& value) {
    open(key);
    put(value, 1);
  }
  template <typename Each>
  void array(const std::string& key, std::size_t count, Each each) {
    open(key);
    if (count == 0) {
      out_ << "[]";
      return;
    }
    out_ << "[";
    for (std::size_t i = 0; i < count; ++i) {
      out_ << (i > 0 ? "," : "") << "\n    ";
      put(each(i), 2);
    }
    out_ << "\n  ]";
  }
  void close() { out_ << "\n}\n"; }

 private:
  void open(const std::string& key) {
    out_ << (first_ ? "" : ",") << "\n  " << Json(key).dump() << ": ";
    first_ = false;
  }
  // A string's own line breaks are escaped in JSON: every raw one is the layout's.
  void put(const Json& value, int depth) {
    const std::string pad(static_cast<std::size_t>(2 * depth), ' ');
    const std::string text = value.dump(2);
    std::size_t from = 0;
    for (std::size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', from)) {
      out_.write(text.data() + from, static_cast<std::streamsize>(nl + 1 - from));
      out_ << pad;
      from = nl + 1;
    }
    out_.write(text.data() + from, static_cast<std::streamsize>(text.size() - from));
  }

  std::ostream& out_;
  bool first_ = true;
};

Json program_json(const Topology& t, const Program& prog) {
  Json rounds = Json::array();
  for (const Round& round : prog.rounds) {
    Json sends = Json::array();
    for (const Send& send : round.sends) sends.push_back(Json::array({t.machine(send.dst).name, send.phase}));
    rounds.push_back({{"sends", sends}, {"dummy", round.dummy}, {"waits", round.waits}, {"emits", round.emits}});
    if (round.rate_bps > 0) rounds.back()["rate_bps"] = round.rate_bps;
  }
  Json on_receive = Json::object();
  for (const auto& [src, ids] : prog.on_receive) on_receive[t.machine(src).name] = ids;
  return {{"machine", t.machine(prog.rank).name}, {"rounds", rounds}, {"on_receive", on_receive}};
}

Json sync_json(const Topology& t, const Sync& sy) {
  Json x = {{"id", sy.id}, {"from", t.machine(sy.from).name}, {"to", t.machine(sy.to).name}, {"to_round", sy.to_round}};
  if (sy.trigger == SyncTrigger::kAfterSend) {
    x["after_send_round"] = sy.from_round;
  } else {
    x["after_receive_from"] = t.machine(sy.after_src).name;
  }
  return x;
}

// The plan as JSON on `out`, streamed (JsonStream).
void stream_schedule_json(std::ostream& out, const Topology& t, const Schedule& s, std::int64_t load) {
  const auto count = [](const auto& v) { return v.size(); };
  JsonStream j(out);
  j.field("algorithm", s.algorithm);
  j.array("machines", static_cast<std::size_t>(t.machine_count()), [&](std::size_t r) { return Json(t.machine(static_cast<Rank>(r)).name); });
  j.field("load", load);
  j.array("phases", count(s.phases), [&](std::size_t p) {
    Json ph = Json::array();
    for (const Message& m : s.phases[p]) ph.push_back(Json::array({t.machine(m.src).name, t.machine(m.dst).name}));
    return ph;
  });
  j.field("packet_level", s.packet_level);
  j.field("contention_free", s.contention_free);
  if (s.block_rate_bps > 0) j.field("block_rate_bps", s.block_rate_bps);  // paced schedules only: the others' JSON is unchanged
  j.field("sync", s.sync.name());
  if (s.combining()) j.array("combine", static_cast<std::size_t>(s.machines), [&](std::size_t i) { return combine_node_json(t, s, static_cast<Rank>(i)); });
  if (s.sync.kind != SyncKind::kNone) {
    const SyncStats& st = s.sync_stats;
    j.field("sync_stats", {{"contending_pairs", st.contending_pairs}, {"consecutive_pairs", st.consecutive_pairs}, {"tokens", st.tokens},
                           {"local_waits", st.local_waits},           {"barriers", st.barriers},                   {"barrier_tokens", st.barrier_tokens},
                           {"dummy_messages", st.dummy_messages}});
    j.array("programs", count(s.programs), [&](std::size_t i) { return program_json(t, s.programs[i]); });
    j.array("syncs", count(s.syncs), [&](std::size_t i) { return sync_json(t, s.syncs[i]); });
  }
  j.close();
}

int cmd_show(const std::string& path, const std::string& algo, const std::string& sync, const std::string& format, bool programs) {
  Topology t = load_topology(path);
  Schedule s = build(t, algo, sync);
  TreeModel model(t);
  if (format == "json") {
    stream_schedule_json(std::cout, t, s, model.load());
    return 0;
  }
  std::cout << s.algorithm << " on " << t.source() << ": " << t.machine_count() << " machines, " << s.phases.size()
            << (s.packet_level ? " packet slots" : s.combining() ? " combining steps" : " phases") << ", load " << model.load()
            << (s.block_rate_bps > 0 ? ", every block paced at " + std::to_string(s.block_rate_bps / 1000) + " kbit/s" : std::string()) << "\n\n";
  print_phase_table(t, s);
  if (s.combining()) print_combine(t, s);
  if (s.sync.kind != SyncKind::kNone) print_sync_stats(s);
  if (programs || s.sync.kind != SyncKind::kNone) print_programs(t, s);
  return 0;
}

int cmd_verify(const std::string& path, const std::string& algo, const std::string& sync) {
  Topology t = load_topology(path);
  Schedule s = build(t, algo, sync);
  VerifyReport report = verify(t, s);
  std::cout << s.algorithm << (s.sync.kind != SyncKind::kNone ? " + " + s.sync.name() : "") << " on " << t.source() << ": "
            << report.summary() << "\n";
  if (!report.ok()) {
    for (const auto& e : report.errors) std::cerr << "  " << e << "\n";
    if (report.error_count > static_cast<std::int64_t>(report.errors.size()))
      std::cerr << "  ... and " << report.error_count - static_cast<std::int64_t>(report.errors.size()) << " more\n";
    return 1;
  }
  return 0;
}

int cmd_list() {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(topologies_dir()))
    if (entry.path().extension() == ".dot") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::cout << "shipped topologies in " << topologies_dir() << ":\n";
  for (const auto& f : files) {
    Topology t = load_topology(f.string());
    TreeModel model(t);
    std::cout << "  " << std::left << std::setw(22) << f.stem().string() << std::right << std::setw(4) << t.machine_count() << " machines "
              << std::setw(3) << t.switch_count() << " switches  load " << std::setw(4) << model.load() << "  peak "
              << mbps(model.peak_aggregate_bps()) << "\n";
  }
  return 0;
}

int cmd_generate(int machines, int switches, const std::string& shape, std::uint64_t seed, const std::string& rate) {
  RandomTreeOptions o;
  o.machines = machines;
  o.switches = switches;
  static const std::map<std::string, TreeShape> kShapes = {
      {"random", TreeShape::kRandom}, {"chain", TreeShape::kChain}, {"star", TreeShape::kStar}, {"one", TreeShape::kOneSwitch}, {"two-level", TreeShape::kTwoLevel}};
  o.shape = kShapes.at(shape);
  auto bps = parse_rate(rate);
  if (!bps) throw CLI::ValidationError("--rate", "'" + rate + "' is not a rate like 100Mbit");
  o.rate_bps = *bps;
  std::mt19937_64 rng(seed);
  std::cout << to_dot(random_tree(o, rng));
  return 0;
}

// An alltoallv of Figure 7's pattern: its CGM plan against the dense schedule, and its bound.
int cmd_sparse(const std::string& path, int degree, std::uint64_t seed, const std::string& size, const std::string& rate) {
  const Topology t = load_topology(path);
  const auto block = parse_bytes(size);
  if (!block) throw CLI::ValidationError("--size", "'" + size + "' is not a size like 64K");
  std::uint64_t bps = 0;
  if (!rate.empty()) {
    const auto r = parse_rate(rate);
    if (!r) throw CLI::ValidationError("--rate", "'" + rate + "' is not a rate like 25Mbit");
    bps = *r;
  }
  std::mt19937_64 rng(seed);
  SparsePattern p = SparsePattern::figure7(t.machine_count(), std::min(degree, t.machine_count()), rng);
  for (int i = 0; i < p.n; ++i) std::erase(p.dsts[static_cast<std::size_t>(i)], i);  // copies, not messages (as the daemon sees it)
  const Schedule cgm = planned_sparse(t, p, "sparse");
  const TreeModel model(t);
  const Choice dense_choice = auto_choice(model, kAnyBlockSize);
  const Schedule dense = plan_sync(t, make_schedule(t, dense_choice.algorithm), dense_choice.sync);
  const SparseVerdict v = sparse_verdict(t, p, dense.phases.size());
  const PatternBound b = pattern_bound(t, p, *block, bps);
  std::size_t messages = 0;
  for (int i = 0; i < p.n; ++i)
    for (Rank j : p.dsts[static_cast<std::size_t>(i)]) messages += j != i ? 1 : 0;
  std::cout << t.name() << ": Figure 7 pattern, " << degree << " destinations per rank (seed " << seed << "), " << messages
            << " messages between ranks, largest degree " << v.degree << "; auto"
            << (t.single_switch() ? " on one switch: dense without agreeing on counts" : ": " + v.reason) << "\n";
  std::cout << "  " << cgm.algorithm << " " << cgm.phases.size() << " phases, " << cgm.syncs.size() << " tokens (" << cgm.sync.name() << ")\n";
  std::cout << "  dense " << dense.algorithm << ": " << dense.phases.size() << " phases, " << dense.syncs.size() << " tokens (" << dense.sync.name()
            << ")\n";
  if (b.edge >= 0)
    std::cout << "  bound " << b.messages << " messages of " << *block << " bytes over " << t.edge_name(b.edge) << ": " << b.seconds * 1e3
              << " ms at " << format_rate(bps != 0 ? bps : t.links()[static_cast<std::size_t>(b.edge / 2)].rate_bps) << "\n";
  return 0;
}

// A duration typed by a person: a number and a unit (s, ms, us, ns); "0" needs none.
double parse_duration(const std::string& option, const std::string& text) {
  std::size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw CLI::ValidationError(option, "'" + text + "' is not a duration like 1us, 0.5us, 300ns or 2ms");
  }
  static const std::map<std::string, double> kUnits = {{"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  const std::string unit = text.substr(used);
  const auto it = kUnits.find(unit);
  if (!(value >= 0.0) || !std::isfinite(value) || (it == kUnits.end() && !(unit.empty() && value == 0.0)))
    throw CLI::ValidationError(option, "'" + text + "' is not a duration like 1us, 0.5us, 300ns or 2ms (at least 0, with a unit)");
  return it == kUnits.end() ? 0.0 : value * it->second;
}

std::string duration_text(double s) {
  std::ostringstream out;
  out << std::setprecision(4);
  if (s >= 1.0) {
    out << s << " s";
  } else if (s >= 1e-3) {
    out << s * 1e3 << " ms";
  } else if (s >= 1e-6 || s == 0.0) {
    out << s * 1e6 << " us";
  } else {
    out << s * 1e9 << " ns";
  }
  return out.str();
}

std::string percent(double part, double whole) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << (whole > 0.0 ? 100.0 * part / whole : 0.0) << "%";
  return out.str();
}

// What `aapc-sched predict` was asked, as typed (checked in predict_options()).
struct PredictArgs {
  std::string size = "64K", rate, per_link = "0", per_switch = "0.5us", per_nic = "1us", engine = "0.2us", lead = "0", leaves = "drained";
  std::string measured;  // FILL,HAND-OVER: what a cluster's daemons agreed on (aapc status: phases_agreed)
  double frames_ahead = 1.0, store_forward = 1.0;
  std::uint32_t wire_extra = 24, token_bytes = HandOver{}.token_bytes;
  double link_share = 1.0;
  bool json = false, path = false;
};

PredictOptions predict_options(const PredictArgs& a) {
  PredictOptions o;
  const auto block = parse_bytes(a.size);
  if (!block || *block == 0) throw CLI::ValidationError("--size", "'" + a.size + "' is not a block size like 64K (at least one byte)");
  o.block_bytes = *block;
  o.wire_extra_bytes = a.wire_extra;
  o.link_share = a.link_share;
  HandOver& h = o.hand_over;
  h.per_link_s = parse_duration("--per-link", a.per_link);
  h.per_switch_s = parse_duration("--per-switch", a.per_switch);
  h.per_nic_s = parse_duration("--per-nic", a.per_nic);
  h.engine_s = parse_duration("--engine", a.engine);
  h.lead_s = a.lead == "engine" ? 0.0 : parse_duration("--token-lead", a.lead);
  h.frames_ahead = a.frames_ahead;
  h.store_forward = a.store_forward;
  h.token_bytes = a.token_bytes;
  h.leaves = a.leaves == "arrived" ? TokenLeaves::kArrived : TokenLeaves::kDrained;
  o.keep_path = a.path;
  return o;
}

Json prediction_json(const Topology& t, const Choice& c, const PredictOptions& o, const Prediction& p) {
  const HandOver& h = o.hand_over;
  Json j;
  j["topology"] = t.name().empty() ? t.source() : t.name();
  j["machines"] = t.machine_count();
  j["algorithm"] = c.algorithm.name();
  j["sync"] = c.sync.name();
  j["block_bytes"] = o.block_bytes;
  j["wire_extra_bytes"] = o.wire_extra_bytes;
  j["link_share"] = o.link_share;
  j["hand_over"] = {{"per_link_s", h.per_link_s}, {"frames_ahead", h.frames_ahead}, {"store_forward", h.store_forward}, {"token_bytes", h.token_bytes}, {"per_switch_s", h.per_switch_s}, {"per_nic_s", h.per_nic_s},
                    {"engine_s", h.engine_s},     {"lead_s", h.lead_s},             {"leaves", h.leaves == TokenLeaves::kArrived ? "arrived" : "drained"}};
  j["time_s"] = p.time_s;
  j["limit_s"] = p.limit_s;
  j["fraction_of_limit"] = p.fraction();
  j["path_s"] = p.path_s;
  j["link_bound_s"] = p.link_bound_s;
  j["link_bound_edge"] = p.link_bound_edge >= 0 ? t.edge_name(p.link_bound_edge) : "";
  j["path_rounds"] = p.path_rounds;
  j["path_tokens"] = p.path_tokens;
  j["path_token_links"] = p.path_token_links;
  j["data_s"] = p.data_s;
  j["hand_over_s"] = p.hand_over_s;
  j["waiting_s"] = p.waiting_s;
  j["from_phases"] = p.streamed;
  if (o.keep_path) {
    static const char* const kKinds[] = {"ready", "round", "token", "delivery"};
    Json steps = Json::array();
    for (const PathStep& s : p.path) {
      Json step = {{"kind", kKinds[static_cast<int>(s.kind)]}, {"node", t.machine(s.node).name}, {"start_s", s.start_s}, {"end_s", s.end_s}};
      if (s.peer >= 0) step["peer"] = t.machine(s.peer).name;
      if (s.round >= 0) step["round"] = s.round;
      if (s.phase >= 0) step["phase"] = s.phase;
      steps.push_back(step);
    }
    j["path"] = steps;
  }
  return j;
}

void print_prediction(const Topology& t, const Choice& c, const PredictOptions& o, const Prediction& p) {
  const HandOver& h = o.hand_over;
  std::cout << c.algorithm.name() << " + " << c.sync.name() << " on " << (t.name().empty() ? t.source() : t.name()) << ": " << t.machine_count()
            << " machines, blocks of " << o.block_bytes << " bytes\n";
  std::cout << "  predicted      " << duration_text(p.time_s) << ", " << percent(p.limit_s, p.time_s) << " of the limit ("
            << duration_text(p.limit_s) << ")\n";
  std::cout << "  critical path  " << duration_text(p.path_s) << ": " << p.path_rounds << " rounds, " << p.path_tokens << " tokens crossing "
            << p.path_token_links << " links\n";
  std::cout << "  its time       data " << percent(p.data_s, p.path_s) << ", hand-overs " << percent(p.hand_over_s, p.path_s) << ", waiting "
            << percent(p.waiting_s, p.path_s) << "\n";
  if (p.link_bound_edge >= 0)
    std::cout << "  busiest link   " << t.edge_name(p.link_bound_edge) << ": " << duration_text(p.link_bound_s) << " on the wire"
              << (p.link_bound_s > p.path_s ? " (longer than the path: blocks overlap there, and the link decides)" : "") << "\n";
  std::cout << "  hand-over      per link " << duration_text(h.per_link_s) << " + " << h.frames_ahead << " frame(s) ahead, per switch "
            << duration_text(h.per_switch_s) << ", per NIC " << duration_text(h.per_nic_s) << ", engines " << duration_text(h.engine_s)
            << "; a block's last frame held " << h.store_forward << " frame(s) a link; tokens leave when " << (h.leaves == TokenLeaves::kArrived ? "the blocks arrived" : "the round drained")
            << (h.lead_s > 0.0 ? ", " + duration_text(h.lead_s) + " early" : "") << "\n";
  std::cout << "  computed       " << (p.streamed ? "from the phases alone (no programs built)" : "over the planned programs and tokens") << "\n";
}

void print_path(const Topology& t, const Prediction& p) {
  static const char* const kKinds[] = {"ready", "round", "token", "delivery"};
  std::cout << "\ncritical path (kind node[->peer] [round] [phase]: start .. end):\n";
  for (const PathStep& s : p.path) {
    std::cout << "  " << kKinds[static_cast<int>(s.kind)] << " " << t.machine(s.node).name << (s.peer >= 0 ? "->" + t.machine(s.peer).name : "");
    if (s.round >= 0) std::cout << " round " << s.round;
    if (s.phase >= 0) std::cout << " phase " << s.phase;
    std::cout << ": " << duration_text(s.start_s) << " .. " << duration_text(s.end_s) << "\n";
  }
}

// --measured FILL,HAND-OVER, e.g. 0.83,142us; nothing measured when empty.
Measured measured_option(const std::string& text) {
  if (text.empty()) return {};
  const auto comma = text.find(',');
  const std::string fill_text = text.substr(0, comma);
  char* end = nullptr;
  const double fill = std::strtod(fill_text.c_str(), &end);
  if (comma == std::string::npos || fill_text.empty() || *end != '\0' || !(fill > 0 && fill <= 1))
    throw CLI::ValidationError("--measured", "'" + text + "' is not FILL,HAND-OVER with a fill in (0, 1], e.g. 0.83,142us");
  return {fill, parse_duration("--measured", text.substr(comma + 1))};
}

int cmd_predict(const std::string& path, const std::string& algo, const std::string& sync, const PredictArgs& args) {
  PredictOptions o = predict_options(args);
  if (algo != "auto") algorithm_option(algo);
  if (!sync.empty()) sync_option(sync);
  Topology t = load_topology(path);
  if (!args.rate.empty()) {
    const auto bps = parse_rate(args.rate);
    if (!bps || *bps == 0) throw CLI::ValidationError("--rate", "'" + args.rate + "' is not a rate like 100Gbit");
    t = Topology::from_spec(read_dot(to_dot(t, *bps), t.source()));
  }
  const TreeModel model(t);
  const Choice c = choose(model, sync.empty() ? algo : algo + "+" + sync, o.block_bytes, measured_option(args.measured));
  // The engine's lead: one switch buffer over the phases (of the tree, the load), at machine 0's
  // rate, within the round's last frame.
  if (args.lead == "engine")
    o.hand_over.lead_s =
        engine_token_lead_s(t, static_cast<std::size_t>(model.load()), t.links()[static_cast<std::size_t>(t.machine(0).links.front())].rate_bps, o.block_bytes);
  const Prediction p = predict(t, c.algorithm, c.sync, o);
  if (args.json) {
    std::cout << prediction_json(t, c, o, p).dump(2) << "\n";
    return 0;
  }
  print_prediction(t, c, o, p);
  if (args.path) print_path(t, p);
  return 0;
}

CLI::App* add_predict(CLI::App& app, std::string& topo, std::string& algo, std::string& sync, PredictArgs& a, const std::string& algo_help,
                      const std::string& sync_help) {
  auto* p = app.add_subcommand("predict",
                               "the predicted time of one exchange: the longest path (critical path) through the plan's rounds and tokens, "
                               "with each round's blocks at the link rate and each token's hand-over from the terms below; "
                               "prints the time, its % of the physical limit, the critical path and where its time went "
                               "(data, hand-overs, waiting). Where blocks overlap on a link (shuffles, phases without tokens on a tree) "
                               "the busiest link's bytes decide instead: a flow model, blind to switch queues and drops.");
  p->add_option("TOPO", topo, "topology file or shipped name")->required();
  p->add_option("--size", a.size, "block size (bytes per pair; K, M suffixes)")->capture_default_str();
  p->add_option("--rate", a.rate, "every link at this rate (e.g. 100Gbit); default: the topology's rates");
  p->add_option("--algo,-a", algo, algo_help + "; or auto (what aapc runs for this block size)")->capture_default_str();
  p->add_option("--measured", a.measured,
                "with --algo auto: what the cluster's daemons measured of their tree exchanges, FILL,HAND-OVER (`aapc status`: "
                "phases_agreed, e.g. 0.83,142us); default: nothing measured, the model alone");
  p->add_option("--sync,-s", sync, sync_help + "; default: the schedule's own (the tree: sender-all)");
  p->add_option("--per-link", a.per_link, "hand-over: fixed time per link a token crosses (cable, PHY)")->capture_default_str();
  p->add_option("--frames-ahead", a.frames_ahead, "hand-over: full frames a token queues behind at each link it crosses (a sender-based token's first link "
                "holds its round's last frame, which the round's time counts)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  p->add_option("--store-forward", a.store_forward,
                "hand-over: frames a block's last frame is held at each link after its sender's own (1: switches store and forward; 0 "
                "in the emulator, whose shapers pass a frame at once while their bucket holds tokens): receiver-based tokens wait for it")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  p->add_option("--token-bytes", a.token_bytes, "hand-over: the token's frame, serialised at each link it crosses (0: not counted)")
      ->capture_default_str();
  p->add_option("--per-switch", a.per_switch, "hand-over: each switch a token or a block's last frame crosses")->capture_default_str();
  p->add_option("--per-nic", a.per_nic, "hand-over: each NIC crossed (two per token and per block)")->capture_default_str();
  p->add_option("--engine", a.engine, "hand-over: the two engines' part of a token (aapc-engine-bench --handover)")->capture_default_str();
  p->add_option("--token-lead", a.lead,
                "sender-based tokens leave this long before their round's event; engine: as aapc's engine, one switch buffer "
                "spread over the phases (matters only on small clusters)")
      ->capture_default_str();
  p->add_option("--link-share", a.link_share, "the share of each link's rate the senders carry (1 on hardware; the emulator: see docs/scale.md)")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  p->add_option("--token-leaves", a.leaves, "drained: when the round's last frame has left the sender (aapc); arrived: when its blocks arrived")
      ->check(CLI::IsMember({"drained", "arrived"}))
      ->capture_default_str();
  p->add_option("--wire-extra", a.wire_extra, "bytes a frame takes on the wire beyond header and payload: 24 on Ethernet, 0 in the emulator")
      ->capture_default_str();
  p->add_flag("--json", a.json, "print the prediction as JSON");
  p->add_flag("--path", a.path, "also list the critical path's steps");
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-sched: the contention-free schedules of the papers for an Ethernet switched cluster.\n"
               "TOPO is a topology file (Graphviz DOT) or the name of a shipped one (see `aapc-sched list`)."};
  app.require_subcommand(1);
  std::string topo, algo = "tree", sync = "none", format = "text";
  bool programs = false;

  auto* info = app.add_subcommand("info", "machines, switches, root and subtrees, bottleneck links, load, peak aggregate throughput");
  info->add_option("TOPO", topo, "topology file or shipped name")->required();

  auto algo_help = "schedule: " + algorithm_usages(AlgorithmInput::kDense) + " (`aapc-sched algorithms` says what each is)";
  auto sync_help = "synchronisation of phases: " + join(SyncSpec::names(), ", ") + " (:N sets the block size bs)";

  auto* show = app.add_subcommand("show", "the phase table (like the papers' Table 4); with --sync, the plan and its size");
  show->add_option("TOPO", topo, "topology file or shipped name")->required();
  show->add_option("--algo,-a", algo, algo_help)->capture_default_str();
  show->add_option("--sync,-s", sync, sync_help)->capture_default_str();
  show->add_option("--format,-f", format, "text or json")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  show->add_flag("--programs,-p", programs, "also print every machine's program of rounds");

  auto* ver = app.add_subcommand("verify", "check the schedule (and sync plan): exit 0 and a summary, or 1 and what failed");
  ver->add_option("TOPO", topo, "topology file or shipped name")->required();
  ver->add_option("--algo,-a", algo, algo_help)->capture_default_str();
  ver->add_option("--sync,-s", sync, sync_help)->capture_default_str();

  app.add_subcommand("list", "the shipped topologies with their load and peak throughput");
  bool markdown = false;
  auto* algos = app.add_subcommand("algorithms", "the registry of algorithms: name, parameter, where contention-free, what it schedules, what it is");
  algos->add_flag("--markdown", markdown, "as the table in docs/guide.md");

  int machines = 8, switches = 2;
  std::string shape = "random", rate = "1Gbit";
  std::uint64_t seed = 1;
  auto* gen = app.add_subcommand("generate", "print a random tree topology as DOT");
  gen->add_option("--machines,-m", machines, "number of machines")->check(CLI::Range(2, 65534))->capture_default_str();
  gen->add_option("--switches,-n", switches, "number of switches")->check(CLI::Range(1, 100000))->capture_default_str();
  gen->add_option("--shape", shape, "random, chain, star, one, or two-level (s0 over leaves s1.. that hold the machines evenly)")
      ->check(CLI::IsMember({"random", "chain", "star", "one", "two-level"}))
      ->capture_default_str();
  gen->add_option("--seed", seed, "random seed")->capture_default_str();
  gen->add_option("--rate", rate, "link rate")->capture_default_str();

  int degree = 4;
  std::string size = "64K", sparse_rate;
  auto* sparse = app.add_subcommand("sparse", "an alltoallv of Figure 7's pattern (as `aapc run --sparse D`): CGM against the dense schedule, and its bound");
  sparse->add_option("TOPO", topo, "topology file or shipped name")->required();
  sparse->add_option("--degree,-d", degree, "destinations per rank")->check(CLI::PositiveNumber)->capture_default_str();
  sparse->add_option("--seed", seed, "the pattern's seed (aapc run --sparse: 14)")->capture_default_str();
  sparse->add_option("--size", size, "block size")->capture_default_str();
  sparse->add_option("--rate", sparse_rate, "every link at this rate (as aapc-emu --rate); default: the topology's");

  PredictArgs pargs;
  std::string palgo = "tree", psync;
  auto* pred = add_predict(app, topo, palgo, psync, pargs, algo_help, sync_help);

  CLI11_PARSE(app, argc, argv);
  try {
    if (pred->parsed()) return cmd_predict(topo, palgo, psync, pargs);
    if (info->parsed()) return cmd_info(topo);
    if (show->parsed()) return cmd_show(topo, algo, sync, format, programs);
    if (ver->parsed()) return cmd_verify(topo, algo, sync);
    if (sparse->parsed()) return cmd_sparse(topo, degree, sparse->count("--seed") != 0 ? seed : 14, size, sparse_rate);
    if (gen->parsed()) return cmd_generate(machines, switches, shape, seed, rate);
    if (algos->parsed()) return cmd_algorithms(markdown);
    return cmd_list();
  } catch (const CLI::Error& e) {
    app.exit(e);
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "aapc-sched: " << e.what() << "\n";
    return 2;
  }
}
