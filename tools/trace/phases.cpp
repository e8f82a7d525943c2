// Phases: rounds against their tokens, the plan given or inferred, phases in time.
#include "aapc/trace/trace.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/sync.hpp"
#include "internal.hpp"

namespace aapc::trace {

namespace fs = std::filesystem;
using engine::FrameType;
using namespace detail;

// --- phases -------------------------------------------------------------------------------

namespace {

struct Token {
  Rank from, to;
  std::uint32_t id;
  auto operator<=>(const Token&) const = default;
};

std::set<Token> wire_tokens(const sched::Schedule& s) {
  std::set<Token> out;
  for (const auto& y : s.syncs)
    if (y.from != y.to) out.insert({y.from, y.to, y.id});
  return out;
}

// Every sync variant, with the block sizes worth trying for the partial ones.
std::vector<sched::SyncSpec> sync_candidates() {
  std::vector<sched::SyncSpec> out;
  for (const auto& name : sched::SyncSpec::names()) {
    auto base = sched::SyncSpec::parse(name);
    if (!base) continue;
    if (!base->partial()) {
      out.push_back(*base);
      continue;
    }
    for (int bs : {2, 4, 8, 16}) {
      auto s = *base;
      s.block = bs;
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace

namespace {

// What the wire shows of an exchange: tokens (from, to, id), and the phase of every block.
struct WireView {
  std::set<Token> seen;
  std::map<std::pair<Rank, Rank>, int> block_phase;
};

WireView wire_view(const Trace& trace, std::uint32_t exchange) {
  WireView w;
  for (const auto& c : trace.captures())
    for (const auto& f : c.frames) {
      if (f.h.exchange != exchange || !f.sound()) continue;
      if (f.h.type == FrameType::kSync && (f.tx || trace.capture_of(f.h.src) == nullptr)) w.seen.insert({f.h.src, f.h.dst, f.h.seq});
      if (f.data() && !f.dummy() && f.h.phase != engine::kNoPhase) w.block_phase[{f.h.src, f.h.dst}] = f.h.phase;
    }
  if (w.block_phase.empty()) throw TraceError("exchange " + std::to_string(exchange) + " carried no data with phases (a barrier?): nothing to check");
  return w;
}

// Whether every block seen went in the phase `s` gives it.
bool phases_match(const sched::Schedule& s, const std::map<std::pair<Rank, Rank>, int>& block_phase) {
  for (std::size_t p = 0; p < s.phases.size(); ++p)
    for (const auto& m : s.phases[p]) {
      auto it = block_phase.find({m.src, m.dst});
      if (it != block_phase.end() && it->second != static_cast<int>(p)) return false;
    }
  return true;
}

// The plan of --schedule, checked against the phases on the wire.
sched::Schedule given_plan(const sched::Topology& topo, const std::string& schedule, const WireView& wire, std::uint32_t exchange, PhaseReport& rep) {
  std::optional<sched::Schedule> plan;
  std::optional<sched::AlgorithmSpec> algo;
  std::optional<sched::SyncSpec> sync;
  try {
    auto given = sched::parse_plan_spec(schedule);
    algo = given.algorithm;
    sync = given.sync.value_or(sched::SyncSpec{});  // none: a trace has no block size to choose by
  } catch (const std::invalid_argument&) {
  }
  if (!algo) throw TraceError("--schedule " + schedule + ": give ALGORITHM[+SYNC], e.g. tree+sender-all");
  try {
    plan = sched::plan_sync(topo, sched::make_schedule(topo, *algo), *sync);
  } catch (const std::exception& e) {
    throw TraceError("--schedule " + schedule + ": " + e.what());
  }
  rep.schedule = sched::format_plan_spec(*algo, *sync);
  rep.how = "given";
  if (!phases_match(*plan, wire.block_phase)) throw TraceError("--schedule " + schedule + ": the phases of the DATA frames of exchange " + std::to_string(exchange) + " are not its phases");
  return std::move(*plan);
}

// The plan of the first algorithm and sync variant whose phases and tokens the wire shows.
sched::Schedule inferred_plan(const Trace& trace, const WireView& wire, std::uint32_t exchange, PhaseReport& rep) {
  const auto& topo = trace.topology();
  std::optional<sched::Schedule> plan;
  std::vector<std::string> matches;
  for (const auto& name : sched::AlgorithmSpec::names()) {
    auto algo = sched::AlgorithmSpec::parse(name);
    if (!algo) continue;
    sched::Schedule base;
    try {
      base = sched::make_schedule(topo, *algo);
    } catch (const std::exception&) {
      continue;  // does not apply to this topology
    }
    if (base.packet_level || !phases_match(base, wire.block_phase)) continue;
    for (const auto& sync : sync_candidates()) {
      sched::Schedule s;
      try {
        s = sched::plan_sync(topo, base, sync);
      } catch (const std::exception&) {
        continue;
      }
      auto expected = wire_tokens(s);
      // Every token seen is in the plan, and every planned token between captured nodes was seen.
      bool ok = std::includes(expected.begin(), expected.end(), wire.seen.begin(), wire.seen.end());
      for (const auto& t : expected)
        if (ok && trace.capture_of(t.from) != nullptr && wire.seen.count(t) == 0) ok = false;
      if (!ok) continue;
      matches.push_back(sched::format_plan_spec(*algo, sync));
      if (!plan) plan = std::move(s);
    }
  }
  if (!plan)
    throw TraceError("exchange " + std::to_string(exchange) + ": no schedule and sync variant of aapc explains its " + std::to_string(wire.seen.size()) +
                     " tokens and phases; give --schedule ALGORITHM+SYNC");
  rep.schedule = matches.front();
  rep.how = "inferred from " + std::to_string(wire.seen.size()) + " tokens and " + std::to_string(wire.block_phase.size()) + " blocks";
  if (matches.size() > 1) {
    rep.how += "; the same tokens fit";
    for (std::size_t i = 1; i < matches.size() && i < 4; ++i) rep.how += " " + matches[i];
    if (matches.size() > 4) rep.how += " ...";
  }
  return std::move(*plan);
}

// Rounds against their tokens, on each node's own clock.
void check_rounds(const Trace& trace, const sched::Schedule& plan, std::uint32_t exchange, PhaseReport& rep) {
  std::map<std::uint32_t, const sched::Sync*> sync_by_id;
  for (const auto& y : plan.syncs) sync_by_id[y.id] = &y;
  for (const auto& c : trace.captures()) {
    const auto& prog = plan.programs.at(static_cast<std::size_t>(c.node));
    std::map<std::uint32_t, std::int64_t> token_at;                     // first arrival of each token
    std::map<std::pair<Rank, int>, std::int64_t> first_send;            // (dst, phase) -> first DATA sent
    for (const auto& f : c.frames) {
      if (f.h.exchange != exchange || !f.sound()) continue;
      if (!f.tx && f.h.type == FrameType::kSync) token_at.try_emplace(f.h.seq, f.at);
      if (f.tx && f.data()) first_send.try_emplace({f.h.dst, f.h.phase == engine::kNoPhase ? -1 : f.h.phase}, f.at);
    }
    for (std::size_t r = 0; r < prog.rounds.size(); ++r) {
      const auto& round = prog.rounds[r];
      RoundCheck rc;
      rc.node = c.node;
      rc.round = static_cast<int>(r);
      rc.phase = round.phase();
      for (std::uint32_t id : round.waits) {
        auto y = sync_by_id.find(id);
        if (y == sync_by_id.end() || y->second->from == c.node) continue;  // local ordering
        rc.waits.push_back(id);
        auto t = token_at.find(id);
        if (t == token_at.end()) {
          rc.missing_token = true;
        } else {
          rc.tokens_arrived = std::max(rc.tokens_arrived, t->second);
        }
      }
      if (rc.waits.empty()) continue;
      rc.started = kNever;
      for (const auto& s : round.sends) {
        auto it = first_send.find({s.dst, s.phase});
        if (it != first_send.end()) rc.started = std::min(rc.started, it->second);
      }
      if (rc.started == kNever) continue;  // nothing sent in this round (dummy or empty blocks)
      rep.missing_tokens += rc.missing_token ? 1 : 0;
      rep.early_rounds += rc.early() ? 1 : 0;
      rep.rounds.push_back(rc);
    }
  }
}

// Phases in time, and how much consecutive ones overlapped (and contended).
void phase_spans(const Trace& trace, std::uint32_t exchange, PhaseReport& rep) {
  auto blocks = blocks_of(trace, exchange);
  std::map<int, PhaseSpan> spans;
  for (const auto& b : blocks) {
    if (b.phase < 0 || b.dummy) continue;
    auto [it, fresh] = spans.try_emplace(b.phase, PhaseSpan{b.phase, b.start, b.end, 0, 0});
    if (!fresh) it->second.start = std::min(it->second.start, b.start), it->second.end = std::max(it->second.end, b.end);
  }
  std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> contended;
  for (const auto& c : contention_of(trace.topology(), blocks))
    if (std::abs(c.a.phase - c.b.phase) == 1) contended[std::min(c.a.phase, c.b.phase)].emplace_back(c.from, c.to);
  for (auto it = spans.begin(); it != spans.end(); ++it) {
    auto next = std::next(it);
    if (next != spans.end()) it->second.overlap_next_ns = std::max<std::int64_t>(0, it->second.end - next->second.start);
    it->second.contended_ns = covered(contended[it->first]);
    rep.phases.push_back(it->second);
  }
}

}  // namespace

PhaseReport phases(const Trace& trace, std::uint32_t exchange, const std::string& schedule) {
  PhaseReport rep;
  rep.exchange = exchange;
  const WireView wire = wire_view(trace, exchange);
  const sched::Schedule plan = schedule.empty() ? inferred_plan(trace, wire, exchange, rep) : given_plan(trace.topology(), schedule, wire, exchange, rep);
  check_rounds(trace, plan, exchange, rep);
  phase_spans(trace, exchange, rep);
  return rep;
}

}  // namespace aapc::trace
