// alltoallv with Ranka/Wang/Fox's all-to-many decomposition. Each daemon
// knows only its own rank's send and receive sizes; the schedule of a sparse pattern depends
// on all of them. So an alltoallv that may run sparse (schedule "auto" on a tree of switches,
// "cgm", "gm", "cgm-links", "sparse") first agrees on the pattern with two small exchanges of
// its own on the next two exchange ids: every rank's sizes gathered at rank 0, which checks them
// against each other, then rank 0's verdict and every rank's destinations broadcast (Counting).
// The client's exchange takes the id after them. A group's alltoallv agrees the same
// way among its members, in its ranks, over the tree that joins them, on its slot's ids. All
// three ids are used up on every rank whatever happens, as every collective's is; a rank that
// fails a step tells the others with ABORT for the ids it will not start. All ranks decide the
// same from the same bitmaps: all-to-many permutations (sched::sparse_verdict) or the dense
// schedule, empty blocks skipped.
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
bool Daemon::Impl::counts_first(const std::string& spec, const sched::Topology& tree) {
  const std::string algorithm = sched::read_spec(spec).algorithm;
  return (algorithm == "auto" && !tree.single_switch()) || sched::forced_sparse_algorithm(algorithm).has_value();
}

bool Daemon::Impl::agreeing(std::uint32_t slot) const {
  return std::any_of(counting.begin(), counting.end(), [&](const auto& k) { return k.second.p.slot == slot; });
}

// A group closed (or closed and opened again by others) while its alltoallv agreed: what is
// left of the agreement cannot run in it.
bool Daemon::Impl::still_open(const Counting& k) const {
  if (k.p.slot == kWorldSlot) return true;
  auto g = groups.find(k.p.slot);
  return g != groups.end() && g->second.client == k.p.client && g->second.members == k.members;
}

// Starts the gather and answers START with the id the client's exchange will have.
void Daemon::Impl::launch_counted(Prepared p) {
  const std::uint32_t gather_id = take_id(p.slot);  // gather, broadcast, exchange: all used up, started or not
  Counting& k = counting[gather_id];
  k.broadcast_id = take_id(p.slot);
  k.id = take_id(p.slot);
  if (p.slot != kWorldSlot) k.members = groups.at(p.slot).members;
  const std::size_t n = p.send.size();  // the slot's ranks
  k.words = (n + 63) / 64;
  k.row.resize(2 * n);
  for (std::size_t r = 0; r < n; ++r) {
    k.row[r] = p.send[r].len;
    k.row[n + r] = p.recv[r].len;
  }
  k.verdict.assign(1 + kVerdictWords + n * k.words, 0);
  if (rank_in(p.slot) == kRoot) k.rows.assign(2 * n * n, 0);
  k.p = std::move(p);
  ClientState& c = clients[k.p.client];
  if (auto started = start_counts(k, gather_id, false); !started) {
    const std::string why = "rank " + std::to_string(rank) + " could not start the agreement on alltoallv counts";
    engine->abort_unstarted(gather_id, why, k.members);
    engine->abort_unstarted(k.broadcast_id, why, k.members);
    engine->abort_unstarted(k.id, why, k.members);
    const std::uint32_t request = k.p.request;
    counting.erase(gather_id);
    return reply_error(c.fd, request, started.error().code(), started.error().message());
  }
  ExchangeRecord& rec = exchanges[k.id] = k.p.rec;
  rec.cpu_ns = cpu_now();
  c.exchanges.insert(k.id);
  if (k.p.run) {
    rec.waiters.push_back(k.p.request);  // RUN: DONE when the client's exchange finished
  } else {
    proto::send_message(c.fd, proto::message(proto::StartedReply{k.id, rec.schedule, rec.sync}, k.p.request));
  }
}

// Starts the gather (rows to rank 0) or the broadcast (rank 0's verdict to all) of `k` as `id`,
// among the ranks of its slot.
Result<void> Daemon::Impl::start_counts(Counting& k, std::uint32_t id, bool broadcast) {
  TreeSchedules& tree = schedules_of(k.p.slot);
  const int n = tree.topo.machine_count();
  if (!tree.gather) {
    tree.gather = std::make_shared<const sched::Schedule>(sched::gather_schedule(n, kRoot));
    tree.broadcast = std::make_shared<const sched::Schedule>(sched::broadcast_schedule(n, kRoot));
  }
  ExchangeSpec spec = slot_spec(k.p.slot, broadcast ? *tree.broadcast : *tree.gather, id);
  const Rank me = rank_in(k.p.slot);
  const auto words = broadcast ? k.verdict.size() : k.row.size();
  const std::uint64_t bytes = words * sizeof(std::uint64_t);
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
    const bool to = broadcast ? me == kRoot : r == static_cast<std::size_t>(kRoot);
    const bool from = broadcast ? r == static_cast<std::size_t>(kRoot) && me != kRoot : me == kRoot;
    const std::size_t at = cluster_rank(k.p.slot, r);
    if (to) spec.send[at] = {reinterpret_cast<const std::uint8_t*>(broadcast ? k.verdict.data() : k.row.data()), bytes, nullptr};
    if (from) spec.recv[at] = {reinterpret_cast<std::uint8_t*>(broadcast ? k.verdict.data() : k.rows.data() + r * words), bytes};
  }
  spec.timeout = std::chrono::milliseconds(k.p.timeout_ms);
  spec.descriptor.kind = Collective::kAlltoallv;
  spec.descriptor.plan = "counts:" + spec.descriptor.plan;
  return engine->start(std::move(spec));
}

// Rank 0, all rows in: the verdict (what disagrees, or nothing) and every rank's destinations.
void Daemon::Impl::judge_counts(Counting& k) const {
  const std::size_t n = k.row.size() / 2;
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
    if (!k.gathered) engine->abort_unstarted(k.broadcast_id, why, k.members);
    engine->abort_unstarted(k.id, why, k.members);
  };
  if (ex == exchanges.end() || clients.count(k.p.client) == 0) {
    give_up("the client of rank " + std::to_string(rank) + " went away");
    return true;
  }
  if (!still_open(k)) {
    const std::string why =
        "group slot " + std::to_string(k.p.slot) + " closed at rank " + std::to_string(rank) + " while its alltoallv agreed on counts";
    give_up(why);
    fail_exchange(k.id, Errc::kAborted, why);
    return true;
  }
  if (rep.state != ExchangeState::kDone) {
    give_up("the agreement on alltoallv counts failed at rank " + std::to_string(rank));
    fail_exchange(k.id, rep.code, "alltoallv: the agreement on counts before it failed: " + rep.error);
    return true;
  }
  if (!k.gathered) {
    k.gathered = true;
    if (rank_in(k.p.slot) == kRoot) judge_counts(k);
    if (auto started = start_counts(k, k.broadcast_id, true); !started) {
      engine->abort_unstarted(k.id, started.error().message(), k.members);
      fail_exchange(k.id, started.error().code(), started.error().message());
      return true;
    }
    counting[k.broadcast_id] = std::move(k);
    return true;
  }
  if (auto chosen = choose_counted_schedule(k); !chosen) {
    fail_exchange(k.id, chosen.error().code(), chosen.error().message());
    return true;
  }
  ex->second.schedule = k.p.rec.schedule;
  ex->second.sync = k.p.rec.sync;
  auto started = engine->start(spec_of(k.p, k.id));
  if (!started) {
    engine->abort_unstarted(k.id, started.error().message(), k.members);
    fail_exchange(k.id, started.error().code(), started.error().message());
  }
  return true;
}

// The schedule of the agreed pattern, or why there is none: the same on every rank, which all
// hold the same verdict (and a spec that differs is found by the exchange's descriptor).
Result<void> Daemon::Impl::choose_counted_schedule(Counting& k) {
  TreeSchedules& tree = schedules_of(k.p.slot);  // the tree of the slot's ranks
  const std::size_t n = k.row.size() / 2;
  const std::size_t length = std::min<std::size_t>(k.verdict[0], kVerdictWords * sizeof(std::uint64_t));
  if (length > 0) return Error(Errc::kInvalidArgument, std::string(reinterpret_cast<const char*>(k.verdict.data() + 1), length));
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
    auto dense = k.p.schedule;  // the dense schedule for any block size (choose_schedule())
    // What the dense schedule takes, in blocks over the bottleneck: its phases, or the load for
    // one that sends every block at once (the paced shuffle's few packet slots take as long).
    const std::size_t dense_phases = std::max<std::size_t>(dense->phases.size(), static_cast<std::size_t>(tree.model.load()));
    const sched::SparseVerdict verdict = sched::sparse_verdict(tree.topo, pattern, dense_phases);
    if (!forced && !verdict.sparse) {
      k.p.rec.schedule = dense->algorithm;
      k.p.rec.sync = dense->sync.name();
      return {};
    }
    std::optional<sched::SyncSpec> sync;
    if (!spec.sync.empty() && spec.sync != "auto") sync = sched::parse_plan_spec("auto+" + spec.sync).sync;
    k.p.schedule = tree.sparse_plans.get(tree.topo, pattern, forced.value_or("sparse"), sync);
    const auto& s = *k.p.schedule;
    k.p.rec.schedule = s.algorithm + ": " + std::to_string(s.phases.size()) + " phases, " + std::to_string(s.sync_total()) +
                       " tokens (dense " + dense->algorithm + ": " + std::to_string(dense->phases.size()) + " phases, " +
                       std::to_string(dense->sync_total()) + " tokens; " + verdict.reason + ")";
    k.p.rec.sync = s.sync.name();
  } catch (const std::exception& e) {
    return Error(Errc::kInvalidArgument, std::string("alltoallv: ") + e.what());
  }
  return {};
}

// The collectives that waited for an agreement, each slot's in order, until one of the slot
// agrees in turn.
void Daemon::Impl::launch_waiting() {
  for (bool launched = true; launched;) {
    launched = false;
    std::set<std::uint32_t> held;  // slots whose first waiting collective still waits
    for (auto w = waiting_counts.begin(); w != waiting_counts.end(); ++w) {
      if (held.count(w->slot) != 0) continue;
      if (agreeing(w->slot)) {
        held.insert(w->slot);
        continue;
      }
      Prepared p = std::move(*w);
      waiting_counts.erase(w);
      if (clients.count(p.client) != 0) launch(std::move(p));
      launched = true;
      break;  // launch() may have queued again
    }
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
