// aapc-trace: what an exchange did on the wire, from the captures of its daemons.
//
//   aapc-trace summary -t TOPO CAPTURES...   per exchange and node: time, bytes, frames, resent,
//                                            lost, waits on READY and tokens; clock offsets
//   aapc-trace links   -t TOPO CAPTURES...   load of every directed link, contention intervals
//   aapc-trace phases  -t TOPO CAPTURES...   rounds against their tokens, overlap of phases
//   aapc-trace plot    -t TOPO CAPTURES...   timeline and link utilisation (gnuplot PNG + SVG)
//   aapc-trace handover -t TOPO CAPTURES...  tokens' one-way times, the waiters' reaction and the
//                                            senders' pacing: aapc-sched predict's terms, measured
//
// CAPTURES are pcap files, one per node (`aapcd --capture`, `aapc-emu run --capture-dir`), or
// directories of them.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <numeric>
#include <sstream>

#include "aapc/sched/dot.hpp"
#include "aapc/trace/trace.hpp"

namespace fs = std::filesystem;
using Json = nlohmann::json;
using namespace aapc;
using namespace aapc::trace;

namespace {

struct Options {
  std::string topology;
  std::vector<std::string> captures;
  std::optional<std::uint32_t> exchange;
  bool json = false;
  double bin_ms = 1.0;
  std::size_t limit = 20;
  std::string schedule;
  std::string out = "trace-plots";
  std::string ethertype = "0x88B5";
  bool same_clock = false;
  std::uint32_t wire_extra = 0;
};

std::string ms(std::int64_t ns, int precision = 3) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << static_cast<double>(ns) / 1e6;
  return o.str();
}

std::string name_of(const Trace& t, Rank r) { return t.topology().machine(r).name; }

Trace load(const Options& o) {
  auto topo = sched::load_topology(o.topology);
  std::uint16_t ethertype = static_cast<std::uint16_t>(std::stoul(o.ethertype, nullptr, 0));
  std::vector<std::string> files;
  for (const auto& c : o.captures) {
    if (fs::is_directory(c)) {
      std::vector<std::string> in;
      for (const auto& e : fs::directory_iterator(c))
        if (e.path().extension() == ".pcap") in.push_back(e.path().string());
      if (in.empty()) throw TraceError(c + ": no .pcap files in this directory");
      std::sort(in.begin(), in.end());
      files.insert(files.end(), in.begin(), in.end());
    } else {
      files.push_back(c);
    }
  }
  std::vector<Capture> caps;
  for (const auto& f : files) caps.push_back(read_capture(f, topo, ethertype));
  Trace t(std::move(topo), std::move(caps), o.same_clock);
  if (o.exchange && !std::binary_search(t.exchanges().begin(), t.exchanges().end(), *o.exchange))
    throw TraceError("exchange " + std::to_string(*o.exchange) + " is not in every capture; the captures hold " + std::to_string(t.exchanges().size()) +
                     " exchanges from " + std::to_string(t.exchanges().front()) + " to " + std::to_string(t.exchanges().back()));
  return t;
}

void print_header(const Trace& t, const Options& o) {
  std::uint64_t other = 0, malformed = 0, truncated = 0, frames = 0, flooded = 0;
  for (const auto& c : t.captures()) {
    flooded += c.not_ours;
    other += c.other_protocols;
    malformed += c.malformed;
    truncated += c.truncated_frames;
    frames += c.frames.size();
  }
  std::cout << t.captures().size() << " captures of " << t.topology().machine_count() << " machines (" << t.topology().name() << "), " << frames
            << " aapc frames, exchanges " << t.exchanges().front() << ".." << t.exchanges().back() << " (" << t.exchanges().size() << ")\n";
  if (other + malformed + flooded > 0)
    std::cout << "  ignored: " << other << " frames of other protocols, " << malformed << " malformed aapc frames, " << flooded
              << " frames between other machines (flooded by a switch)\n";
  if (truncated > 0) std::cout << "  " << truncated << " frames cut by the snap length: their CRC was not checked\n";
  if (o.same_clock) {
    std::cout << "one clock for every capture (--same-clock)\n";
    for (const auto& w : t.warnings) std::cout << "warning: " << w << "\n";
    return;
  }
  std::cout << "clock offsets to " << name_of(t, t.reference()) << " (from control frames seen at both ends):";
  for (const auto& c : t.clocks()) {
    if (c.node == t.reference()) continue;
    std::cout << "\n  " << std::left << std::setw(8) << name_of(t, c.node) << std::right;
    if (!c.known) {
      std::cout << " unknown";
      continue;
    }
    std::cout << std::showpos << std::setw(10) << ms(static_cast<std::int64_t>(c.offset_ns)) << std::noshowpos << " ms  within " << ms(static_cast<std::int64_t>(c.uncertainty_ns))
              << " ms  (via " << name_of(t, c.via) << ", " << c.samples << " frames)";
  }
  std::cout << "\n";
  for (const auto& w : t.warnings) std::cout << "warning: " << w << "\n";
}

Json clocks_json(const Trace& t) {
  Json j = Json::array();
  for (const auto& c : t.clocks())
    j.push_back({{"node", c.node}, {"name", name_of(t, c.node)}, {"known", c.known}, {"offset_ns", c.offset_ns}, {"uncertainty_ns", c.uncertainty_ns}, {"samples", c.samples}});
  return j;
}

int cmd_summary(const Options& o) {
  Trace t = load(o);
  auto rows = summarize(t);
  if (o.json) {
    Json j = {{"clocks", clocks_json(t)}, {"warnings", t.warnings}, {"nodes", Json::array()}};
    for (const auto& s : rows) {
      if (o.exchange && s.exchange != *o.exchange) continue;
      j["nodes"].push_back({{"exchange", s.exchange},
                            {"node", s.node},
                            {"name", name_of(t, s.node)},
                            {"seconds", s.seconds()},
                            {"frames_sent", s.frames_sent},
                            {"frames_received", s.frames_received},
                            {"data_frames_sent", s.data_frames_sent},
                            {"data_bytes_sent", s.data_bytes_sent},
                            {"retransmitted_frames", s.retransmitted_frames},
                            {"dummy_frames_sent", s.dummy_frames_sent},
                            {"data_frames_received", s.data_frames_received},
                            {"data_bytes_received", s.data_bytes_received},
                            {"duplicate_frames", s.duplicate_frames},
                            {"bad_crc_frames", s.bad_crc_frames},
                            {"lost_frames", s.lost_frames},
                            {"syncs_sent", s.syncs_sent},
                            {"syncs_received", s.syncs_received},
                            {"nacks_sent", s.nacks_sent},
                            {"nacks_received", s.nacks_received},
                            {"ready_wait_s", static_cast<double>(s.ready_wait_ns) / 1e9},
                            {"sync_wait_s", static_cast<double>(s.sync_wait_ns) / 1e9},
                            {"goodput_bps", s.goodput_bps()}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  print_header(t, o);
  std::uint32_t current = 0;
  bool first = true;
  for (const auto& s : rows) {
    if (o.exchange && s.exchange != *o.exchange) continue;
    if (first || s.exchange != current) {
      first = false;
      current = s.exchange;
      std::cout << "\nexchange " << s.exchange << "\n"
                << std::left << std::setw(8) << "node" << std::right << std::setw(10) << "ms" << std::setw(10) << "sent" << std::setw(12) << "bytes"
                << std::setw(8) << "resent" << std::setw(10) << "received" << std::setw(12) << "bytes" << std::setw(6) << "dup" << std::setw(6) << "crc"
                << std::setw(6) << "lost" << std::setw(9) << "tokens" << std::setw(10) << "ready ms" << std::setw(9) << "sync ms" << std::setw(10) << "Mbit/s"
                << "\n";
    }
    std::cout << std::left << std::setw(8) << name_of(t, s.node) << std::right << std::setw(10) << ms(s.end - s.start, 2) << std::setw(10)
              << s.data_frames_sent << std::setw(12) << s.data_bytes_sent << std::setw(8) << s.retransmitted_frames << std::setw(10) << s.data_frames_received
              << std::setw(12) << s.data_bytes_received << std::setw(6) << s.duplicate_frames << std::setw(6) << s.bad_crc_frames << std::setw(6)
              << s.lost_frames << std::setw(9) << (std::to_string(s.syncs_sent) + "/" + std::to_string(s.syncs_received)) << std::setw(10)
              << ms(s.ready_wait_ns, 2) << std::setw(9) << ms(s.sync_wait_ns, 2) << std::setw(10) << std::fixed << std::setprecision(1)
              << s.goodput_bps() / 1e6 << "\n";
  }
  std::cout << "\nsent/received: DATA frames and payload bytes (received: new and sound); resent: retransmitted frames; dup: received again;\n"
               "crc: received with a bad CRC; lost: sent here by a captured peer and never seen here; tokens: SYNC sent/received;\n"
               "ready ms: from the first frame to the first DATA frame sent; sync ms: sending gaps that ended when a token came.\n";
  return 0;
}

std::string block_name(const Trace& t, const Block& b) {
  std::string s = name_of(t, b.src) + "->" + name_of(t, b.dst);
  if (b.phase >= 0) s += " (phase " + std::to_string(b.phase) + ")";
  if (t.exchanges().size() > 1) s += " [ex " + std::to_string(b.exchange) + "]";
  return s;
}

Json block_json(const Block& b, std::int64_t t0) {
  return {{"exchange", b.exchange}, {"src", b.src}, {"dst", b.dst}, {"phase", b.phase},
          {"start_s", static_cast<double>(b.start - t0) / 1e9}, {"end_s", static_cast<double>(b.end - t0) / 1e9}};
}

int cmd_links(const Options& o) {
  Trace t = load(o);
  auto rep = links(t, o.exchange, static_cast<std::int64_t>(o.bin_ms * 1e6));
  const auto& topo = t.topology();
  if (o.json) {
    Json j = {{"t0_ns", rep.t0}, {"t1_ns", rep.t1}, {"bin_ns", rep.bin_ns}, {"links", Json::array()}, {"contention", Json::array()}};
    for (const auto& l : rep.links)
      j["links"].push_back({{"edge", topo.edge_name(l.edge)}, {"rate_bps", l.rate_bps}, {"bytes", l.bytes}, {"mean_utilisation", l.mean_utilisation},
                            {"peak_utilisation", *std::max_element(l.utilisation.begin(), l.utilisation.end())}, {"contended_s", static_cast<double>(l.contended_ns) / 1e9}});
    for (const auto& c : rep.contention)
      j["contention"].push_back({{"edge", topo.edge_name(c.edge)},
                                 {"from_s", static_cast<double>(c.from - rep.t0) / 1e9},
                                 {"seconds", static_cast<double>(c.ns()) / 1e9},
                                 {"a", block_json(c.a, rep.t0)},
                                 {"b", block_json(c.b, rep.t0)}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  print_header(t, o);
  std::cout << "\n" << (o.exchange ? "exchange " + std::to_string(*o.exchange) : std::string("all exchanges")) << ": " << ms(rep.t1 - rep.t0, 2)
            << " ms, bins of " << ms(rep.bin_ns, 3) << " ms\n";
  std::cout << std::left << std::setw(14) << "link" << std::right << std::setw(10) << "rate" << std::setw(12) << "MB" << std::setw(8) << "mean" << std::setw(8)
            << "peak" << std::setw(15) << "contended ms\n";
  for (const auto& l : rep.links) {
    double peak = *std::max_element(l.utilisation.begin(), l.utilisation.end());
    std::cout << std::left << std::setw(14) << topo.edge_name(l.edge) << std::right << std::setw(10) << sched::format_rate(l.rate_bps) << std::setw(12)
              << std::fixed << std::setprecision(2) << static_cast<double>(l.bytes) / 1e6 << std::setw(7) << std::setprecision(1) << l.mean_utilisation * 100
              << "%" << std::setw(7) << peak * 100 << "%" << std::setw(14) << ms(l.contended_ns, 2) << "\n";
  }
  std::int64_t total = 0;
  std::set<int> edges;
  for (const auto& c : rep.contention) total += c.ns(), edges.insert(c.edge);
  std::cout << "\ncontention (two blocks of different senders on one directed link at once): ";
  if (rep.contention.empty()) {
    std::cout << "none\n";
    return 0;
  }
  std::cout << rep.contention.size() << " intervals on " << edges.size() << " links, " << ms(total, 2) << " ms in all; longest first:\n";
  for (std::size_t i = 0; i < rep.contention.size() && i < o.limit; ++i) {
    const auto& c = rep.contention[i];
    std::cout << "  " << std::left << std::setw(12) << topo.edge_name(c.edge) << std::right << std::setw(10) << ms(c.from - rep.t0, 2) << " ms +"
              << std::setw(8) << ms(c.ns(), 3) << " ms  " << block_name(t, c.a) << " and " << block_name(t, c.b) << "\n";
  }
  if (rep.contention.size() > o.limit) std::cout << "  ... " << rep.contention.size() - o.limit << " more (--limit)\n";
  return 0;
}

int cmd_phases(const Options& o) {
  Trace t = load(o);
  std::vector<std::uint32_t> ids = o.exchange ? std::vector<std::uint32_t>{*o.exchange} : t.exchanges();
  Json all = Json::array();
  if (!o.json) print_header(t, o);
  int bad = 0;
  for (std::uint32_t id : ids) {
    PhaseReport rep;
    try {
      rep = phases(t, id, o.schedule);
    } catch (const TraceError& e) {
      if (o.exchange) throw;
      if (!o.json) std::cout << "\nexchange " << id << ": " << e.what() << "\n";
      continue;
    }
    bad += rep.early_rounds > 0 ? 1 : 0;
    if (o.json) {
      Json j = {{"exchange", id}, {"schedule", rep.schedule}, {"how", rep.how}, {"rounds_checked", rep.rounds.size()},
                {"early_rounds", rep.early_rounds}, {"missing_tokens", rep.missing_tokens}, {"phases", Json::array()}};
      for (const auto& p : rep.phases)
        j["phases"].push_back({{"phase", p.phase}, {"start_ns", p.start}, {"end_ns", p.end}, {"overlap_next_s", static_cast<double>(p.overlap_next_ns) / 1e9},
                               {"contended_s", static_cast<double>(p.contended_ns) / 1e9}});
      all.push_back(j);
      continue;
    }
    std::cout << "\nexchange " << id << ": " << rep.schedule << " (" << rep.how << ")\n";
    std::cout << "  " << rep.rounds.size() << " rounds waited for tokens: ";
    if (rep.early_rounds == 0) {
      std::cout << "every one started after its tokens arrived";
    } else {
      std::cout << rep.early_rounds << " STARTED BEFORE their tokens arrived";
    }
    if (rep.missing_tokens > 0) std::cout << "; " << rep.missing_tokens << " awaited tokens are not in the captures";
    std::cout << "\n";
    for (const auto& r : rep.rounds)
      if (r.early())
        std::cout << "    " << name_of(t, r.node) << " round " << r.round << " (phase " << r.phase << ") started " << ms(r.tokens_arrived - r.started, 3)
                  << " ms before its last token\n";
    if (rep.phases.empty()) continue;
    const std::int64_t t0 = rep.phases.front().start;
    std::int64_t overlap = 0, contended = 0;
    for (const auto& p : rep.phases) overlap += p.overlap_next_ns, contended += p.contended_ns;
    std::cout << "  " << rep.phases.size() << " phases; consecutive phases overlapped " << ms(overlap, 2) << " ms in all, of which blocks contending for a link "
              << ms(contended, 2) << " ms\n";
    std::cout << "  " << std::setw(6) << "phase" << std::setw(11) << "start ms" << std::setw(11) << "end ms" << std::setw(14) << "overlap ms" << std::setw(15)
              << "contended ms\n";
    for (const auto& p : rep.phases)
      std::cout << "  " << std::setw(6) << p.phase << std::setw(11) << ms(p.start - t0, 2) << std::setw(11) << ms(p.end - t0, 2) << std::setw(14)
                << ms(p.overlap_next_ns, 3) << std::setw(14) << ms(p.contended_ns, 3) << "\n";
  }
  if (o.json) std::cout << all.dump(2) << "\n";
  return bad == 0 ? 0 : 3;
}

// The median and the 10th and 90th percentiles, each as `scale` x the value and its unit.
std::string spread(std::vector<double> v, double scale, const char* unit) {
  if (v.empty()) return "-";
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) { return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)] * scale; };
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << at(0.5) << unit << " (" << at(0.1) << "-" << at(0.9) << ")";
  return out.str();
}
std::string spread_us(const std::vector<double>& ns) { return spread(ns, 1e-3, " us"); }
std::string percent(const std::vector<double>& shares) { return spread(shares, 100.0, "%"); }
double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

int cmd_handover(const Options& o) {
  Trace t = load(o);
  const HandOverReport r = hand_over(t, o.exchange, o.wire_extra);
  if (r.tokens.empty()) throw TraceError("no token was seen leaving and arriving once in these captures: run a schedule with tokens (e.g. --schedule tree)");
  std::map<int, std::vector<double>> by_links;
  for (const TokenTime& k : r.tokens) by_links[k.links].push_back(static_cast<double>(k.one_way_ns));
  std::vector<double> reactions(r.reactions_ns.begin(), r.reactions_ns.end());
  const double reaction = reactions.empty() ? 0.0 : std::accumulate(reactions.begin(), reactions.end(), 0.0) / static_cast<double>(reactions.size());
  // aapc-sched predict's terms that these figures give: the fixed part is the NICs' (two per
  // token), the waiter's mean reaction the engines'; switches are not told apart from frames
  // ahead on links of one rate, so they are left in the two.
  // Blocks that arrived at or above their rate leave the share at 1; none seen, too.
  const double share = r.received.empty() ? 1.0 : std::clamp(median(r.received), 0.01, 1.0);
  std::ostringstream flags;
  flags << std::fixed << std::setprecision(1) << "--per-nic " << r.fixed_ns / 2e3 << "us --per-switch 0us --per-link 0us --engine " << reaction / 1e3
        << "us --frames-ahead " << std::setprecision(3) << r.frames_ahead << " --link-share " << share << " --wire-extra " << o.wire_extra;
  if (o.json) {
    Json links = Json::object();
    for (const auto& [n, v] : by_links) links[std::to_string(n)] = {{"tokens", v.size()}, {"median_one_way_s", median(v) / 1e9}};
    Json j = {{"tokens", r.tokens.size()},      {"tokens_left_out", r.tokens_left_out}, {"fitted", r.fitted},
              {"fixed_s", r.fixed_ns / 1e9},     {"frames_ahead", r.frames_ahead},       {"reaction_mean_s", reaction / 1e9},
              {"reactions", reactions.size()},   {"sent_share", median(r.sent)},         {"received_share", median(r.received)},
              {"by_links", links},               {"predict_flags", flags.str()}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  print_header(t, o);
  std::cout << "\ntokens seen leaving and arriving once: " << r.tokens.size() << " (" << r.tokens_left_out << " left out: resent, or seen at one end only)\n";
  std::cout << "  one-way time by links crossed (median, 10th-90th percentile):\n";
  for (const auto& [n, v] : by_links) std::cout << "    " << n << " links  " << std::setw(6) << v.size() << " tokens  " << spread_us(v) << "\n";
  std::cout << std::fixed << std::setprecision(2);
  if (r.fitted) {
    std::cout << "  fitted: one-way = the token's own bits + " << r.fixed_ns / 1e3 << " us + " << r.frames_ahead
              << " x a full frame at every link past the emitter's\n";
  } else {
    std::cout << "  every token crossed the same frame times, so frames ahead cannot be told from the fixed part: one-way = the token's own bits + "
              << r.fixed_ns / 1e3 << " us (mean); capture a tree with paths of different lengths or rates to fit both\n";
  }
  std::cout << "  the waiter's reaction (last token in to its next DATA frame out): mean " << reaction / 1e3 << " us, median " << spread_us(reactions) << ", "
            << reactions.size() << " tokens\n";
  std::cout << std::setprecision(1) << "  blocks, against their link's rate (median, 10th-90th percentile): sent at " << percent(r.sent) << " of "
            << r.sent.size() << ", received at " << percent(r.received) << " of " << r.received.size() << "\n";
  std::cout << "aapc-sched predict with these terms: " << flags.str() << "\n";
  return 0;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int cmd_plot(const Options& o) {
  Trace t = load(o);
  fs::create_directories(o.out);
  const fs::path dir = fs::canonical(o.out);
  auto rep = links(t, o.exchange, static_cast<std::int64_t>(o.bin_ms * 1e6));
  const std::int64_t t0 = rep.t0;
  const int n = t.topology().machine_count();
  {
    std::ofstream data(dir / "frames.dat"), syncs(dir / "syncs.dat"), resent(dir / "resent.dat");
    for (const auto& c : t.captures())
      for (const auto& f : c.frames) {
        if (!f.tx) continue;
        if (o.exchange ? f.h.exchange != *o.exchange : !std::binary_search(t.exchanges().begin(), t.exchanges().end(), f.h.exchange)) continue;
        const double x = static_cast<double>(f.at - t0) / 1e6;
        if (f.data()) {
          (f.retransmitted() ? resent : data) << x << " " << c.node << " " << f.h.dst << "\n";
        } else if (f.h.type == engine::FrameType::kSync) {
          syncs << x << " " << c.node << "\n";
        }
      }
  }
  {
    std::ofstream l(dir / "links.dat");
    const std::size_t shown = std::min<std::size_t>(rep.links.size(), 8);
    for (std::size_t b = 0; shown > 0 && b < rep.links.front().utilisation.size(); ++b) {
      l << static_cast<double>(b) * static_cast<double>(rep.bin_ns) / 1e6;
      for (std::size_t i = 0; i < shown; ++i) l << " " << rep.links[i].utilisation[b] * 100;
      l << "\n";
    }
  }
  std::ofstream gp(dir / "plot.gp");
  const std::string what = o.exchange ? "exchange " + std::to_string(*o.exchange) : "exchanges " + std::to_string(t.exchanges().front()) + ".." + std::to_string(t.exchanges().back());
  for (const char* term : {"pngcairo size 1400,800", "svg size 1400,800"}) {
    const std::string ext = std::string(term).rfind("png", 0) == 0 ? "png" : "svg";
    gp << "set terminal " << term << "\nset output 'timeline." << ext << "'\n"
       << "set title '" << t.topology().name() << ", " << what << ": frames sent, by node (colour: destination)'\n"
       << "set xlabel 'time (ms)'\nset ylabel 'node (rank)'\nset yrange [-0.5:" << n - 0.5 << "]\nset ytics 1\nset grid xtics\n"
       << "set palette defined (0 'blue', 1 'cyan', 2 'green', 3 'orange', 4 'red', 5 'magenta')\nset cbrange [0:" << std::max(1, n - 1) << "]\nset cblabel 'destination'\n"
       << "plot 'frames.dat' using 1:2:3 with points pt 5 ps 0.25 lc palette notitle, "
       << "'resent.dat' using 1:($2+0.25):3 with points pt 2 ps 0.8 lc rgb 'black' title 'retransmitted', "
       << "'syncs.dat' using 1:($2-0.3) with points pt 9 ps 0.9 lc rgb 'red' title 'sync token'\n"
       << "unset cbrange\nunset cblabel\nset output 'links." << ext << "'\n"
       << "set title '" << t.topology().name() << ", " << what << ": utilisation of the busiest links (bins of " << ms(rep.bin_ns, 3) << " ms)'\n"
       << "set ylabel 'utilisation (% of the link rate)'\nset autoscale y\nset ytics auto\nset key outside right\nplot ";
    const std::size_t shown = std::min<std::size_t>(rep.links.size(), 8);
    for (std::size_t i = 0; i < shown; ++i)
      gp << (i ? ", " : "") << "'links.dat' using 1:" << i + 2 << " with steps title '" << t.topology().edge_name(rep.links[i].edge) << "'";
    gp << "\n";
  }
  gp.close();
  const std::string cmd = "cd " + quote(dir.string()) + " && gnuplot plot.gp 2>&1";
  if (std::system(cmd.c_str()) != 0) throw TraceError("gnuplot failed (is it installed? apt-get install gnuplot); data and script are in " + dir.string());
  std::cout << "written: " << (dir / "timeline.png").string() << ", timeline.svg, links.png, links.svg\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc-trace: what exchanges did on the wire, from the pcap captures of their daemons (one per node) and the topology"};
  app.require_subcommand(1);
  Options o;
  auto common = [&](CLI::App* c) {
    c->add_option("--topology,-t", o.topology, "topology of the run (file or shipped name)")->required();
    c->add_option("captures", o.captures, "pcap files, one per node, or directories of them")->required();
    c->add_option("--exchange,-x", o.exchange, "only this exchange id");
    c->add_option("--ethertype", o.ethertype, "EtherType of aapc frames")->capture_default_str();
    c->add_flag("--same-clock", o.same_clock, "the captures were taken on one host (aapc-emu): use its clock, estimate no offsets");
  };
  auto* summary = app.add_subcommand("summary", "per exchange and node: duration, bytes, goodput, frames, retransmissions, losses, waits; clock offsets");
  common(summary);
  summary->add_flag("--json", o.json, "machine-readable output");
  auto* linksc = app.add_subcommand("links", "load of every directed link over time, the busiest links, and every interval two blocks shared one");
  common(linksc);
  linksc->add_flag("--json", o.json, "machine-readable output");
  linksc->add_option("--bin-ms", o.bin_ms, "width of the time bins")->capture_default_str();
  linksc->add_option("--limit", o.limit, "contention intervals listed")->capture_default_str();
  auto* phasesc = app.add_subcommand("phases", "phased schedules: rounds against the tokens they waited for, overlap of phases (exit 3 when a round started early)");
  common(phasesc);
  phasesc->add_flag("--json", o.json, "machine-readable output");
  phasesc->add_option("--schedule", o.schedule, "ALGORITHM+SYNC of the run (default: inferred from the tokens on the wire)");
  auto* handoverc = app.add_subcommand("handover",
                                       "what the captures measure of aapc-sched predict's hand-over terms: tokens' one-way times by links crossed, frames they "
                                       "waited behind, the waiters' reaction, the senders' pacing; prints the predict flags they give");
  common(handoverc);
  handoverc->add_flag("--json", o.json, "machine-readable output");
  handoverc->add_option("--wire-extra", o.wire_extra, "bytes a frame takes on the wire beyond its captured length (0 on the emulator, 24 on Ethernet)")
      ->capture_default_str();
  auto* plotc = app.add_subcommand("plot", "timeline (one row per node, frames coloured by destination, tokens and retransmissions marked) and link utilisation");
  common(plotc);
  plotc->add_option("--out,-o", o.out, "directory for the pictures")->capture_default_str();
  plotc->add_option("--bin-ms", o.bin_ms, "width of the utilisation bins")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (summary->parsed()) return cmd_summary(o);
    if (linksc->parsed()) return cmd_links(o);
    if (phasesc->parsed()) return cmd_phases(o);
    if (handoverc->parsed()) return cmd_handover(o);
    return cmd_plot(o);
  } catch (const std::exception& e) {
    std::cerr << "aapc-trace: " << e.what() << "\n";
    return 1;
  }
}
