#include "aapc/sched/sync.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "internal.hpp"

namespace aapc::sched {
namespace {

using detail::Level;
using detail::Variant;
using detail::variant_of;

int ceil_log2(int n) {
  int s = 0;
  while ((1 << s) < n) ++s;
  return s;
}

// Faraj/Yuan/Patarasuk section 5, 'dummy': for each machine idle in a phase, a dummy message
// to a machine on the same switch that receives nothing in that phase, else to itself.
void add_dummies(const Topology& topo, Schedule& s) {
  const int n = s.machines;
  std::vector<std::vector<Round>> extra(static_cast<std::size_t>(n));
  for (std::size_t p = 0; p < s.phases.size(); ++p) {
    std::vector<bool> sends(static_cast<std::size_t>(n), false), receives(static_cast<std::size_t>(n), false);
    for (const Message& m : s.phases[p]) {
      sends[static_cast<std::size_t>(m.src)] = true;
      receives[static_cast<std::size_t>(m.dst)] = true;
    }
    for (Rank x = 0; x < n; ++x) {
      if (sends[static_cast<std::size_t>(x)]) continue;
      Rank partner = x;
      int sw = topo.switch_of(x);
      for (Rank y = 0; y < n && sw >= 0; ++y) {
        if (y != x && !receives[static_cast<std::size_t>(y)] && topo.switch_of(y) == sw) {
          partner = y;
          break;
        }
      }
      receives[static_cast<std::size_t>(partner)] = true;
      Round round;
      round.sends.push_back({partner, static_cast<int>(p)});
      round.dummy = true;
      extra[static_cast<std::size_t>(x)].push_back(std::move(round));
      ++s.sync_stats.dummy_messages;
    }
  }
  for (Rank x = 0; x < n; ++x) {
    auto& rounds = s.programs[static_cast<std::size_t>(x)].rounds;
    rounds.insert(rounds.end(), extra[static_cast<std::size_t>(x)].begin(), extra[static_cast<std::size_t>(x)].end());
    std::stable_sort(rounds.begin(), rounds.end(), [](const Round& a, const Round& b) { return a.phase() < b.phase(); });
  }
}

class SyncPlanner {
 public:
  SyncPlanner(const Topology& topo, Schedule& s, Variant v)
      : topo_(topo), s_(s), v_(v), n_(s.machines), flat_(s.phases) {}

  void run() {
    build_programs();
    add_barrier_syncs();
    add_requirements();
    process();
    finish();
  }

 private:
  struct Req {
    int msg;  // the earlier message; the later one is the round's own
    Level level;
  };
  struct FixedWait {
    int from_node, from_round;  // whose clock the token carries
  };

  std::size_t idx(int x) const { return static_cast<std::size_t>(x); }

  bool barrier_after(int p) const {
    return v_.barrier && (p + 1) % v_.block == 0 && p + 1 < static_cast<int>(s_.phases.size());
  }

  void build_programs() {
    stages_ = ceil_log2(n_);
    std::vector<std::vector<int>> sent_by(idx(n_));
    for (int id = 0; id < flat_.size(); ++id) sent_by[idx(flat_.msg[idx(id)].src)].push_back(id);
    msg_round_.assign(idx(flat_.size()), -1);
    const int phases = static_cast<int>(s_.phases.size());
    for (Rank c = 0; c < n_; ++c) {
      Program& prog = s_.programs[idx(c)];
      prog = Program{};
      prog.rank = c;
      std::size_t next = 0;
      const auto& mine = sent_by[idx(c)];
      std::vector<std::vector<int>> barrier_rounds;
      for (int p = 0; p < phases; ++p) {
        while (next < mine.size() && flat_.phase[idx(mine[next])] == p) {
          Round round;
          round.sends.push_back({flat_.msg[idx(mine[next])].dst, p});
          msg_round_[idx(mine[next])] = static_cast<int>(prog.rounds.size());
          prog.rounds.push_back(std::move(round));
          ++next;
        }
        if (barrier_after(p)) {
          std::vector<int> stage_rounds;
          for (int st = 0; st < stages_; ++st) {
            stage_rounds.push_back(static_cast<int>(prog.rounds.size()));
            prog.rounds.emplace_back();
          }
          barrier_rounds.push_back(std::move(stage_rounds));
        }
      }
      barrier_round_.push_back(std::move(barrier_rounds));
    }
    fixed_.assign(idx(n_), {});
    std::vector<std::size_t> rounds;
    for (Rank c = 0; c < n_; ++c) {
      fixed_[idx(c)].resize(s_.programs[idx(c)].rounds.size());
      rounds.push_back(s_.programs[idx(c)].rounds.size());
    }
    clocks_.emplace(n_, rounds);
    kept_recv_.assign(idx(flat_.size()), {});
  }

  std::uint32_t new_sync(Sync sync) {
    sync.id = static_cast<std::uint32_t>(s_.syncs.size());
    Program& waiter = s_.programs[idx(sync.to)];
    waiter.rounds[idx(sync.to_round)].waits.push_back(sync.id);
    if (sync.trigger == SyncTrigger::kAfterSend) {
      s_.programs[idx(sync.from)].rounds[idx(sync.from_round)].emits.push_back(sync.id);
    } else {
      on_receive_[idx(sync.from)][sync.after_src].push_back(sync.id);
    }
    s_.syncs.push_back(sync);
    return sync.id;
  }

  // Dissemination barrier (stage s: i signals i+2^s, waits for i-2^s); stage 0 also waits,
  // locally, for every block the node received in the block just ended.
  void add_barrier_syncs() {
    on_receive_.assign(idx(n_), {});
    if (!v_.barrier) return;
    std::vector<std::vector<int>> received_by(idx(n_));
    for (int id = 0; id < flat_.size(); ++id) received_by[idx(flat_.msg[idx(id)].dst)].push_back(id);
    const std::size_t barriers = barrier_round_.empty() ? 0 : barrier_round_[0].size();
    s_.sync_stats.barriers = static_cast<std::int64_t>(barriers);
    for (std::size_t b = 0; b < barriers; ++b) {
      for (Rank c = 0; c < n_; ++c) {
        int r0 = barrier_round_[idx(c)][b][0];
        for (int id : received_by[idx(c)]) {
          if (flat_.phase[idx(id)] / v_.block != static_cast<int>(b)) continue;
          const Message& m = flat_.msg[idx(id)];
          new_sync({0, c, c, SyncTrigger::kAfterReceive, -1, m.src, r0});
          add_fixed(c, r0, m.src, msg_round_[idx(id)]);
          kept_recv_[idx(id)].emplace_back(c, r0);
        }
      }
      for (int st = 0; st < stages_; ++st) {
        for (Rank c = 0; c < n_; ++c) {
          Rank d = static_cast<Rank>((c + (1 << st)) % n_);
          int from_round = barrier_round_[idx(c)][b][idx(st)];
          int to_round = st + 1 < stages_ ? barrier_round_[idx(d)][b][idx(st + 1)] : barrier_round_[idx(d)][b][idx(st)] + 1;
          if (to_round >= static_cast<int>(s_.programs[idx(d)].rounds.size())) continue;  // d has nothing left to do
          new_sync({0, c, d, SyncTrigger::kAfterSend, from_round, -1, to_round});
          add_fixed(d, to_round, c, from_round);
          ++s_.sync_stats.barrier_tokens;
        }
      }
    }
  }

  void add_fixed(int node, int round, int from_node, int from_round) {
    fixed_[idx(node)][idx(round)].push_back({from_node, from_round});
    clocks_->add_ref(from_node, from_round);
  }

  // Two messages need ordering only if they share a directed edge; along each edge it is
  // enough to order consecutive users (or consecutive blocks of users), the rest follows.
  void add_requirements() {
    reqs_.assign(idx(flat_.size()), {});
    if (v_.level == Level::kNone) return;
    auto users = detail::edge_users(topo_, flat_);
    auto block = [&](int id) { return flat_.phase[idx(id)] / v_.block; };
    for (const auto& list : users) {
      if (v_.across) {
        // All pairs between consecutive non-empty blocks.
        std::size_t g = 0;
        std::size_t prev_begin = 0, prev_end = 0;
        bool have_prev = false;
        while (g < list.size()) {
          std::size_t end = g;
          while (end < list.size() && block(list[end]) == block(list[g])) ++end;
          if (have_prev)
            for (std::size_t y = g; y < end; ++y)
              for (std::size_t x = prev_begin; x < prev_end; ++x) reqs_[idx(list[y])].push_back({list[x], v_.level});
          prev_begin = g;
          prev_end = end;
          have_prev = true;
          g = end;
        }
      } else {
        for (std::size_t t = 1; t < list.size(); ++t) {
          int a = list[t - 1], b = list[t];
          if (block(a) == block(b) && flat_.phase[idx(a)] != flat_.phase[idx(b)]) reqs_[idx(b)].push_back({a, v_.level});
        }
      }
    }
    for (auto& list : reqs_) {
      std::sort(list.begin(), list.end(), [](const Req& a, const Req& b) { return a.msg < b.msg; });
      list.erase(std::unique(list.begin(), list.end(), [](const Req& a, const Req& b) { return a.msg == b.msg; }), list.end());
      s_.sync_stats.consecutive_pairs += static_cast<std::int64_t>(list.size());
      for (const Req& r : list) clocks_->add_ref(flat_.msg[idx(r.msg)].src, msg_round_[idx(r.msg)]);
    }
    const int bs = v_.block;
    s_.sync_stats.contending_pairs =
        v_.across ? detail::count_contending_pairs(topo_, flat_, users, [bs](int p) { return p / bs; })
                  : detail::count_contending_pairs(topo_, flat_, users, [](int p) { return p; });
  }

  // Is the ordering "m1 done before round (c, r) starts" already implied by `clock` and the
  // receiver tokens kept so far (plus those in `chosen` for this round)?
  bool satisfied(const Req& req, int c, int r, const std::vector<std::uint32_t>& clock, const std::vector<Req>& chosen) const {
    const Message& m1 = flat_.msg[idx(req.msg)];
    if (req.level == Level::kSend)
      return m1.src == c || clock[idx(m1.src)] >= static_cast<std::uint32_t>(msg_round_[idx(req.msg)] + 1);
    for (const Req& x : chosen)
      if (x.msg == req.msg) return true;
    for (const auto& [node, round] : kept_recv_[idx(req.msg)])
      if ((node == c && round <= r) || clock[idx(node)] >= static_cast<std::uint32_t>(round + 1)) return true;
    return false;
  }

  bool all_satisfied(const std::vector<Req>& reqs, int c, int r, const std::vector<std::uint32_t>& clock, const std::vector<Req>& chosen) const {
    return std::all_of(reqs.begin(), reqs.end(), [&](const Req& q) { return satisfied(q, c, r, clock, chosen); });
  }

  void merge_msg_clock(std::vector<std::uint32_t>& clock, int msg) const {
    clocks_->merge(clock.data(), flat_.msg[idx(msg)].src, msg_round_[idx(msg)]);
  }

  void process_round(Rank c, int r, int msg) {
    std::vector<std::uint32_t>& base = base_;
    base = vc_[idx(c)];
    for (const FixedWait& w : fixed_[idx(c)][idx(r)]) {
      clocks_->merge(base.data(), w.from_node, w.from_round);
      clocks_->release(w.from_node, w.from_round);
    }
    std::vector<std::uint32_t>& clock = clock_;
    clock = base;
    if (msg >= 0 && !reqs_[idx(msg)].empty()) {
      const auto& reqs = reqs_[idx(msg)];
      std::vector<Req> pending;
      for (const Req& q : reqs)
        if (!satisfied(q, c, r, clock, {})) pending.push_back(q);
      // Latest first: a token from a later message often implies the earlier ones.
      std::sort(pending.begin(), pending.end(), [&](const Req& a, const Req& b) { return flat_.phase[idx(a.msg)] > flat_.phase[idx(b.msg)]; });
      std::vector<Req> chosen;
      for (const Req& q : pending) {
        if (satisfied(q, c, r, clock, chosen)) continue;
        chosen.push_back(q);
        merge_msg_clock(clock, q.msg);
      }
      // Drop any chosen token that the others imply (redundant synchronisation).
      for (std::size_t i = 0; chosen.size() > 1 && i < chosen.size();) {
        std::vector<Req> rest = chosen;
        rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(i));
        trial_ = base;
        for (const Req& q : rest) merge_msg_clock(trial_, q.msg);
        if (all_satisfied(reqs, c, r, trial_, rest)) {
          chosen = std::move(rest);
          clock = trial_;
        } else {
          ++i;
        }
      }
      for (const Req& q : chosen) {
        const Message& m1 = flat_.msg[idx(q.msg)];
        if (q.level == Level::kSend) {
          new_sync({0, m1.src, c, SyncTrigger::kAfterSend, msg_round_[idx(q.msg)], -1, r});
        } else {
          new_sync({0, m1.dst, c, SyncTrigger::kAfterReceive, -1, m1.src, r});
          kept_recv_[idx(q.msg)].emplace_back(c, r);
        }
      }
      for (const Req& q : reqs) clocks_->release(flat_.msg[idx(q.msg)].src, msg_round_[idx(q.msg)]);
    }
    clock[idx(c)] = static_cast<std::uint32_t>(r + 1);
    clocks_->put(c, r, clock.data());
    vc_[idx(c)] = clock;
  }

  // Rounds in an order consistent with every token: by phase, then barrier stages.
  void process() {
    vc_.assign(idx(n_), std::vector<std::uint32_t>(idx(n_), 0));
    std::vector<std::size_t> cursor(idx(n_), 0);
    std::vector<std::vector<int>> msg_of_round(idx(n_));
    for (Rank c = 0; c < n_; ++c) msg_of_round[idx(c)].assign(s_.programs[idx(c)].rounds.size(), -1);
    for (int id = 0; id < flat_.size(); ++id) msg_of_round[idx(flat_.msg[idx(id)].src)][idx(msg_round_[idx(id)])] = id;
    const int phases = static_cast<int>(s_.phases.size());
    for (int p = 0; p < phases; ++p) {
      for (Rank c = 0; c < n_; ++c) {
        auto& rounds = s_.programs[idx(c)].rounds;
        while (cursor[idx(c)] < rounds.size() && rounds[cursor[idx(c)]].phase() == p) {
          int r = static_cast<int>(cursor[idx(c)]++);
          process_round(c, r, msg_of_round[idx(c)][idx(r)]);
        }
      }
      if (!barrier_after(p)) continue;
      for (int st = 0; st < stages_; ++st) {
        for (Rank c = 0; c < n_; ++c) {
          int r = static_cast<int>(cursor[idx(c)]++);
          process_round(c, r, -1);
        }
      }
    }
  }

  void finish() {
    for (Rank c = 0; c < n_; ++c) {
      auto& prog = s_.programs[idx(c)];
      for (auto& [src, ids] : on_receive_[idx(c)]) prog.on_receive.emplace_back(src, std::move(ids));
    }
    for (const Sync& sync : s_.syncs) {
      if (sync.from == sync.to) {
        ++s_.sync_stats.local_waits;
      } else {
        ++s_.sync_stats.tokens;
      }
    }
  }

  const Topology& topo_;
  Schedule& s_;
  Variant v_;
  int n_;
  detail::FlatMessages flat_;
  std::optional<detail::ClockStore> clocks_;
  int stages_ = 0;
  std::vector<int> msg_round_;                          // message id -> round in its sender's program
  std::vector<std::vector<std::vector<int>>> barrier_round_;  // node, barrier, stage -> round
  std::vector<std::vector<std::vector<FixedWait>>> fixed_;    // node, round -> barrier waits
  std::vector<std::vector<Req>> reqs_;                  // message id -> earlier messages to order after
  std::vector<std::vector<std::pair<int, int>>> kept_recv_;   // message id -> rounds its receipt token reaches
  std::vector<std::map<Rank, std::vector<std::uint32_t>>> on_receive_;
  std::vector<std::vector<std::uint32_t>> vc_;          // clock after each node's last processed round
  std::vector<std::uint32_t> base_, clock_, trial_;     // scratch
};

}  // namespace

Schedule plan_sync(const Topology& topology, const Schedule& schedule, const SyncSpec& spec) {
  if (schedule.machines != topology.machine_count())
    throw std::invalid_argument("schedule is for " + std::to_string(schedule.machines) + " machines, topology has " +
                                std::to_string(topology.machine_count()));
  if (spec.block < 1) throw std::invalid_argument("sync block size must be at least 1");
  if (schedule.combining()) {
    // Its local tokens are the algorithm itself (a step forwards what the previous one brought).
    if (spec.kind != SyncKind::kNone)
      throw std::invalid_argument(schedule.algorithm + " combines blocks in steps that already wait for each other; sync variant '" + spec.name() +
                                  "' orders phases and applies only to phased schedules (use --sync none)");
    Schedule s = schedule;
    s.sync = spec;
    return s;
  }
  if (spec.kind == SyncKind::kNone) {
    Schedule s = schedule;
    s.sync = spec;
    s.syncs.clear();
    s.sync_stats = {};
    return s;
  }
  if (schedule.packet_level)
    throw std::invalid_argument(schedule.algorithm + " interleaves all its destinations packet by packet inside rounds; sync variant '" +
                                spec.name() + "' orders phases and applies only to phased schedules (use --sync none)");
  // The programs are rebuilt from the phases, so only the phases are copied.
  Schedule s;
  s.algorithm = schedule.algorithm;
  s.machines = schedule.machines;
  s.contention_free = schedule.contention_free;
  s.phases = schedule.phases;
  s.sync = spec;
  if (spec.kind == SyncKind::kDummy) {
    s.programs = programs_from_phases(s.machines, s.phases);
    add_dummies(topology, s);
    return s;
  }
  s.programs.resize(static_cast<std::size_t>(s.machines));
  SyncPlanner(topology, s, variant_of(spec)).run();
  return s;
}

}  // namespace aapc::sched
