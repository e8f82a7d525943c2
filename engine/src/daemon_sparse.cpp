// alltoallv with Ranka/Wang/Fox's all-to-many decomposition (issue 14, item 3). Each daemon
// knows only its own rank's send and receive sizes; the schedule of a sparse pattern depends
// on all of them. So an alltoallv that may run sparse (schedule "auto", "cgm", "gm",
// "cgm-links", "sparse") first runs a small internal exchange on the next exchange id: every
// rank sends each rank the size of its block for it and the bitmap of its destinations
// (Counting); the client's exchange takes the id after it. Both ids are used up on every rank
// whatever happens, as every collective's is. Each rank checks the sizes it is sent against
// those it expects (a rank that finds a difference fails and tells the others with ABORT), and
// all decide the same from the same bitmaps: all-to-many permutations (sched::sparse_verdict)
// or the dense schedule with empty blocks skipped.
//
// Why personalised blocks of 8 + n/8 bytes rather than every rank's whole row of sizes to every
// rank (2n x 8 bytes): an allgather done as an alltoall carries load x row over the bottleneck,
// and at 64 machines (load 448, 25 Mbit/s) the 1 KiB rows took 390 ms, more than half the
// sparse exchange itself (650 ms).
#include <spdlog/spdlog.h>

#include <cstring>

#include "aapc/sched/choice.hpp"
#include "daemon_impl.hpp"

namespace aapc::engine {

// On one switch `auto` skips the counts: the synchronous shuffle with empty blocks skipped runs
// a sparse pattern as fast as CGM (8-one-switch, 64 KiB, 3 and 4 of 8 destinations: 17.5 and
// 23.4 ms against CGM's 17.3 and 23.2, at the bound), and the counts cost 1.5-2 ms more.
bool Daemon::Impl::counts_first(const std::string& spec) const {
  const std::string algorithm = sched::read_spec(spec).algorithm;
  return (algorithm == "auto" && !topo.single_switch()) || sched::forced_sparse_algorithm(algorithm).has_value();
}

// Starts the counts exchange and answers START with the id the client's exchange will have.
void Daemon::Impl::launch_counted(Prepared p) {
  ClientState& c = clients[p.client];
  const std::uint32_t counts_id = next_id, id = next_id + 1;
  next_id += 2;  // both used up, started or not
  const auto n = static_cast<std::size_t>(topo.machine_count());
  Counting& k = counting[counts_id];
  k.id = id;
  k.words = 1 + (n + 63) / 64;
  k.out.assign(n * k.words, 0);
  k.in.assign(n * k.words, 0);
  for (std::size_t j = 0; j < n; ++j) {
    k.out[j * k.words] = p.send[j].len;
    if (p.send[j].len > 0 && j != static_cast<std::size_t>(rank))
      for (std::size_t b = 0; b < n; ++b) k.out[b * k.words + 1 + j / 64] |= std::uint64_t{1} << (j % 64);
  }
  const std::uint64_t bytes = k.words * sizeof(std::uint64_t);
  // What `auto` runs for blocks this small, so that the counts gain from every improvement of
  // small exchanges. (The synchronous shuffle instead of auto's pairwise exchange made no
  // difference at 64 machines: 16-byte exchanges took 170 and 159 ms, docs/sparse.md.)
  const sched::Choice choice = sched::auto_choice(*model, bytes);
  auto plan = schedule(choice.algorithm, choice.sync);
  ExchangeSpec spec = exchange_spec(*plan, rank, counts_id);
  for (std::size_t r = 0; r < n; ++r) {
    spec.send[r] = {reinterpret_cast<const std::uint8_t*>(k.out.data() + r * k.words), bytes, nullptr};
    spec.recv[r] = {reinterpret_cast<std::uint8_t*>(k.in.data() + r * k.words), bytes};
  }
  spec.timeout = std::chrono::milliseconds(p.timeout_ms);
  spec.token_slack = token_slack(slack_buffer, plan->phases.size(), pace_bps);
  spec.descriptor.kind = Collective::kAlltoallv;
  spec.descriptor.plan = "counts:" + spec.descriptor.plan;
  auto started = engine->start(std::move(spec));
  if (!started) {
    counting.erase(counts_id);
    engine->abort_unstarted(id, "rank " + std::to_string(rank) + " could not start the exchange of alltoallv counts");
    return reply_error(c.fd, p.request, started.error().code(), started.error().message());
  }
  p.rec.cpu_ns = cpu_now();
  exchanges[id] = p.rec;
  c.exchanges.insert(id);
  c.started = true;
  proto::send_message(c.fd, proto::message(proto::StartedReply{id, p.rec.schedule, p.rec.sync}, p.request));
  k.p = std::move(p);
}

// When `rep` is a counts exchange: the client's exchange starts with the schedule its pattern
// calls for, or fails with why (and the peers are told). False for every other exchange.
bool Daemon::Impl::counted(const ExchangeReport& rep) {
  auto it = counting.find(rep.id);
  if (it == counting.end()) return false;
  Counting k = std::move(it->second);
  counting.erase(it);
  auto ex = exchanges.find(k.id);
  if (ex == exchanges.end() || clients.count(k.p.client) == 0) {
    engine->abort_unstarted(k.id, "the client of rank " + std::to_string(rank) + " went away");
    return true;
  }
  if (rep.state != ExchangeState::kDone) {
    engine->abort_unstarted(k.id, "the exchange of alltoallv counts failed at rank " + std::to_string(rank));
    fail_exchange(k.id, rep.code, "alltoallv: the exchange of counts before it failed: " + rep.error);
    return true;
  }
  if (auto why = plan_counted(k)) {
    engine->abort_unstarted(k.id, *why);
    fail_exchange(k.id, Errc::kInvalidArgument, *why);
    return true;
  }
  ex->second.schedule = k.p.rec.schedule;
  ex->second.sync = k.p.rec.sync;
  auto started = engine->start(spec_of(k.p, k.id));
  if (!started) fail_exchange(k.id, started.error().code(), started.error().message());
  return true;
}

// The schedule of the agreed pattern, or why there is none. The same on every rank: the
// bitmaps and the spec are (a spec that differs is found by the exchange's descriptor).
std::optional<std::string> Daemon::Impl::plan_counted(Counting& k) {
  const auto n = static_cast<std::size_t>(topo.machine_count());
  std::vector<std::uint64_t> sent(n), expected(n);
  sched::SparsePattern pattern;
  pattern.n = static_cast<int>(n);
  pattern.dsts.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t* block = k.in.data() + i * k.words;
    sent[i] = block[0];
    expected[i] = k.p.recv[i].len;
    for (std::size_t j = 0; j < n; ++j)
      if ((block[1 + j / 64] >> (j % 64) & 1) != 0 && j != i) pattern.dsts[i].push_back(static_cast<sched::Rank>(j));
  }
  if (const std::string m = sched::column_mismatch(rank, sent, expected); !m.empty()) return "alltoallv counts disagree: " + m;
  try {
    const sched::SpecText spec = sched::read_spec(k.p.spec);
    const auto forced = sched::forced_sparse_algorithm(spec.algorithm);
    const sched::SparseVerdict verdict = sched::sparse_verdict(pattern);
    auto dense = k.p.plan;  // the dense schedule for any block size (plan())
    if (!forced && !verdict.sparse) {
      k.p.rec.schedule = dense->algorithm;
      k.p.rec.sync = dense->sync.name();
      return std::nullopt;
    }
    std::optional<sched::SyncSpec> sync;
    if (!spec.sync.empty() && spec.sync != "auto") sync = sched::parse_plan_spec("auto+" + spec.sync).sync;
    k.p.plan = sparse_plans.get(topo, pattern, forced.value_or("sparse"), sync);
    const auto& s = *k.p.plan;
    k.p.rec.schedule = s.algorithm + ": " + std::to_string(s.phases.size()) + " phases, " + std::to_string(s.syncs.size()) +
                       " tokens (dense " + dense->algorithm + ": " + std::to_string(dense->phases.size()) + " phases, " +
                       std::to_string(dense->syncs.size()) + " tokens; " + verdict.reason + ")";
    k.p.rec.sync = s.sync.name();
  } catch (const std::exception& e) {
    return std::string("alltoallv: ") + e.what();
  }
  return std::nullopt;
}

// The client's exchange `id`, never started, fails with `why`.
void Daemon::Impl::fail_exchange(std::uint32_t id, Errc code, const std::string& why) {
  ExchangeReport rep;
  rep.id = id;
  rep.state = ExchangeState::kFailed;
  rep.code = code;
  rep.error = why;
  finished(rep);
}

}  // namespace aapc::engine
