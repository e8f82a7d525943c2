// The verifier of combining schedules (Schedule::combine): blocks travel through intermediate
// nodes, so "every ordered pair once in some phase" becomes "every block reaches its
// destination exactly once, and every node forwards only what it holds".
#include <string>

#include "internal.hpp"

namespace aapc::sched::detail {
namespace {

constexpr std::size_t kMaxListed = 20;

class CombineVerifier {
 public:
  CombineVerifier(const Topology& topo, const Schedule& s, VerifyReport& report)
      : topo_(topo), s_(s), n_(topo.machine_count()), report_(report) {}

  void run() {
    if (s_.combine.size() != idx(n_) || s_.programs.size() != idx(n_)) {
      error("combining schedule has " + std::to_string(s_.combine.size()) + " step lists and " + std::to_string(s_.programs.size()) +
            " programs for " + std::to_string(n_) + " machines");
      return;
    }
    steps_ = s_.combine.front().size();
    report_.phases = static_cast<std::int64_t>(steps_);
    for (Rank i = 0; i < n_; ++i)
      if (s_.combine[idx(i)].size() != steps_) error(name(i) + " has " + std::to_string(s_.combine[idx(i)].size()) + " steps, rank 0 has " + std::to_string(steps_));
    if (!report_.ok()) return;
    check_partners();
    if (!report_.ok()) return;
    check_delivery();
    check_programs();
  }

 private:
  static std::size_t idx(int x) { return static_cast<std::size_t>(x); }
  std::string name(Rank r) const { return r >= 0 && r < n_ ? topo_.machine(r).name : "rank " + std::to_string(r); }
  std::string where(Rank i, std::size_t k) const { return name(i) + " step " + std::to_string(k); }
  bool valid(Rank r) const { return r >= 0 && r < n_; }
  const CombineStep& step(Rank i, std::size_t k) const { return s_.combine[idx(i)][k]; }

  void error(const std::string& what) {
    ++report_.error_count;
    if (report_.errors.size() < kMaxListed) report_.errors.push_back(what);
  }

  // One partner out and one in per step, each a distinct peer (the engine keeps one block per
  // peer and direction), and what i sends at step k is what its partner receives at step k.
  void check_partners() {
    for (Rank i = 0; i < n_; ++i) {
      std::vector<int> to_seen(idx(n_), -1), from_seen(idx(n_), -1);
      for (std::size_t k = 0; k < steps_; ++k) {
        const CombineStep& st = step(i, k);
        if (!valid(st.to) || !valid(st.from) || st.to == i || st.from == i) {
          error(where(i, k) + ": partners " + std::to_string(st.to) + " and " + std::to_string(st.from) + " are not other machines");
          continue;
        }
        if (to_seen[idx(st.to)] >= 0) error(where(i, k) + ": sends to " + name(st.to) + " again (step " + std::to_string(to_seen[idx(st.to)]) + ")");
        if (from_seen[idx(st.from)] >= 0) error(where(i, k) + ": receives from " + name(st.from) + " again");
        to_seen[idx(st.to)] = from_seen[idx(st.from)] = static_cast<int>(k);
        const CombineStep& peer = step(st.to, k);
        if (peer.from != i) error(where(i, k) + ": sends to " + name(st.to) + ", which expects step " + std::to_string(k) + " from " + name(peer.from));
        else if (peer.recv != st.send) error(where(i, k) + ": its message to " + name(st.to) + " is not the one " + name(st.to) + " expects");
      }
    }
  }

  // Moves the pieces as the steps say: a node sends only what it holds (its own blocks, or
  // blocks that arrived at an earlier step), and every block arrives at its destination once.
  void check_delivery() {
    std::vector<Rank> holder(idx(n_ * n_));
    std::vector<int> delivered(idx(n_ * n_), 0);
    for (Rank o = 0; o < n_; ++o)
      for (Rank d = 0; d < n_; ++d) holder[idx(o * n_ + d)] = o == d ? -1 : o;
    for (std::size_t k = 0; k < steps_; ++k) {
      std::vector<std::pair<std::size_t, Rank>> arrivals;
      for (Rank i = 0; i < n_; ++i) {
        const CombineStep& st = step(i, k);
        for (const CombinePiece& piece : st.send) {
          if (!valid(piece.origin) || !valid(piece.dest) || piece.origin == piece.dest) {
            error(where(i, k) + ": piece " + std::to_string(piece.origin) + "->" + std::to_string(piece.dest) + " is no block");
            continue;
          }
          const std::size_t b = idx(piece.origin * n_ + piece.dest);
          if (holder[b] != i) {
            error(where(i, k) + ": sends block " + name(piece.origin) + "->" + name(piece.dest) + ", which it does not hold then");
            continue;
          }
          holder[b] = -1;
          arrivals.emplace_back(b, st.to);
        }
      }
      for (const auto& [b, to] : arrivals) {
        if (idx(to) == b % idx(n_)) {
          ++delivered[b];
        } else {
          holder[b] = to;
        }
      }
    }
    for (Rank o = 0; o < n_; ++o) {
      for (Rank d = 0; d < n_; ++d) {
        if (o == d) continue;
        const std::size_t b = idx(o * n_ + d);
        if (delivered[b] != 1)
          error("block " + name(o) + "->" + name(d) + " reaches its destination " + std::to_string(delivered[b]) + " times" +
                (holder[b] >= 0 ? " (it ends at " + name(holder[b]) + ")" : ""));
      }
    }
    report_.messages = static_cast<std::int64_t>(n_) * (n_ - 1);
  }

  // Round k sends step k's message and, for k > 0, waits for the local token emitted when step
  // k-1's message has arrived: a step never forwards what is still on its way.
  void check_programs() {
    std::vector<int> used(s_.syncs.size(), 0);
    for (Rank i = 0; i < n_; ++i) {
      const Program& prog = s_.programs[idx(i)];
      if (prog.rank != i || prog.rounds.size() != steps_) {
        error(name(i) + ": its program has " + std::to_string(prog.rounds.size()) + " rounds for " + std::to_string(steps_) + " steps");
        continue;
      }
      for (std::size_t k = 0; k < steps_; ++k) {
        const Round& round = prog.rounds[k];
        if (round.dummy || round.sends.size() != 1 || round.sends.front().dst != step(i, k).to || !round.emits.empty())
          error(where(i, k) + ": its round does not send the step's message alone");
        if (k == 0) {
          if (!round.waits.empty()) error(where(i, k) + ": the first step waits for a token");
          continue;
        }
        const Rank before = step(i, k - 1).from;
        bool ok = round.waits.size() == 1 && round.waits.front() < s_.syncs.size();
        if (ok) {
          const Sync& sy = s_.syncs[round.waits.front()];
          const auto* emits = prog.emits_on_receive(before);
          ok = sy.id == round.waits.front() && sy.from == i && sy.to == i && sy.trigger == SyncTrigger::kAfterReceive && sy.after_src == before &&
               sy.to_round == static_cast<int>(k) && emits != nullptr && std::count(emits->begin(), emits->end(), sy.id) == 1;
          ++used[sy.id];
        }
        if (!ok) error(where(i, k) + ": does not wait for the message of step " + std::to_string(k - 1) + " from " + name(before));
      }
    }
    for (std::size_t id = 0; id < used.size(); ++id)
      if (used[id] != 1) error("sync " + std::to_string(id) + " is waited for " + std::to_string(used[id]) + " times");
  }

  const Topology& topo_;
  const Schedule& s_;
  int n_;
  VerifyReport& report_;
  std::size_t steps_ = 0;
};

}  // namespace

void verify_combine(const Topology& topology, const Schedule& schedule, VerifyReport& report) {
  CombineVerifier(topology, schedule, report).run();
}

}  // namespace aapc::sched::detail
