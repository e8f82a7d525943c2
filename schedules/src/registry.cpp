// The registry of algorithms (algorithms.def) and what reads it: the parser of an algorithm's
// name, names(), make_schedule(), and the lists of --help and the docs.
#include <stdexcept>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/alltomany.hpp"
#include "builders.hpp"
#include "internal.hpp"

namespace aapc::sched {
namespace {

constexpr AlgorithmInfo kAlgorithms[] = {
#define AAPC_ALGORITHM(ID, NAME, PARAM, DEFAULT, KIND, INPUT, SYNC, BUILDER, DESCRIPTION) \
  {Algorithm::ID, NAME, PARAM, DEFAULT, AlgorithmKind::KIND, AlgorithmInput::INPUT, SYNC, &BUILDER, DESCRIPTION},
#include "aapc/sched/algorithms.def"
#undef AAPC_ALGORITHM
};

// The enumerators are the rows' indices: algorithm_info() looks a row up by its id.
constexpr bool ids_are_indices() {
  for (std::size_t i = 0; i < std::size(kAlgorithms); ++i)
    if (static_cast<std::size_t>(kAlgorithms[i].id) != i) return false;
  return true;
}
static_assert(ids_are_indices());

// A name finds one row.
constexpr bool names_are_unique() {
  for (std::size_t i = 0; i < std::size(kAlgorithms); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (kAlgorithms[i].name == kAlgorithms[j].name) return false;
  return true;
}
static_assert(names_are_unique());

bool dense(const AlgorithmInfo& info) { return info.input != AlgorithmInput::kPattern; }
bool of_pattern(const AlgorithmInfo& info) { return info.input != AlgorithmInput::kDense; }

std::string usages(bool (*which)(const AlgorithmInfo&)) {
  std::string out;
  for (const AlgorithmInfo& info : kAlgorithms)
    if (which(info)) out.append(out.empty() ? "" : ", ").append(info.usage());
  return out;
}

}  // namespace

std::string AlgorithmInfo::usage() const {
  std::string out(name);
  if (!param.empty()) out.append("[:").append(param).append("]");
  return out;
}

std::span<const AlgorithmInfo> algorithms() { return kAlgorithms; }

const AlgorithmInfo* find_algorithm(std::string_view name) {
  for (const AlgorithmInfo& info : kAlgorithms)
    if (info.name == name) return &info;
  return nullptr;
}

const AlgorithmInfo& algorithm_info(Algorithm id) { return kAlgorithms[static_cast<std::size_t>(id)]; }

std::string algorithm_name(Algorithm id, int param) {
  const AlgorithmInfo& info = algorithm_info(id);
  return info.param.empty() ? std::string(info.name) : name_with_param(info.name, param);
}

std::string name_with_param(std::string_view name, int param) { return std::string(name) + ":" + std::to_string(param); }

std::string algorithm_usages(AlgorithmInput input) {
  if (input == AlgorithmInput::kDense) return usages(dense);
  return usages([](const AlgorithmInfo& info) { return info.input == AlgorithmInput::kPattern; });
}

std::string algorithms_markdown() {
  static const char* const kKinds[] = {"one switch", "any tree", "any tree (paced)", "no (combining)"};
  static const char* const kInputs[] = {"every pair", "alltoallv pattern", "either"};
  std::string out = "| algorithm | contention-free on | schedules | what it is |\n|---|---|---|---|\n";
  for (const AlgorithmInfo& info : kAlgorithms) {
    std::string usage = "`" + info.usage() + "`";
    if (!info.param.empty()) usage += " (" + std::string(info.param) + " = " + std::to_string(info.param_default) + ")";
    out.append("| ").append(usage).append(" | ").append(kKinds[static_cast<int>(info.kind)]).append(" | ");
    out.append(kInputs[static_cast<int>(info.input)]).append(" | ").append(info.description).append(" |\n");
  }
  return out;
}

std::optional<AlgorithmSpec> AlgorithmSpec::parse(std::string_view text) {
  std::string_view name;
  std::optional<int> param;
  if (!detail::split_param(text, name, param)) return std::nullopt;
  const AlgorithmInfo* info = find_algorithm(name);
  if (info == nullptr || !dense(*info) || (param && info->param.empty())) return std::nullopt;
  return AlgorithmSpec{info->id, param.value_or(info->param_default)};
}

std::string AlgorithmSpec::name() const { return algorithm_name(algorithm, param); }

std::vector<std::string> AlgorithmSpec::names() {
  std::vector<std::string> out;
  for (const AlgorithmInfo& info : kAlgorithms)
    if (dense(info)) out.push_back(AlgorithmSpec{info.id, info.param_default}.name());
  return out;
}

std::optional<Algorithm> algorithm_of(std::string_view name) {
  const auto spec = AlgorithmSpec::parse(name);
  if (!spec) return std::nullopt;
  return spec->algorithm;
}

SyncSpec default_sync(Algorithm algorithm) {
  const AlgorithmInfo& info = algorithm_info(algorithm);
  const auto sync = SyncSpec::parse(info.sync);
  if (!sync) throw std::invalid_argument("the registry's row " + std::string(info.name) + " names no sync variant");
  return *sync;
}

std::optional<std::string> forced_sparse_algorithm(std::string_view algorithm) {
  const AlgorithmInfo* info = find_algorithm(algorithm);
  if (info == nullptr || info->input != AlgorithmInput::kPattern) return std::nullopt;
  return std::string(algorithm);
}

Schedule pattern_schedule(const Topology& topology, const SparsePattern& pattern, std::string_view algorithm, std::uint64_t seed) {
  const AlgorithmInfo* info = find_algorithm(algorithm);
  if (info == nullptr || !of_pattern(*info))
    throw std::invalid_argument("unknown all-to-many algorithm '" + std::string(algorithm) + "' (" + usages(of_pattern) + ")");
  return info->build({.topology = topology, .param = info->param_default, .pattern = &pattern, .seed = seed});
}

Schedule make_schedule(const Topology& topology, const AlgorithmSpec& spec) { return detail::build_schedule(topology, spec, true); }

Schedule detail::build_schedule(const Topology& topology, const AlgorithmSpec& spec, bool programs) {
  const AlgorithmInfo& info = algorithm_info(spec.algorithm);
  if (!dense(info)) throw std::invalid_argument(std::string(info.name) + " decomposes an alltoallv's pattern (planned_sparse)");
  Schedule s = info.build({.topology = topology, .param = info.param.empty() ? 0 : spec.param, .programs = programs});
  // The single-switch algorithms avoid contention only when every machine hangs off one
  // switch; on a tree of switches they are unscheduled baselines. The shuffles' packet slots
  // (Tam/Wang Alg. 2 and 3) are permutations only while every frame takes one time on every
  // link: with hosts of different rates, a slow host's link takes its senders' slots slower
  // than they come.
  if (info.kind == AlgorithmKind::kSwitch && (!topology.single_switch() || (s.packet_level && !one_rate(topology)))) s.contention_free = false;
  if (programs) cap_round_rates(topology, s);
  return s;
}

}  // namespace aapc::sched
