// Helpers shared by the sync planner, the verifier and the parsers (not installed).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/schedule.hpp"
#include "aapc/sched/topology.hpp"
#include "aapc/sched/verify.hpp"

namespace aapc::sched::detail {

// Splits "name:4", "name(4)" or "name=4" into name and parameter (at least 1); false when the
// parameter is not such a number. The one grammar of an algorithm's and a sync variant's
// parameter (AlgorithmSpec::parse, SyncSpec::parse).
bool split_param(std::string_view text, std::string_view& name, std::optional<int>& param);

// make_schedule(), where `programs` false lets a builder leave the programs out
// (BuildInput::programs): for plan_part(), whose planner makes its own.
Schedule build_schedule(const Topology& topology, const AlgorithmSpec& spec, bool programs);

// The checks of a combining schedule (verify_combine.cpp), added to `report`.
void verify_combine(const Topology& topology, const Schedule& schedule, VerifyReport& report);

enum class Level : std::uint8_t { kNone, kSend, kReceive };

// What a sync variant orders (the planner's, sync.cpp; the predictor's walk over the phases,
// predict.cpp): pair-wise tokens at `level`, between blocks (`across`) or inside them, and
// whether a barrier separates blocks of `block` phases. Dummies and no-sync order nothing.
struct Variant {
  Level level = Level::kNone;
  bool across = true;
  bool barrier = false;
  int block = 1;
};

inline Variant variant_of(const SyncSpec& spec) {
  switch (spec.kind) {
    case SyncKind::kSenderAll: return {Level::kSend, true, false, 1};
    case SyncKind::kSenderPartial: return {Level::kSend, true, false, spec.block};
    case SyncKind::kReceiverAll: return {Level::kReceive, true, false, 1};
    case SyncKind::kReceiverPartial: return {Level::kReceive, true, false, spec.block};
    case SyncKind::kBarrierAll: return {Level::kNone, true, true, 1};
    case SyncKind::kBarrierPartialNone: return {Level::kNone, true, true, spec.block};
    case SyncKind::kBarrierPartialSender: return {Level::kSend, false, true, spec.block};
    case SyncKind::kBarrierPartialReceiver: return {Level::kReceive, false, true, spec.block};
    default: return {};
  }
}

// The messages of a schedule numbered 0.. in phase order.
struct FlatMessages {
  std::vector<Message> msg;
  std::vector<int> phase;

  explicit FlatMessages(const std::vector<Phase>& phases) {
    for (std::size_t p = 0; p < phases.size(); ++p) {
      for (const Message& m : phases[p]) {
        msg.push_back(m);
        phase.push_back(static_cast<int>(p));
      }
    }
  }
  int size() const { return static_cast<int>(msg.size()); }
};

// A directed edge's users in its last two non-empty blocks of phases, kept while the messages
// are walked in phase order (the sync planner, sync.cpp; the predictor's walk, predict.cpp).
// Along an edge it is enough to order each block's users after the previous block's
// (Faraj/Yuan/Patarasuk section 5); the rest follows.
template <typename User>
struct BlockUsers {
  int block = -1;  // of `current`
  std::vector<User> earlier, current;

  // The users a message of `b` on this edge follows: those of the last block before `b`.
  const std::vector<User>& enter(int b) {
    if (block != b) {
      earlier.swap(current);
      current.clear();
      block = b;
    }
    return earlier;
  }
};

// For every directed edge, the messages whose path uses it, in phase order (message ids are
// already in phase order).
inline std::vector<std::vector<int>> edge_users(const Topology& topo, const FlatMessages& flat) {
  std::vector<std::vector<int>> users(static_cast<std::size_t>(topo.directed_edge_count()));
  std::vector<int> path;
  for (int id = 0; id < flat.size(); ++id) {
    const Message& m = flat.msg[static_cast<std::size_t>(id)];
    if (m.src == m.dst) continue;
    topo.path(topo.machine_node(m.src), topo.machine_node(m.dst), path);
    for (int e : path) users[static_cast<std::size_t>(e)].push_back(id);
  }
  return users;
}

// Vector clocks over the "sends done" events of each node: clock[k] = number of rounds of node
// k whose sends are known to be done. A round's clock is kept only while some later event
// still needs it (reference counted), in a flat arena of N-wide slots. A round whose node merged
// no other clock since the node's last kept one shares that slot: the two differ only in the
// node's own entry, which merge() sets (at thousands of machines a copy of every round's clock
// was most of a plan's time).
class ClockStore {
 public:
  ClockStore(int nodes, const std::vector<std::size_t>& rounds_per_node) : n_(static_cast<std::size_t>(nodes)) {
    std::size_t total = 0;
    for (std::size_t r : rounds_per_node) {
      offset_.push_back(total);
      total += r;
    }
    refs_.assign(total, 0);
    slot_.assign(total, -1);
    current_.assign(n_, -1);
    stale_.assign(n_, 1);
  }

  void add_ref(int node, int round) { ++refs_[at(node, round)]; }
  // The clock of (node, round), whose own entry is round + 1, kept if anything references it.
  // `merged`: whether the node merged another clock into its own in this round (else only its
  // own entry moved since its previous round). Called for every round of a node, in order.
  void put(int node, int round, const std::uint32_t* clock, bool merged = true) {
    const std::size_t k = static_cast<std::size_t>(node);
    stale_[k] = stale_[k] != 0 || merged ? 1 : 0;
    std::size_t i = at(node, round);
    if (refs_[i] == 0) return;
    if (stale_[k] != 0) {
      if (current_[k] >= 0 && users_[static_cast<std::size_t>(current_[k])] == 0) free_.push_back(current_[k]);
      current_[k] = take(clock);
      stale_[k] = 0;
    }
    slot_[i] = current_[k];
    ++users_[static_cast<std::size_t>(current_[k])];
  }
  void release(int node, int round) {
    std::size_t i = at(node, round);
    if (--refs_[i] != 0 || slot_[i] < 0) return;
    const int slot = slot_[i];
    slot_[i] = -1;
    if (--users_[static_cast<std::size_t>(slot)] == 0 && current_[static_cast<std::size_t>(node)] != slot) free_.push_back(slot);
  }

  // Entry `of` of the clock of (node, round): how many of node `of`'s rounds it follows.
  std::uint32_t entry(int node, int round, int of) const {
    if (of == node) return static_cast<std::uint32_t>(round + 1);
    return arena_[static_cast<std::size_t>(slot_[at(node, round)]) * n_ + static_cast<std::size_t>(of)];
  }

  void merge(std::uint32_t* into, int node, int round) const {
    const std::uint32_t* from = arena_.data() + static_cast<std::size_t>(slot_[at(node, round)]) * n_;
    for (std::size_t i = 0; i < n_; ++i) into[i] = std::max(into[i], from[i]);
    const auto own = static_cast<std::uint32_t>(round + 1);
    into[static_cast<std::size_t>(node)] = std::max(into[static_cast<std::size_t>(node)], own);
  }

 private:
  std::size_t at(int node, int round) const { return offset_[static_cast<std::size_t>(node)] + static_cast<std::size_t>(round); }
  int take(const std::uint32_t* clock) {
    int slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = static_cast<int>(users_.size());
      arena_.resize(arena_.size() + n_);
      users_.push_back(0);
    }
    std::copy(clock, clock + n_, arena_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(slot) * n_));
    return slot;
  }

  std::size_t n_;
  std::vector<std::size_t> offset_;
  std::vector<int> refs_;
  std::vector<int> slot_;
  std::vector<std::uint32_t> arena_;
  std::vector<int> users_;            // by slot: the rounds that share it
  std::vector<int> free_;
  std::vector<int> current_;          // by node: the slot of its last kept clock, or -1
  std::vector<std::uint8_t> stale_;   // by node: it merged a clock since that slot was taken
};

// Counts the contending pairs of messages that a variant must order, without listing them:
// pairs sharing at least one directed edge = sum over edges of pairs on that edge minus, for
// each two consecutive edges of a path, the pairs using both (the edges two tree paths share
// form one contiguous sub-path, so each pair is counted once). Two messages need ordering
// when `group(phase)` differs (the phase itself, or its block for the partial variants).
template <typename Group>
std::int64_t count_contending_pairs(const Topology& topo, const FlatMessages& flat, const std::vector<std::vector<int>>& users,
                                    Group group) {
  auto pairs_in = [&](std::vector<int> groups) {
    std::sort(groups.begin(), groups.end());
    auto n = static_cast<std::int64_t>(groups.size());
    std::int64_t count = n * (n - 1) / 2;
    for (std::size_t i = 0; i < groups.size();) {
      std::size_t j = i;
      while (j < groups.size() && groups[j] == groups[i]) ++j;
      auto same = static_cast<std::int64_t>(j - i);
      count -= same * (same - 1) / 2;
      i = j;
    }
    return count;
  };
  std::int64_t total = 0;
  for (const auto& list : users) {
    std::vector<int> groups;
    for (int id : list) groups.push_back(group(flat.phase[static_cast<std::size_t>(id)]));
    total += pairs_in(std::move(groups));
  }
  std::unordered_map<std::uint64_t, std::vector<int>> both;
  std::vector<int> path;
  for (int id = 0; id < flat.size(); ++id) {
    const Message& m = flat.msg[static_cast<std::size_t>(id)];
    if (m.src == m.dst) continue;
    topo.path(topo.machine_node(m.src), topo.machine_node(m.dst), path);
    for (std::size_t i = 0; i + 1 < path.size(); ++i)
      both[(static_cast<std::uint64_t>(path[i]) << 32) | static_cast<std::uint32_t>(path[i + 1])].push_back(
          group(flat.phase[static_cast<std::size_t>(id)]));
  }
  for (auto& entry : both) total -= pairs_in(std::move(entry.second));
  return total;
}

}  // namespace aapc::sched::detail
