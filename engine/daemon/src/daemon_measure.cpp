// What this node's tree exchanges measured (docs/design.md, Fast links): phases slower than
// their blocks' rates allow, and each longer by a hand-over, weigh the tree's phases against the
// paced shuffle in `auto` (sched::phases_reach). Each daemon fits its last exchanges
// (sched::fit_measured) and proposes the fit at each session's JOIN; the ranks agree on the
// slowest fill and the longest hand-over, so every rank chooses alike for the whole session.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "daemon_impl.hpp"

namespace aapc::engine {

// The cluster's alltoall with the tree's phases and tokens: what measure() will read.
std::uint64_t Daemon::Impl::tree_block(const sched::Choice& choice, const Prepared& p) const {
  if (p.slot != kWorldSlot || p.kind != Collective::kAlltoall) return 0;
  if (choice.algorithm.algorithm != sched::Algorithm::kTree || choice.sync.kind == sched::SyncKind::kNone) return 0;
  return p.block;
}

void Daemon::Impl::measure(const ExchangeRecord& rec, const ExchangeReport& rep) {
  if (rec.tree_block == 0 || rep.state != ExchangeState::kDone) return;
  const auto sample = sched::tree_sample(world->model, rec.tree_block, static_cast<double>(rep.duration_ns) / 1e9);
  if (!sample) return;
  measures.push_back(*sample);
  if (measures.size() > kMeasuresKept) measures.pop_front();
  spdlog::debug("tree exchange {}: {:.1f} us a phase, {:.1f} us in the model", rep.id, sample->took_s * 1e6, sample->model_s * 1e6);
}

sched::Measured Daemon::Impl::own_measure() const { return sched::fit_measured({measures.begin(), measures.end()}); }

// What `spec` runs: for the cluster's collectives with what the session agreed, for a group's
// with the model alone.
sched::Choice Daemon::Impl::measured_choice(const TreeSchedules& tree, const Prepared& p, const std::string& spec) {
  const std::uint64_t block = p.kind == Collective::kAlltoall ? p.block : sched::kAnyBlockSize;
  sched::Choice modelled = sched::choose(tree.model, spec, block);
  if (p.slot != kWorldSlot || !agreed.known()) return modelled;
  sched::Choice choice = sched::choose(tree.model, spec, block, agreed);
  if (choice.algorithm.algorithm == modelled.algorithm.algorithm || !joined) return choice;
  if (++moved_off_phases % kRemeasureEvery != 0) return choice;
  modelled.reason += " (once in " + std::to_string(kRemeasureEvery) + " where the measure ran " + choice.algorithm.name() + ": to measure them again)";
  return modelled;
}

JoinMeasure Daemon::Impl::join_measure() const {
  const sched::Measured m = own_measure();
  if (!m.known()) return {};
  const auto fill = static_cast<std::uint32_t>(std::clamp(std::lround(m.fill * kJoinFillWhole), 1L, static_cast<long>(kJoinFillWhole)));
  const auto ns = static_cast<std::uint32_t>(std::clamp(std::llround(m.hand_over_s * 1e9), 0LL, static_cast<long long>(UINT32_MAX)));
  return {fill, ns};
}

void Daemon::Impl::take_agreed(const JoinMeasure& m) {
  agreed = m.known() ? sched::Measured{static_cast<double>(m.fill_ppm) / kJoinFillWhole, static_cast<double>(m.hand_over_ns) / 1e9} : sched::Measured{};
  if (agreed.known())
    spdlog::info("the session agreed on what its ranks measured of their tree exchanges: blocks at {:.0f}% of their links' rate, {:.1f} us a phase of hand-over",
                 agreed.fill * 100, agreed.hand_over_s * 1e6);
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
      measures.push_back({model_s, took_s});
      if (measures.size() > kMeasuresKept) measures.pop_front();
    }
  } catch (const std::exception& e) {
    spdlog::warn("{}: not read ({}); the tree exchanges are measured anew", measures_path(), e.what());
  }
}

void Daemon::Impl::save_measures() const {
  if (measures.empty()) return;
  nlohmann::json j = {{"machine", topo.machine(rank).name}, {"topology", topo.source()}, {"pace_bps", pace_bps}, {"measures", nlohmann::json::array()}};
  for (const auto& m : measures) j["measures"].push_back({m.model_s, m.took_s});
  const std::string path = measures_path(), temporary = path + ".new";
  std::ofstream(temporary) << j.dump() << "\n";
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) spdlog::warn("{}: not written ({})", path, ec.message());
}

}  // namespace aapc::engine
