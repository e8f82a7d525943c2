// Faraj/Yuan: contention-free AAPC phases for any tree of Ethernet switches.
//
// Section numbers follow "A Message Scheduling Scheme for All-to-all Personalized
// Communication on Ethernet Switched Clusters" (Faraj, Yuan, Patarasuk); the six steps are
// those of its Figure 4 (Figure 4 of the routine-generator paper is the same algorithm).
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "aapc/sched/algorithms.hpp"
#include "builders.hpp"

namespace aapc::sched {
namespace {

// Mathematical modulo (the papers' "(p - |M0| x (|M| - |M0|)) mod |Mj|" is of a negative value).
std::int64_t mod(std::int64_t a, std::int64_t m) { return ((a % m) + m) % m; }

[[noreturn]] void internal_error(const std::string& what) {
  throw std::logic_error("tree schedule: " + what + " (please report this topology)");
}

}  // namespace

std::int64_t global_start_phase(const std::vector<int>& sizes, int i, int j) {
  // Section 4.2, extended ring scheduling.
  std::int64_t total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  std::int64_t load = sizes[0] * (total - sizes[0]);
  auto size = [&](int n) { return static_cast<std::int64_t>(sizes[static_cast<std::size_t>(n)]); };
  std::int64_t sum = 0;
  if (j > i) {
    // T_i -> T_j starts at |Mi| x (|M_{i+1}| + ... + |M_{j-1}|).
    for (int n = i + 1; n <= j - 1; ++n) sum += size(n);
    return size(i) * sum;
  }
  // T_i -> T_j, i > j, starts at |M0|(|M|-|M0|) - |Mj| x (|M_{j+1}| + ... + |M_i|).
  for (int n = j + 1; n <= i; ++n) sum += size(n);
  return load - size(j) * sum;
}

std::vector<std::pair<int, int>> rotate_pattern(const std::vector<int>& senders, const std::vector<int>& receivers) {
  // Section 4.3.1, the rotate scheme: receivers repeat their fixed sequence; senders repeat
  // the base sequence b times (a x b x D = lcm phases), then at each multiple of a x b x D the
  // base sequence is rotated by the smallest n for which the message at that phase has not
  // happened before. D segments cover all |Mi| x |Mj| messages.
  const std::size_t mi = senders.size(), mj = receivers.size();
  const std::size_t total = mi * mj;
  const std::size_t segment = std::lcm(mi, mj);
  std::vector<bool> used(total, false);
  std::vector<std::pair<int, int>> out;
  out.reserve(total);
  for (std::size_t start = 0; start < total; start += segment) {
    std::size_t n = 0;
    while (n < mi && used[((start + n) % mi) * mj + start % mj]) ++n;
    if (n == mi) internal_error("rotate pattern found no fresh rotation");
    for (std::size_t t = start; t < start + segment; ++t) {
      std::size_t s = (t + n) % mi, r = t % mj;
      if (used[s * mj + r]) internal_error("rotate pattern repeats a message");
      used[s * mj + r] = true;
      out.emplace_back(senders[s], receivers[r]);
    }
  }
  return out;
}

namespace {

// The state of Figure 4's construction: the phases built so far, and which machine of each
// subtree sends and receives a global message in each phase (the steps read them back).
class TreeBuilder {
 public:
  explicit TreeBuilder(const TreeModel& model);
  void step1_t0_to_others();
  void step2_others_to_t0();
  void step3_t0_locals();
  void step4_later_to_earlier();
  void step5_subtree_locals();
  void step6_earlier_to_later();
  std::vector<Phase> finish();

 private:
  std::int64_t size(int i) const { return static_cast<std::int64_t>(sizes_[static_cast<std::size_t>(i)]); }
  Rank machine(int i, std::int64_t x) const { return subtrees_[static_cast<std::size_t>(i)].machines[static_cast<std::size_t>(x)]; }
  std::int64_t start(int i, int j) const { return global_start_phase(sizes_, i, j); }
  Rank& gsend(int i, std::int64_t p) { return gsend_[static_cast<std::size_t>(i)][static_cast<std::size_t>(p)]; }
  Rank& grecv(int i, std::int64_t p) { return grecv_[static_cast<std::size_t>(i)][static_cast<std::size_t>(p)]; }
  std::int64_t index_in_subtree(Rank r) const { return index_in_subtree_[static_cast<std::size_t>(r)]; }
  void add_global(std::int64_t p, int i, Rank src, int j, Rank dst);
  void add_local(std::int64_t p, Rank src, Rank dst) { phases_[static_cast<std::size_t>(p)].push_back({src, dst}); }
  // Ti -> Tj in the broadcast pattern (Steps 4 and 6): senders in the order m_{i,0}, m_{i,1},
  // ..., each to receivers m_{j,0} .. m_{j,|Mj|-1}.
  void broadcast(int i, int j);

  const std::vector<Subtree>& subtrees_;
  int n_;
  int k_;
  std::vector<int> sizes_;
  std::int64_t m0_;
  std::int64_t load_;
  std::vector<Phase> phases_;
  // Per subtree and phase: the machine sending / receiving a global message (-1: none).
  std::vector<std::vector<Rank>> gsend_, grecv_;
  std::vector<int> index_in_subtree_;  // index of each machine within its subtree
};

TreeBuilder::TreeBuilder(const TreeModel& model)
    : subtrees_(model.subtrees()), n_(model.machines()), k_(static_cast<int>(model.subtrees().size())) {
  if (k_ < 2) internal_error("the root has fewer than two subtrees with machines");
  for (const auto& st : subtrees_) sizes_.push_back(static_cast<int>(st.machines.size()));
  m0_ = sizes_[0];
  load_ = m0_ * (n_ - m0_);
  if (load_ != model.load()) internal_error("load of the two-level view differs from the bottleneck load");
  phases_.resize(static_cast<std::size_t>(load_));
  gsend_.assign(static_cast<std::size_t>(k_), std::vector<Rank>(static_cast<std::size_t>(load_), -1));
  grecv_ = gsend_;
  index_in_subtree_.assign(static_cast<std::size_t>(n_), -1);
  for (int i = 0; i < k_; ++i)
    for (std::size_t x = 0; x < subtrees_[static_cast<std::size_t>(i)].machines.size(); ++x)
      index_in_subtree_[static_cast<std::size_t>(machine(i, static_cast<std::int64_t>(x)))] = static_cast<int>(x);
}

void TreeBuilder::add_global(std::int64_t p, int i, Rank src, int j, Rank dst) {
  Rank& s = gsend(i, p);
  Rank& r = grecv(j, p);
  if (s != -1 || r != -1) internal_error("two global messages of one subtree in phase " + std::to_string(p));
  s = src;
  r = dst;
  add_local(p, src, dst);
}

// Step 1: T0 -> Tj, 1 <= j < k. Receivers: at phase p, m_{j,(p - load) mod |Mj|} (1.a);
// senders: the rotate pattern with base sequence m_{0,0} .. m_{0,|M0|-1} (1.b).
void TreeBuilder::step1_t0_to_others() {
  for (int j = 1; j < k_; ++j) {
    std::int64_t s = start(0, j);
    std::vector<int> senders(static_cast<std::size_t>(m0_)), receivers(static_cast<std::size_t>(size(j)));
    std::iota(senders.begin(), senders.end(), 0);
    for (std::int64_t t = 0; t < size(j); ++t) receivers[static_cast<std::size_t>(t)] = static_cast<int>(mod(s + t - load_, size(j)));
    auto pattern = rotate_pattern(senders, receivers);
    for (std::size_t t = 0; t < pattern.size(); ++t)
      add_global(s + static_cast<std::int64_t>(t), 0, machine(0, pattern[t].first), j, machine(j, pattern[t].second));
  }
}

// Step 2: Ti -> T0, 1 <= i < k. A round is |M0| phases; Step 1 made every machine of T0 send
// once per round. 2.a: receivers follow the mapping of Table 3 (round r: the sender
// m_{0,x} pairs with receiver m_{0,(x + r + 1) mod |M0|}; round r maps like r mod |M0|).
// Step 3 needs that mapping by sender in rounds 0 .. |M0|-2; in the later rounds any
// bijection is contention-free and we read Table 3 by position within the round, which is
// how the second paper's Table 4 continues it (its round 1) and agrees with the first
// paper's Table 4. 2.b: senders broadcast in the order m_{i,0}, m_{i,1}, ...
void TreeBuilder::step2_others_to_t0() {
  for (int i = 1; i < k_; ++i) {
    std::int64_t s = start(i, 0);
    for (std::int64_t t = 0; t < size(i) * m0_; ++t) {
      std::int64_t p = s + t;
      std::int64_t round = p / m0_;
      Rank t0_sender = gsend(0, p);
      if (t0_sender < 0) internal_error("T0 has no sender in phase " + std::to_string(p));
      std::int64_t x = round < m0_ - 1 ? index_in_subtree(t0_sender) : p % m0_;
      std::int64_t receiver = (x + round % m0_ + 1) % m0_;
      add_global(p, i, machine(i, t / m0_), 0, machine(0, receiver));
    }
  }
}

// Step 3: local messages of T0 in phases 0 .. |M0|(|M0|-1)-1: m_{0,a} -> m_{0,b} where
// m_{0,a} receives and m_{0,b} sends a global message (case 1 of Table 2).
void TreeBuilder::step3_t0_locals() {
  std::int64_t locals = 0;
  for (std::int64_t p = 0; p < m0_ * (m0_ - 1); ++p) {
    Rank receiver = grecv(0, p), sender = gsend(0, p);
    if (receiver < 0 || sender < 0) internal_error("T0 idle in phase " + std::to_string(p));
    if (receiver == sender) internal_error("Table 3 mapping pairs a machine with itself in phase " + std::to_string(p));
    add_local(p, receiver, sender);
    ++locals;
  }
  if (locals != m0_ * (m0_ - 1)) internal_error("T0 local messages incomplete");
}

void TreeBuilder::broadcast(int i, int j) {
  std::int64_t s = start(i, j);
  for (std::int64_t t = 0; t < size(i) * size(j); ++t) add_global(s + t, i, machine(i, t / size(j)), j, machine(j, t % size(j)));
}

// Step 4: Ti -> Tj, i > j > 0: broadcast, receivers repeating m_{j,0} .. m_{j,|Mj|-1} for
// each sender, senders in the order m_{i,0}, m_{i,1}, ...
void TreeBuilder::step4_later_to_earlier() {
  for (int i = 1; i < k_; ++i)
    for (int j = 1; j < i; ++j) broadcast(i, j);
}

// Step 5: local messages of Ti, i > 0, in the phases of Ti -> Ti-1. The designated receiver
// at phase p is m_{i,(p - load) mod |Mi|} (Steps 1 and 4 aligned every global receiver of Ti
// with it); m_{i,a} -> m_{i,b} goes in a phase where m_{i,b} sends a global message and
// m_{i,a} is the designated receiver (cases 1 and 2 of Table 2).
void TreeBuilder::step5_subtree_locals() {
  for (int i = 1; i < k_; ++i) {
    std::int64_t mi = size(i);
    std::int64_t s = start(i, i - 1);
    std::vector<bool> done(static_cast<std::size_t>(mi * mi), false);
    std::int64_t count = 0;
    for (std::int64_t p = s; p < s + mi * size(i - 1); ++p) {
      Rank sender = gsend(i, p);
      std::int64_t a = mod(p - load_, mi);
      Rank receiver = machine(i, a);
      Rank actual = grecv(i, p);
      if (actual >= 0 && actual != receiver) internal_error("global receiver not aligned in phase " + std::to_string(p));
      if (sender < 0 || sender == receiver) continue;
      std::int64_t b = index_in_subtree(sender);
      if (done[static_cast<std::size_t>(a * mi + b)]) continue;
      done[static_cast<std::size_t>(a * mi + b)] = true;
      add_local(p, receiver, sender);
      ++count;
    }
    if (count != mi * (mi - 1)) internal_error("local messages of subtree " + std::to_string(i) + " incomplete");
  }
}

// Step 6: Ti -> Tj, 0 < i < j: the broadcast pattern.
void TreeBuilder::step6_earlier_to_later() {
  for (int i = 1; i < k_; ++i)
    for (int j = i + 1; j < k_; ++j) broadcast(i, j);
}

std::vector<Phase> TreeBuilder::finish() {
  for (auto& phase : phases_)
    std::sort(phase.begin(), phase.end(), [](const Message& a, const Message& b) { return a.src < b.src; });
  return std::move(phases_);
}

}  // namespace

// Figure 4, Steps 1 to 6, in the paper's order: each step reads the global messages the
// earlier ones placed.
std::vector<Phase> tree_phases(const TreeModel& model) {
  TreeBuilder b(model);
  b.step1_t0_to_others();
  b.step2_others_to_t0();
  b.step3_t0_locals();
  b.step4_later_to_earlier();
  b.step5_subtree_locals();
  b.step6_earlier_to_later();
  return b.finish();
}

Schedule tree_schedule(const TreeModel& model, bool programs) {
  Schedule sched;
  sched.algorithm = algorithm_name(Algorithm::kTree);
  sched.machines = model.machines();
  sched.contention_free = true;
  sched.phases = tree_phases(model);
  if (programs) sched.programs = programs_from_phases(sched.machines, sched.phases);
  return sched;
}

Schedule build_tree(const BuildInput& in) { return tree_schedule(TreeModel(in.topology), in.programs); }

}  // namespace aapc::sched
