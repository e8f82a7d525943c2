// What this node's exchanges measured (docs/design.md, Fast links, "`auto` by measurement"):
// tree phases slower than their blocks' rates allow, each longer by a hand-over, and what each
// schedule that `auto` weighs reached at each size. Each daemon fits its last tree exchanges
// (sched::fit_measured), keeps its last reaches by exchange, and proposes both at each
// session's JOIN; the ranks agree on the slowest of each, so every rank chooses alike for the
// whole session.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "daemon_impl.hpp"

namespace aapc::engine {

static_assert(sched::kReachCells == kJoinReachCells, "a JOIN carries every reach `auto` weighs");

namespace {

// `kept` with `value` added, its oldest dropped past `most`.
template <class T>
void keep_last(std::deque<T>& kept, T value, std::size_t most) {
  kept.push_back(std::move(value));
  if (kept.size() > most) kept.pop_front();
}

}  // namespace

// What the cluster's alltoall will measure: measure() reads it.
void Daemon::Impl::note_measured(const sched::Choice& choice, Prepared& p) const {
  if (p.slot != kWorldSlot || p.kind != Collective::kAlltoall) return;
  p.rec.measured_block = p.block;
  p.rec.tree_phases = choice.algorithm.algorithm == sched::Algorithm::kTree && choice.sync.kind != sched::SyncKind::kNone;
  p.rec.reach_cell = sched::reach_cell(choice.algorithm, choice.sync, p.block);
}

void Daemon::Impl::measure(const ExchangeRecord& rec, const ExchangeReport& rep) {
  if (rec.measured_block == 0 || rep.state != ExchangeState::kDone) return;
  const double took_s = static_cast<double>(rep.duration_ns) / 1e9;
  if (rec.reach_cell) {
    // From the first frame of the exchange this rank saw (its own start, or a peer's earlier
    // READY): a rank that started late, the others' blocks waiting for it, would read a short
    // exchange where it held them up.
    auto& kept = reaches.at(*rec.reach_cell);
    keep_last(kept, {rep.id, sched::exchange_reach(world->model, rec.measured_block, static_cast<double>(rep.span_ns) / 1e9)}, kReachesKept);
    spdlog::debug("exchange {} ({}): {:.1f}% of the limit, span {} us, own {} us, {} frames resent, {} duplicates received", rep.id, rec.schedule,
                  kept.back().reach * 100, rep.span_ns / 1000, rep.duration_ns / 1000, rep.counters.retransmitted_frames,
                  rep.counters.drops[static_cast<int>(DropReason::kDuplicate)]);
  }
  if (!rec.tree_phases) return;
  const auto sample = sched::tree_sample(world->model, rec.measured_block, took_s);
  if (!sample) return;
  keep_last(measures, *sample, kMeasuresKept);
  spdlog::debug("tree exchange {}: {:.1f} us a phase, {:.1f} us in the model", rep.id, sample->took_s * 1e6, sample->model_s * 1e6);
}

sched::Measured Daemon::Impl::own_measure() const {
  sched::Measured m = sched::fit_measured({measures.begin(), measures.end()});
  for (std::size_t c = 0; c < sched::kReachCells; ++c) {
    std::vector<double> seen;
    for (const Reach& r : reaches[c]) seen.push_back(r.reach);
    m.reach[c] = sched::reach_together(seen);
  }
  return m;
}

// What `spec` runs: for the cluster's collectives with what the session agreed, for a group's
// with the model alone.
sched::Choice Daemon::Impl::measured_choice(const TreeSchedules& tree, const Prepared& p, const std::string& spec) {
  const std::uint64_t block = p.kind == Collective::kAlltoall ? p.block : sched::kAnyBlockSize;
  if (p.slot != kWorldSlot) return sched::choose(tree.model, spec, block);
  sched::Choice choice = sched::choose(tree.model, spec, block, agreed);
  if (!choice.weighed || !joined) return choice;
  return measure_another(choice, block);
}

// Now and then, in place of what `auto` chose by measurement, another of the schedules it weighs
// (kMeasureUnmeasuredEvery, kRemeasureEvery): so each is measured at each size, and again.
sched::Choice Daemon::Impl::measure_another(const sched::Choice& chosen, std::uint64_t block) {
  ++weighed_choices;
  std::vector<sched::Weighed> others, unmeasured;
  for (const sched::Weighed& w : sched::kWeighed) {
    if (w.algorithm == chosen.algorithm.algorithm && w.sync == chosen.sync.kind) continue;
    others.push_back(w);
    const bool fitted = w.algorithm == sched::Algorithm::kTree && agreed.known();
    if (!fitted && agreed.reach_at(sched::reach_cell(w, block)) == 0) unmeasured.push_back(w);
  }
  const bool first = !unmeasured.empty() && weighed_choices % kMeasureUnmeasuredEvery == 0;
  if (!first && weighed_choices % kRemeasureEvery != 0) return chosen;
  const std::uint64_t every = first ? kMeasureUnmeasuredEvery : kRemeasureEvery;
  const auto& from = first ? unmeasured : others;
  const sched::Weighed& w = from[(weighed_choices / every - 1) % from.size()];
  sched::Choice other{w.algorithm_spec(), w.sync_spec(), {}, false};
  other.reason = "once in " + std::to_string(every) + " of the alltoalls `auto` chooses by measurement: " + sched::format_plan_spec(other.algorithm, other.sync) +
                 (first ? ", which this session knew nothing of at this size" : "") + ", to measure it (auto would run " +
                 sched::format_plan_spec(chosen.algorithm, chosen.sync) + ": " + chosen.reason + ")";
  return other;
}

JoinMeasure Daemon::Impl::join_measure() const {
  const sched::Measured fit = sched::fit_measured({measures.begin(), measures.end()});
  JoinMeasure j;
  if (fit.known()) {
    j.fill_ppm = static_cast<std::uint32_t>(std::clamp(std::lround(fit.fill * kJoinFillWhole), 1L, static_cast<long>(kJoinFillWhole)));
    j.hand_over_ns = static_cast<std::uint32_t>(std::clamp(std::llround(fit.hand_over_s * 1e9), 0LL, static_cast<long long>(UINT32_MAX)));
  }
  std::array<std::size_t, sched::kReachCells> kept{};
  for (std::size_t c = 0; c < sched::kReachCells; ++c) kept[c] = reaches[c].size();
  for (const auto& [c, i] : sched::reach_listing(kept)) {  // what a JOIN has no room for: the oldest (Engine::start_join)
    const Reach& r = reaches[c][i];
    j.reaches.push_back({r.exchange, static_cast<std::uint8_t>(c), static_cast<std::uint16_t>(std::clamp(std::lround(r.reach * kJoinReachWhole), 1L, static_cast<long>(kJoinReachWhole)))});
  }
  return j;
}

void Daemon::Impl::take_agreed(const AgreedMeasure& m) {
  agreed = {static_cast<double>(m.fill_ppm) / kJoinFillWhole, m.fill_ppm > 0 ? static_cast<double>(m.hand_over_ns) / 1e9 : 0.0, {}};
  for (std::size_t c = 0; c < sched::kReachCells; ++c) agreed.reach[c] = static_cast<double>(m.reach[c]) / kJoinReachWhole;
  if (agreed.known())
    spdlog::info("the session agreed on what its ranks measured of their tree exchanges: blocks at {:.0f}% of their links' rate, {:.1f} us a phase of hand-over",
                 agreed.fill * 100, agreed.hand_over_s * 1e6);
  std::string reached;
  for (std::size_t c = 0; c < sched::kReachCells; ++c)
    if (agreed.reach[c] > 0)
      reached += fmt::format("{}{} {:.1f}% from {} B", reached.empty() ? "" : ", ", sched::reach_cell_schedule(c), agreed.reach[c] * 100, sched::reach_cell_block(c));
  if (!reached.empty()) spdlog::info("the session agreed on what its exchanges reached of the limit (the slowest rank's view of each): {}", reached);
}

// Kept beside the socket from one daemon to the next (`aapc-emu run` starts the daemons for
// each command, a cluster's daemons restart on an upgrade): what they measured of this machine,
// its tree and its pacing rate, and only for the same three.
std::string Daemon::Impl::measures_path() const { return cfg.socket_path + ".measured"; }

void Daemon::Impl::load_measures() {
  std::ifstream in(measures_path());
  if (!in) return;
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.at("machine") != topo.machine(rank).name || j.at("topology") != topo.source() || j.at("pace_bps") != pace_bps) return;
    for (const auto& m : j.at("measures")) {
      const double model_s = m.at(0), took_s = m.at(1);
      if (!(model_s > 0 && model_s < 60 && took_s > 0 && took_s < 60)) continue;  // NaN too
      keep_last(measures, {model_s, took_s}, kMeasuresKept);
    }
    for (const auto& r : j.value("reach", nlohmann::json::array())) {  // [schedule, smallest block, [[exchange, reach]...]]
      const std::string schedule = r.at(0);
      const std::uint64_t block = r.at(1);
      for (std::size_t c = 0; c < sched::kReachCells; ++c) {
        if (sched::reach_cell_schedule(c) != schedule || sched::reach_cell_block(c) != block) continue;
        for (const auto& seen : r.at(2)) {
          const double v = seen.at(1);
          if (v > 0 && v < 60) keep_last(reaches[c], {seen.at(0).get<std::uint32_t>(), v}, kReachesKept);  // NaN too; above 1 where this rank finished first
        }
      }
    }
  } catch (const std::exception& e) {
    spdlog::warn("{}: not read ({}); the exchanges are measured anew", measures_path(), e.what());
    measures.clear();
    for (auto& kept : reaches) kept.clear();
  }
}

void Daemon::Impl::save_measures() const {
  if (measures.empty() && std::all_of(reaches.begin(), reaches.end(), [](const auto& kept) { return kept.empty(); })) return;
  nlohmann::json j = {{"machine", topo.machine(rank).name}, {"topology", topo.source()}, {"pace_bps", pace_bps}, {"measures", nlohmann::json::array()},
                      {"reach", nlohmann::json::array()}};
  for (const auto& m : measures) j["measures"].push_back({m.model_s, m.took_s});
  for (std::size_t c = 0; c < sched::kReachCells; ++c)
    if (!reaches[c].empty()) {
      nlohmann::json seen = nlohmann::json::array();
      for (const Reach& r : reaches[c]) seen.push_back({r.exchange, r.reach});
      j["reach"].push_back({sched::reach_cell_schedule(c), sched::reach_cell_block(c), seen});
    }
  const std::string path = measures_path(), temporary = path + ".new";
  std::ofstream(temporary) << j.dump() << "\n";
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) spdlog::warn("{}: not written ({})", path, ec.message());
}

}  // namespace aapc::engine
