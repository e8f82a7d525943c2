// alltoallv with Ranka/Wang/Fox's all-to-many decomposition (issue 14, item 3). Each daemon
// knows only its own rank's send and receive sizes; the schedule of a sparse pattern depends
// on all of them. So an alltoallv that may run sparse (schedule "auto" on a tree of switches,
// "cgm", "gm", "cgm-links", "sparse") first agrees on the pattern with two small exchanges of
// its own on the next two exchange ids: every rank's sizes gathered at rank 0, which checks them
// against each other, then rank 0's verdict and every rank's destinations broadcast (Counting).
// The client's exchange takes the id after them. All three ids are used up on every rank
// whatever happens, as every collective's is; a rank that fails a step tells the others with
// ABORT for the ids it will not start. All ranks decide the same from the same bitmaps:
// all-to-many permutations (sched::sparse_verdict) or the dense schedule, empty blocks skipped.
//
// Why gather and broadcast, 2(n-1) messages, rather than an alltoall of the counts (n(n-1)):
// on this 2-core box a 16-byte alltoall of 64 machines takes 160 ms, and the counts as an
// alltoall (1 KiB rows to everyone, then 16-byte personalised blocks) cost 390 and 200 ms
// against the sparse exchange's 650 (docs/sparse.md).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "aapc/sched/choice.hpp"
#include "daemon_impl.hpp"

namespace aapc::engine {
namespace {

constexpr std::size_t kVerdictWords = 48;  // room for the text of a disagreement (384 bytes)
constexpr sched::Rank kRoot = 0;

}  // namespace

// On one switch `auto` skips the counts: the synchronous shuffle with empty blocks skipped runs
// a sparse pattern as fast as CGM (8-one-switch, 64 KiB, 3 and 4 of 8 destinations: 17.5 and
// 23.4 ms against CGM's 17.3 and 23.2, at the bound), and the counts cost 1.5-2 ms more.
bool Daemon::Impl::counts_first(const std::string& spec) const {
  const std::string algorithm = sched::read_spec(spec).algorithm;
  return (algorithm == "auto" && !topo.single_switch()) || sched::forced_sparse_algorithm(algorithm).has_value();
}

// Starts the gather and answers START with the id the client's exchange will have.
void Daemon::Impl::launch_counted(Prepared p) {
  ClientState& c = clients[p.client];
  const std::uint32_t gather_id = next_id;
  for (int i = 0; i < 3; ++i) next_id = next_id_of(next_id);  // gather, broadcast, exchange: all used up, started or not
  const auto n = static_cast<std::size_t>(topo.machine_count());
  Counting& k = counting[gather_id];
  k.broadcast_id = next_id_of(gather_id);
  k.id = next_id_of(k.broadcast_id);
  k.words = (n + 63) / 64;
  k.row.resize(2 * n);
  for (std::size_t r = 0; r < n; ++r) {
    k.row[r] = p.send[r].len;
    k.row[n + r] = p.recv[r].len;
  }
  k.verdict.assign(1 + kVerdictWords + n * k.words, 0);
  if (rank == kRoot) k.rows.assign(2 * n * n, 0);
  auto started = start_counts(k, gather_id, false);
  if (!started) {
    const std::string why = "rank " + std::to_string(rank) + " could not start the agreement on alltoallv counts";
    engine->abort_unstarted(k.broadcast_id, why);
    engine->abort_unstarted(k.id, why);
    counting.erase(gather_id);
    return reply_error(c.fd, p.request, started.error().code(), started.error().message());
  }
  p.rec.cpu_ns = cpu_now();
  exchanges[k.id] = p.rec;
  c.exchanges.insert(k.id);
  c.started = true;
  if (p.run) {
    exchanges[k.id].waiters.push_back(p.request);  // RUN: DONE when the client's exchange finished
  } else {
    proto::send_message(c.fd, proto::message(proto::StartedReply{k.id, p.rec.schedule, p.rec.sync}, p.request));
  }
  k.p = std::move(p);
}

// Starts the gather (rows to rank 0) or the broadcast (rank 0's verdict to all) of `k` as `id`.
Result<void> Daemon::Impl::start_counts(Counting& k, std::uint32_t id, bool broadcast) {
  const int n = topo.machine_count();
  if (!gather_plan) {
    gather_plan = std::make_shared<const sched::Schedule>(sched::gather_schedule(n, kRoot));
    broadcast_plan = std::make_shared<const sched::Schedule>(sched::broadcast_schedule(n, kRoot));
  }
  const sched::Schedule& plan = broadcast ? *broadcast_plan : *gather_plan;
  ExchangeSpec spec = exchange_spec(plan, rank, id);
  const auto words = broadcast ? k.verdict.size() : k.row.size();
  const std::uint64_t bytes = words * sizeof(std::uint64_t);
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
    const bool to = broadcast ? rank == kRoot : r == static_cast<std::size_t>(kRoot);
    const bool from = broadcast ? r == static_cast<std::size_t>(kRoot) && rank != kRoot : rank == kRoot;
    if (to) spec.send[r] = {reinterpret_cast<const std::uint8_t*>(broadcast ? k.verdict.data() : k.row.data()), bytes, nullptr};
    if (from) spec.recv[r] = {reinterpret_cast<std::uint8_t*>(broadcast ? k.verdict.data() : k.rows.data() + r * words), bytes};
  }
  spec.timeout = std::chrono::milliseconds(k.p.timeout_ms);
  spec.descriptor.kind = Collective::kAlltoallv;
  spec.descriptor.plan = "counts:" + spec.descriptor.plan;
  return engine->start(std::move(spec));
}

// Rank 0, all rows in: the verdict (what disagrees, or nothing) and every rank's destinations.
void Daemon::Impl::judge_counts(Counting& k) const {
  const auto n = static_cast<std::size_t>(topo.machine_count());
  std::vector<std::vector<std::uint64_t>> send(n), recv(n);
  for (std::size_t r = 0; r < n; ++r) {
    const std::uint64_t* row = k.rows.data() + r * 2 * n;
    send[r].assign(row, row + n);
    recv[r].assign(row + n, row + 2 * n);
    for (std::size_t j = 0; j < n; ++j)
      if (send[r][j] > 0 && j != r) k.verdict[1 + kVerdictWords + r * k.words + j / 64] |= std::uint64_t{1} << (j % 64);
  }
  std::string text = sched::sizes_mismatch(send, recv);
  if (!text.empty()) text = "alltoallv counts disagree: " + text;
  text.resize(std::min(text.size(), kVerdictWords * sizeof(std::uint64_t)));
  k.verdict[0] = text.size();
  std::memcpy(k.verdict.data() + 1, text.data(), text.size());
}

// When `rep` is a step of an agreement: the next step, or the client's exchange with the
// schedule its pattern calls for, or a failure with why (the peers told). False for every other
// exchange.
bool Daemon::Impl::counted(const ExchangeReport& rep) {
  auto it = counting.find(rep.id);
  if (it == counting.end()) return false;
  Counting k = std::move(it->second);
  counting.erase(it);
  auto ex = exchanges.find(k.id);
  auto give_up = [&](const std::string& why) {
    if (!k.gathered) engine->abort_unstarted(k.broadcast_id, why);
    engine->abort_unstarted(k.id, why);
  };
  if (ex == exchanges.end() || clients.count(k.p.client) == 0) {
    give_up("the client of rank " + std::to_string(rank) + " went away");
    return true;
  }
  if (rep.state != ExchangeState::kDone) {
    give_up("the agreement on alltoallv counts failed at rank " + std::to_string(rank));
    fail_exchange(k.id, rep.code, "alltoallv: the agreement on counts before it failed: " + rep.error);
    return true;
  }
  if (!k.gathered) {
    k.gathered = true;
    if (rank == kRoot) judge_counts(k);
    if (auto started = start_counts(k, k.broadcast_id, true); !started) {
      engine->abort_unstarted(k.id, started.error().message());
      fail_exchange(k.id, started.error().code(), started.error().message());
      return true;
    }
    counting[k.broadcast_id] = std::move(k);
    return true;
  }
  if (auto why = plan_counted(k)) {
    fail_exchange(k.id, Errc::kInvalidArgument, *why);
    return true;
  }
  ex->second.schedule = k.p.rec.schedule;
  ex->second.sync = k.p.rec.sync;
  auto started = engine->start(spec_of(k.p, k.id));
  if (!started) {
    engine->abort_unstarted(k.id, started.error().message());
    fail_exchange(k.id, started.error().code(), started.error().message());
  }
  return true;
}

// The schedule of the agreed pattern, or why there is none: the same on every rank, which all
// hold the same verdict (and a spec that differs is found by the exchange's descriptor).
std::optional<std::string> Daemon::Impl::plan_counted(Counting& k) {
  const auto n = static_cast<std::size_t>(topo.machine_count());
  const std::size_t length = std::min<std::size_t>(k.verdict[0], kVerdictWords * sizeof(std::uint64_t));
  if (length > 0) return std::string(reinterpret_cast<const char*>(k.verdict.data() + 1), length);
  sched::SparsePattern pattern;
  pattern.n = static_cast<int>(n);
  pattern.dsts.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t* bits = k.verdict.data() + 1 + kVerdictWords + i * k.words;
    for (std::size_t j = 0; j < n; ++j)
      if ((bits[j / 64] >> (j % 64) & 1) != 0 && j != i) pattern.dsts[i].push_back(static_cast<sched::Rank>(j));
  }
  try {
    const sched::SpecText spec = sched::read_spec(k.p.spec);
    const auto forced = sched::forced_sparse_algorithm(spec.algorithm);
    auto dense = k.p.plan;  // the dense schedule for any block size (plan())
    const sched::SparseVerdict verdict = sched::sparse_verdict(topo, pattern, dense->phases.size());
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

// The collectives that waited for an agreement, in order, until one agrees in turn.
void Daemon::Impl::launch_waiting() {
  while (counting.empty() && !waiting_counts.empty()) {
    Prepared p = std::move(waiting_counts.front());
    waiting_counts.pop_front();
    if (clients.count(p.client) != 0) launch(std::move(p));
  }
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
