// aapc-bench's statistics: one point per label and size from repeated runs, why a point falls
// short of the limit, auto against the best schedule turn by turn, and the report's files.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "aapc/sched/algorithms.hpp"
#include "bench/bench.hpp"

namespace aapc::bench {

namespace {

// Whether what ran ("tree", "group-shuffle:4", "cgm-links: 12 phases, ...") keeps every link of a
// tree within its rate: contention-free phases, or pacing (docs/design.md, Fast links).
bool contention_free_on_trees(const std::string& ran) {
  const sched::AlgorithmInfo* info = sched::find_algorithm(std::string_view(ran).substr(0, ran.find(':')));
  return info != nullptr && (info->kind == sched::AlgorithmKind::kTree || info->kind == sched::AlgorithmKind::kPaced);
}

// Why a point falls short of 90% of the limit, from what it measured.
std::string why(const Json& p, double fraction, bool multi_switch) {
  if (p.contains("check_ok") && !p["check_ok"].get<bool>()) return "CHECK FAILED: received bytes wrong";
  // Nothing crosses the bottleneck faster than the wire: a point faster than the emulated
  // network can carry its bytes did not move them over it, whatever the library reported.
  if (p.value("too_fast", false)) return "ABOVE the physical limit: not a real exchange";
  if (!p.value("over_network", true)) return "NOT over the network (shared memory?)";
  if (fraction >= 0.9) return "";
  std::vector<std::string> reasons;
  const double secs = p.value("seconds", 0.0);
  if (p.value("aapc_mpi", false)) return "aapc under the MPI: hand-overs, the MPI's barrier (AAPC_MPI_TIMING=1 times the parts)";
  if (p.value("impl", std::string()) != "aapc") return "TCP, MPI's own schedule";
  if (p.value("retransmissions", 0) > 0) reasons.push_back(std::to_string(p["retransmissions"].get<std::uint64_t>()) + " frames resent (queues overflowed)");
  const double wait = p.value("sync_wait_s", 0.0), cpu = p.value("cpu_s", 0.0);
  if (wait > 0.1 * secs) reasons.push_back("sync wait " + std::to_string(static_cast<int>(wait / secs * 100)) + "%");
  if (cpu > 0.8 * secs) reasons.push_back("daemon CPU " + std::to_string(static_cast<int>(cpu / secs * 100)) + "%");
  const std::string s = p.value("schedule", std::string());
  if (multi_switch && !contention_free_on_trees(s)) reasons.push_back("not contention-free on this tree");
  const double fixed = secs - p.value("exchange_s", secs);
  if (fixed > 0.1 * secs) reasons.push_back("barrier/start " + std::to_string(static_cast<int>(fixed / secs * 100)) + "%");
  if (reasons.empty()) reasons.push_back("per-exchange overhead at this size");
  std::string out;
  for (const auto& r : reasons) out += (out.empty() ? "" : "; ") + r;
  return out;
}

// One point per label and size from repeated runs: the run with the median time (the slower
// of the two middle ones for an even count), with every run's time and the spread
// (max - min) / median kept. A point is trusted only if every run was: one failed check or
// one run around the network marks it.
std::vector<Json> median_points(const std::vector<Json>& runs) {
  std::map<std::pair<std::string, std::uint64_t>, std::vector<const Json*>> by;
  for (const auto& r : runs) by[{r["label"].get<std::string>(), r["size"].get<std::uint64_t>()}].push_back(&r);
  std::vector<Json> out;
  for (auto& [key, group] : by) {
    Json all = Json::array();  // in the order of the repetitions
    for (const Json* r : group) all.push_back((*r)["seconds"]);
    std::sort(group.begin(), group.end(), [](const Json* x, const Json* y) { return (*x)["seconds"].get<double>() < (*y)["seconds"].get<double>(); });
    Json p = *group[group.size() / 2];
    bool check_ok = true, over_network = true;
    for (const Json* r : group) {
      check_ok = check_ok && r->value("check_ok", true);
      over_network = over_network && r->value("over_network", true);
    }
    p["runs"] = group.size();
    p["seconds_all"] = all;
    p["spread"] = (group.back()->at("seconds").get<double>() - group.front()->at("seconds").get<double>()) / p["seconds"].get<double>();
    if (p.contains("check_ok")) p["check_ok"] = check_ok;
    if (p.contains("over_network")) p["over_network"] = over_network;
    out.push_back(std::move(p));
  }
  return out;
}

// Writes each series (sorted) to PREFIX-I.dat in `dir`, and with gnuplot's `settings` and one
// more line `extra` (a limit), draws them into STEM.png and STEM.svg by a script STEM.gp.
template <class X>
void draw(const fs::path& dir, const std::string& stem, const std::string& settings, std::map<std::string, std::vector<std::pair<X, double>>>& series,
          const std::string& extra) {
  std::string plots;
  int i = 0;
  for (auto& [label, data] : series) {
    std::sort(data.begin(), data.end());
    const std::string file = stem + "-" + std::to_string(i++) + ".dat";
    std::ofstream d(dir / file);
    for (auto& [x, y] : data) d << x << " " << y << "\n";
    plots += (plots.empty() ? "" : ", ") + std::string("'") + file + "' with linespoints title '" + label + "'";
  }
  plots += ", " + extra;
  std::ofstream script(dir / (stem + ".gp"));
  script << settings;
  for (const char* term : {"pngcairo size 1200,700", "svg size 1200,700"}) {
    const std::string ext = std::string(term).rfind("png", 0) == 0 ? "png" : "svg";
    script << "set terminal " << term << "\nset output \"" << stem << "." << ext << "\"\nplot " << plots << "\n";
  }
  script.close();
  const std::string cmd = "cd " + shell_quote(dir.string()) + " && gnuplot " + stem + ".gp 2>&1";
  if (std::system(cmd.c_str()) != 0) std::cerr << "aapc-bench: gnuplot failed (is gnuplot installed?); data and script are in " << dir << "\n";
}

void plot(const fs::path& dir, const std::vector<Json>& points, double peak_bps, const std::string& title) {
  std::map<std::string, std::vector<std::pair<std::uint64_t, double>>> series;
  for (const auto& p : points) series[p["label"]].emplace_back(p["size"].get<std::uint64_t>(), p["aggregate_bps"].get<double>() / 1e6);
  draw(dir, "throughput",
       "set title \"" + title + "\"\nset xlabel \"block size (bytes)\"\nset ylabel \"aggregate throughput (Mbit/s)\"\n" +
           "set logscale x 2\nset format x \"%.0s%cB\"\nset key outside right\nset grid\n",
       series, std::to_string(peak_bps / 1e6) + " with lines dashtype 2 lw 2 title 'peak (physical limit)'");
}

// A point is trusted unless its check failed, it went around the network or it was faster
// than the network can carry it.
bool trusted(const Json& p) { return p.value("check_ok", true) && p.value("over_network", true) && !p.value("too_fast", false); }

// The highest fraction of the limit that an exchange of `block` bytes can show on the
// emulated cluster: the limiting link's full bucket passes its first burst_s at once, and
// eager blocks leave ranks that are out of the barrier before rank 0 starts its
// clock (5%). With a fixed 1.02, 4 KiB points of real exchanges on 8-two-switch (a burst of
// 38% of the busiest link's bytes) were cast out, and with them every pairing of auto with the
// best schedule. Infinite where the burst holds the exchange's whole share of that link.
double fraction_ceiling(const Sweep& sweep, double block) {
  const double at_limit = exchange_bits(sweep.n, block) / sweep.peak;
  return at_limit > sweep.burst_s ? 1.05 * at_limit / (at_limit - sweep.burst_s) : std::numeric_limits<double>::infinity();
}

// One configuration against another, turn by turn: the r-th turns of all configurations
// ran in the same round, within a second or so of each other, so their ratio is what the
// machine's slow and fast moments do not move. The median of these ratios over every round
// of every repetition. (Comparing each repetition's totals with the best total of that
// repetition, as before, favoured whichever of eight near-equal schedules drew the luckiest
// noise: auto then trailed "the best" by as much as it trailed its own schedule measured as
// itself.)
// Nothing where no round has both configurations trusted: a ratio of 0 would read as auto
// far behind.
std::optional<double> paired(const std::vector<Json>& runs, int repeat, std::uint64_t b, const std::string& label, const std::string& against) {
  std::vector<double> ratios;
  for (int r = 0; r < repeat; ++r) {
    const Json *mine = nullptr, *ref = nullptr;
    for (const auto& p : runs) {
      if (p["size"] != b || p.value("rep", 0) != r || p["impl"] != "aapc" || !trusted(p)) continue;
      if (p["label"] == label) mine = &p;
      if (p["label"] == against) ref = &p;
    }
    if (mine == nullptr || ref == nullptr) continue;
    const Json &x = (*mine)["turn_s"], &y = (*ref)["turn_s"];
    for (std::size_t t = 0; t < std::min(x.size(), y.size()); ++t)
      if (x[t].get<double>() > 0) ratios.push_back(y[t].get<double>() / x[t].get<double>());  // throughput: time inverted
  }
  if (ratios.empty()) return std::nullopt;
  std::sort(ratios.begin(), ratios.end());
  const std::size_t m = ratios.size() / 2;
  return ratios.size() % 2 == 1 ? ratios[m] : (ratios[m - 1] + ratios[m]) / 2;
}

std::string table_of(const Args& a, const Sweep& sweep, const std::vector<Json>& points, const Json& auto_check) {
  const std::string& name = sweep.name;
  const int n = sweep.n;
  const double peak = sweep.peak;
  std::ostringstream table;
  table << "\n" << name << ": " << n << " machines, physical limit " << mb(peak) << " Mbit/s\n";
  table << std::left << std::setw(34) << "schedule" << std::right << std::setw(9) << "block" << std::setw(11) << "ms/exch" << std::setw(11) << "Mbit/s"
        << std::setw(8) << "limit" << std::setw(9) << "resent" << (a.repeat > 1 ? "  spread" : "") << "  why below 90%\n";
  for (const auto& p : points) {
    table << std::left << std::setw(34) << p["label"].get<std::string>() << std::right << std::setw(9) << p["size"].get<std::uint64_t>() << std::setw(11)
          << std::fixed << std::setprecision(2) << p["seconds"].get<double>() * 1e3 << std::setw(11) << mb(p["aggregate_bps"]) << std::setw(7)
          << std::setprecision(1) << p["fraction_of_peak"].get<double>() * 100 << "%" << std::setw(9) << p.value("retransmissions", 0);
    if (a.repeat > 1) table << std::setw(7) << p["spread"].get<double>() * 100 << "%";
    table << "  " << p["why"].get<std::string>() << "\n";
  }
  table << "\nper block size: best aapc schedule, auto, best MPI"
        << (a.repeat > 1 ? " (Mbit/s: medians of " + std::to_string(a.repeat) + " runs)" : "")
        << "\n  (auto's % of the best: the median, over every round of turns, of auto's throughput over the best schedule's in the same round)\n";
  for (const auto& r : auto_check) {
    table << "  " << std::setw(8) << r["size"].get<std::uint64_t>() << " B  best " << std::left << std::setw(24) << r["best"].get<std::string>() << std::right
          << std::setw(8) << mb(r["best_bps"]) << "  auto " << std::setw(8) << mb(r["auto_bps"]);
    if (r.contains("auto_of_best"))
      table << " = " << std::setprecision(1) << r["auto_of_best"].get<double>() * 100 << "% of the best"
            << (r["auto_within_5pct"].get<bool>() ? " (within 5%)" : " (MORE than 5% below)");
    else if (r["auto_bps"].get<double>() > 0 && r["best_bps"].get<double>() > 0)
      table << " (not compared: no round timed both as real exchanges)";
    if (r.contains("auto_chose")) table << ", ran " << r["auto_chose"].get<std::string>();
    if (r.contains("auto_choice"))
      table << " (as " << r["auto_choice"].get<std::string>() << ": " << mb(r["auto_choice_bps"]) << ", " << r["auto_choice_of_best"].get<double>() * 100
            << "%; auto/" << r["auto_choice"].get<std::string>() << " " << r["auto_of_choice"].get<double>() * 100 << "%)";
    if (r.contains("best_mpi"))
      table << "  best MPI " << r["best_mpi"].get<std::string>() << " " << mb(r["best_mpi_bps"]) << "  speedup " << std::setprecision(2)
            << r["speedup_over_best_mpi"].get<double>() << "x";
    table << "\n";
  }
  return table.str();
}

}  // namespace

std::vector<Json> report_points(std::vector<Json>& runs, const Sweep& sweep) {
  for (auto& p : runs) {
    double agg = exchange_bits(sweep.n, p["size"].get<double>()) / p["seconds"].get<double>();
    p["aggregate_bps"] = agg;
    p["fraction_of_peak"] = agg / sweep.peak;
    p["too_fast"] = agg / sweep.peak > fraction_ceiling(sweep, p["size"].get<double>());
  }
  std::vector<Json> points = median_points(runs);
  for (auto& p : points) p["why"] = why(p, p["fraction_of_peak"].get<double>(), sweep.multi_switch);
  std::sort(points.begin(), points.end(), [](const Json& x, const Json& y) {
    if (x["size"] != y["size"]) return x["size"].get<std::uint64_t>() < y["size"].get<std::uint64_t>();
    return x["aggregate_bps"].get<double>() > y["aggregate_bps"].get<double>();
  });
  return points;
}

Json summary(const Args& a, const Sweep& sweep, const std::vector<Json>& runs, const std::vector<Json>& points) {
  Json auto_check = Json::array();
  for (std::uint64_t b : sweep.sizes) {
    double best = 0, chosen = 0;
    std::string best_label, choice;
    for (const auto& p : points) {
      if (p["size"] != b || p["impl"] != "aapc") continue;
      if (p["label"] == "auto") choice = p.value("chosen", std::string());  // what auto ran, however it timed
      if (!trusted(p)) continue;
      if (p["label"] == "auto") chosen = p["aggregate_bps"];
      if (p["aggregate_bps"].get<double>() > best) best = p["aggregate_bps"], best_label = p["label"];
    }
    // auto runs one of the other configurations; that one's own measurement, where the sweep
    // has it, is a second reading of the same schedule, and how far the two differ is how
    // finely this machine can tell schedules apart.
    double choice_bps = 0;
    std::string choice_label;
    for (const auto& p : points)
      if (p["size"] == b && p["impl"] == "aapc" && p["label"] != "auto" && label_of(p["schedule"], p["sync"]) == choice && trusted(p))
        choice_bps = p["aggregate_bps"], choice_label = p["label"];
    double best_mpi = 0;
    std::string best_mpi_label;
    for (const auto& p : points)
      if (p["size"] == b && p["impl"] != "aapc" && trusted(p) && p["aggregate_bps"].get<double>() > best_mpi) best_mpi = p["aggregate_bps"], best_mpi_label = p["label"];
    Json row = {{"size", b}, {"best", best_label}, {"best_bps", best}, {"auto_bps", chosen}};
    if (best > 0 && chosen > 0) {
      if (auto ratio = paired(runs, a.repeat, b, "auto", best_label)) {
        row["auto_of_best"] = *ratio;
        row["auto_within_5pct"] = *ratio >= 0.95;
      }
    }
    if (!choice.empty()) row["auto_chose"] = choice;
    const auto choice_of_best = paired(runs, a.repeat, b, choice_label, best_label);
    const auto of_choice = paired(runs, a.repeat, b, "auto", choice_label);  // the same schedule twice: the resolution
    if (choice_bps > 0 && choice_of_best && of_choice) {
      row["auto_choice"] = choice_label;
      row["auto_choice_bps"] = choice_bps;
      row["auto_choice_of_best"] = *choice_of_best;
      row["auto_of_choice"] = *of_choice;
    }
    if (best_mpi > 0) {
      row["best_mpi"] = best_mpi_label;
      row["best_mpi_bps"] = best_mpi;
      row["speedup_over_best_mpi"] = best / best_mpi;
    }
    auto_check.push_back(row);
  }
  return auto_check;
}

void write_report(const Args& a, const Sweep& sweep, const std::vector<Json>& points, const Json& auto_check) {
  const fs::path& out = sweep.out;
  Json report = {{"topology", sweep.name}, {"machines", sweep.n}, {"peak_bps", sweep.peak}, {"points", points}};
  report["summary"] = auto_check;
  std::ofstream(out / "results.json") << report.dump(2);
  {
    std::ofstream csv(out / "results.csv");
    csv << "impl,label,schedule,sync,size,iters,seconds,aggregate_bps,fraction_of_peak,retransmissions,sync_wait_s,daemon_cpu_s,runs,spread,why\n";
    for (const auto& p : points)
      csv << p.value("impl", std::string()) << "," << p["label"].get<std::string>() << "," << p.value("schedule", std::string()) << ","
          << p.value("sync", std::string()) << "," << p["size"] << "," << p["iters"] << "," << p["seconds"] << "," << p["aggregate_bps"] << ","
          << p["fraction_of_peak"] << "," << p.value("retransmissions", 0) << "," << p.value("sync_wait_s", 0.0) << "," << p.value("cpu_s", 0.0) << ","
          << p["runs"] << "," << p["spread"] << ",\""
          << p["why"].get<std::string>() << "\"\n";
  }
  const std::string table = table_of(a, sweep, points, auto_check);
  std::cout << table;
  std::ofstream(out / "results.txt") << table;
  if (a.plot && !points.empty()) plot(out, points, sweep.peak, sweep.name + ": aggregate throughput (" + std::to_string(sweep.n) + " machines)");
  std::cout << "written: " << out / "results.txt" << ", results.csv, results.json" << (a.plot ? ", throughput.png, throughput.svg" : "") << "\n";
}

void write_rates_report(const fs::path& dir, const std::string& title, const std::vector<std::pair<std::uint64_t, std::vector<Json>>>& by_rate, bool plot) {
  // One series per configuration and block size: (rate in Mbit/s, % of the limit).
  std::map<std::string, std::vector<std::pair<double, double>>> series;
  std::ofstream csv(dir / "rates.csv");
  csv << "rate_bps,label,size,fraction_of_peak,retransmissions\n";
  for (const auto& [rate, points] : by_rate) {
    for (const auto& p : points) {
      const std::string label = p["label"].get<std::string>() + " " + std::to_string(p["size"].get<std::uint64_t>() >> 10) + " KiB";
      csv << rate << "," << p["label"].get<std::string>() << "," << p["size"] << "," << p["fraction_of_peak"] << "," << p.value("retransmissions", 0) << "\n";
      series[label].emplace_back(static_cast<double>(rate) / 1e6, p["fraction_of_peak"].get<double>() * 100);
    }
  }
  csv.close();
  std::cout << "written: " << dir / "rates.csv" << (plot ? ", rates.png, rates.svg" : "") << "\n";
  if (!plot || series.empty()) return;
  draw(dir, "rates",
       "set title \"" + title + "\"\nset xlabel \"link rate (Mbit/s)\"\nset ylabel \"% of the physical limit\"\n" +
           "set logscale x 10\nset yrange [0:105]\nset key outside right\nset grid\n",
       series, "100 with lines dashtype 2 lw 2 title 'physical limit'");
}

}  // namespace aapc::bench
