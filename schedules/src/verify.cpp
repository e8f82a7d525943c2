#include "aapc/sched/verify.hpp"

#include <algorithm>
#include <deque>
#include <sstream>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/tree.hpp"
#include "internal.hpp"

namespace aapc::sched {
namespace {

constexpr std::size_t kMaxListed = 20;

enum class Order : std::uint8_t { kNone, kSend, kReceive };

// What a variant promises for two contending messages in different phases, depending on
// whether they fall in the same block.
struct Promise {
  Order across = Order::kNone;  // different blocks
  Order within = Order::kNone;  // same block, different phases
  int block = 1;
};

Promise promise_of(const SyncSpec& spec) {
  switch (spec.kind) {
    case SyncKind::kSenderAll: return {Order::kSend, Order::kNone, 1};
    case SyncKind::kSenderPartial: return {Order::kSend, Order::kNone, spec.block};
    case SyncKind::kReceiverAll: return {Order::kReceive, Order::kNone, 1};
    case SyncKind::kReceiverPartial: return {Order::kReceive, Order::kNone, spec.block};
    case SyncKind::kBarrierAll: return {Order::kReceive, Order::kNone, 1};
    case SyncKind::kBarrierPartialNone: return {Order::kReceive, Order::kNone, spec.block};
    case SyncKind::kBarrierPartialSender: return {Order::kReceive, Order::kSend, spec.block};
    case SyncKind::kBarrierPartialReceiver: return {Order::kReceive, Order::kReceive, spec.block};
    default: return {};
  }
}

class Verifier {
 public:
  Verifier(const Topology& topo, const Schedule& s) : topo_(topo), s_(s), n_(topo.machine_count()), flat_(s.phases) {}

  VerifyReport run() {
    report_.phases = static_cast<std::int64_t>(s_.phases.size());
    report_.messages = flat_.size();
    if (s_.machines != n_) {
      error("schedule is for " + std::to_string(s_.machines) + " machines, the topology has " + std::to_string(n_));
      return report_;
    }
    report_.load = TreeModel(topo_).load();
    if (s_.combining()) {
      detail::verify_combine(topo_, s_, report_);
      return report_;
    }
    check_pairs();
    if (s_.contention_free) check_contention();
    if (s_.block_rate_bps > 0) check_rates();
    if (algorithm_of(s_.algorithm) == Algorithm::kTree && report_.phases != report_.load)
      error("tree schedule has " + std::to_string(report_.phases) + " phases, the load is " + std::to_string(report_.load));
    check_programs();
    if (s_.contention_free && !s_.packet_level && !one_rate(topo_) && report_.ok()) check_round_rates();
    if (report_.ok()) check_syncs();
    return report_;
  }

 private:
  std::size_t idx(int x) const { return static_cast<std::size_t>(x); }
  std::size_t pair(Rank a, Rank b) const { return idx(a) * idx(n_) + idx(b); }
  std::string name(Rank r) const { return topo_.machine(r).name; }
  std::string msg_name(const Message& m) const { return name(m.src) + "->" + name(m.dst); }

  void error(const std::string& what) {
    ++report_.error_count;
    if (report_.errors.size() < kMaxListed) report_.errors.push_back(what);
  }

  void check_pairs() {
    phase_of_.assign(idx(n_ * n_), -1);
    for (int id = 0; id < flat_.size(); ++id) {
      const Message& m = flat_.msg[idx(id)];
      int p = flat_.phase[idx(id)];
      if (m.src < 0 || m.src >= n_ || m.dst < 0 || m.dst >= n_) {
        error("phase " + std::to_string(p) + ": message " + std::to_string(m.src) + "->" + std::to_string(m.dst) + " names no machine");
        continue;
      }
      if (m.src == m.dst) {
        error("phase " + std::to_string(p) + ": " + name(m.src) + " sends to itself");
        continue;
      }
      int& slot = phase_of_[pair(m.src, m.dst)];
      if (slot != -1) {
        error(msg_name(m) + " is sent twice (phases " + std::to_string(slot) + " and " + std::to_string(p) + ")");
        continue;
      }
      slot = p;
    }
    for (Rank a = 0; a < n_; ++a)
      for (Rank b = 0; b < n_; ++b)
        if (a != b && phase_of_[pair(a, b)] == -1) error(name(a) + "->" + name(b) + " is never sent");
  }

  // Messages (and dummy messages) of a phase must not share a directed edge.
  void check_contention() {
    std::vector<std::vector<Message>> dummies(s_.phases.size());
    for (const Program& prog : s_.programs)
      for (const Round& round : prog.rounds)
        if (round.dummy)
          for (const Send& send : round.sends)
            if (send.phase >= 0 && idx(send.phase) < dummies.size()) dummies[idx(send.phase)].push_back({prog.rank, send.dst});
    std::vector<int> stamp(idx(topo_.directed_edge_count()), -1);
    std::vector<Message> owner(idx(topo_.directed_edge_count()));
    std::vector<int> sent(idx(n_), -1), received(idx(n_), -1);
    std::vector<int> path;
    const bool one_switch = topo_.single_switch();
    auto check = [&](int p, const Message& m) {
      if (m.src == m.dst || m.src < 0 || m.dst < 0 || m.src >= n_ || m.dst >= n_) return;
      if (one_switch && (sent[idx(m.src)] == p || received[idx(m.dst)] == p))
        error("phase " + std::to_string(p) + " is not a partial permutation: " + msg_name(m) + " shares a sender or receiver");
      sent[idx(m.src)] = received[idx(m.dst)] = p;
      topo_.path(topo_.machine_node(m.src), topo_.machine_node(m.dst), path);
      for (int e : path) {
        if (stamp[idx(e)] == p) {
          error("phase " + std::to_string(p) + ": " + msg_name(owner[idx(e)]) + " and " + msg_name(m) + " both use edge " + topo_.edge_name(e));
          return;
        }
        stamp[idx(e)] = p;
        owner[idx(e)] = m;
      }
    };
    for (std::size_t p = 0; p < s_.phases.size(); ++p) {
      for (const Message& m : s_.phases[p]) check(static_cast<int>(p), m);
      for (const Message& m : dummies[p]) check(static_cast<int>(p), m);
    }
  }

  // A paced schedule (Schedule::block_rate_bps): every link within its rate even if every block
  // that crosses it were in flight at once, whatever the rounds say.
  void check_rates() {
    std::vector<std::int64_t> crossing(idx(topo_.directed_edge_count()), 0);
    std::vector<int> path;
    for (int id = 0; id < flat_.size(); ++id) {
      const Message& m = flat_.msg[idx(id)];
      if (m.src == m.dst || m.src < 0 || m.dst < 0 || m.src >= n_ || m.dst >= n_) continue;
      topo_.path(topo_.machine_node(m.src), topo_.machine_node(m.dst), path);
      for (int e : path) ++crossing[idx(e)];
    }
    for (int e = 0; e < topo_.directed_edge_count(); ++e) {
      const std::uint64_t rate = topo_.links()[idx(e / 2)].rate_bps;
      const double carried = static_cast<double>(crossing[idx(e)]) * static_cast<double>(s_.block_rate_bps);
      if (carried > static_cast<double>(rate))
        error("edge " + topo_.edge_name(e) + " carries " + std::to_string(crossing[idx(e)]) + " blocks paced at " + format_rate(s_.block_rate_bps) +
              ", more than its " + format_rate(rate));
    }
  }

  // Contention-free rounds: no block leaves faster than a link on its path carries it. A block
  // gets an equal share of its sender's link, at most the paced rate and its round's cap
  // (Round::rate_bps, cap_round_rates): one block a link in a phase is within the link's rate
  // only if the block is.
  void check_round_rates() {
    std::vector<int> path;
    for (Rank c = 0; c < n_; ++c) {
      const auto& rounds = s_.programs[idx(c)].rounds;
      const Node& me = topo_.machine(c);
      if (rounds.empty() || me.links.empty()) continue;
      const auto own = static_cast<double>(topo_.links()[idx(me.links.front())].rate_bps);
      for (std::size_t r = 0; r < rounds.size(); ++r) {
        const Round& round = rounds[r];
        if (round.sends.empty()) continue;
        const double rate = block_rate(s_, round, own);
        for (const Send& send : round.sends) {
          if (send.dst == c) continue;
          topo_.path(topo_.machine_node(c), topo_.machine_node(send.dst), path);
          for (int e : path) {
            const auto link = static_cast<double>(topo_.links()[idx(e / 2)].rate_bps);
            if (rate > link * (1 + 1e-9))
              error(round_name(c, r) + ": its block to " + name(send.dst) + " leaves at " + format_rate(static_cast<std::uint64_t>(rate)) +
                    ", faster than edge " + topo_.edge_name(e) + " carries (" + format_rate(static_cast<std::uint64_t>(link)) + ")");
          }
        }
      }
    }
  }

  std::string round_name(Rank c, std::size_t r) const { return name(c) + " round " + std::to_string(r); }

  void check_programs() {
    if (s_.programs.size() != idx(n_)) {
      error("schedule has " + std::to_string(s_.programs.size()) + " programs for " + std::to_string(n_) + " machines");
      return;
    }
    msg_round_.assign(idx(n_ * n_), -1);
    for (Rank c = 0; c < n_; ++c) {
      const Program& prog = s_.programs[idx(c)];
      if (prog.rank != c) error("program " + std::to_string(c) + " says it is rank " + std::to_string(prog.rank));
      int last_phase = -1;
      for (std::size_t r = 0; r < prog.rounds.size(); ++r) {
        const Round& round = prog.rounds[r];
        if (round.dummy && s_.sync.kind != SyncKind::kDummy) error(round_name(c, r) + ": dummy round without the dummy sync variant");
        if (!s_.packet_level && !round.sends.empty()) {
          if (round.phase() < last_phase)
            error(round_name(c, r) + ": phase " + std::to_string(round.phase()) + " after phase " + std::to_string(last_phase));
          last_phase = round.phase();
        }
        for (const Send& send : round.sends) {
          Rank d = send.dst;
          if (d < 0 || d >= n_) {
            error(round_name(c, r) + ": destination " + std::to_string(d) + " is no machine");
            continue;
          }
          if (round.dummy) continue;
          if (phase_of_[pair(c, d)] != send.phase)
            error(round_name(c, r) + ": sends " + name(c) + "->" + name(d) + " as phase " + std::to_string(send.phase) +
                  ", the phases have it in " + std::to_string(phase_of_[pair(c, d)]));
          if (msg_round_[pair(c, d)] != -1) error(round_name(c, r) + ": sends " + name(c) + "->" + name(d) + " a second time");
          msg_round_[pair(c, d)] = static_cast<int>(r);
        }
      }
    }
    for (Rank a = 0; a < n_; ++a)
      for (Rank b = 0; b < n_; ++b)
        if (a != b && phase_of_[pair(a, b)] != -1 && msg_round_[pair(a, b)] == -1) error("no program sends " + name(a) + "->" + name(b));
  }

  // The emitter event whose clock a sync carries: the end of the sends of a round.
  std::pair<int, int> emitter_event(const Sync& sync) const {
    if (sync.trigger == SyncTrigger::kAfterSend) return {sync.from, sync.from_round};
    return {sync.after_src, msg_round_[pair(sync.after_src, sync.from)]};
  }

  bool check_sync_shapes() {
    const auto& syncs = s_.syncs;
    std::vector<int> waited(syncs.size(), 0), emitted(syncs.size(), 0);
    auto valid_round = [&](Rank node, int round) {
      return node >= 0 && node < n_ && round >= 0 && idx(round) < s_.programs[idx(node)].rounds.size();
    };
    for (std::size_t i = 0; i < syncs.size(); ++i) {
      const Sync& sy = syncs[i];
      auto where = [i] { return "sync " + std::to_string(i); };
      if (sy.id != i) error(where() + " has id " + std::to_string(sy.id));
      if (!valid_round(sy.to, sy.to_round)) {
        error(where() + ": waiter round does not exist");
        continue;
      }
      if (sy.trigger == SyncTrigger::kAfterSend) {
        if (!valid_round(sy.from, sy.from_round)) error(where() + ": emitting round does not exist");
      } else if (sy.from < 0 || sy.from >= n_ || sy.after_src < 0 || sy.after_src >= n_ || sy.after_src == sy.from ||
                 msg_round_[pair(sy.after_src, sy.from)] == -1) {
        error(where() + ": emitted on a receipt that no program sends");
      }
    }
    if (!report_.ok()) return false;
    for (Rank c = 0; c < n_; ++c) {
      const Program& prog = s_.programs[idx(c)];
      for (std::size_t r = 0; r < prog.rounds.size(); ++r) {
        for (std::uint32_t id : prog.rounds[r].waits) {
          if (id >= syncs.size() || syncs[id].to != c || syncs[id].to_round != static_cast<int>(r)) {
            error(name(c) + " round " + std::to_string(r) + " waits for sync " + std::to_string(id) + " that is not addressed to it");
            continue;
          }
          ++waited[id];
        }
        for (std::uint32_t id : prog.rounds[r].emits) {
          if (id >= syncs.size() || syncs[id].from != c || syncs[id].trigger != SyncTrigger::kAfterSend || syncs[id].from_round != static_cast<int>(r)) {
            error(name(c) + " round " + std::to_string(r) + " emits sync " + std::to_string(id) + " that is not its own");
            continue;
          }
          ++emitted[id];
        }
      }
      for (const auto& [src, ids] : prog.on_receive) {
        for (std::uint32_t id : ids) {
          if (id >= syncs.size() || syncs[id].from != c || syncs[id].trigger != SyncTrigger::kAfterReceive || syncs[id].after_src != src) {
            error(name(c) + " emits sync " + std::to_string(id) + " on receipt from rank " + std::to_string(src) + " but the sync says otherwise");
            continue;
          }
          ++emitted[id];
        }
      }
    }
    for (std::size_t i = 0; i < syncs.size(); ++i) {
      if (waited[i] != 1) error("sync " + std::to_string(i) + " is waited for " + std::to_string(waited[i]) + " times");
      if (emitted[i] != 1) error("sync " + std::to_string(i) + " is emitted " + std::to_string(emitted[i]) + " times");
    }
    return report_.ok();
  }

  // For each message, the earlier contending messages that must be ordered before it and how.
  std::vector<std::vector<std::pair<int, Order>>> required_orderings() const {
    std::vector<std::vector<std::pair<int, Order>>> need(idx(flat_.size()));
    Promise promise = promise_of(s_.sync);
    if (promise.across == Order::kNone && promise.within == Order::kNone) return need;
    auto users = detail::edge_users(topo_, flat_);
    for (const auto& list : users) {
      // Users grouped by block: every pair between consecutive groups, consecutive pairs
      // inside a group. By transitivity this orders every pair the variant promises.
      std::vector<std::pair<std::size_t, std::size_t>> groups;
      for (std::size_t i = 0; i < list.size();) {
        std::size_t j = i;
        int block = flat_.phase[idx(list[i])] / promise.block;
        while (j < list.size() && flat_.phase[idx(list[j])] / promise.block == block) ++j;
        groups.emplace_back(i, j);
        i = j;
      }
      for (std::size_t g = 0; g < groups.size(); ++g) {
        auto [begin, end] = groups[g];
        if (promise.within != Order::kNone)
          for (std::size_t t = begin + 1; t < end; ++t)
            if (flat_.phase[idx(list[t - 1])] != flat_.phase[idx(list[t])]) need[idx(list[t])].emplace_back(list[t - 1], promise.within);
        if (g > 0 && promise.across != Order::kNone)
          for (std::size_t y = begin; y < end; ++y)
            for (std::size_t x = groups[g - 1].first; x < groups[g - 1].second; ++x) need[idx(list[y])].emplace_back(list[x], promise.across);
      }
    }
    return need;
  }

  void check_syncs() {
    if (!check_sync_shapes()) return;
    // Without tokens there is nothing to deadlock; without a promise nothing to order.
    Promise promise = promise_of(s_.sync);
    if (s_.syncs.empty() && promise.across == Order::kNone && promise.within == Order::kNone) return;
    const auto& syncs = s_.syncs;
    // Where each receipt's tokens lead.
    std::vector<std::vector<std::pair<int, int>>> receipt_targets(idx(n_ * n_));
    for (const Sync& sy : syncs)
      if (sy.trigger == SyncTrigger::kAfterReceive) receipt_targets[pair(sy.after_src, sy.from)].emplace_back(sy.to, sy.to_round);
    auto need = required_orderings();

    // Kahn's algorithm over rounds; a round starts after the previous round of its node and
    // after every token it waits for. Clocks count, per node, the rounds whose sends are done.
    std::vector<std::size_t> rounds_per_node;
    for (const Program& prog : s_.programs) rounds_per_node.push_back(prog.rounds.size());
    detail::ClockStore clocks(n_, rounds_per_node);
    for (const Sync& sy : syncs) {
      auto [node, round] = emitter_event(sy);
      clocks.add_ref(node, round);
    }
    std::vector<std::vector<int>> indegree(idx(n_));
    std::size_t total = 0;
    std::deque<std::pair<int, int>> ready;
    for (Rank c = 0; c < n_; ++c) {
      const auto& rounds = s_.programs[idx(c)].rounds;
      total += rounds.size();
      indegree[idx(c)].resize(rounds.size());
      for (std::size_t r = 0; r < rounds.size(); ++r) {
        indegree[idx(c)][r] = (r > 0 ? 1 : 0) + static_cast<int>(rounds[r].waits.size());
        if (indegree[idx(c)][r] == 0) ready.emplace_back(c, static_cast<int>(r));
      }
    }
    auto release = [&](int node, int round) {
      if (--indegree[idx(node)][idx(round)] == 0) ready.emplace_back(node, round);
    };
    std::vector<std::uint32_t> current(idx(n_ * n_), 0);  // clock after each node's last round
    std::vector<std::uint32_t> clock(idx(n_));
    std::size_t done = 0;
    while (!ready.empty()) {
      auto [c, r] = ready.front();
      ready.pop_front();
      ++done;
      const Round& round = s_.programs[idx(c)].rounds[idx(r)];
      std::copy_n(current.begin() + static_cast<std::ptrdiff_t>(idx(c) * idx(n_)), n_, clock.begin());
      for (std::uint32_t id : round.waits) {
        auto [node, er] = emitter_event(syncs[id]);
        clocks.merge(clock.data(), node, er);
        clocks.release(node, er);
      }
      for (std::size_t i = 0; i < round.sends.size() && !round.dummy; ++i) {
        int id = message_id(c, round.sends[i].dst);
        for (const auto& [m1, order] : need[idx(id)]) check_ordering(m1, order, c, r, clock, receipt_targets);
      }
      clock[idx(c)] = static_cast<std::uint32_t>(r + 1);
      clocks.put(c, r, clock.data());
      std::copy(clock.begin(), clock.end(), current.begin() + static_cast<std::ptrdiff_t>(idx(c) * idx(n_)));
      if (idx(r) + 1 < s_.programs[idx(c)].rounds.size()) release(c, r + 1);
      for (std::uint32_t id : round.emits) release(syncs[id].to, syncs[id].to_round);
      for (std::size_t i = 0; i < round.sends.size() && !round.dummy; ++i) {
        Rank d = round.sends[i].dst;
        if (const auto* ids = s_.programs[idx(d)].emits_on_receive(c))
          for (std::uint32_t id : *ids) release(syncs[id].to, syncs[id].to_round);
      }
    }
    if (done != total) {
      for (Rank c = 0; c < n_; ++c) {
        for (std::size_t r = 0; r < indegree[idx(c)].size(); ++r) {
          if (indegree[idx(c)][r] > 0) {
            error("deadlock: " + std::to_string(total - done) + " rounds never start, e.g. " + name(c) + " round " + std::to_string(r));
            return;
          }
        }
      }
    }
  }

  int message_id(Rank src, Rank dst) {
    if (message_index_.empty()) {
      message_index_.assign(idx(n_ * n_), -1);
      for (int id = 0; id < flat_.size(); ++id) message_index_[pair(flat_.msg[idx(id)].src, flat_.msg[idx(id)].dst)] = id;
    }
    return message_index_[pair(src, dst)];
  }

  void check_ordering(int m1, Order order, Rank c, int r, const std::vector<std::uint32_t>& clock,
                      const std::vector<std::vector<std::pair<int, int>>>& receipt_targets) {
    ++report_.orderings_checked;
    const Message& first = flat_.msg[idx(m1)];
    int first_round = msg_round_[pair(first.src, first.dst)];
    bool ok = false;
    if (order == Order::kSend) {
      ok = first.src == c ? first_round < r : clock[idx(first.src)] >= static_cast<std::uint32_t>(first_round + 1);
    } else {
      for (const auto& [node, round] : receipt_targets[pair(first.src, first.dst)])
        if ((node == c && round <= r) || clock[idx(node)] >= static_cast<std::uint32_t>(round + 1)) ok = true;
    }
    if (!ok) {
      const Round& round = s_.programs[idx(c)].rounds[idx(r)];
      error(std::string("not synchronised: ") + msg_name(first) + " (phase " + std::to_string(flat_.phase[idx(m1)]) + ") may still be " +
            (order == Order::kSend ? "sending" : "in flight") + " when " + name(c) + "->" + name(round.sends.front().dst) + " (phase " +
            std::to_string(round.phase()) + ") starts, and they share a link");
    }
  }

  const Topology& topo_;
  const Schedule& s_;
  int n_;
  detail::FlatMessages flat_;
  VerifyReport report_;
  std::vector<int> phase_of_;   // pair -> phase
  std::vector<int> msg_round_;  // pair -> round in the sender's program
  std::vector<int> message_index_;
};

}  // namespace

std::string VerifyReport::summary() const {
  std::ostringstream out;
  if (ok()) {
    out << "OK: " << messages << " messages in " << phases << " phases (load " << load << ")";
    if (orderings_checked > 0) out << ", " << orderings_checked << " orderings of contending messages checked";
  } else {
    out << "FAILED: " << error_count << " error(s)";
    if (!errors.empty()) out << "; first: " << errors.front();
  }
  return out.str();
}

VerifyReport verify(const Topology& topology, const Schedule& schedule) { return Verifier(topology, schedule).run(); }

}  // namespace aapc::sched
