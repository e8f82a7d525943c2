#include "aapc/sched/sync.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

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
  // `only`: the node whose part is kept (plan_sync_part()), or -1 for every node's.
  SyncPlanner(const Topology& topo, Schedule& s, Variant v, Rank only)
      : topo_(topo), s_(s), v_(v), n_(s.machines), only_(only), flat_(s.phases) {}

  void run() {
    build_programs();
    add_barrier_syncs();
    add_requirements();
    process();
    finish();
  }

 private:
  struct FixedWait {
    int from_node, from_round;  // whose clock the token carries
  };

  std::size_t idx(int x) const { return static_cast<std::size_t>(x); }

  bool barrier_after(int p) const {
    return v_.barrier && (p + 1) % v_.block == 0 && p + 1 < static_cast<int>(s_.phases.size());
  }

  // Every node's rounds as the message each sends (-1: a barrier's stage), and the kept
  // nodes' programs. A round of a node not kept is never made: at 4,096 machines the
  // programs of every node took gigabytes.
  void build_programs() {
    stages_ = ceil_log2(n_);
    // A barrier's stages are rounds of every node: counted, and refused past the bounds below
    // (kMaxRounds), before anything is made.
    std::size_t barriers = 0;
    for (int p = 0; p < static_cast<int>(s_.phases.size()); ++p) barriers += barrier_after(p) ? 1 : 0;
    const std::size_t barrier_rounds = barriers * idx(stages_) * idx(n_);
    const std::size_t rounds_in_all = idx(flat_.size()) + barrier_rounds;
    if (rounds_in_all > kMaxRounds || static_cast<double>(barrier_rounds) * n_ > kMaxBarrierEntries)
      too_large(std::to_string(rounds_in_all) + " rounds in all, " + std::to_string(barriers) + " barriers of " + std::to_string(stages_) +
                    " stages at every node, each stage a merge of " + std::to_string(n_) + " clock entries",
                "a larger block of phases between barriers (barrier-partial-...:K), or pair-wise tokens (sender-all)");
    msg_round_.assign(idx(flat_.size()), -1);
    round_msg_.assign(idx(n_), {});
    barrier_round_.assign(idx(n_), {});
    // flat_ holds the messages in phase order, so each node's rounds are its messages in that
    // order, with a barrier's stages after each block of phases.
    const int phases = static_cast<int>(s_.phases.size());
    int id = 0;
    for (int p = 0; p < phases; ++p) {
      for (; id < flat_.size() && flat_.phase[idx(id)] == p; ++id) {
        std::vector<int>& rounds = round_msg_[idx(flat_.msg[idx(id)].src)];
        msg_round_[idx(id)] = static_cast<int>(rounds.size());
        rounds.push_back(id);
      }
      if (!barrier_after(p)) continue;
      for (Rank c = 0; c < n_; ++c) {
        std::vector<int>& rounds = round_msg_[idx(c)];
        std::vector<int> stage_rounds;
        for (int st = 0; st < stages_; ++st) {
          stage_rounds.push_back(static_cast<int>(rounds.size()));
          rounds.push_back(-1);
        }
        barrier_round_[idx(c)].push_back(std::move(stage_rounds));
      }
    }
    for (Rank c = 0; c < n_; ++c) {
      const std::vector<int>& rounds = round_msg_[idx(c)];
      Program& prog = s_.programs[idx(c)];
      prog = Program{};
      prog.rank = c;
      if (!kept(c)) continue;
      prog.rounds.resize(rounds.size());
      for (std::size_t r = 0; r < rounds.size(); ++r)
        if (rounds[r] >= 0) prog.rounds[r].sends.push_back({flat_.msg[idx(rounds[r])].dst, flat_.phase[idx(rounds[r])]});
    }
    std::vector<std::size_t> rounds;
    for (Rank c = 0; c < n_; ++c) rounds.push_back(round_msg_[idx(c)].size());
    if (v_.barrier) {  // only barriers wait for fixed tokens
      fixed_.assign(idx(n_), {});
      for (Rank c = 0; c < n_; ++c) fixed_[idx(c)].resize(rounds[idx(c)]);
    }
    clocks_.emplace(n_, rounds);
    if (v_.barrier || v_.level == Level::kReceive) kept_recv_.assign(idx(flat_.size()), {});  // receipt tokens only
  }

  bool kept(Rank node) const { return only_ < 0 || node == only_; }

  // Numbers every sync of the plan; keeps those of the kept nodes.
  void new_sync(Sync sync) {
    sync.id = next_sync_++;
    ++(sync.from == sync.to ? s_.sync_stats.local_waits : s_.sync_stats.tokens);
    if (kept(sync.to)) s_.programs[idx(sync.to)].rounds[idx(sync.to_round)].waits.push_back(sync.id);
    if (kept(sync.from)) {
      if (sync.trigger == SyncTrigger::kAfterSend) s_.programs[idx(sync.from)].rounds[idx(sync.from_round)].emits.push_back(sync.id);
      else on_receive_[idx(sync.from)][sync.after_src].push_back(sync.id);
    }
    if (kept(sync.to) || kept(sync.from)) s_.syncs.push_back(sync);
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
          if (to_round >= static_cast<int>(round_msg_[idx(d)].size())) continue;  // d has nothing left to do
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

  // Each message's requirements: the earlier messages it must follow. Two messages need
  // ordering only if they share a directed edge, and along each edge it is enough to order
  // consecutive users (or consecutive blocks of users): the rest follows. The messages are
  // walked once, in phase order (their ids' order), and each edge keeps only its last users,
  // so each message's list is made in turn and stored flat (reqs_at_): a table of every edge's
  // users and a vector per message took gigabytes at 4,096 machines.
  void add_requirements() {
    reqs_at_.assign(idx(flat_.size()) + 1, 0);
    if (v_.level == Level::kNone) return;
    std::vector<detail::BlockUsers<int>> blocks(v_.across ? idx(topo_.directed_edge_count()) : 0);  // between blocks
    std::vector<int> last(v_.across ? 0 : idx(topo_.directed_edge_count()), -1);                      // inside blocks
    std::vector<int> path, mine;
    auto block = [&](int id) { return flat_.phase[idx(id)] / v_.block; };
    for (int id = 0; id < flat_.size(); ++id) {
      const Message& m = flat_.msg[idx(id)];
      mine.clear();
      path.clear();  // a message to oneself uses no edge
      if (m.src != m.dst) topo_.path(topo_.machine_node(m.src), topo_.machine_node(m.dst), path);
      for (const int e : path) {
        if (v_.across) {  // every user of the edge's previous block of phases
          const std::vector<int>& earlier = blocks[idx(e)].enter(block(id));
          mine.insert(mine.end(), earlier.begin(), earlier.end());
          blocks[idx(e)].current.push_back(id);
        } else {  // the edge's previous user, inside a block
          const int u = last[idx(e)];
          if (u >= 0 && block(u) == block(id) && flat_.phase[idx(u)] != flat_.phase[idx(id)]) mine.push_back(u);
          last[idx(e)] = id;
        }
      }
      std::sort(mine.begin(), mine.end());
      mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
      reqs_flat_.insert(reqs_flat_.end(), mine.begin(), mine.end());
      reqs_at_[idx(id) + 1] = reqs_flat_.size();
      if (reqs_flat_.size() > kMaxRequirements)
        too_large("more than " + std::to_string(kMaxRequirements) + " orderings of messages",
                  s_.contention_free ? "sender-based tokens on every phase (sender-all), which keep fewer, or no tokens (sync none)"
                                     : "the tree's phases, which share no link (the tree with this sync variant), or no tokens (sync none)");
    }
    reqs_flat_.shrink_to_fit();
    s_.sync_stats.consecutive_pairs = static_cast<std::int64_t>(reqs_flat_.size());
    for (const int earlier : reqs_flat_) clocks_->add_ref(flat_.msg[idx(earlier)].src, msg_round_[idx(earlier)]);
    if (only_ >= 0) return;  // a figure for `aapc-sched show`, which a daemon's part does without (SyncStats)
    const auto users = detail::edge_users(topo_, flat_);
    const int bs = v_.block;
    s_.sync_stats.contending_pairs =
        v_.across ? detail::count_contending_pairs(topo_, flat_, users, [bs](int p) { return p / bs; })
                  : detail::count_contending_pairs(topo_, flat_, users, [](int p) { return p; });
  }

  std::span<const int> reqs(int msg) const {
    return {reqs_flat_.data() + reqs_at_[idx(msg)], reqs_at_[idx(msg) + 1] - reqs_at_[idx(msg)]};
  }

  // Is the ordering "message `earlier` done before round (c, r) starts" (at the variant's
  // level) already implied by `clock` and the receiver tokens kept so far (plus those in
  // `chosen` for this round)?
  bool satisfied(int earlier, int c, int r, const std::vector<std::uint32_t>& clock, const std::vector<int>& chosen) const {
    const Message& m1 = flat_.msg[idx(earlier)];
    if (v_.level == Level::kSend)
      return m1.src == c || clock[idx(m1.src)] >= static_cast<std::uint32_t>(msg_round_[idx(earlier)] + 1);
    if (std::find(chosen.begin(), chosen.end(), earlier) != chosen.end()) return true;
    for (const auto& [node, round] : kept_recv_[idx(earlier)])
      if ((node == c && round <= r) || clock[idx(node)] >= static_cast<std::uint32_t>(round + 1)) return true;
    return false;
  }

  void merge_msg_clock(std::vector<std::uint32_t>& clock, int msg) const {
    clocks_->merge(clock.data(), flat_.msg[idx(msg)].src, msg_round_[idx(msg)]);
  }

  // Bounds on what a plan holds, checked before it is made, past which it is refused at once
  // (and the same on every node) rather than grown until the host runs out of memory, in a
  // daemon that also serves other jobs:
  // - Every round in all, barriers' stages included, and the clock entries the stages merge
  //   (each stage waits for another node's clock of n entries). A barrier after each of the
  //   tree's 31,744 phases at 1,024 machines makes 325 million rounds, and took 22 GB before it
  //   failed; one every 4 phases, 81 million rounds, took 3 minutes. The tree itself has 16.8
  //   million rounds at 4,096 machines, 67 million at 8,192; a barrier after each of its 3,840
  //   phases at 256 machines merges 2 billion entries.
  // - The orderings of messages: phases that share links (pairwise-ec on a tree of switches)
  //   make a round wait for every earlier user of each link on its path, with sender-all on a
  //   random tree 3.3 million at 250 machines, 27 million at 500, some n^3 / 20, and 18 GB at
  //   3,000 machines. The tree's phases share no link: 8.6 million at 2,048 machines with
  //   sender-all, 21.7 million with receiver-partial:4 (some 85 million at 4,096).
  static constexpr std::size_t kMaxRounds = std::size_t{1} << 27;
  static constexpr double kMaxBarrierEntries = 4.3e9;
  static constexpr std::size_t kMaxRequirements = std::size_t{1} << 27;

  [[noreturn]] void too_large(const std::string& what, const std::string& instead) const {
    throw std::invalid_argument(s_.algorithm + " with " + level_name() + " tokens on these " + std::to_string(n_) +
                                " machines is too large to plan (" + what + "); use " + instead);
  }
  const char* level_name() const { return v_.barrier ? "barrier" : v_.level == Level::kReceive ? "receiver-based" : "sender-based"; }

  // Whether the clock of chosen token `o` (its message's round at the sender, as
  // merge_msg_clock() merges it) satisfies requirement `x` of round (c, r): satisfied() with that
  // clock alone, less what holds without any token.
  bool token_satisfies(int o, int x) const {
    const Message& mo = flat_.msg[idx(o)];
    const int ro = msg_round_[idx(o)];
    if (v_.level == Level::kSend)
      return clocks_->entry(mo.src, ro, flat_.msg[idx(x)].src) >= static_cast<std::uint32_t>(msg_round_[idx(x)] + 1);
    return std::any_of(kept_recv_[idx(x)].begin(), kept_recv_[idx(x)].end(),
                       [&](const auto& k) { return clocks_->entry(mo.src, ro, k.first) >= static_cast<std::uint32_t>(k.second + 1); });
  }

  // Drops, one at a time in order, each chosen token whose round's requirements `all` the other
  // tokens still chosen satisfy with `base` (the clock before any token). A requirement is
  // satisfied by a set of tokens when it is one of them, holds with `base`, or one token's
  // clock satisfies it (a clock merged from several satisfies what one of them does: satisfied()
  // looks at single entries), so single clock entries decide, where trial merges of whole
  // clocks cost k^2 x n a round: with pairwise-ec under sender-all on a random tree of 250
  // machines, a round waits for some 60 tokens, and the trials took 27 of 28 s. Returns
  // whether any went.
  bool drop_implied(std::span<const int> all, int c, int r, const std::vector<std::uint32_t>& base, std::vector<int>& chosen) const {
    const std::size_t k = chosen.size(), m = all.size();
    std::vector<std::uint8_t> holds(m), by(k * m), in(k, 1);
    std::vector<int> at(m, -1);  // all[j]'s place in chosen
    for (std::size_t j = 0; j < m; ++j) {
      holds[j] = satisfied(all[j], c, r, base, {}) ? 1 : 0;
      const auto it = std::find(chosen.begin(), chosen.end(), all[j]);
      if (it != chosen.end()) at[j] = static_cast<int>(it - chosen.begin());
      for (std::size_t i = 0; i < k && holds[j] == 0; ++i) by[i * m + j] = token_satisfies(chosen[i], all[j]) ? 1 : 0;
    }
    bool dropped = false;
    for (std::size_t i = 0; i < k; ++i) {
      in[i] = 0;
      bool all_hold = true;
      for (std::size_t j = 0; j < m && all_hold; ++j) {
        if (holds[j] != 0 || (at[j] >= 0 && in[idx(at[j])] != 0)) continue;
        bool one = false;
        for (std::size_t o = 0; o < k && !one; ++o) one = in[o] != 0 && by[o * m + j] != 0;
        all_hold = one;
      }
      if (all_hold) dropped = true;
      else in[i] = 1;
    }
    if (!dropped) return false;
    std::vector<int> kept;
    for (std::size_t i = 0; i < k; ++i)
      if (in[i] != 0) kept.push_back(chosen[i]);
    chosen = std::move(kept);
    return true;
  }

  // The node's clock is made in place (it only grows): a copy of the clock per round was most
  // of the time of a plan of thousands of machines.
  void process_round(Rank c, int r, int msg) {
    std::vector<std::uint32_t>& clock = vc_[idx(c)];
    bool merged = false;  // another clock into this node's (ClockStore::put)
    for (const FixedWait& w : fixed_.empty() ? kNoWaits : fixed_[idx(c)][idx(r)]) {
      merged = true;
      clocks_->merge(clock.data(), w.from_node, w.from_round);
      clocks_->release(w.from_node, w.from_round);
    }
    if (msg >= 0 && !reqs(msg).empty()) {
      const std::span<const int> all = reqs(msg);
      std::vector<int> pending;
      for (const int q : all)
        if (!satisfied(q, c, r, clock, {})) pending.push_back(q);
      // The clock before any token, for dropping redundant ones below (two or more chosen).
      std::vector<std::uint32_t>& base = base_;
      if (pending.size() > 1) base = clock;
      // Latest first: a token from a later message often implies the earlier ones.
      std::sort(pending.begin(), pending.end(), [&](int a, int b) { return flat_.phase[idx(a)] > flat_.phase[idx(b)]; });
      std::vector<int> chosen;
      for (const int q : pending) {
        if (satisfied(q, c, r, clock, chosen)) continue;
        chosen.push_back(q);
        merge_msg_clock(clock, q);
        merged = true;
      }
      // Drop any chosen token that the others imply (redundant synchronisation).
      if (chosen.size() > 1 && drop_implied(all, c, r, base, chosen)) {
        clock = base;
        for (const int q : chosen) merge_msg_clock(clock, q);
      }
      for (const int q : chosen) {
        const Message& m1 = flat_.msg[idx(q)];
        if (v_.level == Level::kSend) {
          new_sync({0, m1.src, c, SyncTrigger::kAfterSend, msg_round_[idx(q)], -1, r});
        } else {
          new_sync({0, m1.dst, c, SyncTrigger::kAfterReceive, -1, m1.src, r});
          kept_recv_[idx(q)].emplace_back(c, r);
        }
      }
      for (const int q : all) clocks_->release(flat_.msg[idx(q)].src, msg_round_[idx(q)]);
    }
    clock[idx(c)] = static_cast<std::uint32_t>(r + 1);
    clocks_->put(c, r, clock.data(), merged);
  }

  // Rounds in an order consistent with every token: by phase, then barrier stages.
  void process() {
    vc_.assign(idx(n_), std::vector<std::uint32_t>(idx(n_), 0));
    std::vector<std::size_t> cursor(idx(n_), 0);
    const int phases = static_cast<int>(s_.phases.size());
    std::vector<Rank> senders;
    int first = 0;  // of the phase's messages (flat_ holds them in phase order)
    for (int p = 0; p < phases; ++p) {
      // The phase's senders in rank order, not every node: at 4,096 machines a look at each
      // node in each phase was most of the plan's time. The order numbers the tokens.
      senders.clear();
      for (; first < flat_.size() && flat_.phase[idx(first)] == p; ++first) senders.push_back(flat_.msg[idx(first)].src);
      std::sort(senders.begin(), senders.end());
      senders.erase(std::unique(senders.begin(), senders.end()), senders.end());
      for (const Rank c : senders) {
        const auto& rounds = round_msg_[idx(c)];
        while (cursor[idx(c)] < rounds.size() && rounds[cursor[idx(c)]] >= 0 && flat_.phase[idx(rounds[cursor[idx(c)]])] == p) {
          int r = static_cast<int>(cursor[idx(c)]++);
          process_round(c, r, rounds[idx(r)]);
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
      if (!kept(c)) prog.rounds = {};  // were the plan's frame only
    }
    s_.part = only_;
    s_.part_sync_total = only_ < 0 ? 0 : next_sync_;
  }

  const Topology& topo_;
  Schedule& s_;
  Variant v_;
  int n_;
  Rank only_;
  std::uint32_t next_sync_ = 0;
  detail::FlatMessages flat_;
  std::optional<detail::ClockStore> clocks_;
  int stages_ = 0;
  std::vector<int> msg_round_;                          // message id -> round in its sender's program
  std::vector<std::vector<int>> round_msg_;             // node, round -> the message it sends, or -1 (a barrier's stage)
  std::vector<std::vector<std::vector<int>>> barrier_round_;  // node, barrier, stage -> round
  std::vector<std::vector<std::vector<FixedWait>>> fixed_;    // node, round -> barrier waits (empty without barriers)
  static inline const std::vector<FixedWait> kNoWaits;
  std::vector<std::size_t> reqs_at_;                    // message id -> its first in reqs_flat_ (and its end at id + 1)
  std::vector<int> reqs_flat_;                          // the earlier messages to order each after, by message
  std::vector<std::vector<std::pair<int, int>>> kept_recv_;   // message id -> rounds its receipt token reaches (receipt tokens only)
  std::vector<std::map<Rank, std::vector<std::uint32_t>>> on_receive_;
  std::vector<std::vector<std::uint32_t>> vc_;          // clock after each node's last processed round
  std::vector<std::uint32_t> base_;                     // scratch
};

// `s` cut to `node`'s part (Schedule::part), where its planner kept every node's.
void keep_part(Schedule& s, Rank node) {
  s.part_sync_total = s.syncs.size();
  s.part = node;
  std::erase_if(s.syncs, [node](const Sync& x) { return x.from != node && x.to != node; });
  for (std::size_t x = 0; x < s.programs.size(); ++x)
    if (x != static_cast<std::size_t>(node)) s.programs[x] = Program{.rank = s.programs[x].rank, .rounds = {}, .on_receive = {}};
  for (std::size_t x = 0; x < s.combine.size(); ++x)
    if (x != static_cast<std::size_t>(node)) s.combine[x] = {};
}

// plan_sync(), keeping every node's part (only < 0) or `only`'s. A schedule that is the
// caller's to give (not const) gives up its programs and phases to the planner, which
// rebuilds the programs: at 4,096 machines they took gigabytes.
template <typename S>
Schedule plan_programs(const Topology& topology, S&& schedule, const SyncSpec& spec, Rank only) {
  if (schedule.machines != topology.machine_count())
    throw std::invalid_argument("schedule is for " + std::to_string(schedule.machines) + " machines, topology has " +
                                std::to_string(topology.machine_count()));
  if (spec.block < 1) throw std::invalid_argument("sync block size must be at least 1");
  if (schedule.combining()) {
    // Its local tokens are the algorithm itself (a step forwards what the previous one brought).
    if (spec.kind != SyncKind::kNone)
      throw std::invalid_argument(schedule.algorithm + " combines blocks in steps that already wait for each other; sync variant '" + spec.name() +
                                  "' orders phases and applies only to phased schedules (use --sync none)");
    Schedule s = std::forward<S>(schedule);
    s.sync = spec;
    if (only >= 0) keep_part(s, only);
    return s;
  }
  if (spec.kind == SyncKind::kNone) {
    Schedule s = std::forward<S>(schedule);
    if (s.programs.empty()) s.programs = programs_from_phases(s.machines, s.phases, only);  // built without (plan_part)
    s.sync = spec;
    s.syncs.clear();
    s.sync_stats = {};
    if (only >= 0) keep_part(s, only);
    return s;
  }
  if (schedule.packet_level)
    throw std::invalid_argument(schedule.algorithm + " interleaves all its destinations packet by packet inside rounds; sync variant '" +
                                spec.name() + "' orders phases and applies only to phased schedules (use --sync none)");
  // The programs are rebuilt from the phases, so only the phases are taken.
  Schedule s;
  s.algorithm = schedule.algorithm;
  s.machines = schedule.machines;
  s.contention_free = schedule.contention_free;
  if constexpr (std::is_const_v<std::remove_reference_t<S>>) {
    s.phases = schedule.phases;
  } else {
    s.phases = std::move(schedule.phases);
    schedule.programs = {};
  }
  s.sync = spec;
  if (spec.kind == SyncKind::kDummy) {
    s.programs = programs_from_phases(s.machines, s.phases);
    add_dummies(topology, s);
    if (only >= 0) keep_part(s, only);
    return s;
  }
  s.programs.resize(static_cast<std::size_t>(s.machines));
  SyncPlanner(topology, s, variant_of(spec), only).run();
  return s;
}

template <typename S>
Schedule plan(const Topology& topology, S&& schedule, const SyncSpec& spec, Rank only) {
  Schedule s = plan_programs(topology, std::forward<S>(schedule), spec, only);
  cap_round_rates(topology, s);
  return s;
}

}  // namespace

Schedule plan_sync(const Topology& topology, const Schedule& schedule, const SyncSpec& spec) { return plan(topology, schedule, spec, -1); }

Schedule plan_sync_part(const Topology& topology, Schedule schedule, const SyncSpec& spec, Rank node) {
  if (node < 0 || node >= schedule.machines)
    throw std::invalid_argument("node " + std::to_string(node) + " is not one of the schedule's " + std::to_string(schedule.machines) + " machines");
  return plan(topology, std::move(schedule), spec, node);
}

Schedule plan_part(const Topology& topology, const AlgorithmSpec& algorithm, const SyncSpec& spec, Rank node) {
  return plan_sync_part(topology, detail::build_schedule(topology, algorithm, false), spec, node);
}

}  // namespace aapc::sched
