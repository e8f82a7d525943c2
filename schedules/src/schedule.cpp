#include <algorithm>
#include <charconv>

#include "aapc/sched/schedule.hpp"
#include "internal.hpp"

namespace aapc::sched {

bool detail::split_param(std::string_view text, std::string_view& name, std::optional<int>& param) {
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

namespace {

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

}  // namespace

const std::vector<std::uint32_t>* Program::emits_on_receive(Rank src) const {
  auto it = std::lower_bound(on_receive.begin(), on_receive.end(), src,
                             [](const auto& entry, Rank value) { return entry.first < value; });
  return it != on_receive.end() && it->first == src ? &it->second : nullptr;
}

std::optional<SyncSpec> SyncSpec::parse(std::string_view text) {
  std::string_view name;
  std::optional<int> param;
  if (!detail::split_param(text, name, param)) return std::nullopt;
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

std::size_t Schedule::message_count() const {
  std::size_t n = 0;
  for (const auto& phase : phases) n += phase.size();
  return n;
}

void cap_round_rates(const Topology& topology, Schedule& schedule) {
  if (schedule.combining() || one_rate(topology)) return;  // no block is faster than a link it crosses
  for (std::size_t me = 0; me < schedule.programs.size(); ++me) {
    auto& rounds = schedule.programs[me].rounds;
    if (rounds.empty()) continue;  // another node's, in a part (Schedule::part)
    const std::vector<std::uint64_t> slowest = topology.slowest_from(static_cast<Rank>(me));
    const auto own = static_cast<double>(slowest[me]);
    for (Round& round : rounds) {
      round.rate_bps = 0;  // what each block gets uncapped, below
      std::uint64_t cap = 0;
      for (const Send& send : round.sends)
        if (send.dst >= 0 && static_cast<std::size_t>(send.dst) < slowest.size() && static_cast<std::size_t>(send.dst) != me && slowest[static_cast<std::size_t>(send.dst)] > 0)
          cap = cap == 0 ? slowest[static_cast<std::size_t>(send.dst)] : std::min(cap, slowest[static_cast<std::size_t>(send.dst)]);
      if (cap > 0 && static_cast<double>(cap) < block_rate(schedule, round, own)) round.rate_bps = cap;
    }
  }
}

double block_rate(const Schedule& schedule, const Round& round, double own_bps) {
  double rate = round.sends.empty() ? own_bps : own_bps / static_cast<double>(round.sends.size());
  if (schedule.block_rate_bps > 0) rate = std::min(rate, static_cast<double>(schedule.block_rate_bps));
  if (round.rate_bps > 0) rate = std::min(rate, static_cast<double>(round.rate_bps));
  return rate;
}

std::vector<Program> programs_from_phases(int machines, const std::vector<Phase>& phases, Rank only) {
  std::vector<Program> programs(static_cast<std::size_t>(machines));
  for (int r = 0; r < machines; ++r) programs[static_cast<std::size_t>(r)].rank = r;
  for (std::size_t p = 0; p < phases.size(); ++p) {
    for (const Message& m : phases[p]) {
      if (only >= 0 && m.src != only) continue;
      Round round;
      round.sends.push_back({m.dst, static_cast<int>(p)});
      programs[static_cast<std::size_t>(m.src)].rounds.push_back(std::move(round));
    }
  }
  return programs;
}

}  // namespace aapc::sched
