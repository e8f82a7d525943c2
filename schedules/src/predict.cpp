// The longest path through a plan's rounds and tokens (predict.hpp). Two walks share one wire
// model and one way of tracing the path back: PlanWalk over a planned Schedule in the order its
// tokens allow (Kahn's algorithm, as the verifier's deadlock check), and PhaseWalk over the
// tree's phases alone, which derives each round's tokens as the planner would instead of keeping
// them.
#include "aapc/sched/predict.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>

#include "aapc/sched/frame.hpp"
#include "aapc/sched/sync.hpp"
#include "aapc/sched/tree.hpp"
#include "internal.hpp"

namespace aapc::sched {
namespace {

// What aapc puts in a frame (aapc/sched/frame.hpp, the lengths the wire lays out): the Ethernet
// header, then the data header and up to MTU minus that header of a block.
constexpr std::uint64_t kEthHeaderBytes = kFrameEthHeaderBytes;
constexpr std::uint64_t kDataHeaderBytes = kFrameDataHeaderBytes;

std::size_t idx(std::int64_t x) { return static_cast<std::size_t>(x); }

// The wire: a block's bits, a machine's link, and what a token or a block's last frame takes
// from one machine to another, as sums along the tree from its node 0.
class WireModel {
 public:
  WireModel(const Topology& t, const PredictOptions& o) : t_(t), o_(o) {
    if (o.block_bytes == 0) throw std::invalid_argument("predict: the block size must be at least one byte");
    if (t.mtu() <= static_cast<int>(kDataHeaderBytes)) throw std::invalid_argument("predict: the MTU leaves no room for a block's bytes");
    if (!(o.link_share > 0.0 && o.link_share <= 1.0)) throw std::invalid_argument("predict: the share of a link's rate must be in (0, 1]");
    const HandOver& h = o.hand_over;
    for (double term : {h.per_link_s, h.frames_ahead, h.store_forward, h.per_switch_s, h.per_nic_s, h.engine_s, h.lead_s})
      if (!(term >= 0.0 && std::isfinite(term))) throw std::invalid_argument("predict: every hand-over term must be finite and at least 0");
    const std::size_t nodes = t.nodes().size();
    parent_.assign(nodes, -1);
    up_rate_.assign(nodes, 0.0);
    depth_.assign(nodes, 0);
    token_sum_.assign(nodes, 0.0);
    frame_sum_.assign(nodes, 0.0);
    for (int node : t.walk_order()) {
      const int link = t.parent_link(node);
      if (link < 0) continue;
      const int up = t.links()[idx(link)].other(node);
      parent_[idx(node)] = up;
      up_rate_[idx(node)] = rate(link);
      depth_[idx(node)] = depth_[idx(up)] + 1;
      token_sum_[idx(node)] = token_sum_[idx(up)] + o.hand_over.per_link_s + o.hand_over.frames_ahead * frame_s(link) + token_s(link);
      frame_sum_[idx(node)] = frame_sum_[idx(up)] + o.hand_over.per_link_s + o.hand_over.store_forward * frame_s(link);
    }
  }

  double block_bits(std::uint64_t bytes) const {
    const std::uint64_t chunk = static_cast<std::uint64_t>(t_.mtu()) - kDataHeaderBytes;
    const std::uint64_t frames = std::max<std::uint64_t>(1, (bytes + chunk - 1) / chunk);
    return 8.0 * static_cast<double>(bytes + frames * (kEthHeaderBytes + kDataHeaderBytes + o_.wire_extra_bytes));
  }
  double machine_rate(Rank r) const { return rate(t_.machine(r).links.front()); }
  double rate(int link) const { return o_.link_share * static_cast<double>(t_.links()[idx(link)].rate_bps); }
  // The slowest link from a to b: a block crosses its path no faster (the sender paces it at
  // that link's rate, sched::Round::rate_bps).
  double path_rate(Rank a, Rank b) const {
    int u = t_.machine_node(a), v = t_.machine_node(b);
    double slowest = machine_rate(a);
    const auto climb = [&](int& node) {
      slowest = std::min(slowest, up_rate_[idx(node)]);
      node = parent_[idx(node)];
    };
    while (depth_[idx(u)] > depth_[idx(v)]) climb(u);
    while (depth_[idx(v)] > depth_[idx(u)]) climb(v);
    while (u != v) {
      climb(u);
      climb(v);
    }
    return slowest;
  }
  int links_between(Rank a, Rank b) const {
    const int u = t_.machine_node(a), v = t_.machine_node(b);
    return depth_[idx(u)] + depth_[idx(v)] - 2 * depth_[idx(meet(u, v))];
  }
  // A token from a to b: from its event to the waiting round's start. Nothing for a local one.
  // A sender-based token (`after_own_frames`) leaves right behind its round's last frame, whose
  // time is the round's: it waits for frames ahead of it only from the first switch on.
  double hand_over(Rank a, Rank b, bool after_own_frames) const {
    if (a == b) return 0.0;
    const HandOver& h = o_.hand_over;
    const double own = after_own_frames ? h.frames_ahead * frame_s(t_.machine(a).links.front()) : 0.0;
    return h.engine_s + 2.0 * h.per_nic_s + crossed_switches(a, b) * h.per_switch_s + along(token_sum_, a, b) - own;
  }
  // A block's last frame, from leaving a's NIC to its arrival at b: its store and forward on
  // every link after a's own (HandOver::store_forward).
  double delivery(Rank a, Rank b) const {
    if (a == b) return 0.0;
    const HandOver& h = o_.hand_over;
    return 2.0 * h.per_nic_s + crossed_switches(a, b) * h.per_switch_s + along(frame_sum_, a, b) - h.store_forward * frame_s(t_.machine(a).links.front());
  }

 private:
  double frame_s(int link) const {
    return 8.0 * static_cast<double>(static_cast<std::uint64_t>(t_.mtu()) + kEthHeaderBytes + o_.wire_extra_bytes) / rate(link);
  }
  double token_s(int link) const {
    return o_.hand_over.token_bytes == 0 ? 0.0 : 8.0 * static_cast<double>(o_.hand_over.token_bytes + o_.wire_extra_bytes) / rate(link);
  }
  int meet(int u, int v) const {
    while (depth_[idx(u)] > depth_[idx(v)]) u = parent_[idx(u)];
    while (depth_[idx(v)] > depth_[idx(u)]) v = parent_[idx(v)];
    while (u != v) {
      u = parent_[idx(u)];
      v = parent_[idx(v)];
    }
    return u;
  }
  // Machines are leaves: every node strictly between two of them is a switch.
  double crossed_switches(Rank a, Rank b) const { return static_cast<double>(links_between(a, b) - 1); }
  double along(const std::vector<double>& sum, Rank a, Rank b) const {
    const int u = t_.machine_node(a), v = t_.machine_node(b);
    return sum[idx(u)] + sum[idx(v)] - 2.0 * sum[idx(meet(u, v))];
  }

  const Topology& t_;
  const PredictOptions& o_;
  std::vector<int> parent_, depth_;
  std::vector<double> up_rate_;                // each node's link towards node 0
  std::vector<double> token_sum_, frame_sum_;  // from node 0 down to each node
};

// The critical path, traced back from its end: steps arrive last first.
class PathBuilder {
 public:
  explicit PathBuilder(bool keep) : keep_(keep) {}
  void add(const PathStep& step, int token_links = 0) {
    const double spent = step.end_s - step.start_s;
    switch (step.kind) {
      case PathStep::Kind::kRound:
        ++rounds_;
        data_ += spent;
        break;
      case PathStep::Kind::kToken:
        ++tokens_;
        token_links_ += token_links;
        hand_over_ += spent;
        break;
      default: waiting_ += spent;
    }
    if (keep_) steps_.push_back(step);
  }
  void finish(Prediction& p) {
    std::reverse(steps_.begin(), steps_.end());
    p.path = std::move(steps_);
    p.path_rounds = rounds_;
    p.path_tokens = tokens_;
    p.path_token_links = token_links_;
    p.data_s = data_;
    p.hand_over_s = hand_over_;
    p.waiting_s = waiting_;
  }

 private:
  bool keep_;
  std::vector<PathStep> steps_;
  std::int64_t rounds_ = 0, tokens_ = 0, token_links_ = 0;
  double data_ = 0.0, hand_over_ = 0.0, waiting_ = 0.0;
};

// What both walks end with: the last arrival, the busiest link, the limit.
struct Totals {
  double last_s = -1.0;
  std::vector<double> edge_bits;
};

void finish_prediction(const Topology& t, const WireModel& wire, const PredictOptions& o, const Totals& totals, Prediction& p) {
  p.path_s = totals.last_s;
  for (std::size_t e = 0; e < totals.edge_bits.size(); ++e) {
    const double busy = totals.edge_bits[e] / wire.rate(static_cast<int>(e / 2));
    if (busy > p.link_bound_s) {
      p.link_bound_s = busy;
      p.link_bound_edge = static_cast<int>(e);
    }
  }
  p.time_s = std::max(p.path_s, p.link_bound_s);
  p.limit_s = TreeModel(t).best_time_s(o.block_bytes);
}

// When a sender-based token leaves: its round's last frame (or the round's blocks' arrival),
// less the lead, and never before its round started.
double token_leaves(const HandOver& h, double start, double end, double arrived) {
  return std::max(start, (h.leaves == TokenLeaves::kDrained ? end : arrived) - h.lead_s);
}

// Every round of a planned schedule in an order its tokens allow (Kahn's algorithm), each
// starting at the latest of its node's previous round, its tokens and its receivers' READY.
class PlanWalk {
 public:
  PlanWalk(const Topology& t, const Schedule& s, const WireModel& wire, const PredictOptions& o)
      : t_(t), s_(s), wire_(wire), o_(o), n_(t.machine_count()) {
    for (const Program& prog : s.programs) {
      offset_.push_back(total_);
      total_ += prog.rounds.size();
    }
    indegree_.resize(total_);
    start_.assign(total_, 0.0);
    end_.assign(total_, 0.0);
    pred_.assign(total_, kReady);
    sync_ready_.assign(s.syncs.size(), 0.0);
    sync_emitter_.assign(s.syncs.size(), 0);
    totals_.edge_bits.assign(idx(t.directed_edge_count()), 0.0);
    for (Rank c = 0; c < n_; ++c) {
      const auto& rounds = s.programs[idx(c)].rounds;
      for (std::size_t r = 0; r < rounds.size(); ++r) {
        for (std::uint32_t id : rounds[r].waits)
          if (id >= s.syncs.size()) throw std::invalid_argument("predict: " + t.machine(c).name + " waits for a token the plan does not have");
        indegree_[at(c, r)] = (r > 0 ? 1 : 0) + static_cast<int>(rounds[r].waits.size());
        if (indegree_[at(c, r)] == 0) ready_.emplace_back(c, r);
      }
    }
  }

  void run() {
    std::size_t done = 0;
    while (!ready_.empty()) {
      auto [c, r] = ready_.front();
      ready_.pop_front();
      start_round(c, r);
      ++done;
    }
    if (done != total_)
      throw std::invalid_argument("predict: the plan's tokens deadlock: " + std::to_string(total_ - done) + " rounds never start");
  }

  void trace(Prediction& p) const {
    PathBuilder path(o_.keep_path);
    std::size_t g = last_round_;
    const Rank c = node_of(g);
    if (last_dst_ >= 0) path.add({PathStep::Kind::kDelivery, c, last_dst_, -1, -1, end_[g], totals_.last_s});
    for (;;) {
      const Rank node = node_of(g);
      const std::size_t r = g - offset_[idx(node)];
      const Round& round = s_.programs[idx(node)].rounds[r];
      path.add({PathStep::Kind::kRound, node, -1, static_cast<std::int64_t>(r), round.phase(), start_[g], end_[g]});
      const std::int64_t pred = pred_[g];
      if (pred == kReady) {
        path.add({PathStep::Kind::kReady, node, -1, -1, -1, 0.0, start_[g]});
        break;
      }
      if (pred == kLocal) {
        --g;
        continue;
      }
      const Sync& sync = s_.syncs[idx(pred)];
      const std::size_t e = sync_emitter_[idx(pred)];
      path.add({PathStep::Kind::kToken, sync.from, sync.to, -1, -1, end_[e], sync_ready_[idx(pred)]}, wire_.links_between(sync.from, sync.to));
      g = e;
    }
    path.finish(p);
  }

  const Totals& totals() const { return totals_; }

 private:
  static constexpr std::int64_t kReady = -1;  // the round waited longest for READY
  static constexpr std::int64_t kLocal = -2;  // for its node's previous round; else a sync id

  std::size_t at(Rank c, std::size_t r) const { return offset_[idx(c)] + r; }
  Rank node_of(std::size_t g) const {
    return static_cast<Rank>(std::upper_bound(offset_.begin(), offset_.end(), g) - offset_.begin() - 1);
  }
  // A combining schedule's round k sends step k's message: as many blocks as it gathers.
  std::uint64_t send_bytes(Rank c, std::size_t r) const {
    if (!s_.combining()) return o_.block_bytes;
    const auto& steps = s_.combine[idx(c)];
    return r < steps.size() ? o_.block_bytes * steps[r].send.size() : o_.block_bytes;
  }
  // The round's blocks interleaved at the node's link rate, or at their paced rate, and each no
  // faster than the slowest link on its path.
  double duration(Rank c, std::size_t r, const Round& round) const {
    if (round.sends.empty()) return 0.0;
    const double rate = static_cast<double>(round.sends.size()) * block_rate(s_, round, wire_.machine_rate(c));
    const double bits = wire_.block_bits(send_bytes(c, r));
    double longest = static_cast<double>(round.sends.size()) * bits / rate;
    for (const Send& send : round.sends)
      if (send.dst != c) longest = std::max(longest, bits / wire_.path_rate(c, send.dst));
    return longest;
  }

  void start_round(Rank c, std::size_t r) {
    const Round& round = s_.programs[idx(c)].rounds[r];
    const std::size_t g = at(c, r);
    double start = 0.0;
    for (const Send& send : round.sends)
      if (!round.dummy) start = std::max(start, wire_.hand_over(send.dst, c, false));
    if (r > 0 && end_[g - 1] >= start) {
      start = end_[g - 1];
      pred_[g] = kLocal;
    }
    for (std::uint32_t id : round.waits) {
      if (sync_ready_[id] > start) {
        start = sync_ready_[id];
        pred_[g] = id;
      }
    }
    start_[g] = start;
    end_[g] = start + duration(c, r, round);
    double arrived = end_[g];
    for (const Send& send : round.sends)
      if (!round.dummy) arrived = std::max(arrived, deliver(c, g, send.dst));
    for (std::uint32_t id : round.emits) {
      const Sync& sync = s_.syncs[id];
      sync_ready_[id] = token_leaves(o_.hand_over, start, end_[g], arrived) + wire_.hand_over(c, sync.to, true);
      sync_emitter_[id] = g;
      release(sync.to, sync.to_round);
    }
    if (r + 1 < s_.programs[idx(c)].rounds.size()) release(c, static_cast<int>(r + 1));
  }

  // The block of round g from c to d: its arrival, the links it crosses, the tokens d emits
  // once it is whole. Returns the arrival.
  double deliver(Rank c, std::size_t g, Rank d) {
    const double arrival = end_[g] + wire_.delivery(c, d);
    if (arrival > totals_.last_s) {
      totals_.last_s = arrival;
      last_round_ = g;
      last_dst_ = d;
    }
    const double bits = wire_.block_bits(send_bytes(c, g - offset_[idx(c)]));
    t_.path(t_.machine_node(c), t_.machine_node(d), path_);
    for (int e : path_) totals_.edge_bits[idx(e)] += bits;
    if (const auto* ids = s_.programs[idx(d)].emits_on_receive(c)) {
      for (std::uint32_t id : *ids) {
        const Sync& sync = s_.syncs[id];
        sync_ready_[id] = arrival + wire_.hand_over(d, sync.to, false);
        sync_emitter_[id] = g;
        release(sync.to, sync.to_round);
      }
    }
    return arrival;
  }

  void release(Rank node, int round) {
    const std::size_t g = at(node, idx(round));
    if (--indegree_[g] == 0) ready_.emplace_back(node, idx(round));
  }

  const Topology& t_;
  const Schedule& s_;
  const WireModel& wire_;
  const PredictOptions& o_;
  int n_;
  std::size_t total_ = 0;
  std::vector<std::size_t> offset_;  // each node's first round, in the flat arrays below
  std::vector<int> indegree_;
  std::vector<double> start_, end_;
  std::vector<std::int64_t> pred_;  // what each round's start waited for longest
  std::vector<double> sync_ready_;  // when each token arrived at its waiter
  std::vector<std::size_t> sync_emitter_;  // the round whose event each token reports
  std::deque<std::pair<Rank, std::size_t>> ready_;
  std::vector<int> path_;
  Totals totals_;
  std::size_t last_round_ = 0;
  Rank last_dst_ = -1;
};

using detail::Level;
using detail::Variant;

// The variants the walk over the phases takes: no tokens, or pair-wise ones between blocks of
// phases (the planner's Variant). Sender-based tokens that leave on arrival can leave a node
// out of its rounds' order (a later block may arrive sooner), and then a token the planner
// dropped as implied can be longer than the chain that implies it: those are walked over the
// plan, as are dummies and barriers, which add rounds of their own.
std::optional<Variant> pair_wise(const SyncSpec& sync, TokenLeaves leaves) {
  const Variant v = detail::variant_of(sync);
  if (sync.kind == SyncKind::kDummy || v.barrier || !v.across) return std::nullopt;
  if (v.level == Level::kSend && leaves != TokenLeaves::kDrained) return std::nullopt;
  return v;
}

// The tree's phases without their programs: each node sends one block a round, in phase order
// (programs_from_phases), and a round waits for the previous users of each directed link on its
// path as the variant says (Faraj/Yuan/Patarasuk section 5: consecutive users of a link, or
// consecutive blocks of them; the others follow). The planner keeps only some of these tokens
// and drops those that others imply; an implied ordering runs through a chain of tokens and
// rounds that is at least as long as the token it replaces (a hand-over's terms add up along
// the tree's links, so a chain of tokens costs at least what one token over the same ends
// does; a receiver-based ordering is implied only through a token that reports the same
// block), so the longest path is the same.
class PhaseWalk {
 public:
  PhaseWalk(const Topology& t, const std::vector<Phase>& phases, Variant sync, const WireModel& wire, const PredictOptions& o)
      : t_(t), phases_(phases), sync_(sync), wire_(wire), o_(o), block_bits_(wire.block_bits(o.block_bytes)) {
    if (sync.block < 1) throw std::invalid_argument("sync block size must be at least 1");
    std::int64_t messages = 0;
    for (const Phase& phase : phases) {
      phase_offset_.push_back(messages);
      messages += static_cast<std::int64_t>(phase.size());
    }
    end_.resize(idx(messages));
    pred_.resize(idx(messages));
    node_end_.assign(idx(t.machine_count()), 0.0);
    node_last_.assign(idx(t.machine_count()), -1);
    edge_.assign(idx(t.directed_edge_count()), {});
    totals_.edge_bits.assign(idx(t.directed_edge_count()), 0.0);
  }

  void run() {
    std::int64_t id = 0;
    for (std::size_t p = 0; p < phases_.size(); ++p)
      for (const Message& m : phases_[p]) message(id++, static_cast<int>(p), m);
  }

  void trace(Prediction& p) const {
    PathBuilder path(o_.keep_path);
    std::int64_t g = last_;
    Message m = message_of(g);
    path.add({PathStep::Kind::kDelivery, m.src, m.dst, -1, -1, end_[idx(g)], totals_.last_s});
    for (;;) {
      m = message_of(g);
      const double start = end_[idx(g)] - duration(m);
      path.add({PathStep::Kind::kRound, m.src, -1, -1, phase_of(g), start, end_[idx(g)]});
      const std::int64_t pred = pred_[idx(g)];
      if (pred < 0) {
        path.add({PathStep::Kind::kReady, m.src, -1, -1, -1, 0.0, start});
        break;
      }
      const std::int64_t before = pred / kPredKinds;
      if (pred % kPredKinds != kPredLocal) {
        // A receiver-based token's step starts where its block's round ended, as the planned walk's.
        const Message& b = message_of(before);
        const Rank from = pred % kPredKinds == kPredSent ? b.src : b.dst;
        path.add({PathStep::Kind::kToken, from, m.src, -1, -1, end_[idx(before)], start}, wire_.links_between(from, m.src));
      }
      g = before;
    }
    path.finish(p);
  }

  const Totals& totals() const { return totals_; }

 private:
  // A user of a directed link: its message and when its tokens are ready to leave.
  struct EdgeUser {
    std::int64_t msg = -1;
    Rank src = -1, dst = -1;
    double leaves = 0.0;   // a sender-based token
    double arrival = 0.0;  // a receiver-based token
  };
  // pred_: -1 READY, else kPredKinds x the message waited for plus what of it was waited for.
  static constexpr std::int64_t kPredKinds = 3, kPredLocal = 0, kPredSent = 1, kPredReceived = 2;

  double duration(const Message& m) const { return block_bits_ / wire_.path_rate(m.src, m.dst); }
  int phase_of(std::int64_t id) const {
    return static_cast<int>(std::upper_bound(phase_offset_.begin(), phase_offset_.end(), id) - phase_offset_.begin() - 1);
  }
  Message message_of(std::int64_t id) const {
    const int p = phase_of(id);
    return phases_[idx(p)][idx(id - phase_offset_[idx(p)])];
  }

  // When a token from user u lets node c start, and what the start waited for.
  std::pair<double, std::int64_t> token_ready(const EdgeUser& u, Rank c) const {
    if (sync_.level == Level::kSend) return {u.leaves + wire_.hand_over(u.src, c, true), kPredKinds * u.msg + kPredSent};
    return {u.arrival + wire_.hand_over(u.dst, c, false), kPredKinds * u.msg + kPredReceived};
  }

  void message(std::int64_t id, int phase, const Message& m) {
    const Rank c = m.src;
    double start = wire_.hand_over(m.dst, c, false);
    std::int64_t pred = -1;
    if (node_last_[idx(c)] >= 0 && node_end_[idx(c)] >= start) {
      start = node_end_[idx(c)];
      pred = kPredKinds * node_last_[idx(c)] + kPredLocal;
    }
    const int block = phase / sync_.block;
    t_.path(t_.machine_node(c), t_.machine_node(m.dst), path_);
    for (int e : path_) {
      if (sync_.level == Level::kNone) break;  // no tokens: no users to keep
      for (const EdgeUser& u : edge_[idx(e)].enter(block)) {
        if (sync_.level == Level::kSend && u.src == c) continue;  // its own earlier round
        const auto [ready, waited] = token_ready(u, c);
        if (ready > start) {
          start = ready;
          pred = waited;
        }
      }
    }
    const double end = start + duration(m);
    const double arrival = end + wire_.delivery(c, m.dst);
    const EdgeUser user{id, c, m.dst, token_leaves(o_.hand_over, start, end, arrival), arrival};
    for (int e : path_) {
      if (sync_.level != Level::kNone) edge_[idx(e)].current.push_back(user);
      totals_.edge_bits[idx(e)] += block_bits_;
    }
    end_[idx(id)] = end;
    pred_[idx(id)] = pred;
    node_end_[idx(c)] = end;
    node_last_[idx(c)] = id;
    if (arrival > totals_.last_s) {
      totals_.last_s = arrival;
      last_ = id;
    }
  }

  const Topology& t_;
  const std::vector<Phase>& phases_;
  Variant sync_;
  const WireModel& wire_;
  const PredictOptions& o_;
  double block_bits_;
  std::vector<std::int64_t> phase_offset_;  // the first message of each phase
  std::vector<double> end_;                  // per message: when its last frame left
  std::vector<std::int64_t> pred_;
  std::vector<double> node_end_;
  std::vector<std::int64_t> node_last_;
  std::vector<detail::BlockUsers<EdgeUser>> edge_;  // a directed link's users in its last two blocks
  std::vector<int> path_;
  Totals totals_;
  std::int64_t last_ = 0;
};

}  // namespace

double TreeModel::phase_efficiency() const {
  if (uniform_rates_) return 1.0;
  std::call_once(lazy_->once, [this] {
    PredictOptions o;
    o.wire_extra_bytes = 0;
    o.hand_over = HandOver{.per_link_s = 0, .frames_ahead = 0, .store_forward = 0, .token_bytes = 0, .per_switch_s = 0, .per_nic_s = 0, .engine_s = 0};
    o.keep_path = false;
    try {
      lazy_->phase_efficiency = predict(*topology_, AlgorithmSpec{Algorithm::kTree, 4}, SyncSpec{SyncKind::kSenderAll, 1}, o).fraction();
    } catch (const std::exception&) {  // a tree the planner refuses: nothing to weigh
      lazy_->phase_efficiency = 1.0;
    }
  });
  return lazy_->phase_efficiency;
}

double engine_token_lead_s(const Topology& topology, std::size_t phases, std::uint64_t pace_bps, std::uint64_t block_bytes) {
  if (phases == 0 || pace_bps == 0 || block_bytes == 0) return 0.0;
  const std::uint64_t buffer = smallest_switch_buffer(topology);
  const double slack = 8.0 * static_cast<double>(buffer) / static_cast<double>(phases) / static_cast<double>(pace_bps);
  if (topology.mtu() <= static_cast<int>(kDataHeaderBytes)) return slack;
  const std::uint64_t chunk = static_cast<std::uint64_t>(topology.mtu()) - kDataHeaderBytes;
  const std::uint64_t last = block_bytes % chunk == 0 ? chunk : block_bytes % chunk;
  return std::min(slack, 8.0 * static_cast<double>(last + kEthHeaderBytes + kDataHeaderBytes) / static_cast<double>(pace_bps));
}

Prediction predict(const Topology& topology, const Schedule& schedule, const PredictOptions& options) {
  if (schedule.machines != topology.machine_count() || schedule.programs.size() != idx(topology.machine_count()))
    throw std::invalid_argument("predict: the schedule is for " + std::to_string(schedule.machines) + " machines, the topology has " +
                                std::to_string(topology.machine_count()));
  const WireModel wire(topology, options);
  PlanWalk walk(topology, schedule, wire, options);
  walk.run();
  Prediction p;
  walk.trace(p);
  finish_prediction(topology, wire, options, walk.totals(), p);
  return p;
}

Prediction predict(const Topology& topology, const AlgorithmSpec& algorithm, const SyncSpec& sync, const PredictOptions& options) {
  const std::optional<Variant> walk_phases = algorithm.algorithm == Algorithm::kTree ? pair_wise(sync, options.hand_over.leaves) : std::nullopt;
  if (!walk_phases)
    return predict(topology, plan_sync(topology, make_schedule(topology, algorithm), sync), options);
  const WireModel wire(topology, options);
  const std::vector<Phase> phases = tree_phases(TreeModel(topology));
  PhaseWalk walk(topology, phases, *walk_phases, wire, options);
  walk.run();
  Prediction p;
  p.streamed = true;
  walk.trace(p);
  finish_prediction(topology, wire, options, walk.totals(), p);
  return p;
}

}  // namespace aapc::sched
