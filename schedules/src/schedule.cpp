#include <algorithm>
#include <charconv>
#include <stdexcept>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/schedule.hpp"

namespace aapc::sched {
namespace {

// Splits "name:4" or "name(4)" into name and parameter.
bool split_param(std::string_view text, std::string_view& name, std::optional<int>& param) {
  name = text;
  param.reset();
  std::size_t cut = text.find_first_of(":(=");
  if (cut == std::string_view::npos) return true;
  name = text.substr(0, cut);
  std::string_view rest = text.substr(cut + 1);
  if (text[cut] == '(') {
    if (rest.empty() || rest.back() != ')') return false;
    rest.remove_suffix(1);
  }
  int value = 0;
  auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  if (ec != std::errc() || ptr != rest.data() + rest.size() || value < 1) return false;
  param = value;
  return true;
}

struct SyncName {
  SyncKind kind;
  const char* name;
};
constexpr SyncName kSyncNames[] = {
    {SyncKind::kNone, "none"},
    {SyncKind::kDummy, "dummy"},
    {SyncKind::kSenderAll, "sender-all"},
    {SyncKind::kSenderPartial, "sender-partial"},
    {SyncKind::kReceiverAll, "receiver-all"},
    {SyncKind::kReceiverPartial, "receiver-partial"},
    {SyncKind::kBarrierAll, "barrier-all"},
    {SyncKind::kBarrierPartialNone, "barrier-partial-none"},
    {SyncKind::kBarrierPartialSender, "barrier-partial-sender"},
    {SyncKind::kBarrierPartialReceiver, "barrier-partial-receiver"},
};

struct AlgorithmName {
  Algorithm algorithm;
  const char* name;
};
constexpr AlgorithmName kAlgorithmNames[] = {
    {Algorithm::kTree, "tree"},
    {Algorithm::kLinear, "linear"},
    {Algorithm::kRing, "ring"},
    {Algorithm::kPairwise, "pairwise"},
    {Algorithm::kPairwiseXor, "pairwise-xor"},
    {Algorithm::kPairwiseEc, "pairwise-ec"},
    {Algorithm::kLp, "lp"},
    {Algorithm::kSyncShuffle, "sync-shuffle"},
    {Algorithm::kGroupShuffle, "group-shuffle"},
    {Algorithm::kPacedShuffle, "paced-shuffle"},
    {Algorithm::kBruck, "bruck"},
    {Algorithm::kHypercube, "hypercube"},
};

}  // namespace

const std::vector<std::uint32_t>* Program::emits_on_receive(Rank src) const {
  auto it = std::lower_bound(on_receive.begin(), on_receive.end(), src,
                             [](const auto& entry, Rank value) { return entry.first < value; });
  return it != on_receive.end() && it->first == src ? &it->second : nullptr;
}

std::optional<SyncSpec> SyncSpec::parse(std::string_view text) {
  std::string_view name;
  std::optional<int> param;
  if (!split_param(text, name, param)) return std::nullopt;
  for (const auto& entry : kSyncNames) {
    if (name != entry.name) continue;
    SyncSpec spec{entry.kind, param.value_or(1)};
    if (param && !spec.partial()) return std::nullopt;
    if (!param && spec.partial()) spec.block = 4;
    return spec;
  }
  return std::nullopt;
}

bool SyncSpec::partial() const {
  switch (kind) {
    case SyncKind::kSenderPartial:
    case SyncKind::kReceiverPartial:
    case SyncKind::kBarrierPartialNone:
    case SyncKind::kBarrierPartialSender:
    case SyncKind::kBarrierPartialReceiver:
      return true;
    default:
      return false;
  }
}

std::string SyncSpec::name() const {
  for (const auto& entry : kSyncNames)
    if (entry.kind == kind) return partial() ? std::string(entry.name) + ":" + std::to_string(block) : entry.name;
  return "?";
}

std::vector<std::string> SyncSpec::names() {
  std::vector<std::string> out;
  for (const auto& entry : kSyncNames) out.push_back(SyncSpec{entry.kind, 4}.name());
  return out;
}

std::optional<AlgorithmSpec> AlgorithmSpec::parse(std::string_view text) {
  std::string_view name;
  std::optional<int> param;
  if (!split_param(text, name, param)) return std::nullopt;
  for (const auto& entry : kAlgorithmNames) {
    if (name != entry.name) continue;
    AlgorithmSpec spec{entry.algorithm, 4};
    if (param) {
      if (entry.algorithm != Algorithm::kGroupShuffle) return std::nullopt;
      spec.group = *param;
    }
    return spec;
  }
  return std::nullopt;
}

std::string AlgorithmSpec::name() const {
  for (const auto& entry : kAlgorithmNames)
    if (entry.algorithm == algorithm)
      return algorithm == Algorithm::kGroupShuffle ? std::string(entry.name) + ":" + std::to_string(group) : entry.name;
  return "?";
}

std::vector<std::string> AlgorithmSpec::names() {
  std::vector<std::string> out;
  for (const auto& entry : kAlgorithmNames) out.push_back(AlgorithmSpec{entry.algorithm, 4}.name());
  return out;
}

std::size_t Schedule::message_count() const {
  std::size_t n = 0;
  for (const auto& phase : phases) n += phase.size();
  return n;
}

std::vector<Program> programs_from_phases(int machines, const std::vector<Phase>& phases) {
  std::vector<Program> programs(static_cast<std::size_t>(machines));
  for (int r = 0; r < machines; ++r) programs[static_cast<std::size_t>(r)].rank = r;
  for (std::size_t p = 0; p < phases.size(); ++p) {
    for (const Message& m : phases[p]) {
      Round round;
      round.sends.push_back({m.dst, static_cast<int>(p)});
      programs[static_cast<std::size_t>(m.src)].rounds.push_back(std::move(round));
    }
  }
  return programs;
}

Schedule make_schedule(const Topology& topology, const AlgorithmSpec& spec) {
  int p = topology.machine_count();
  Schedule s;
  switch (spec.algorithm) {
    case Algorithm::kLinear: s = linear_schedule(p); break;
    case Algorithm::kRing: s = ring_schedule(p); break;
    case Algorithm::kPairwise: s = (p & (p - 1)) == 0 ? pairwise_xor_schedule(p) : pairwise_ec_schedule(p); break;
    case Algorithm::kPairwiseXor: s = pairwise_xor_schedule(p); break;
    case Algorithm::kPairwiseEc: s = pairwise_ec_schedule(p); break;
    case Algorithm::kLp: s = lp_schedule(p); break;
    case Algorithm::kSyncShuffle: s = sync_shuffle_schedule(p); break;
    case Algorithm::kGroupShuffle: s = group_shuffle_schedule(p, spec.group); break;
    case Algorithm::kTree: return tree_schedule(TreeModel(topology));
    case Algorithm::kPacedShuffle: return paced_shuffle_schedule(TreeModel(topology));
    case Algorithm::kBruck: return bruck_schedule(p);
    case Algorithm::kHypercube: return hypercube_schedule(p);
  }
  // The single-switch algorithms avoid contention only when every machine hangs off one
  // switch; on a tree of switches they are unscheduled baselines.
  if (!topology.single_switch()) s.contention_free = false;
  return s;
}

}  // namespace aapc::sched
