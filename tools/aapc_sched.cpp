// aapc-sched: inspect topologies and the schedules of the papers.
//
//   aapc-sched info TOPO
//   aapc-sched show TOPO --algo ALGO [--sync SYNC] [--format text|json]
//   aapc-sched verify TOPO --algo ALGO [--sync SYNC]
//   aapc-sched list
//   aapc-sched generate --machines N --switches S [--shape random|chain|star|one] [--seed X]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
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
  return 0;
}

Schedule build(const Topology& t, const std::string& algo, const std::string& sync) {
  auto spec = AlgorithmSpec::parse(algo);
  if (!spec) throw CLI::ValidationError("--algo", "unknown algorithm '" + algo + "'; one of: " + join(AlgorithmSpec::names(), ", "));
  auto sync_spec = SyncSpec::parse(sync);
  if (!sync_spec) throw CLI::ValidationError("--sync", "unknown sync variant '" + sync + "'; one of: " + join(SyncSpec::names(), ", "));
  Schedule s = make_schedule(t, *spec);
  return plan_sync(t, s, *sync_spec);
}

// The phase table laid out like the papers' Table 4: for the tree algorithm, global messages
// grouped by the sending subtree and local messages by subtree.
void print_phase_table(const Topology& t, const Schedule& s) {
  TreeModel model(t);
  const bool grouped = s.algorithm == "tree";
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
  std::cout << "\nprograms (round: destinations [phase]; wait #id<from; emit #id>to after the sends; on receipt from X emit):\n";
  for (const Program& prog : s.programs) {
    std::cout << t.machine(prog.rank).name << ":\n";
    for (std::size_t r = 0; r < prog.rounds.size(); ++r) {
      const Round& round = prog.rounds[r];
      std::vector<std::string> sends, waits, emits;
      for (const Send& send : round.sends) sends.push_back(t.machine(send.dst).name + "[" + std::to_string(send.phase) + "]");
      for (auto id : round.waits) waits.push_back(sync_ref(t, s.syncs[id], true));
      for (auto id : round.emits) emits.push_back(sync_ref(t, s.syncs[id], false));
      std::cout << "  " << std::setw(3) << r << ": " << (sends.empty() ? std::string("(sync)") : join(sends, " ")) << (round.dummy ? " dummy" : "");
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

Json combine_json(const Topology& t, const Schedule& s) {
  Json nodes = Json::array();
  for (Rank i = 0; i < s.machines; ++i) {
    Json steps = Json::array();
    for (const CombineStep& step : s.combine[static_cast<std::size_t>(i)]) {
      Json pieces = Json::array();
      for (const CombinePiece& piece : step.send) pieces.push_back(Json::array({t.machine(piece.origin).name, t.machine(piece.dest).name}));
      steps.push_back({{"to", t.machine(step.to).name}, {"from", t.machine(step.from).name}, {"send", pieces}});
    }
    nodes.push_back({{"machine", t.machine(i).name}, {"steps", steps}});
  }
  return nodes;
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

Json schedule_json(const Topology& t, const Schedule& s, std::int64_t load) {
  Json j;
  j["algorithm"] = s.algorithm;
  Json machines = Json::array();
  for (Rank r = 0; r < t.machine_count(); ++r) machines.push_back(t.machine(r).name);
  j["machines"] = machines;
  j["load"] = load;
  Json phases = Json::array();
  for (const auto& phase : s.phases) {
    Json ph = Json::array();
    for (const Message& m : phase) ph.push_back(Json::array({t.machine(m.src).name, t.machine(m.dst).name}));
    phases.push_back(ph);
  }
  j["phases"] = phases;
  j["packet_level"] = s.packet_level;
  j["contention_free"] = s.contention_free;
  if (s.block_rate_bps > 0) j["block_rate_bps"] = s.block_rate_bps;  // paced schedules only: the others' JSON is unchanged
  j["sync"] = s.sync.name();
  if (s.combining()) j["combine"] = combine_json(t, s);
  if (s.sync.kind != SyncKind::kNone) {
    const SyncStats& st = s.sync_stats;
    j["sync_stats"] = {{"contending_pairs", st.contending_pairs}, {"consecutive_pairs", st.consecutive_pairs}, {"tokens", st.tokens},
                       {"local_waits", st.local_waits},           {"barriers", st.barriers},                   {"barrier_tokens", st.barrier_tokens},
                       {"dummy_messages", st.dummy_messages}};
    Json programs = Json::array();
    for (const Program& prog : s.programs) {
      Json rounds = Json::array();
      for (const Round& round : prog.rounds) {
        Json sends = Json::array();
        for (const Send& send : round.sends) sends.push_back(Json::array({t.machine(send.dst).name, send.phase}));
        rounds.push_back({{"sends", sends}, {"dummy", round.dummy}, {"waits", round.waits}, {"emits", round.emits}});
      }
      Json on_receive = Json::object();
      for (const auto& [src, ids] : prog.on_receive) on_receive[t.machine(src).name] = ids;
      programs.push_back({{"machine", t.machine(prog.rank).name}, {"rounds", rounds}, {"on_receive", on_receive}});
    }
    j["programs"] = programs;
    Json syncs = Json::array();
    for (const Sync& sy : s.syncs) {
      Json x = {{"id", sy.id}, {"from", t.machine(sy.from).name}, {"to", t.machine(sy.to).name}, {"to_round", sy.to_round}};
      if (sy.trigger == SyncTrigger::kAfterSend) {
        x["after_send_round"] = sy.from_round;
      } else {
        x["after_receive_from"] = t.machine(sy.after_src).name;
      }
      syncs.push_back(x);
    }
    j["syncs"] = syncs;
  }
  return j;
}

int cmd_show(const std::string& path, const std::string& algo, const std::string& sync, const std::string& format, bool programs) {
  Topology t = load_topology(path);
  Schedule s = build(t, algo, sync);
  TreeModel model(t);
  if (format == "json") {
    std::cout << schedule_json(t, s, model.load()).dump(2) << "\n";
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
      {"random", TreeShape::kRandom}, {"chain", TreeShape::kChain}, {"star", TreeShape::kStar}, {"one", TreeShape::kOneSwitch}};
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-sched: the contention-free schedules of the papers for an Ethernet switched cluster.\n"
               "TOPO is a topology file (Graphviz DOT) or the name of a shipped one (see `aapc-sched list`)."};
  app.require_subcommand(1);
  std::string topo, algo = "tree", sync = "none", format = "text";
  bool programs = false;

  auto* info = app.add_subcommand("info", "machines, switches, root and subtrees, bottleneck links, load, peak aggregate throughput");
  info->add_option("TOPO", topo, "topology file or shipped name")->required();

  auto algo_help = "schedule: " + join(AlgorithmSpec::names(), ", ") + " (group-shuffle:W sets the group size)";
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

  int machines = 8, switches = 2;
  std::string shape = "random", rate = "1Gbit";
  std::uint64_t seed = 1;
  auto* gen = app.add_subcommand("generate", "print a random tree topology as DOT");
  gen->add_option("--machines,-m", machines, "number of machines")->check(CLI::Range(2, 65534))->capture_default_str();
  gen->add_option("--switches,-n", switches, "number of switches")->check(CLI::Range(1, 100000))->capture_default_str();
  gen->add_option("--shape", shape, "random, chain, star or one")->check(CLI::IsMember({"random", "chain", "star", "one"}))->capture_default_str();
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

  CLI11_PARSE(app, argc, argv);
  try {
    if (info->parsed()) return cmd_info(topo);
    if (show->parsed()) return cmd_show(topo, algo, sync, format, programs);
    if (ver->parsed()) return cmd_verify(topo, algo, sync);
    if (sparse->parsed()) return cmd_sparse(topo, degree, sparse->count("--seed") != 0 ? seed : 14, size, sparse_rate);
    if (gen->parsed()) return cmd_generate(machines, switches, shape, seed, rate);
    return cmd_list();
  } catch (const CLI::Error& e) {
    app.exit(e);
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "aapc-sched: " << e.what() << "\n";
    return 2;
  }
}
